#!/usr/bin/env python
"""Where the first-run calibration's time goes: ``calibrate_verify_cost(target, K)`` (T(k) for
k = 1..K+1 and the exact batch size, what ``moa-cpp generate`` runs after its first output on a new
model) with every ``Target.decode`` counted and timed by its row count, in a fresh cache each
repetition.

    python -m bench.costs calibration                        # SmolLM2 Q4_1, K = 8, 3 repetitions
    python -m bench.costs calibration --model X.gguf --k-max 4 --reps 5

Prints, per repetition: total seconds, seconds inside decodes, the measured T(k) in ms, and
{rows: (decodes, ms)}. Run it alone: it is a timing.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="target GGUF (default: the embedded SmolLM2 Q4_1)")
    ap.add_argument("--k-max", type=int, default=8, help="the cost-aware default's chain limit (default 8)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    from moa_cpp.models import defaults
    from moa_cpp.speculative.policy import calibrate_verify_cost
    from moa_cpp.target.target import Target

    t = Target.from_path(args.model or str(defaults.default_target()), n_threads=args.threads)
    decode, stats = t.decode, {}

    def timed(tokens, *a, **k):
        t0 = time.perf_counter()
        out = decode(tokens, *a, **k)
        n = stats.setdefault(len(tokens), [0, 0.0])
        n[0] += 1
        n[1] += time.perf_counter() - t0
        return out

    t.decode = timed
    for rep in range(args.reps):
        os.environ["MOA_CPP_CACHE"] = tempfile.mkdtemp(prefix="moa-cal-")   # nothing cached
        stats.clear()
        t._exact_known.clear()
        t0 = time.perf_counter()
        cost = calibrate_verify_cost(t, args.k_max)
        dt = time.perf_counter() - t0
        inside = sum(v[1] for v in stats.values())
        print(f"rep {rep}: {dt:.3f} s, decodes {inside:.3f} s; T(k) ms "
              f"{ {k: round(v * 1e3, 1) for k, v in cost.items()} }")
        print("  rows: (decodes, ms)", {k: (v[0], round(v[1] * 1e3)) for k, v in sorted(stats.items())})
    t.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
