#!/usr/bin/env python
"""Time to first token over multi-turn chats: ``moa-cpp serve`` reusing the prompt prefix its
session's KV caches hold (``cache_prompt``, on by default) vs the same server told not to
(``cache_prompt: false``) vs llama-cpp-python's server (which reuses the longest common prefix of
its one Llama's cache).

Servers (one process each, 127.0.0.1, all threads; only one is sent a request at a time):
``moa`` (``moa-cpp serve``, default draft), ``moa-nocache`` (the same command; its requests carry
``cache_prompt: false``), ``llama`` (``python -m llama_cpp.server --flash_attn true``; requests
carry ``repeat_penalty: 1.0``: its default 1.1 is not greedy); with ``--llama-server BIN`` also
``llama-server`` (llama.cpp's own server, ``-np 1 -fa on``, all threads, its prompt cache on:
``bash bench/peers/build.sh`` builds it; ``auto`` runs that script); with ``--baseline DIR`` also
``moa-landed``: the same ``moa-cpp serve`` command run from another checkout of moa_cpp (e.g. the
commit before issue 41's exact reuse: ``git worktree add /tmp/landed 24edf8b``), with this venv's
native library.

Chats: ``--chats`` conversations of ``--turns`` user turns each; turn t of chat c is the eval sets'
prompt c * turns + t (mt_bench, alpaca, qa... in order: different questions one after another in
one conversation, as a user goes on). Each server continues its own conversation (its own answers
in the history, as a client would send them). Turns are interleaved across servers (server order
rotates every turn). Per request (streaming chat, greedy, ``--max-tokens``): TTFT = time to the
first chunk with content, total time, prompt tokens, cached tokens (``usage.prompt_tokens_details``,
moa only). Answers of ``moa`` (and ``moa-landed``) are compared with ``moa-nocache``'s turn by
turn while their histories are equal: since issue 41 a reused cell is one a fresh prefill
computes bit for bit alike (moa_cpp/speculative/prefix_cache.py), so every answer must be equal.

    python -m bench.serve prompt-cache                       # 4 chats x 6 turns, SmolLM2 + its drafter
    python -m bench.serve prompt-cache -m Qwen.gguf --chats 2
    python -m bench.serve prompt-cache --baseline /tmp/landed        # + the landed code's inexact reuse
    python -m bench.serve prompt-cache --llama-server auto --servers moa moa-nocache llama-server

Writes bench/results/<machine-label>/<--name>.json/.md/.png.
"""
from __future__ import annotations

import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import BENCH_DIR, EVAL_DIR, base_parser, eval_prompts, md_table, run_info, usable_cores, write_results
from bench.serve.load import LLAMA, Proc, free_port

SERVERS = ["moa", "moa-nocache", LLAMA]
SETS = ["mt_bench", "alpaca", "qa", "gsm8k", "humaneval"]      # "sum": too long for 6 turns in 4096


LANDED = "moa-landed"
LLAMA_SERVER = "llama-server"
# a server from another checkout: its moa_cpp before this venv's editable install (the editable
# finder goes first on sys.meta_path, so PYTHONPATH alone would not do)
_SHIM = ("import sys\n"
         "sys.meta_path[:] = [f for f in sys.meta_path if 'skbc' not in type(f).__module__]\n"
         "sys.path.insert(0, {src!r})\n")


def start(name: str, model: str, drafter, args) -> Proc:
    port = free_port()
    threads = args.threads or usable_cores()
    if name == LLAMA_SERVER:
        cmd = [args.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", str(args.n_ctx),
               "-t", str(threads), "-fa", "on", "-np", "1"]
    elif name == LLAMA:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1", "--port", str(port),
               "--n_ctx", str(args.n_ctx), "--n_threads", str(threads), "--n_threads_batch", str(threads),
               "--verbose", "false", "--flash_attn", "true"]
    else:
        cmd = [sys.executable, "-m", "moa_cpp.cli.main", "serve", "--port", str(port), "-m", model, "--n-ctx",
               str(args.n_ctx), "-t", str(threads), *(["-d", drafter] if drafter else [])]
    env = cwd = None
    if name == LANDED:
        shim = Path(tempfile.mkdtemp(prefix="moa-landed-"))
        (shim / "sitecustomize.py").write_text(_SHIM.format(src=str(Path(args.baseline).resolve())))
        env, cwd = {"PYTHONPATH": str(shim)}, str(Path(args.baseline).resolve())
    t0 = time.perf_counter()
    p = Proc(name, cmd, port, env=env, cwd=cwd)
    print(f"{name}: up in {time.perf_counter() - t0:.1f} s", flush=True)
    return p


