#!/usr/bin/env python
"""Whole-process cost of one-shot generation: ``moa-cpp generate`` vs a llama-cpp-python script
doing the same, each a fresh process timed from spawn to exit (interpreter start, imports, model
load, chat template, prompt, 128 tokens, exit) with a warm cache (the model file in the OS page
cache, T(k) and the exact batch size measured by an earlier run), as a user runs them one after
another (issue 23 part 5; aim: ratio >= 0.95).

Methods (each a command line; greedy, chat template, same prompt and token limit):

- ``llama``: ``python -c`` a llama-cpp-python script: ``Llama(model, n_ctx=4096, n_threads=T,
  flash_attn=True, verbose=False).create_chat_completion(messages, max_tokens=N, temperature=0)``,
  printing the text;
- ``moa``: ``moa-cpp generate --chat -p PROMPT -n N`` (the embedded default target and drafter,
  the cost-aware default);
- ``moa-ngram``: ``moa-cpp generate --chat -m MODEL ...`` (no drafter: n-gram drafts, cost-aware);
- ``moa-plain``: ``moa-cpp generate --chat --no-draft ...``;
- ``moa-stop36`` (not in the default set): ``moa`` plus the two start-up costs removed after stop
  36, paid on purpose in the same process: parsing moa.h with cffi's parser (now cached) and
  gguf-py's import + reader on the drafter (its acceptance prior now comes from the native
  loader). Run beside ``moa`` it measures what those removals saved, on one machine, in one run.

The methods alternate (order flipped every repetition) after one discarded warm-up run each
(which also fills MOA_CPP_CACHE, here a temp dir, the way a user's first run does); ``--calibrate``
times that first run's calibration apart (the fresh-cache case).

    python -m bench.process startup                       # SmolLM2 Q4_1, 128 tokens, 5 repetitions
    python -m bench.process startup --reps 1 --max-tokens 16 --results-dir /tmp/smoke

Writes bench/results/<machine-label>/<--name>.json/.md/.png.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO_ROOT, md_table, run_info, usable_cores, write_results

REPO = REPO_ROOT
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
LLAMA_SCRIPT = """
import sys
from llama_cpp import Llama
path, prompt, n, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=path, n_ctx=4096, n_threads=threads, n_threads_batch=threads, flash_attn=True, verbose=False)
out = llm.create_chat_completion(messages=[{"role": "user", "content": prompt}], max_tokens=n, temperature=0.0)
print(out["choices"][0]["message"]["content"])
"""


STOP36_SCRIPT = """
import sys
import gguf
import moa_cpp.drafter.native as n
from moa_cpp.models.defaults import DEFAULT_DRAFTER
n.FFI().cdef(n._cdef_source(n._header_path().read_text()))
gguf.GGUFReader(str(DEFAULT_DRAFTER)).fields.get("moa.eval.acceptance")
from moa_cpp.cli.main import main
sys.argv = ["moa-cpp"] + sys.argv[1:]
sys.exit(main())
"""


def commands(model: str, prompt: str, n: int, threads: int) -> dict:
    py = sys.executable
    args = ["generate", "--chat", "-p", prompt, "-n", str(n), "-t", str(threads)]
    moa = [py, "-m", "moa_cpp.cli.main"] + args
    moa_bin = Path(py).with_name("moa-cpp")
    if moa_bin.is_file():                        # the console script a user runs
        moa = [str(moa_bin)] + args
    return {"llama": [py, "-c", LLAMA_SCRIPT, model, prompt, str(n), str(threads)],
            "moa": moa,
            "moa-ngram": moa + ["-m", model],
            "moa-plain": moa + ["--no-draft"],
            "moa-stop36": [py, "-c", STOP36_SCRIPT] + args}


def run(cmd: list, env: dict, timeout: int) -> tuple[float, str, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[:4]}... failed (rc {p.returncode}):\n{p.stdout[-1500:]}\n{p.stderr[-3000:]}")
    return wall, p.stdout.strip(), p.stderr


def bytecode_state() -> dict:
    """Whether moa_cpp's sources have up-to-date .pyc files, as a wheel install has (pip compiles
    them; llama-cpp-python's are). An editable install under PYTHONDONTWRITEBYTECODE has none
    unless compiled (scripts/setup.sh runs compileall), and then every process recompiles
    moa_cpp: ~40 ms that a user's install does not pay."""
    import importlib.util
    import moa_cpp
    srcs = list(Path(moa_cpp.__file__).parent.rglob("*.py"))
    fresh = sum(1 for f in srcs if (c := Path(importlib.util.cache_from_source(str(f)))).is_file()
                and c.stat().st_mtime >= f.stat().st_mtime)
    return {"modules": len(srcs), "compiled": fresh, "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="target GGUF (default: the embedded default, SmolLM2 Q4_1)")
    ap.add_argument("--methods", nargs="+", default=["llama", "moa", "moa-ngram", "moa-plain"],
                    choices=["llama", "moa", "moa-ngram", "moa-plain", "moa-stop36"])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="default: all usable cores")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--name", default="process-startup")
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)
    from moa_cpp.models import defaults
    model = args.model or str(defaults.default_target())
    threads = args.threads or usable_cores()
    cmds = {k: v for k, v in commands(model, args.prompt, args.max_tokens, threads).items() if k in args.methods}
    cache = tempfile.TemporaryDirectory(prefix="moa-startup-cache-")
    env = dict(os.environ, MOA_CPP_CACHE=cache.name)
    bytecode = bytecode_state()
    if bytecode["compiled"] < bytecode["modules"] and bytecode["PYTHONDONTWRITEBYTECODE"]:
        print(f"note: {bytecode['modules'] - bytecode['compiled']} moa_cpp modules have no up-to-date .pyc and "
              "PYTHONDONTWRITEBYTECODE is set: each process recompiles them (python -m compileall -q moa_cpp)",
              flush=True)
    t_start = time.perf_counter()
    first = {}
    for k, cmd in cmds.items():                  # warm-up: page cache, and the first run's calibration
        wall, out, err = run(cmd, env, args.timeout)
        first[k] = wall
        print(f"warm-up {k}: {wall:.2f} s" + (" (calibrated after its output)" if "measuring" in err else ""), flush=True)
    walls: dict = {k: [] for k in cmds}
    texts: dict = {}
    for rep in range(args.reps):
        order = list(cmds) if rep % 2 == 0 else list(cmds)[::-1]
        for k in order:
            wall, out, err = run(cmds[k], env, args.timeout)
            walls[k].append(wall)
            texts.setdefault(k, out)
            print(f"rep {rep} {k:<9} {wall:.2f} s", flush=True)
    elapsed = time.perf_counter() - t_start
    base = walls.get("llama")
    rows = []
    for k, ws in walls.items():
        row = {"method": k, "command": " ".join(c if " " not in c and "\n" not in c else repr(c[:40] + "...")
                                                 for c in cmds[k][1 if k in ("llama", "moa-stop36") else 0:]),
               "wall_median_s": statistics.median(ws), "wall_min_s": min(ws), "wall_max_s": max(ws),
               "first_run_s": first[k], "same_text_as_llama": texts.get(k) == texts.get("llama") if base else None}
        if base:
            row["ratio_vs_llama"] = statistics.median(base) / statistics.median(ws)
            row["ratio_paired_median"] = statistics.median(b / w for b, w in zip(base, ws))
        rows.append(row)
    hdr = ["method", "process s (median, min-max)", "x llama-cpp-python (time ratio)", "paired", "first run s",
           "same text"]
    table = [[r["method"], f"{r['wall_median_s']:.2f} ({r['wall_min_s']:.2f}-{r['wall_max_s']:.2f})",
              f"**{r['ratio_vs_llama']:.2f}**" if "ratio_vs_llama" in r else "",
              f"{r['ratio_paired_median']:.2f}" if "ratio_paired_median" in r else "", f"{r['first_run_s']:.2f}",
              "" if r["same_text_as_llama"] is None else ("yes" if r["same_text_as_llama"] else "no")]
             for r in rows]
    md = "\n".join([
        f"Whole-process time of one-shot generation, {Path(model).name}, {args.max_tokens} tokens, greedy, chat "
        f"template, {threads} threads, {args.reps} repetitions (alternating) after a warm-up run each, "
        f"{elapsed:.0f} s in all. Ratio = llama-cpp-python's median process time / this method's (> 1: faster). "
        "`first run s`: the warm-up run, with an empty MOA_CPP_CACHE (moa-cpp measures T(k) and the exact "
        "batch size after printing its output, once per model). moa_cpp bytecode: "
        f"{bytecode['compiled']}/{bytecode['modules']} modules with an up-to-date .pyc "
        f"(PYTHONDONTWRITEBYTECODE={bytecode['PYTHONDONTWRITEBYTECODE'] or 'unset'}).", "",
        md_table(hdr, table), "", "Commands:", ""] + [f"- `{k}`: `{' '.join(cmds[k][:2]) if k in ('llama', 'moa-stop36') else ' '.join(cmds[k])}`"
                                                      for k in cmds])
    print("\n" + md, flush=True)
    info = run_info(threads)
    doc = {"run": info, "model": model, "prompt": args.prompt, "max_tokens": args.max_tokens, "reps": args.reps,
           "elapsed_s": elapsed, "bytecode": bytecode, "rows": rows, "walls": walls, "texts": texts}
    write_results(args.name, doc, md, lambda plt: plot(plt, rows), out_dir=args.results_dir, info=info)
    cache.cleanup()
    return 0


def plot(plt, rows: list):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([r["method"] for r in rows], [r["wall_median_s"] for r in rows], color="tab:blue")
    for i, r in enumerate(rows):
        if "ratio_vs_llama" in r:
            ax.text(i, r["wall_median_s"], f"{r['ratio_vs_llama']:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("process seconds (median)")
    ax.set_title("One-shot generation, whole process (warm cache)")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())
