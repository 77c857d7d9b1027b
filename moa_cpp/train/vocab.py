"""Reduced draft vocabulary (issue 4; EAGLE-3's ``d2t``): the drafter predicts only the ``V``
target tokens most frequent in the training responses, with its own head over them.

Why: the LM head is most of a draft step's cost (72-83 % for SmolLM2's 49K vocabulary, far more
for Gemma-3's 262K), and most of the soft-CE cost in training. A token outside the draft
vocabulary can never be drafted, so ``V`` trades coverage for speed; the trainer logs the
held-out coverage.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from moa_cpp.train.data import Dataset

__all__ = ["draft_vocab", "response_tokens", "vocab_coverage"]


def response_tokens(ds: Dataset, idx: Sequence[int]) -> np.ndarray:
    """The response token ids of samples ``idx``, concatenated."""
    parts = [ds.tokens[int(ds.offsets[j]) + int(ds.prompt_len[j]):int(ds.offsets[j + 1])] for j in idx]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def draft_vocab(ds: Dataset, idx: Sequence[int], n_vocab: int, size: int) -> np.ndarray:
    """The ``size`` most frequent response tokens of samples ``idx`` (ties: lower id first), always
    including every token that ends a response (the end-of-turn tokens), as sorted target ids."""
    if size <= 0:
        raise ValueError(f"draft vocabulary size {size}: must be positive")
    size = min(size, n_vocab)
    counts = np.bincount(response_tokens(ds, idx), minlength=n_vocab)[:n_vocab].astype(np.int64)
    ends = {int(ds.tokens[int(ds.offsets[j + 1]) - 1]) for j in idx if ds.offsets[j + 1] > ds.offsets[j]}
    order = np.lexsort((np.arange(n_vocab), -counts))  # count desc, then id asc
    chosen = sorted(ends)[:size]
    seen = set(chosen)
    for t in order:
        if len(chosen) >= size:
            break
        if int(t) not in seen:
            chosen.append(int(t))
            seen.add(int(t))
    return np.sort(np.asarray(chosen, dtype=np.int64))


def vocab_coverage(ds: Dataset, idx: Sequence[int], d2t: np.ndarray) -> float:
    """Share of the response tokens of samples ``idx`` that the draft vocabulary ``d2t`` holds."""
    toks = response_tokens(ds, idx)
    return float(np.isin(toks, d2t).mean()) if len(toks) else 0.0