def stream_chat(proc: Proc, messages: list, max_tokens: int) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if proc.name == LLAMA:
        body["repeat_penalty"] = 1.0
    if proc.name == "moa-nocache":
        body["cache_prompt"] = False
    c = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=600)
    t0 = time.perf_counter()
    ttft, text, usage = None, [], {}
    try:
        c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"{proc.name}: HTTP {r.status}: {r.read()[:300]!r}")
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for ch in chunk.get("choices", []):
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(piece)
    finally:
        c.close()
    return {"ttft": ttft if ttft is not None else time.perf_counter() - t0, "total": time.perf_counter() - t0,
            "text": "".join(text), "prompt_tokens": usage.get("prompt_tokens"),
            "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


def summarize(recs: list, turns: int, servers: list) -> list:
    rows = []
    for t in range(turns):
        by = [r for r in recs if r["turn"] == t]
        rows.append([t + 1, round(statistics.mean(r["prompt_tokens"] or 0 for r in by))] +
                    [round(1000 * statistics.median(r["ttft"] for r in by if r["server"] == s), 1) for s in servers])
    return rows


def plot(plt, rows: list, servers: list):
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, s in enumerate(servers):
        ax.plot([r[0] for r in rows], [r[2 + i] for r in rows], marker="o", label=s)
    ax.set_xlabel("turn")
    ax.set_ylabel("median time to first token (ms)")
    ax.set_title("time to first token over a chat")
    ax.legend()
    return fig


def compare(recs: list, server: str, args) -> tuple:
    """(answers equal to moa-nocache's, chats that parted): turn by turn while the histories are
    equal (after a difference the two conversations differ)."""
    same = diverged = 0
    for c in range(args.chats):
        for t in range(args.turns):
            a = next(r for r in recs if r["server"] == server and r["chat"] == c and r["turn"] == t)
            b = next(r for r in recs if r["server"] == "moa-nocache" and r["chat"] == c and r["turn"] == t)
            if a["text"] != b["text"]:
                diverged += 1
                break
            same += 1
    return same, diverged


def main(argv=None) -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--chats", type=int, default=4)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--name", default="serve-prompt-cache")
    ap.add_argument("--results-dir", default=None)
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="another checkout of moa_cpp: its server joins the run as moa-landed")
    ap.add_argument("--llama-server", default=None, metavar="BIN",
                    help="llama.cpp's llama-server binary (auto: bash bench/peers/build.sh): joins the run")
    ap.add_argument("--servers", nargs="+", default=None, choices=SERVERS + [LLAMA_SERVER, LANDED],
                    help="a subset (default: moa moa-nocache llama, + llama-server / moa-landed when given)")
    args = ap.parse_args(argv)
    if args.llama_server == "auto":
        import subprocess
        out = subprocess.run(["bash", str(BENCH_DIR / "peers" / "build.sh")],
                             stdout=subprocess.PIPE, text=True, check=True).stdout
        args.llama_server = str(Path(out.strip().splitlines()[-1]) / "llama-server")
    servers = args.servers or (SERVERS + ([LLAMA_SERVER] if args.llama_server else []) + ([LANDED] if args.baseline else []))
    if LLAMA_SERVER in servers and not args.llama_server:
        ap.error("--servers llama-server needs --llama-server BIN")
    if LANDED in servers and not args.baseline:
        ap.error("--servers moa-landed needs --baseline DIR")

    from moa_cpp.models import defaults, registry as models
    model = args.model or str(models.smollm2_path())
    drafter = args.drafter or (defaults.default_drafter() if args.model is None else None)
    prompts = eval_prompts(Path(EVAL_DIR), SETS, -(-args.chats * args.turns // len(SETS)))
    info = run_info(args.threads or usable_cores())
    procs: dict = {}
    recs: list = []
    try:
        for s in servers:
            procs[s] = start(s, model, drafter, args)
        for p in procs.values():                     # warm-up (first decode, calibration)
            stream_chat(p, [{"role": "user", "content": "Hello!"}], 8)
        for c in range(args.chats):
            hist = {s: [] for s in servers}
            for t in range(args.turns):
                q = prompts[(c * args.turns + t) % len(prompts)]
                k = t % len(servers)
                order = servers[k:] + servers[:k]
                for s in order:
                    hist[s].append({"role": "user", "content": q})
                    r = stream_chat(procs[s], hist[s], args.max_tokens)
                    hist[s].append({"role": "assistant", "content": r["text"]})
                    recs.append({"server": s, "chat": c, "turn": t, **r})
                    print(f"chat {c} turn {t + 1} {s}: ttft {1000 * r['ttft']:.0f} ms, prompt {r['prompt_tokens']}, "
                          f"cached {r['cached']}", flush=True)
    finally:
        for p in procs.values():
            p.stop()
    rows = summarize(recs, args.turns, servers)
    # answers equal to moa-nocache's (llama-server's: reported, another engine's numerics)
    equal = {s: compare(recs, s, args) for s in servers if s in ("moa", LANDED, LLAMA_SERVER)} \
        if "moa-nocache" in servers else {}
    same, diverged = equal.get("moa", (None, None))
    table = md_table(["turn", "prompt tokens (mean)"] + [f"TTFT ms {s} (median)" for s in servers], rows)
    tot = {s: statistics.mean(r["ttft"] for r in recs if r["server"] == s) for s in servers}
    summary = (f"\nMean TTFT over all turns: " + ", ".join(f"{s} {1000 * v:.0f} ms" for s, v in tot.items()) +
               "".join(f" ({s} / {LANDED}: {tot[s] / tot[LANDED]:.2f}x)" for s in ["moa"] if LANDED in tot) +
               "".join(f" (moa / {LLAMA_SERVER}: {tot['moa'] / tot[LLAMA_SERVER]:.2f}x)" for _ in [0]
                       if "moa" in tot and LLAMA_SERVER in tot) +
               ".\nAnswers with reuse equal to those without (compared while the histories are equal): " +
               "; ".join(f"{s} {a} equal, {b} chats parted" for s, (a, b) in equal.items()) + ".\n")
    print(table + summary)
    header = (f"{model}, drafter {drafter}; {args.chats} chats x {args.turns} turns, max_tokens {args.max_tokens}, "
              f"greedy, streaming. Servers:\n\n" + "".join(f"- {s}: `{' '.join(p.cmd)}`\n" for s, p in procs.items())
              + "\n")
    write_results(args.name, {"rows": rows, "records": recs, "settings": vars(args), "model": model,
                              "drafter": drafter, "equal": same, "parted": diverged, "run": info},
                  header + table + summary, lambda plt: plot(plt, rows, servers), out_dir=args.results_dir, info=info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
