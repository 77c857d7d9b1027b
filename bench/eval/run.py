#!/usr/bin/env python
"""Benchmark MoA speculative decoding against llama-cpp-python's own generation, its
prompt-lookup decoding and our plain loop, on the paper's six evaluation sets
(../shared/data/eval; benchmark only — never train or tune on them).

Rows (all in one process, on the same GGUF, same thread count, flash attention on for all):

- ``llama.cpp``: llama-cpp-python's own greedy generation (``Llama.generate`` on the same
  chat-templated prompt ids, temperature 0, stop at EOG or max tokens) — every speedup is
  relative to it (= 1.00);
- ``llama.cpp PLD``: its prompt-lookup decoding (``LlamaPromptLookupDecoding(num_pred_tokens=10)``
  as ``draft_model=`` of a second ``Llama``; opened with ``logits_all=True``: with a draft model
  llama-cpp-python 0.3.36 keeps every row's logits anyway but sizes the buffer for n_batch rows
  only and crashes on longer prompts otherwise); its tau = tokens after the first / decode calls
  after the prompt;
- ``plain``: our loop without a drafter (``moa-cpp generate --no-draft``);
- ``default auto:8``: what ``moa-cpp generate`` runs without --chain/--tree:
  ``SpeculativeGenerator.from_paths(target, drafter, draft="auto:8")`` (its own Target context,
  cost-aware chain length; its T(k) is cached in ~/.cache/moa_cpp or $MOA_CPP_CACHE:
  ``--fresh-cache`` measures it anew in the warm-up);
- ``moa VARIANT``: our loop with the MoA drafter and a fixed ``--variants`` draft shape;
- ``draftmodel VARIANT`` (``--draft-model GGUF``): draft-model speculation (``DraftModelProposer``:
  a small model with the target's tokenizer drafts the chain, e.g. Qwen2.5-Coder-0.5B for the 1.5B);
- ``ngram VARIANT`` (``--ngram``): prompt-lookup drafts (``NgramProposer``: no drafter, free
  drafts; ``auto:K`` is the cost-aware policy over them, what ``moa-cpp generate -m any.gguf``
  runs);
- ``moa+ngram VARIANT`` (``--hybrid``): the MoA drafter and prompt lookup merged into one tree
  (``HybridProposer``, ``--spec-type moa,ngram``);
- ``draft+ngram VARIANT`` (``--draft-hybrid``, with ``--draft-model``): the draft model and prompt
  lookup merged (``--spec-type draft,ngram``): a long match drafts alone, sparing the model's rows;
- ``oracleR VARIANT``: the test-only oracle proposer (acceptance R per token; the speed-up
  ceiling a drafter with that acceptance approaches; needs no drafter).

For every prompt the methods run back to back (their order rotates from prompt to prompt, the
oracle rows last since they need the plain output); one warm-up generation per method first.
Every method's tokens are compared with llama.cpp's greedy output and with our plain greedy
output (identical prompts / total: a diverging method is reported, not hidden). Times cover the
whole generation call (prompt processing included).

    python -m bench.eval run                                         # SmolLM2 + shipped drafter
    python -m bench.eval run -m target.gguf -d drafter.gguf --variants chain:4 tree:6,8,62 \\
        --prompts 10 --max-tokens 128
    python -m bench.eval run --oracle 0.5 0.7 0.9 --variants chain:3    # speed-up ceiling
    python -m bench.eval run --sets grounded --ngram auto:8 chain:4 --hybrid chain:4   # issue 23

Sets: the paper's six (``--data``, default ../shared/data/eval) and ``grounded``
(bench/prompts/grounded.jsonl: code edits, extraction, summaries, rewrites, questions over a
passage, written for this repository; where prompt lookup pays).

Writes bench/results/<machine-label>/<--name>.json/.md/.png (bench/_common.write_results).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import (BENCH_DIR, EVAL_DIR, EVAL_SETS, CallCounter, base_parser, eval_prompts, llama_greedy,
                     md_table, open_llama, run_generation, run_info, spec_api, usable_cores, write_results)

SETS = EVAL_SETS
PAPER_NAMES = {"mt_bench": "MT-bench", "humaneval": "HumanEval", "gsm8k": "GSM8K", "alpaca": "Alpaca",
               "sum": "CNN/DM", "qa": "Nat. Ques.", "grounded": "grounded"}
OWN_SETS = {"grounded": BENCH_DIR / "prompts"}    # sets written for this repository
LLAMA, PLD, PLAIN, DEFAULT = "llama.cpp", "llama.cpp PLD", "plain", "default auto:8"
SPLIT_KEYS = ("t_prefill", "t_target", "t_drafter", "t_capture", "t_overhead")


def first_diff(a: list, b: list) -> int:
    """Index of the first differing token (-1: identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def stats_record(toks: list, t: float, st) -> dict:
    rec = {"tokens": toks, "n": len(toks), "time": t, "tokens_per_s": len(toks) / t if t > 0 else 0.0,
           "tau": st.tau, "tau_num": st.accepted + st.target_calls, "tau_den": st.target_calls,
           "auto_choices": {str(k): v for k, v in st.auto_choices.items()},
           "accepted_by_depth": st.accepted_by_depth, "proposed_by_depth": st.proposed_by_depth,
           "eog": st.eog_token if st.finish_reason == "stop" else -1, "decision": getattr(st, "decision", ""),
           "draft_rows": getattr(st, "draft_rows", 0), "by_source": getattr(st, "by_source", {})}
    rec.update({k: getattr(st, k) for k in SPLIT_KEYS})
    return rec


def main(argv=None) -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--variants", nargs="*", default=[],
                    help="also run our loop with the MoA drafter (and/or the oracle) at these fixed shapes: "
                         "chain:N / tree:D,K,T (default: none; the CLI default auto:8 always runs with a drafter)")
    ap.add_argument("--oracle", nargs="*", type=float, default=[],
                    help="also run the test-only oracle proposer at these per-token acceptance rates "
                         "(with each --variants shape; chain:3 if none)")
    ap.add_argument("--draft-model", default=None, metavar="GGUF",
                    help="also run draft-model speculation (llama.cpp's classic `speculative`: a small model with the "
                         "target's tokenizer, e.g. Qwen2.5-Coder-0.5B for the 1.5B) at each --variants chain shape")
    ap.add_argument("--ngram", nargs="*", default=[], metavar="VARIANT",
                    help="also run prompt-lookup (n-gram) drafts at these shapes: auto:K, chain:N, tree:D,K,T")
    ap.add_argument("--hybrid", nargs="*", default=[], metavar="VARIANT",
                    help="also run the MoA drafter merged with prompt lookup (--spec-type moa,ngram) at these shapes")
    ap.add_argument("--draft-hybrid", nargs="*", default=[], metavar="VARIANT",
                    help="also run the --draft-model merged with prompt lookup (--spec-type draft,ngram) at these "
                         "shapes: auto:K or chain:N")
    ap.add_argument("--skip", nargs="*", default=[], choices=["pld", "default"],
                    help="leave out llama.cpp's prompt-lookup decoding and/or the CLI default row")
    ap.add_argument("--sets", nargs="+", default=SETS, choices=SETS + list(OWN_SETS))
    ap.add_argument("--prompts", type=int, default=4, help="prompts per set (default 4)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--n-batch", type=int, default=512, help="prompt batch of every context (default 512, as "
                    "Llama's and from_paths' default)")
    ap.add_argument("--threads", type=int, default=None, help="threads for everything (default: all usable cores)")
    ap.add_argument("--fresh-cache", action="store_true",
                    help="point MOA_CPP_CACHE at an empty temp dir: the default row measures T(k) in its warm-up")
    ap.add_argument("--data", default=str(EVAL_DIR))
    ap.add_argument("--name", default="eval-run", help="results file stem (default eval-run)")
    ap.add_argument("--results-dir", default=None, help="default bench/results/<machine-label>/")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--plot", default=None, help="also write the PNG here")
    args = ap.parse_args(argv)
    if args.fresh_cache:
        os.environ["MOA_CPP_CACHE"] = tempfile.mkdtemp(prefix="moa-cache-")
        print(f"MOA_CPP_CACHE={os.environ['MOA_CPP_CACHE']} (fresh)", flush=True)

    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from moa_cpp.models import defaults, registry as models
    from moa_cpp.drafter.drafter import DrafterModel, DrafterState
    from moa_cpp.generator import SpeculativeGenerator, parse_draft
    from moa_cpp.target.target import Target
    api = spec_api()
    SpeculativeLoop, OracleProposer, MoAProposer = api.SpeculativeLoop, api.OracleProposer, api.MoAProposer
    DraftConfig, SamplingParams = api.DraftConfig, api.SamplingParams

    threads = args.threads or usable_cores()
    model = args.model or str(models.smollm2_path())
    drafter = args.drafter
    if drafter is None and args.model is None and defaults.DEFAULT_DRAFTER.is_file():
        drafter = str(defaults.DEFAULT_DRAFTER)
    target = Target.from_path(model, n_ctx=args.n_ctx, n_threads=threads, n_batch=args.n_batch)
    state = None
    if drafter:
        dm = DrafterModel(drafter, model, n_threads=threads)
        state = DrafterState(dm, n_ctx=args.n_ctx, n_draft_max=600, n_batch=args.n_batch)
    oracle_shapes = args.variants or ["chain:3"]
    moa_names = [f"moa {v}" for v in args.variants] if state else []
    dm_shapes = [v for v in args.variants if parse_draft(v).mode == "chain"] or ["chain:3"]
    dm_names = [f"draftmodel {v}" for v in dm_shapes] if args.draft_model else []
    oracle_names = [f"oracle{r} {v}" for r in args.oracle for v in oracle_shapes]
    ngram_names = [f"ngram {v}" for v in args.ngram]
    hybrid_names = [f"moa+ngram {v}" for v in args.hybrid] if state else []
    if args.draft_hybrid and not args.draft_model:
        ap.error("--draft-hybrid needs --draft-model")
    hybrid_names += [f"draft+ngram {v}" for v in args.draft_hybrid]
    ordered = [LLAMA] + ([PLD] if "pld" not in args.skip else []) + [PLAIN] + \
              ([DEFAULT] if drafter and "default" not in args.skip else []) + moa_names + dm_names + ngram_names + \
              hybrid_names
    names = ordered + oracle_names
    print(f"target {model}\ndrafter {drafter}\n{threads} threads; methods: {', '.join(names)}", flush=True)

    sp = SamplingParams()
    plain = SpeculativeLoop(target, None, DraftConfig("none"))
    moa_loops = {n: (SpeculativeLoop(target, MoAProposer(state, parse_draft(v)), parse_draft(v)), parse_draft(v))
                 for n, v in zip(moa_names, args.variants)}
    dm_loops = {}
    if dm_names:
        from moa_cpp.speculative.proposers import DraftModelProposer
        for n, v in zip(dm_names, dm_shapes):   # one draft context per shape: each keeps its KV in step
            cfg = parse_draft(v)
            dm_loops[n] = (SpeculativeLoop(target, DraftModelProposer.from_path(args.draft_model, cfg, target=target,
                                                                                n_batch=args.n_batch), cfg), cfg)
    from moa_cpp.speculative.proposers import HybridProposer, NgramProposer
    ngram_loops = {n: (SpeculativeLoop(target, NgramProposer(parse_draft(v)), parse_draft(v)), parse_draft(v))
                   for n, v in zip(ngram_names, args.ngram)}
    for n, v in zip(hybrid_names, args.hybrid if state else []):   # a drafter state of its own
        hstate = DrafterState(state.model, n_ctx=args.n_ctx, n_draft_max=600, n_batch=args.n_batch)
        cfg = parse_draft(v)
        ngram_loops[n] = (SpeculativeLoop(target, HybridProposer([MoAProposer(hstate, cfg), NgramProposer(cfg)],
                                                                 ["moa", "ngram"], cfg), cfg), cfg)
    for v in args.draft_hybrid:                   # a draft context of its own, as each draftmodel row
        from moa_cpp.speculative.proposers import DraftModelProposer
        cfg = parse_draft(v)
        dm = DraftModelProposer.from_path(args.draft_model, cfg, target=target, n_batch=args.n_batch)
        ngram_loops[f"draft+ngram {v}"] = (SpeculativeLoop(target, HybridProposer([dm, NgramProposer(cfg)],
                                                                                  ["draft", "ngram"], cfg), cfg), cfg)
    llm = open_llama(model, n_ctx=args.n_ctx, threads=threads, n_batch=args.n_batch)
    llm_pld = pld_calls = None
    if PLD in names:
        llm_pld = open_llama(model, n_ctx=args.n_ctx, threads=threads, n_batch=args.n_batch,
                             draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))
        pld_calls = CallCounter(llm_pld)
    gen = None
    if DEFAULT in names:
        gen = SpeculativeGenerator.from_paths(model, drafter, n_ctx=args.n_ctx, n_threads=threads, draft="auto:8")

    def run_loop(loop, ids, cfg=None):
        return stats_record(*run_generation(loop, ids, args.max_tokens, sp, cfg))

    def run_llama(handle, ids, counter=None):
        if counter is not None:
            counter.n = 0
        toks, t, t_first = llama_greedy(handle, ids, args.max_tokens, target.is_eog)
        rec = {"tokens": toks, "n": len(toks), "time": t, "tokens_per_s": len(toks) / t if t > 0 else 0.0,
               "t_prefill": t_first}
        if counter is not None:      # tau: tokens after the first per decode call after the prompt
            rec.update(tau_num=max(0, len(toks) - 1), tau_den=max(1, counter.n - 1),
                       tau=max(0, len(toks) - 1) / max(1, counter.n - 1), calls=counter.n)
        else:
            rec.update(tau=1.0)
        return rec

    def run_default(ids):
        t0 = time.perf_counter()
        # every prompt processed whole, as the other rows (run_generation) and llama-cpp-python
        # (reset) are: a kept prefix changes the prompt's batch split, and llama.cpp's logits
        # with it (Q4_1: up to ~0.8, enough to flip near-ties), and saves prefill time
        r = gen.generate(ids, max_tokens=args.max_tokens, temperature=0.0, cache_prompt=False)
        return stats_record(list(r.tokens), time.perf_counter() - t0, r.stats)

    def run_method(name, ids, ref_plain, qi):
        if name == LLAMA:
            return run_llama(llm, ids)
        if name == PLD:
            return run_llama(llm_pld, ids, pld_calls)
        if name == PLAIN:
            return run_loop(plain, ids)
        if name == DEFAULT:
            return run_default(ids)
        if name in moa_loops or name in dm_loops or name in ngram_loops:
            loop, cfg = moa_loops.get(name) or dm_loops.get(name) or ngram_loops[name]
            return run_loop(loop, ids, cfg)
        kind, spec = name.split(" ", 1)                   # oracle
        rate, cfg = float(kind[len("oracle"):]), parse_draft(spec)
        toks, st = ref_plain
        ref_full = toks + ([st["eog"]] if st["eog"] >= 0 else [])
        loop = SpeculativeLoop(target, OracleProposer(ref_full, len(ids), rate, target.n_vocab, cfg, seed=qi), cfg)
        return run_loop(loop, ids, cfg)

    def chat_ids(text: str) -> list:
        ids = target.tokenize(target.apply_chat_template([{"role": "user", "content": text}]),
                              add_bos=False, special=True).tolist()
        if len(ids) + args.max_tokens + 200 > args.n_ctx:
            ids = ids[-(args.n_ctx - args.max_tokens - 200):]
        return ids

    # warm-up: one short generation per method (page in weights, build graphs, T(k) for auto)
    t_w = time.perf_counter()
    warm = chat_ids("Hello! Who are you?")
    for name in ordered:
        run_method(name, warm, None, 0)
    if gen is not None and getattr(gen, "needs_calibration", lambda: False)():
        # an uncalibrated cost-aware default decodes plainly and the CLI then measures T(k) after
        # its output: measure it now, as a user's earlier run would have
        t_c = time.perf_counter()
        gen.calibrate()
        print(f"default row: measured T(k) in {time.perf_counter() - t_c:.1f} s (cached in "
              f"{os.environ.get('MOA_CPP_CACHE', '~/.cache/moa_cpp')})", flush=True)
        run_method(DEFAULT, warm, None, 0)
    for name, (loop, cfg) in ngram_loops.items():
        if loop.needs_calibration():      # cost-aware rows: T(k) measured (cached) as a user's first run would
            loop.calibrate()
            run_method(name, warm, None, 0)
    print(f"warm-up {time.perf_counter() - t_w:.1f} s", flush=True)

    records = []
    t_start = time.perf_counter()
    gi = 0
    for set_name in args.sets:
        for qi, prompt in enumerate(eval_prompts(OWN_SETS.get(set_name, Path(args.data)), [set_name], args.prompts)):
            ids = chat_ids(prompt)
            rot = gi % len(ordered)
            order = ordered[rot:] + ordered[:rot]
            gi += 1
            res, ref_plain = {}, None
            for name in order:
                res[name] = run_method(name, ids, None, qi)
                if name == PLAIN:        # the oracle's reference: plain output + its EOG (if it stopped)
                    ref_plain = (res[name]["tokens"], {"eog": res[name]["eog"]})
            for name in oracle_names:
                res[name] = run_method(name, ids, ref_plain, qi)
            ref_l, ref_p = res[LLAMA]["tokens"], res[PLAIN]["tokens"]
            for name in names:
                r = res[name]
                r["same_llama"] = r["tokens"] == ref_l
                r["same_plain"] = r["tokens"] == ref_p
                r["diverge_llama_at"] = first_diff(r["tokens"], ref_l)
            records.append({"set": set_name, "q": qi, "prompt_tokens": len(ids), "order": order, **res})
            base = res[LLAMA]["time"]
            print(f"{set_name}[{qi}] {len(ids)}+{res[LLAMA]['n']} tok | " + " | ".join(
                f"{n} {res[n]['tokens_per_s']:.1f} tok/s {base / res[n]['time']:.2f}x"
                + (f" tau {res[n]['tau']:.2f}" if n not in (LLAMA, PLAIN) else "")
                + ("" if res[n]["same_llama"] else f" DIFF@{res[n]['diverge_llama_at']}") for n in names),
                flush=True)
    elapsed = time.perf_counter() - t_start

    summary = summarize(records, names, args.sets)
    info = run_info(threads)
    doc = {"run": info, "model": model, "drafter": drafter, "draft_model": args.draft_model,
           "max_tokens": args.max_tokens,
           "prompts_per_set": args.prompts, "sets": args.sets, "n_ctx": args.n_ctx, "n_batch": args.n_batch,
           "fresh_cache": args.fresh_cache, "elapsed_s": elapsed, "methods": names, "summary": summary,
           "records": records}
    md = markdown(summary, names, args.sets, model, drafter, args, elapsed)
    print("\n" + md, flush=True)
    write_results(args.name, doc, md, lambda plt: plot(plt, summary, names, args.sets),
                  out_dir=args.results_dir, info=info)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}")
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            plot(plt, summary, names, args.sets).savefig(args.plot, dpi=100, bbox_inches="tight")
            print(f"wrote {args.plot}")
        except ImportError:
            print("matplotlib not installed: pip install 'moa_cpp[bench]' for --plot", file=sys.stderr)
    return 0


