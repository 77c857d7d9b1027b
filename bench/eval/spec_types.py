#!/usr/bin/env python
"""Never slower (issue 41 part 4): the whole ``moa-cpp generate`` process under the cost-aware
default (``auto:8``) for every ``--spec-type`` vs ``--no-draft``, on everyday chat prompts (the
paper's evaluation sets, ../shared/data/eval; benchmark only: never tune on them).

Every (prompt, method) is one fresh process, timed from spawn to exit (interpreter, imports,
model and drafter loads, chat template, prompt, generation, exit), with ``--json`` for what the
policy decided (decision, tau, drafts and rows, the per-step time split). Methods run back to back
per prompt, their order rotating from prompt to prompt, after one warm-up process each (page
cache; the first run on a model measures T(k) and the exact batch size after its output, cached
in MOA_CPP_CACHE: ``--fresh-cache`` starts from an empty one, measured in the warm-up).

Methods (each only where its inputs exist):

- ``no-draft``: ``moa-cpp generate -m TARGET --no-draft`` (the baseline, = 1.00);
- ``moa``: ``-m TARGET -d DRAFTER --spec-type moa`` (needs an MoA drafter);
- ``draft``: ``-m TARGET --draft-model GGUF --spec-type draft`` (needs ``--draft-model``);
- ``ngram``: ``-m TARGET --spec-type ngram`` (what ``-m`` alone runs);
- ``moa,ngram`` and ``draft,ngram``: the hybrids.

Reported per method: whole-process tokens/s and its ratio to ``no-draft`` (sum of process times over
the same prompts; per set and all), the decode ratio (prefill + generation inside the process),
the worst per-prompt ratio, tau, drafts / draft rows / K/V capture time, the time split and the
decisions, and how many outputs are token-identical to ``no-draft``'s (greedy: all should be).
The aim: every method >= 0.97x of ``no-draft`` as a whole process.

    python -m bench.eval spec-types                                   # SmolLM2 Q4_1 + shipped drafter
    python -m bench.eval spec-types --prompts 3 --max-tokens 64 --name spec-types-smoke
    python -m bench.eval spec-types -m qwen-1.5b-f16 --draft-model qwen-0.5b --name spec-types-qwen15-f16

``-m``/``--draft-model`` also take the names ``smollm2`` (the embedded default target: as its own
draft model it costs a target row per draft, so ``draft`` can never pay on it, which the policy
must see), ``qwen-1.5b``, ``qwen-1.5b-f16`` (the Q4_K_M model wheel requantized to F16 once into
the moa_cpp cache, the file earlier runs used) and ``qwen-0.5b``.

Writes bench/results/<machine-label>/<--name>.json/.md (bench/_common.write_results).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (EVAL_DIR, EVAL_SETS, base_parser, eval_prompts, md_table, run_info, usable_cores,
                     write_results)

SETS = EVAL_SETS
SPEC_TYPES = ["moa", "draft", "ngram", "moa,ngram", "draft,ngram"]
BASE = "no-draft"
SPLIT = ("t_prefill", "t_target", "t_drafter", "t_capture", "t_overhead")


def model_path(name: str) -> str:
    """A GGUF path, or one of the named models (made on first use, cached)."""
    from moa_cpp.models import registry as models
    if name == "smollm2":
        return str(models.smollm2_path())
    if name == "proxy":                       # the ~1 ms GPU-speed proxy (bench/proxy.py)
        from bench.proxy import proxy_target
        return str(proxy_target())
    if name in ("qwen-1.5b", "qwen-0.5b"):
        return str(models.qwen25_coder_15b_path() if name == "qwen-1.5b" else models.qwen25_coder_05b_path())
    if name == "qwen-1.5b-f16":
        src = models.qwen25_coder_15b_path()
        out = models.cache_dir() / f"{src.stem}.f16.gguf"          # the name earlier runs used
        if not out.is_file():
            t0 = time.perf_counter()
            models.requantize(src, out, "f16")
            print(f"requantized {src.name} -> {out.name} in {time.perf_counter() - t0:.0f} s", flush=True)
        return str(out)
    return name


def commands(model: str, drafter, draft_model, spec_types: list, n: int, threads: int, n_ctx: int) -> dict:
    py = Path(sys.executable)
    exe = [str(py.with_name("moa-cpp"))] if py.with_name("moa-cpp").is_file() else [str(py), "-m", "moa_cpp.cli.main"]
    base = exe + ["generate", "--json", "-m", model, "-n", str(n), "-t", str(threads), "-c", str(n_ctx)]
    out = {BASE: base + ["--no-draft"]}
    for st in spec_types:
        parts = st.split(",")
        if "moa" in parts and not drafter or "draft" in parts and not draft_model:
            continue
        cmd = base + ["--spec-type", st]
        if "moa" in parts:
            cmd += ["-d", drafter]
        if "draft" in parts:
            cmd += ["--draft-model", draft_model]
        out[st] = cmd
    return out


def run(cmd: list, prompt: str, env: dict, timeout: int) -> tuple:
    t0 = time.perf_counter()
    p = subprocess.run(cmd + ["--chat", "-p", prompt], env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[-6:])} failed (rc {p.returncode}):\n{p.stdout[-1000:]}\n{p.stderr[-3000:]}")
    return wall, json.loads(p.stdout.strip().splitlines()[-1]), "measuring" in p.stderr


def record(wall: float, r: dict) -> dict:
    st = r["stats"]
    return {"wall": wall, "n": r["n_tokens"], "tokens": r["tokens"], "tau": r["tau"],
            "inner": st["t_prefill"] + st["t_total"], "target_calls": st["target_calls"],
            "drafted": st["drafted"], "accepted": st["accepted"], "draft_rows": st["draft_rows"],
            "auto_choices": st["auto_choices"], "by_source": st["by_source"], "decision": st["decision"],
            **{k: st[k] for k in SPLIT}}


def summarize(records: list, names: list, sets: list) -> dict:
    out = {}
    for m in names:
        row: dict = {}
        for s in sets + ["all"]:
            rs = [r for r in records if s in ("all", r["set"])]
            if not rs:
                continue
            wall, base = sum(r[m]["wall"] for r in rs), sum(r[BASE]["wall"] for r in rs)
            inner, base_inner = sum(r[m]["inner"] for r in rs), sum(r[BASE]["inner"] for r in rs)
            calls = sum(r[m]["target_calls"] for r in rs)
            row[s] = {"n": len(rs), "tok_s": sum(r[m]["n"] for r in rs) / wall, "vs_no_draft": base / wall,
                      "decode_vs_no_draft": base_inner / inner,
                      "worst": min(r[BASE]["wall"] / r[m]["wall"] for r in rs),
                      "median": statistics.median(r[BASE]["wall"] / r[m]["wall"] for r in rs),
                      "tau": (calls + sum(r[m]["accepted"] for r in rs)) / calls if calls else 0.0,
                      "same": sum(r[m]["tokens"] == r[BASE]["tokens"] for r in rs)}
        rs = records
        row["drafted"] = sum(r[m]["drafted"] for r in rs)
        row["accepted"] = sum(r[m]["accepted"] for r in rs)
        row["draft_rows"] = sum(r[m]["draft_rows"] for r in rs)
        row["split"] = {k: sum(r[m][k] for r in rs) for k in SPLIT}
        choices: dict = {}
        for r in rs:
            for k, v in r[m]["auto_choices"].items():
                choices[int(k)] = choices.get(int(k), 0) + v
        row["auto_choices"] = dict(sorted(choices.items()))
        src: dict = {}
        for r in rs:
            for k, v in r[m]["by_source"].items():
                d = src.setdefault(k, {"proposed": 0, "accepted": 0})
                d["proposed"] += v["proposed"]
                d["accepted"] += v["accepted"]
        row["by_source"] = src
        decisions: dict = {}
        for r in rs:
            key = r[m]["decision"].split(": ")[0] if m == BASE else r[m]["decision"]
            decisions[key] = decisions.get(key, 0) + 1
        row["decisions"] = decisions
        out[m] = row
    return out


def markdown(summary: dict, names: list, sets: list, model: str, args, elapsed: float) -> str:
    present = [s for s in sets if s in summary[BASE]]
    hdr = ["method"] + present + ["all: tok/s (process)", "x no-draft (process)", "median prompt", "worst prompt",
                                  "x no-draft (decode)",
                                  "tau", "= no-draft"]
    rows = []
    for m in names:
        r, a = summary[m], summary[m]["all"]
        rows.append([m] + [f"{r[s]['vs_no_draft']:.2f}" for s in present] + [
            f"{a['tok_s']:.1f}", f"**{a['vs_no_draft']:.3f}**", f"{a['median']:.3f}", f"{a['worst']:.2f}", f"{a['decode_vs_no_draft']:.3f}",
            f"{a['tau']:.2f}", f"{a['same']}/{a['n']}"])
    split = [[m] + [f"{summary[m]['split'][k]:.2f}" for k in SPLIT] +
             [str(summary[m]["drafted"]), str(summary[m]["accepted"]), str(summary[m]["draft_rows"]),
              str(summary[m]["auto_choices"] or ""),
              ", ".join(f"{k} {v['accepted']}/{v['proposed']}" for k, v in summary[m]["by_source"].items())]
             for m in names]
    out = [f"Target `{Path(model).name}`, drafter `{Path(args.drafter).name if args.drafter else '-'}`, draft model "
           f"`{Path(args.draft_model).name if args.draft_model else '-'}`; {args.prompts} prompts per set x "
           f"{len(present)} sets, max {args.max_tokens} new tokens, greedy, chat template, {args.threads} threads; "
           f"{elapsed:.0f} s.", "",
           "Per set and `x no-draft (process)`: `--no-draft`'s process time / this method's, summed over the same "
           "prompts (> 1: faster; aim >= 0.97). `median prompt` / `worst prompt`: the median / lowest per-prompt "
           "ratio (the median shrugs off a process slowed by a neighbour on a shared machine). `decode`: the same "
           "ratio on the time inside the process (prefill + generation). `= no-draft`: token-identical outputs.", "",
           md_table(hdr, rows), "",
           "Seconds in all (from --json), drafts, rows, the cost-aware choices (chain length: cycles) and drafts "
           "per source (accepted/proposed):", "",
           md_table(["method", "prefill", "target", "drafter", "capture", "python", "drafted", "accepted", "rows",
                     "auto choices", "by source"], split), "",
           "Decisions (stats.decision: prompts):", ""]
    for m in names:
        out += [f"- {m}: " + " / ".join(f"{d} ({c})" for d, c in summary[m]["decisions"].items())]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--draft-model", default=None, metavar="GGUF", help="a small LLM with the target's tokenizer "
                    "(spec types draft, draft,ngram), or qwen-0.5b")
    ap.add_argument("--spec-types", nargs="+", default=SPEC_TYPES, help=f"default: {' '.join(SPEC_TYPES)} "
                    "(each where its models are given)")
    ap.add_argument("--sets", nargs="+", default=SETS, choices=SETS)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per set (default 4)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None, help="default: all usable cores")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per process")
    ap.add_argument("--fresh-cache", action="store_true", help="an empty MOA_CPP_CACHE (T(k) measured in the warm-up)")
    ap.add_argument("--data", default=str(EVAL_DIR))
    ap.add_argument("--name", default="eval-spec-types")
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)
    from moa_cpp.models import defaults
    args.threads = args.threads or usable_cores()
    model = model_path(args.model) if args.model else str(defaults.default_target())
    if args.drafter is None and args.model is None:
        args.drafter = str(defaults.default_drafter())
    if args.draft_model:
        args.draft_model = model_path(args.draft_model)
    cmds = commands(model, args.drafter, args.draft_model, args.spec_types, args.max_tokens, args.threads, args.n_ctx)
    names = list(cmds)
    env = dict(os.environ)
    if args.fresh_cache:
        env["MOA_CPP_CACHE"] = tempfile.mkdtemp(prefix="moa-cache-")
    print(f"target {model}\ndrafter {args.drafter}\ndraft model {args.draft_model}\nmethods: {', '.join(names)}"
          + (f"\nMOA_CPP_CACHE={env['MOA_CPP_CACHE']} (fresh)" if args.fresh_cache else ""), flush=True)
    t_w = time.perf_counter()
    warm = "Hello! Who are you?"
    for m in names:                        # page cache; a first run calibrates after its output
        wall, _, calibrated = run(cmds[m], warm, env, args.timeout)
        print(f"warm-up {m}: {wall:.2f} s" + (" (measured T(k) after its output)" if calibrated else ""), flush=True)
        if calibrated:
            wall, _, _ = run(cmds[m], warm, env, args.timeout)
            print(f"warm-up {m} again: {wall:.2f} s", flush=True)
    print(f"warm-up {time.perf_counter() - t_w:.0f} s", flush=True)
    records = []
    t0 = time.perf_counter()
    gi = 0
    for s in args.sets:
        for qi, prompt in enumerate(eval_prompts(Path(args.data), [s], args.prompts)):
            order = names[gi % len(names):] + names[: gi % len(names)]
            gi += 1
            rec = {"set": s, "q": qi, "order": order}
            for m in order:
                wall, r, _ = run(cmds[m], prompt, env, args.timeout)
                rec[m] = record(wall, r)
            records.append(rec)
            b = rec[BASE]
            print(f"{s}[{qi}] {b['n']} tok | " + " | ".join(
                f"{m} {rec[m]['wall']:.2f} s {b['wall'] / rec[m]['wall']:.2f}x tau {rec[m]['tau']:.2f}"
                + ("" if rec[m]["tokens"] == b["tokens"] else " DIFF") for m in names), flush=True)
    elapsed = time.perf_counter() - t0
    summary = summarize(records, names, args.sets)
    md = markdown(summary, names, args.sets, model, args, elapsed)
    print("\n" + md, flush=True)
    info = run_info(args.threads)
    doc = {"run": info, "model": model, "drafter": args.drafter, "draft_model": args.draft_model,
           "max_tokens": args.max_tokens, "prompts_per_set": args.prompts, "sets": args.sets, "elapsed_s": elapsed,
           "commands": cmds, "methods": names, "summary": summary, "records": records}
    write_results(args.name, doc, md, out_dir=args.results_dir, info=info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
