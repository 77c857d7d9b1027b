#!/usr/bin/env python
"""Client-server MoA on loopback: server calls and bytes per verified token, by draft shape and
CA dtype, from real runs of ``RemoteGenerator`` against a real ``moa-cpp serve`` (the embedded
default: SmolLM2 + the shipped drafter), and the output's identity with single-device plain
greedy decoding.

Per run (one chat prompt, greedy): server calls per verified token (= (1 + cycles) / tokens,
the open included), bytes sent / received per verified token (HTTP headers + bodies as
written and read), of which the open (the prompt's CA), and tau.

    python -m bench.remote bytes                      # 2 prompts per eval set, 64 tokens
    python -m bench.remote bytes --shapes chain:4 --dtypes f16 --prompts 1

Writes bench/results/<machine-label>/remote_bytes.json/.md/.png (bench/_common.write_results).
"""
from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO_ROOT, EVAL_DIR, base_parser, eval_prompts, md_table, run_info, write_results

REPO = REPO_ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, drafter: str) -> tuple:
    port = _free_port()
    cmd = [sys.executable, "-m", "moa_cpp.cli.main", "serve", "--port", str(port), "-m", model, "-d", drafter,
           "--draft", "chain:4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, line.split("listening on ")[1].strip(), cmd


def main(argv=None) -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--shapes", nargs="+", default=["chain:1", "chain:4", "tree:4,4,16"])
    ap.add_argument("--dtypes", nargs="+", default=["f16", "q8_0", "f32"])
    ap.add_argument("--prompts", type=int, default=2, help="prompts per eval set (default 2)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--data", default=str(EVAL_DIR))
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)

    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    from moa_cpp.remote.client import RemoteGenerator
    model = args.model or defaults.default_target()
    drafter = args.drafter or defaults.default_drafter()
    prompts = eval_prompts(Path(args.data), None, args.prompts)
    plain = SpeculativeGenerator.from_paths(model, None, draft="none")
    refs = [plain.generate(p, chat=True, max_tokens=args.max_tokens).tokens for p in prompts]
    plain.close()
    proc, url, cmd = start_server(model, drafter)
    rows = []
    try:
        for shape in args.shapes:
            for dt in args.dtypes:
                remote_gen = RemoteGenerator(url, drafter=drafter, target=model, draft=shape, ca_dtype=dt)
                recs = []
                for p, ref in zip(prompts, refs):
                    ids = remote_gen.chat_prompt([{"role": "user", "content": p}])
                    t = time.perf_counter()
                    r = remote_gen.generate(ids, max_tokens=args.max_tokens)
                    st, n = r.stats, max(1, len(r.tokens))
                    recs.append({"tokens": len(r.tokens), "same": r.tokens == ref, "calls": st.server_calls / n,
                                 "sent": st.bytes_sent / n, "received": st.bytes_received / n, "tau": st.tau,
                                 "wall": time.perf_counter() - t})
                remote_gen.close()
                rows.append({"shape": shape, "ca_dtype": dt, "prompts": len(recs),
                             "identical": sum(x["same"] for x in recs),
                             **{k: statistics.fmean(x[k] for x in recs) for k in ("calls", "sent", "received", "tau")}})
                print(rows[-1], flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    table = md_table(["shape", "CA dtype", "= plain greedy", "server calls / token", "bytes sent / token",
                      "bytes received / token", "tau"],
                     [[r["shape"], r["ca_dtype"], f"{r['identical']}/{r['prompts']}", f"{r['calls']:.3f}",
                       f"{r['sent']:.0f}", f"{r['received']:.0f}", f"{r['tau']:.2f}"] for r in rows])
    head = (f"{Path(model).name} + {Path(drafter).name}, loopback, {len(prompts)} chat prompts (first turn of "
            f"{args.prompts} per eval set), greedy, {args.max_tokens} tokens. Server: `{' '.join(cmd)}`. Bytes: "
            "HTTP headers + msgpack bodies, the open (prompt CA) included, per verified token.\n\n")

    def plot(plt):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        labels = [f"{r['shape']}\n{r['ca_dtype']}" for r in rows]
        ax.bar(range(len(rows)), [r["received"] for r in rows])
        ax.axhline(1024, color="gray", ls="--", lw=1, label="1 KiB")
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.set_ylabel("bytes received per verified token")
        ax.legend()
        fig.tight_layout()
        return fig
    write_results("remote-bytes", {"rows": rows, "prompts": prompts, "settings": vars(args)}, head + table, plot,
                  out_dir=args.results_dir, info=run_info(None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
