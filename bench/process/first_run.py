#!/usr/bin/env python
"""First-generation speed in a fresh process: what a user sees the first time they run
``moa-cpp generate`` (no cached T(k)) vs a fresh process running llama-cpp-python's own greedy
generation of the same prompt.

Every measurement is one child process (this script with ``--child``), started fresh:

- ``llama``: ``llama_cpp.Llama(model, n_ctx, n_threads, n_threads_batch, flash_attn=True)``, then
  ``Llama.generate`` of the chat-templated prompt ids (computed once by the parent with the
  target's own chat template; temperature 0, stop at EOG or max tokens);
- ``auto``: ``moa-cpp generate``'s default: ``SpeculativeGenerator.from_paths(target, drafter,
  draft="auto:8")`` then one ``generate(prompt, chat=True, max_tokens=N)``, with
  ``MOA_CPP_CACHE`` pointing at a new empty temp dir (no cached T(k) / exact batch size). The
  cost-aware policy then decodes plainly and the CLI measures T(k) *after* printing its output
  (``gen.calibrate()``): that measurement is timed apart (``calibrate after``, once per model);
  ``setup`` = generate time - prefill - decode (templating, policy start);
- ``auto2`` (``--second-run``): the same in a fresh process whose cache an earlier run filled
  (what every later ``moa-cpp generate`` sees);
- ``plain``: ``moa-cpp generate --no-draft``: ``from_paths(target, None)`` (our loop, no drafter).

Only the generate call is timed (model load excluded; chat templating, T(k) measurement and
prompt processing included). The methods alternate (their order flips every repetition),
``--reps`` repetitions, after one discarded warm-up run per method (pages the model file into the
OS cache, so no method pays the disk read).

Models (``--models``): ``smollm2`` (SmolLM2-135M-Instruct Q4_1 + the shipped MoA drafter),
``smollm2-q8_0`` (the same requantized to Q8_0, cached; shipped drafter), ``gemma3``
(Gemma-3-270M Q4_K_M: there is no trained MoA drafter for it, so it runs ``plain`` and ``auto``
with a *random* drafter made by ``moa_cpp.testing.random_drafter.make_random_drafter`` into a temp dir —
that row shows what the cost-aware default costs when the drafter is useless: it should give
up drafting and approach plain decoding). Any other value is a GGUF path (``plain`` only, unless
``--drafter`` is given).

    python -m bench.process first-run                                   # 3 models x 64/256 tokens x 3 reps
    python -m bench.process first-run --models smollm2 --max-tokens 64 --reps 1

Writes bench/results/<machine-label>/<--name>.json/.md/.png (bench/_common.write_results).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO_ROOT, llama_greedy, md_table, open_llama, run_info, usable_cores, write_results

PROMPT = "Explain speculative decoding in two sentences."
N_CTX = 4096          # moa-cpp generate's default --n-ctx


# ----------------------------------------------------------------------------- child

def child(args: argparse.Namespace) -> int:
    ids = json.loads(Path(args.ids_file).read_text())
    res: dict = {"kind": args.child}
    t0 = time.perf_counter()
    if args.child == "llama":
        import llama_cpp
        llm = open_llama(args.model, n_ctx=N_CTX, threads=args.threads)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        res["t_load"] = time.perf_counter() - t0
        toks, t, t_first = llama_greedy(llm, ids, args.max_tokens,
                                        lambda t: bool(llama_cpp.llama_vocab_is_eog(vocab, t)))
        res.update(tokens=toks, t_generate=t, t_prefill=t_first)
    else:
        from moa_cpp.generator import SpeculativeGenerator
        drafter = args.drafter if args.child in ("auto", "auto2", "calibrate") else None
        gen = SpeculativeGenerator.from_paths(args.model, drafter, n_ctx=N_CTX, n_threads=args.threads,
                                              draft="auto:8" if drafter else "none")
        res["t_load"] = time.perf_counter() - t0
        if args.child == "calibrate":            # fill this process's MOA_CPP_CACHE, as a first CLI run does
            t2 = time.perf_counter()
            gen.loop.policy_for(gen.draft)
            gen.calibrate()
            print("RESULT " + json.dumps({"kind": "calibrate", "t_calibrate": time.perf_counter() - t2}), flush=True)
            return 0
        t1 = time.perf_counter()
        r = gen.generate(args.prompt, chat=True, max_tokens=args.max_tokens)
        t = time.perf_counter() - t1
        st = r.stats
        res.update(tokens=list(r.tokens), t_generate=t, t_prefill=st.t_prefill, t_decode=st.t_total,
                   t_setup=max(0.0, t - st.t_prefill - st.t_total), tau=st.tau, target_calls=st.target_calls,
                   auto_choices={str(k): v for k, v in st.auto_choices.items()},
                   t_target=st.t_target, t_drafter=st.t_drafter, t_capture=st.t_capture, t_overhead=st.t_overhead,
                   same_prompt_ids=r.prompt_tokens == ids, decision=getattr(st, "decision", ""))
        # moa-cpp generate measures T(k) after printing its output when it was not cached (the
        # user waits for it before the command returns, once): timed apart from the generation
        res["t_calibrate"] = None
        if args.calibrate and getattr(gen, "needs_calibration", lambda: False)():
            t2 = time.perf_counter()
            gen.calibrate()
            res["t_calibrate"] = time.perf_counter() - t2
        gen.close()
    res["n"] = len(res["tokens"])
    res["tokens_per_s"] = res["n"] / res["t_generate"] if res["t_generate"] > 0 else 0.0
    print("RESULT " + json.dumps(res), flush=True)
    return 0


# ----------------------------------------------------------------------------- parent

def resolve_models(names: list, drafter_arg, tmp: Path) -> list[dict]:
    from moa_cpp.models import defaults, registry as models
    from moa_cpp.testing.random_drafter import make_random_drafter
    out = []
    for name in names:
        if name in ("smollm2", "smollm2-q8_0"):
            path = models.smollm2_path() if name == "smollm2" else models.smollm2_q8_0_path()
            out.append({"name": name, "path": str(path), "drafter": drafter_arg or str(defaults.default_drafter()),
                        "drafter_kind": "shipped" if not drafter_arg else "given", "methods": ["llama", "auto"]})
        elif name == "gemma3":
            path = models.gemma3_270m_path()
            d = drafter_arg
            if d is None:
                print("gemma3: making a random drafter (no trained MoA drafter exists for Gemma-3) ...", flush=True)
                d = str(make_random_drafter(path, tmp / "random-gemma3.q8_0.gguf", "q8_0"))
            out.append({"name": name, "path": str(path), "drafter": d, "drafter_kind": "given" if drafter_arg else "random",
                        "methods": ["llama", "plain", "auto"]})
        else:
            out.append({"name": Path(name).name, "path": name, "drafter": drafter_arg,
                        "drafter_kind": "given" if drafter_arg else None,
                        "methods": ["llama", "auto"] if drafter_arg else ["llama", "plain"]})
    return out


def prompt_ids(path: str, prompt: str) -> list:
    from moa_cpp.target.target import Target
    with Target.from_path(path, n_ctx=256, n_threads=1, n_batch=64, install_callback=False) as t:
        text = t.apply_chat_template([{"role": "user", "content": prompt}])
        return t.tokenize(text, add_bos=False, special=True).tolist()


def spawn(kind: str, m: dict, ids_file: Path, n: int, threads: int, prompt: str, timeout: int,
          cache_dir: str = None, calibrate: bool = False) -> dict:
    env = dict(os.environ)
    cache = None
    if cache_dir is not None:                    # a given cache (auto2: calibrated by a first run)
        env["MOA_CPP_CACHE"] = cache_dir
    elif kind != "llama":
        cache = tempfile.mkdtemp(prefix="moa-fresh-cache-")
        env["MOA_CPP_CACHE"] = cache             # empty: no cached T(k), nothing else cached either
    cmd = [sys.executable, "-m", "bench.process.first_run", "--child", kind, "--model", m["path"],
           "--ids-file", str(ids_file), "--max-tokens", str(n), "--threads", str(threads), "--prompt", prompt]
    if m.get("drafter"):
        cmd += ["--drafter", m["drafter"]]
    if calibrate:
        cmd += ["--calibrate"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
    wall = time.perf_counter() - t0
    if cache:
        subprocess.run(["rm", "-rf", cache])
    line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"child {kind} {m['name']} failed (rc {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    res = json.loads(line[len("RESULT "):])
    res["wall_process"] = wall
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2", "smollm2-q8_0", "gemma3"],
                    help="smollm2, smollm2-q8_0, gemma3 or GGUF paths (default: the three)")
    ap.add_argument("--drafter", default=None, help="MoA drafter for every model (default: shipped / random, see above)")
    ap.add_argument("--max-tokens", nargs="+", type=int, default=[64, 256])
    ap.add_argument("--reps", type=int, default=3, help="repetitions per method (default 3)")
    ap.add_argument("--with-plain", action="store_true", help="also run --no-draft (plain) for every model")
    ap.add_argument("--no-warmup", action="store_true", help="skip the discarded warm-up run per method")
    ap.add_argument("--threads", type=int, default=None, help="default: all usable cores")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per child process")
    ap.add_argument("--name", default="process-first-run")
    ap.add_argument("--results-dir", default=None)
    # child mode
    ap.add_argument("--second-run", action="store_true",
                    help="also run 'auto2': a fresh process whose MOA_CPP_CACHE was calibrated by an earlier "
                         "run (what every later `moa-cpp generate` sees)")
    ap.add_argument("--child", choices=["llama", "auto", "auto2", "plain", "calibrate"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--ids-file", help=argparse.SUPPRESS)
    ap.add_argument("--calibrate", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    threads = args.threads or usable_cores()
    if args.child:
        args.threads = threads
        args.max_tokens = args.max_tokens[0]
        return child(args)

    tmpdir = tempfile.TemporaryDirectory(prefix="moa-first-run-")
    tmp = Path(tmpdir.name)
    models_ = resolve_models(args.models, args.drafter, tmp)
    for m in models_:
        if args.with_plain and "plain" not in m["methods"]:
            m["methods"].append("plain")
        if args.second_run and m["drafter"]:
            m["methods"].append("auto2")
    runs: list = []
    t_start = time.perf_counter()
    for m in models_:
        ids = prompt_ids(m["path"], args.prompt)
        ids_file = tmp / f"ids-{m['name']}.json"
        ids_file.write_text(json.dumps(ids))
        print(f"== {m['name']}: {m['path']} ({len(ids)} prompt tokens), drafter {m['drafter']} "
              f"({m['drafter_kind']}); methods {m['methods']}", flush=True)
        cal = None
        if "auto2" in m["methods"]:
            cal = str(tmp / f"cache-{m['name']}")
            os.makedirs(cal, exist_ok=True)
            r = spawn("calibrate", m, ids_file, 8, threads, args.prompt, args.timeout, cache_dir=cal)
            print(f"{m['name']}: calibrated a cache for auto2 in {r['t_calibrate']:.1f} s", flush=True)
        if not args.no_warmup:
            for kind in m["methods"]:
                spawn(kind, m, ids_file, 8, threads, args.prompt, args.timeout, cache_dir=cal if kind == "auto2" else None)
        for n in args.max_tokens:
            for rep in range(args.reps):
                order = m["methods"] if rep % 2 == 0 else m["methods"][::-1]
                for kind in order:
                    # the T(k) measurement the CLI runs after its first output: timed once per model
                    once = kind == "auto" and n == args.max_tokens[0] and rep == 0
                    r = spawn(kind, m, ids_file, n, threads, args.prompt, args.timeout,
                              cache_dir=cal if kind == "auto2" else None, calibrate=once)
                    r.update(model=m["name"], max_tokens=n, rep=rep)
                    runs.append(r)
                    extra = (f", setup {r['t_setup']:.2f} s, tau {r['tau']:.2f}, k {r['auto_choices']}"
                             + (f", calibrate after {r['t_calibrate']:.2f} s" if r["t_calibrate"] is not None else "")
                             + f"; {r['decision']}" if kind.startswith("auto") else "")
                    print(f"{m['name']} n={n} rep {rep} {kind:<5} {r['n']} tok in {r['t_generate']:.2f} s = "
                          f"{r['tokens_per_s']:.1f} tok/s (prefill {r['t_prefill']:.3f} s{extra}; load "
                          f"{r['t_load']:.2f} s, process {r['wall_process']:.1f} s)", flush=True)
    elapsed = time.perf_counter() - t_start

    rows = []
    for m in models_:
        for n in args.max_tokens:
            sel = {k: [r for r in runs if r["model"] == m["name"] and r["max_tokens"] == n and r["kind"] == k]
                   for k in m["methods"]}
            base = sel["llama"]
            for kind, rs in sel.items():
                tps = [r["tokens_per_s"] for r in rs]
                paired = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(rs, base) if b["tokens_per_s"] > 0]
                is_auto = kind.startswith("auto")
                row = {"model": m["name"], "max_tokens": n, "method": kind, "drafter": m["drafter"] if is_auto else None,
                       "drafter_kind": m["drafter_kind"] if is_auto else None, "reps": len(rs),
                       "tokens": statistics.median(r["n"] for r in rs),
                       "tok_s_median": statistics.median(tps), "tok_s_min": min(tps), "tok_s_max": max(tps),
                       "t_generate_median": statistics.median(r["t_generate"] for r in rs),
                       "t_prefill_median": statistics.median(r["t_prefill"] for r in rs),
                       "ratio_vs_llama": statistics.median(tps) / statistics.median(r["tokens_per_s"] for r in base),
                       "ratio_paired_median": statistics.median(paired) if paired else None,
                       "identical_to_llama": sum(r["tokens"] == b["tokens"] for r, b in zip(rs, base))}
                if kind != "llama":
                    row.update(t_setup_median=statistics.median(r["t_setup"] for r in rs),
                               tau_median=statistics.median(r["tau"] for r in rs),
                               auto_choices=[r["auto_choices"] for r in rs],
                               t_calibrate=next((r["t_calibrate"] for r in rs if r.get("t_calibrate") is not None), None),
                               decisions=sorted({r["decision"] for r in rs}),
                               same_prompt_ids=all(r["same_prompt_ids"] for r in rs))
                rows.append(row)

    hdr = ["model", "max tokens", "method", "tok/s (median, min-max)", "x llama.cpp", "paired x", "generate s",
           "prefill s", "setup s", "tau", "= llama.cpp", "calibrate after s"]
    table = []
    for r in rows:
        table.append([r["model"], r["max_tokens"], r["method"] + (f" ({r['drafter_kind']} drafter)" if r["drafter_kind"] else ""),
                      f"{r['tok_s_median']:.1f} ({r['tok_s_min']:.1f}-{r['tok_s_max']:.1f})",
                      f"**{r['ratio_vs_llama']:.2f}**", f"{r['ratio_paired_median']:.2f}" if r["ratio_paired_median"] else "",
                      f"{r['t_generate_median']:.2f}", f"{r['t_prefill_median']:.3f}",
                      f"{r['t_setup_median']:.2f}" if "t_setup_median" in r else "",
                      f"{r['tau_median']:.2f}" if "tau_median" in r else "", f"{r['identical_to_llama']}/{r['reps']}",
                      f"{r['t_calibrate']:.1f}" if r.get("t_calibrate") is not None else ""])
    decisions = [f"- {r['model']} {r['max_tokens']} {r['method']}: {'; '.join(r['decisions'])}"
                 for r in rows if r.get("decisions")]
    md = "\n".join([
        f"First generation in a fresh process (model load excluded; chat template, T(k) measurement and prompt "
        f"processing included), prompt {args.prompt!r}, greedy, {threads} threads, {args.reps} repetitions "
        f"(alternating), {elapsed:.0f} s in all.", "",
        "`llama`: llama-cpp-python's own greedy generation (= 1.00). `auto`: `moa-cpp generate` default "
        "(cost-aware chain 0..8) with an empty MOA_CPP_CACHE. `auto2`: the same in a fresh process whose cache a "
        "first run filled. `plain`: `moa-cpp generate --no-draft`. "
        "`x llama.cpp`: median tok/s ratio; `paired x`: median of per-repetition ratios. `setup`: time inside "
        "generate outside prompt processing and decoding (templating, policy start, any T(k) measurement). "
        "`calibrate after`: the measurement (T(k), exact batch rows) `moa-cpp generate` runs after printing its "
        "output when none was cached (once per model; not in the tok/s, but the first command returns only after "
        "it; measured once per model, in the first `auto` run). Gemma-3 has no trained MoA drafter: its "
        "`auto` row uses a random drafter (the cost of the cost-aware default when drafting does not pay).", "",
        md_table(hdr, table), "", "Cost-aware decisions (stats.decision):", ""] + decisions)
    print("\n" + md, flush=True)
    info = run_info(threads)
    doc = {"run": info, "prompt": args.prompt, "models": models_, "reps": args.reps, "elapsed_s": elapsed,
           "rows": rows, "runs": runs}
    write_results(args.name, doc, md, lambda plt: plot(plt, rows, models_, args.max_tokens),
                  out_dir=args.results_dir, info=info)
    tmpdir.cleanup()
    return 0


def plot(plt, rows: list, models_: list, max_tokens: list):
    import numpy as np
    labels = [f"{m['name']}\n{n} tok" for m in models_ for n in max_tokens]
    kinds = [k for k in ("llama", "plain", "auto", "auto2") if any(r["method"] == k for r in rows)]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(labels)), 4))
    x = np.arange(len(labels))
    w = 0.8 / len(kinds)
    for i, k in enumerate(kinds):
        ys = []
        for m in models_:
            for n in max_tokens:
                r = next((r for r in rows if r["model"] == m["name"] and r["max_tokens"] == n and r["method"] == k), None)
                ys.append(r["ratio_vs_llama"] if r else 0)
        ax.bar(x + (i - (len(kinds) - 1) / 2) * w, ys, w, label=k)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("first-run tok/s / llama-cpp-python's")
    ax.set_title("First generation in a fresh process (model load excluded)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())
