"""Paired comparison of two drafters on the evaluation sets: per-prompt tau from two
``bench/run_eval.py`` JSON files (same prompts, same target), the mean difference and its 95 %
bootstrap interval over prompts (the same resampled prompts for both files).

    python bench/compare_eval.py bench/results/issue12-default3-q8_0-t2.json \
        bench/results/issue12-full-lsa192-muon-q8_0-t2.json

Greedy decoding is deterministic, so the interval is the prompt-sampling noise of 60 prompts,
not run-to-run noise. Methods compared: every ``moa ...`` method the two files share.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moa_cpp.train.paired import paired, per_prompt_tau


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="run_eval.py JSON of the first drafter (the reference)")
    ap.add_argument("b", help="run_eval.py JSON of the second drafter")
    ap.add_argument("--out", default=None, help="also write the comparison as JSON")
    args = ap.parse_args()
    ra, rb = (json.loads(Path(p).read_text()) for p in (args.a, args.b))
    methods = [m for m in ra["summary"] if m.startswith("moa ") and m in rb["summary"]]
    if not methods:
        print("no common 'moa ...' method in the two files", file=sys.stderr)
        return 2
    out = {"a": args.a, "b": args.b, "methods": {}}
    for m in methods:
        c = paired(per_prompt_tau(ra, m), per_prompt_tau(rb, m))
        out["methods"][m] = c
        print(f"{m}: tau {c['tau_a']:.3f} -> {c['tau_b']:.3f}, difference {c['diff']:+.3f} "
              f"(95 % {c['diff_ci95'][0]:+.3f} to {c['diff_ci95'][1]:+.3f}, {c['prompts']} prompts)")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