def summarize(records: list, names: list, sets: list) -> dict:
    """Per method and set: speedup vs llama.cpp and vs plain (time ratios over the same prompts),
    tau, tok/s, identical outputs; 'mean' = mean over sets (as the paper), 'all' = all prompts."""
    summary = {}
    for name in names:
        row = {}
        for s in sets + ["all"]:
            rs = [r for r in records if s == "all" or r["set"] == s]
            if not rs:
                continue
            t = sum(r[name]["time"] for r in rs)
            tl = sum(r[LLAMA]["time"] for r in rs)
            tp = sum(r[PLAIN]["time"] for r in rs)
            num = sum(r[name].get("tau_num", r[name]["n"]) for r in rs)
            den = sum(r[name].get("tau_den", r[name]["n"]) for r in rs)
            row[s] = {"vs_llama": tl / t, "vs_plain": tp / t, "tau": num / den if den else 0.0,
                      "tok_s": sum(r[name]["n"] for r in rs) / t, "same_llama": sum(r[name]["same_llama"] for r in rs),
                      "same_plain": sum(r[name]["same_plain"] for r in rs), "n": len(rs)}
        present = [s for s in sets if s in row]
        row["mean"] = {k: float(np.mean([row[s][k] for s in present])) for k in ("vs_llama", "vs_plain", "tau")}
        if "tau_num" in records[0][name] and name not in (PLD,):
            row["time_split"] = {k: sum(r[name][k] for r in records) for k in SPLIT_KEYS}
            choices: dict = {}
            for r in records:
                for k, v in r[name].get("auto_choices", {}).items():
                    choices[int(k)] = choices.get(int(k), 0) + v
            if choices:
                row["auto_choices"] = dict(sorted(choices.items()))
            by_source: dict = {}
            for r in records:
                for k, v in r[name].get("by_source", {}).items():
                    d = by_source.setdefault(k, {"proposed": 0, "accepted": 0})
                    d["proposed"] += v["proposed"]
                    d["accepted"] += v["accepted"]
            if len(by_source) > 1:          # which source of a hybrid produced what
                row["by_source"] = by_source
        decisions = sorted({r[name].get("decision", "") for r in records} - {""})
        if decisions:
            row["decisions"] = decisions
        row["diverging_prompts"] = [f"{r['set']}[{r['q']}]@{r[name]['diverge_llama_at']}"
                                    for r in records if not r[name]["same_llama"]]
        summary[name] = row
    return summary


