"""Padded batches: exact continuous batching on targets whose one-row decodes are computed apart.

On some targets a decode of one row takes other kernels than a decode of several (F16 weights on
the CPU: a matrix-vector product for one row, a tiled matrix product for two or more; measured on
Qwen2.5-Coder-1.5B F16: a 2-row batch's logits differ from one-row decodes by up to 0.01, so its
exact batch size is 1), while every batch of two rows or more computes each row alike, bit for
bit. There, sharing a decode between users changes their rows (alone: one row; in company:
several), and no verification batch equals a plain step.

:func:`padded_exact_rows` measures that second property. Where it holds, the batching engine
(:class:`~moa_cpp.target.slots.BatchEngine`, ``pad_rows``) gives every call at least two rows and
two logits rows: a call of one row gets a dummy row after it (same stream, next position, its cell
removed at once), a call that asks for one logits row asks for one more. Then every row of every
slot is computed the multi-row way, alone or in company, plain step or verification: the answers
of a batched server do not depend on the other users, and drafting there is lossless. The price is
a second row when one row is alone: on a memory-bound target (where this matters) ~5-10 % of a step.
"""
from __future__ import annotations

from typing import Any

import numpy as np

# A text long enough for 16 context tokens + 63 rows with any tokenizer (prose and code).
_TEXT = ("The committee met on a rainy Tuesday to review the budget, and after a long discussion about "
         "the costs of the new library, the roads and the school, it decided to postpone the vote. "
         "def merge(a, b):\n    out = []\n    while a and b:\n        out.append(a.pop(0) if a[0] < b[0] "
         "else b.pop(0))\n    return out + a + b\n# 12345 67890 -- the end of the example, for now. ") * 2

_CTX = 16


def padded_exact_rows(target: Any, pad: int = 2, upto: int = 63) -> int:
    """The largest ``M`` <= ``upto`` such that every batch of ``pad``..``M`` rows computes each
    row bit for bit as an ``upto``-row batch does (all rows with logits, and with logits for the
    last ``pad`` rows only), after the same 16-token context; ``pad - 1`` if not even ``pad`` rows
    agree. Uses sequence 0 of the target's KV cache (cleared): call it before it holds anything."""
    toks = np.asarray(target.tokenize(_TEXT), dtype=np.int32)
    upto = int(min(upto, toks.size - _CTX, target.n_batch))
    if upto < pad:
        return pad - 1

    def rows(k: int, last: int = 0) -> np.ndarray:
        outputs = np.ones(k, np.int8)
        if last:
            outputs[:k - last] = 0
        pos = np.arange(_CTX, _CTX + k, dtype=np.int32)
        out = target.decode_rows(toks[_CTX:_CTX + k], pos, [0] * k, outputs, False)
        target.rollback(_CTX)
        return out

    target.clear()
    try:
        target.decode_rows(toks[:_CTX], np.arange(_CTX, dtype=np.int32), [0] * _CTX, np.ones(_CTX, np.int8), False)
        full = rows(upto)
        best = pad - 1
        for k in sorted({pad, pad + 1, 4, 8, 16, 32, upto}):
            if k < pad or k > upto:
                continue
            if not (np.array_equal(rows(k), full[:k]) and np.array_equal(rows(k, pad), full[k - pad:k])):
                return best
            best = k
        return best
    finally:
        target.clear()
