#!/usr/bin/env python
"""Are a target's rows the same in batches of any size? The last row's logits after n prompt tokens,
decoded one token at a time vs in chunks of c tokens (max |difference|). On SmolLM2 Q4_1 with 2
threads here: 0 for chunks up to 63 rows, 0.42-1.00 from 64 rows on (another kernel) -- why prompt-
cache reuse is exact with ``-ub`` <= 63 and not at the default ubatch (moa_cpp/speculative/prefix_cache.py).

    python -m bench.costs batch-invariance [-m MODEL.gguf] [--threads 2]
"""
from __future__ import annotations

import argparse

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from moa_cpp.models import defaults
    from moa_cpp.target.target import Target
    t = Target.from_path(args.model or defaults.default_target(), n_ctx=1024, n_threads=args.threads)
    ids = t.tokenize("The quick brown fox jumps over the lazy dog. " * 30, add_bos=True).tolist()[:300]

    def last_row(n: int, chunk: int) -> np.ndarray:
        t.clear()
        out = None
        for off in range(0, n, chunk):
            part = ids[off:min(n, off + chunk)]
            out = t.decode(part, list(range(off, off + len(part))), capture=False, logits="last")
        return out[-1]

    chunks = (8, 32, 63, 64, 128, 512)
    print("n tokens | " + " | ".join(f"chunk {c}" for c in chunks))
    for n in (40, 64, 65, 80, 128, 200):
        single = last_row(n, 1)
        print(f"{n} | " + " | ".join(f"{float(np.abs(last_row(n, c) - single).max()):.3f}" for c in chunks))
    t.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
