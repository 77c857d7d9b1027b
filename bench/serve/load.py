#!/usr/bin/env python
"""Server throughput under load: requests/s and generated tokens/s of ``moa-cpp serve`` vs
llama-cpp-python's own OpenAI-compatible server (``python -m llama_cpp.server``, the ``bench``
extra installs its deps) on the same GGUF, at 1, 2 and 4 concurrent clients.

Servers (all started once, loaded and idle; only one is sent requests at a time):

- ``llama`` (llama_cpp.server): ``--n_ctx C --n_threads T --n_threads_batch T`` (T = all usable cores)
  plus ``--llama-args`` (default ``--flash_attn true``, as every llama.cpp row of these
  benchmarks); otherwise its defaults (one Llama, requests served one at a time behind a lock;
  ``logits_all`` true). Requests carry ``repeat_penalty: 1.0`` (its default 1.1 is not greedy);
- ``moa-np1``: ``moa-cpp serve --n-ctx C`` (1 session, all cores, default draft ``auto:8``);
- ``moa-np2``: ``moa-cpp serve --parallel 2`` (2 sessions, cores / 2 threads each);
- ``moa-np1-none``: ``moa-cpp serve --draft none`` (our loop without a drafter);
- ``moa-np<N>[-nocb][-none]``: ``--parallel N``, continuously batched (one context, one decode per
  cycle for all slots) unless ``-nocb`` (a context per session), ``-none``: ``--draft none``.

Clients: N threads posting non-streaming ``/v1/chat/completions`` (one user message: the first
turn of the eval sets' prompts, ``--prompts`` per set, in turn), ``temperature 0``,
``max_tokens``. For each round, each concurrency level, the servers take turns (their order
rotates every round), each getting ``--requests`` requests; one warm-up request per server first.
Client-side: wall time of the block, requests/s, completion tokens/s (``usage.completion_tokens``),
median / p90 latency. Greedy texts are compared per prompt with ``moa-np1-none`` (plain decoding
= ``moa-cpp generate --no-draft``: must all match) and with llama_cpp.server's (reported only: it
reuses the KV cache of the previous prompt's common prefix, so it decodes the rest of a prompt
in a batch of another size, whose logits differ in the last bits; greedy answers then part at
near-ties. The same Llama given a fresh cache matches plain decoding token for token).

    python -m bench.serve load                               # 3 rounds x 12 requests x {1,2,4} clients
    python -m bench.serve load --servers llama moa-np1 --concurrency 1 4 --requests 24

Writes bench/results/<machine-label>/<--name>.json/.md/.png (bench/_common.write_results).
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from typing import Optional
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import (REPO_ROOT, EVAL_DIR, EVAL_SETS, base_parser, eval_prompts, md_table, run_info, usable_cores,
                     write_results)

REPO = REPO_ROOT
SETS = EVAL_SETS
LLAMA = "llama"
PLAIN = "moa-np1-none"
MOA = {"moa-np1": [], "moa-np2": ["--parallel", "2"], "moa-np1-none": ["--draft", "none"]}


def moa_flags(name: str) -> list:
    """Flags of a ``moa-np<N>[-nocb][-none]`` server: N sessions (continuously batched unless
    ``-nocb``: a context each), ``-none``: no drafting."""
    if name in MOA:
        return MOA[name]
    m = re.fullmatch(r"moa-np(\d+)((?:-nocb|-none)*)", name)
    if not m:
        raise SystemExit(f"unknown server {name!r}: llama, moa-np1, moa-np2, moa-np1-none or moa-np<N>[-nocb][-none]")
    flags = ["--parallel", m.group(1)]
    if "-nocb" in m.group(2):
        flags.append("--no-cont-batching")
    if "-none" in m.group(2):
        flags += ["--draft", "none"]
    return flags


class Proc:
    """One server process on 127.0.0.1:``port``, ready once GET /v1/models answers 200; its
    stdout and stderr go to a temp log file (shown if it fails to start, removed by stop())."""

    def __init__(self, name: str, cmd: list, port: int, timeout: float = 300.0, env: Optional[dict] = None,
                 cwd: Optional[str] = None) -> None:
        self.name, self.cmd = name, cmd
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"{name}-", suffix=".log", delete=False)
        e = {k: v for k, v in os.environ.items() if k != "MOA_API_KEY"}
        e.update(env or {})
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, text=True, env=e, cwd=cwd or REPO)
        self.port = port
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                self.fail(f"exited with {self.proc.returncode}")
            try:
                if request(self.port, "GET", "/v1/models", None, 5)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.fail("not ready in time")

    def fail(self, why: str) -> None:
        self.log.seek(0)
        tail = self.log.read()[-3000:]
        self.stop()
        raise RuntimeError(f"{self.name} ({shlex.join(self.cmd)}): {why}\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, method: str, path: str, body, timeout: float = 600.0) -> tuple:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=None if body is None else json.dumps(body).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data
    finally:
        c.close()


def start_servers(out: dict, names: list, model: str, drafter, args) -> None:
    """Start ``names`` one after the other into ``out`` (filled as they come up: the caller stops them)."""
    threads = args.threads or usable_cores()
    for n in names:
        port = free_port()
        if n == LLAMA:
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1",
                   "--port", str(port), "--n_ctx", str(args.n_ctx), "--n_threads", str(threads),
                   "--n_threads_batch", str(threads), "--verbose", "false", *shlex.split(args.llama_args)]
        else:
            cmd = [sys.executable, "-m", "moa_cpp.cli.main", "serve", "--port", str(port), "-m", model, "--n-ctx",
                   str(args.n_ctx), *(["-d", drafter] if drafter else []), *moa_flags(n)]
        t0 = time.perf_counter()
        out[n] = Proc(n, cmd, port)
        print(f"{n}: up in {time.perf_counter() - t0:.1f} s on port {out[n].port}: {shlex.join(cmd)}", flush=True)


def one_request(proc: Proc, prompt_idx: int, prompt: str, max_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0.0}
    if proc.name == LLAMA:
        body["repeat_penalty"] = 1.0
    t0 = time.perf_counter()
    try:
        status, resp = request(proc.port, "POST", "/v1/chat/completions", body)
    except OSError as e:
        status, resp = 0, str(e)
    rec = {"prompt": prompt_idx, "status": status, "latency": time.perf_counter() - t0}
    if status == 200:
        rec.update(text=resp["choices"][0]["message"]["content"], tokens=resp["usage"]["completion_tokens"],
                   tau=(resp.get("moa") or {}).get("tau"))
    else:
        rec["error"] = str(resp)[:300]
    return rec


def run_block(proc: Proc, clients: int, prompts: list, start: int, n: int, max_tokens: int) -> dict:
    """``n`` requests from ``clients`` threads; prompts ``start``, ``start+1``... (cyclic)."""
    idx = [(start + i) % len(prompts) for i in range(n)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as ex:
        recs = list(ex.map(lambda i: one_request(proc, i, prompts[i], max_tokens), idx))
    return {"wall": time.perf_counter() - t0, "requests": recs}


def summarize(blocks: list) -> dict:
    recs = [r for b in blocks for r in b["requests"]]
    ok = [r for r in recs if r["status"] == 200]
    wall = sum(b["wall"] for b in blocks)
    lat = sorted(r["latency"] for r in ok) or [0.0]
    taus = [r["tau"] for r in ok if r.get("tau") is not None]
    toks = sum(r["tokens"] for r in ok)
    return {"requests": len(recs), "errors": len(recs) - len(ok), "wall": wall, "req_per_s": len(ok) / wall,
            "tok_per_s": toks / wall, "completion_tokens": toks,
            "tok_per_s_rounds": [sum(r.get("tokens", 0) for r in b["requests"]) / b["wall"] for b in blocks],
            "latency_median": statistics.median(lat), "latency_p90": lat[min(len(lat) - 1, int(0.9 * len(lat)))],
            "tau_mean": statistics.fmean(taus) if taus else None}


def text_matches(blocks: dict, server: str, ref_server: str) -> tuple:
    """(responses of ``server`` whose text equals ``ref_server``'s first answer to that prompt,
    compared)."""
    ref: dict = {}
    for bl in blocks.get(ref_server, {}).values():
        for b in bl:
            for r in b["requests"]:
                if "text" in r:
                    ref.setdefault(r["prompt"], r["text"])
    mine = [r for bl in blocks[server].values() for b in bl for r in b["requests"] if "text" in r]
    cmp = [r for r in mine if r["prompt"] in ref]
    return sum(r["text"] == ref[r["prompt"]] for r in cmp), len(cmp)


def self_matches(blocks: dict, server: str, clients: int) -> tuple:
    """(responses of ``server`` at ``clients`` whose text equals that server's first answer to the
    same prompt at its lowest concurrency, compared): answers that do not depend on other users."""
    levels = sorted(blocks.get(server, {}), key=int)
    if not levels:
        return 0, 0
    ref: dict = {}
    for b in blocks[server][levels[0]]:
        for r in b["requests"]:
            if "text" in r:
                ref.setdefault(r["prompt"], r["text"])
    mine = [r for b in blocks[server].get(clients, []) for r in b["requests"] if "text" in r and r["prompt"] in ref]
    return sum(r["text"] == ref[r["prompt"]] for r in mine), len(mine)


def results_table(rows: list) -> str:
    return md_table(["server", "clients", "req/s", "tok/s", "tok/s per round", "latency median s", "p90 s",
                     "errors", "tau", "texts = same server, fewest clients", "texts = moa --draft none",
                     "texts = llama_cpp.server"],
                    [[r["server"], r["clients"], f"{r['req_per_s']:.2f}", f"{r['tok_per_s']:.1f}",
                      " ".join(f"{x:.0f}" for x in r["tok_per_s_rounds"]), f"{r['latency_median']:.2f}",
                      f"{r['latency_p90']:.2f}", r["errors"], "" if r["tau_mean"] is None else f"{r['tau_mean']:.2f}",
                      "{}/{}".format(*r.get("self_match", ("", ""))),
                      "" if r["plain_match"] is None else f"{r['plain_match']}/{r['plain_compared']}",
                      "" if r["text_match"] is None else f"{r['text_match']}/{r['text_compared']}"] for r in rows])


def plot(plt, rows: list, servers: list):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for key, ax, label in (("tok_per_s", axes[0], "completion tokens/s"), ("req_per_s", axes[1], "requests/s")):
        for s in servers:
            pts = sorted((r["clients"], r[key]) for r in rows if r["server"] == s)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.set_xticks(sorted({r["clients"] for r in rows}))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("moa-cpp serve vs llama_cpp.server (client side, non-streaming chat)")
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--servers", nargs="+", default=[LLAMA, *MOA],
                    help="llama, moa-np1, moa-np2, moa-np1-none, or moa-np<N>[-nocb][-none] (N sessions, batched "
                         "unless -nocb, -none: no drafting)")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--requests", type=int, default=12, help="requests per server, level and round (default 12)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=2048, help="context size of every server (per session)")
    ap.add_argument("--threads", type=int, default=None, help="llama_cpp.server's --n_threads(_batch) "
                    "(default: all cores; moa-cpp serve keeps its own: cores / --parallel)")
    ap.add_argument("--llama-args", default="--flash_attn true", help="extra llama_cpp.server flags")
    ap.add_argument("--sets", nargs="+", default=SETS, choices=SETS)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per set (default 4)")
    ap.add_argument("--data", default=str(EVAL_DIR))
    ap.add_argument("--name", default="serve-load")
    ap.add_argument("--results-dir", default=None, help="default bench/results/<machine-label>/")
    args = ap.parse_args(argv)

    from moa_cpp.models import defaults, registry as models
    model = args.model or str(models.smollm2_path())
    drafter = args.drafter or (defaults.default_drafter() if args.model is None else None)
    prompts = eval_prompts(Path(args.data), args.sets, args.prompts)
    info = run_info(args.threads or usable_cores())
    if info["loadavg"] and info["loadavg"][0] > 0.5 * usable_cores():
        print(f"warning: load average {info['loadavg'][0]:.1f} on {usable_cores()} cores: llama.cpp slows down many "
              "times over when other processes compete for the cores; these numbers will not mean much", flush=True)
    procs: dict = {}
    blocks: dict = {s: {c: [] for c in args.concurrency} for s in args.servers}
    try:
        start_servers(procs, args.servers, model, drafter, args)
        for p in procs.values():                                        # warm-up
            one_request(p, 0, prompts[0], args.max_tokens)
        start = 0
        for rnd in range(args.rounds):
            order = args.servers[rnd % len(args.servers):] + args.servers[:rnd % len(args.servers)]
            for c in args.concurrency:
                for s in order:
                    b = run_block(procs[s], c, prompts, start, args.requests, args.max_tokens)
                    blocks[s][c].append(b)
                    toks = sum(r.get("tokens", 0) for r in b["requests"])
                    print(f"round {rnd} clients {c} {s}: {b['wall']:.2f} s, {toks / b['wall']:.1f} tok/s", flush=True)
            start += args.requests          # every level of a round gets the same prompts
    finally:
        for p in procs.values():
            p.stop()

    rows = []
    for s in args.servers:
        m, n = text_matches(blocks, s, LLAMA) if s != LLAMA and LLAMA in blocks else (None, None)
        pm, pn = text_matches(blocks, s, PLAIN) if PLAIN in blocks else (None, None)
        for c in args.concurrency:
            rows.append({"server": s, "clients": c, **summarize(blocks[s][c]), "text_match": m, "text_compared": n,
                         "plain_match": pm, "plain_compared": pn, "self_match": self_matches(blocks, s, c)})
    table = results_table(rows)
    print(table)
    header = (f"{model}, drafter {drafter}; {args.rounds} rounds x {args.requests} requests per server and level, "
              f"max_tokens {args.max_tokens}, {len(prompts)} prompts. Servers:\n\n" +
              "".join(f"- {s}: `{shlex.join(p.cmd)}`\n" for s, p in procs.items()) + "\n")
    doc = {"rows": rows, "commands": {s: p.cmd for s, p in procs.items()}, "blocks": blocks,
           "prompts": prompts, "settings": vars(args), "model": model, "drafter": drafter, "run": info}
    write_results(args.name, doc, header + table, lambda plt: plot(plt, rows, args.servers),
                  out_dir=args.results_dir, info=info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