def markdown(summary: dict, names: list, sets: list, model: str, drafter, args, elapsed: float) -> str:
    present = [s for s in sets if s in summary[LLAMA]]
    hdr = ["method"] + [PAPER_NAMES[s] for s in present] + ["mean", "tok/s", "vs plain", "tau", "= llama.cpp",
                                                            "= plain"]
    rows = []
    for n in names:
        r = summary[n]
        a = r["all"]
        rows.append([n] + [f"{r[s]['vs_llama']:.2f}" for s in present] + [
            f"**{r['mean']['vs_llama']:.2f}**", f"{a['tok_s']:.1f}", f"{a['vs_plain']:.2f}",
            f"{a['tau']:.2f}" if n not in (LLAMA, PLAIN) else "1", f"{a['same_llama']}/{a['n']}",
            f"{a['same_plain']}/{a['n']}"])
    out = [f"Target `{Path(model).name}`, drafter `{Path(drafter).name if drafter else '-'}`, "
           f"{args.prompts} prompts per set, max {args.max_tokens} new tokens, greedy, "
           f"{summary[LLAMA]['all']['n']} prompts, {elapsed:.0f} s.", "",
           "Speedup = llama-cpp-python's own greedy generation time / method time over the same prompts "
           "(whole generation call, prompt processing included; llama.cpp = 1.00); per set, then the mean "
           "over sets. `vs plain`: relative to our loop without drafter. `tau`: tokens per target "
           "decode after the prompt. `= llama.cpp` / `= plain`: prompts whose output is token-identical.", "",
           md_table(hdr, rows), ""]
    split_rows = []
    for n in names:
        tt = summary[n].get("time_split")
        if not tt:
            continue
        tot = sum(tt[k] for k in SPLIT_KEYS)
        split_rows.append([n] + [f"{tt[k] / tot:.0%}" for k in SPLIT_KEYS] +
                          [str(summary[n].get("auto_choices", ""))])
    if split_rows:
        out += ["Time split of our loop (share of generation time):", "",
                md_table(["method", "prefill", "target", "drafter", "capture", "python"] + ["auto choices k: cycles"],
                         split_rows), ""]
    src = [(n, summary[n]["by_source"]) for n in names if summary[n].get("by_source")]
    if src:
        out += ["Drafts per source (accepted / proposed; a node both sources proposed counts for both):", ""]
        out += [f"- {n}: " + ", ".join(f"{k} {v['accepted']}/{v['proposed']}" for k, v in d.items()) for n, d in src]
        out += [""]
    dec = [(n, summary[n]["decisions"]) for n in names if summary[n].get("decisions")]
    if dec:
        out += ["Draft decisions (stats.decision; the cost-aware default explains its choice):", ""]
        out += [f"- {n}: " + " / ".join(d) for n, d in dec] + [""]
    div = [(n, summary[n]["diverging_prompts"]) for n in names if summary[n]["diverging_prompts"]]
    if div:
        out += ["Outputs that differ from llama.cpp's greedy output (prompt @ first differing token):", ""]
        out += [f"- {n}: {', '.join(d)}" for n, d in div]
    return "\n".join(out)


def plot(plt, summary: dict, names: list, sets: list):
    present = [s for s in sets if s in summary[LLAMA]]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    x = np.arange(len(present) + 1)
    w = 0.85 / len(names)
    for i, n in enumerate(names):
        axes[0].bar(x + i * w, [summary[n][s]["vs_llama"] for s in present] + [summary[n]["mean"]["vs_llama"]],
                    w, label=n)
        axes[1].bar(x + i * w, [summary[n][s]["tau"] for s in present] + [summary[n]["mean"]["tau"]], w, label=n)
    for ax, title in zip(axes, ["speedup vs llama-cpp-python greedy (= 1)", "tau (tokens per target decode)"]):
        ax.set_xticks(x + 0.425 - w / 2, [PAPER_NAMES[s] for s in present] + ["mean"])
        ax.set_title(title)
        ax.axhline(1.0, color="k", lw=0.8)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())
