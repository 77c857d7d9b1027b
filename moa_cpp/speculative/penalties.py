"""Logit bias and repetition penalties on target rows, each row with its own history.

llama.cpp's penalties sampler (as llama-cpp-python 0.3.36 chains it: bias, penalties, then top-k /
top-p / min-p / temperature) looks at the last ``penalty_last_n`` tokens the sampler accepted:
the tokens generated so far (llama-cpp-python never feeds it the prompt). For a token seen ``c``
times there: ``logit /= repeat`` if positive, else ``logit *= repeat``; then
``logit -= c * frequency + presence``.

Under speculation every verification row has its own history: the root's row has the generated
tokens; the row of draft node i has them plus the path from the root to node i (tree branches
differ). A row's distribution is then exactly the one plain decoding would sample from at that
point, so greedy output stays token-identical and sampling stays distribution-exact.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

import numpy as np

from moa_cpp.speculative.types import Proposal, SamplingParams


def _penalize(row: np.ndarray, window: Sequence[int], sp: SamplingParams) -> None:
    for tok, c in Counter(window).items():
        x = row[tok]
        if sp.repeat_penalty != 1.0:
            x = x / sp.repeat_penalty if x > 0 else x * sp.repeat_penalty
        row[tok] = x - c * sp.frequency_penalty - sp.presence_penalty


def adjust_rows(logits: np.ndarray, sp: SamplingParams, generated: Sequence[int],
                proposal: Optional[Proposal] = None) -> np.ndarray:
    """``logits`` [rows, V] with ``sp.logit_bias`` and the penalties applied (a float32 copy).
    Row 0 follows ``generated`` (every token sampled so far, the root last); with a
    ``proposal``, row i + 1 follows ``generated`` plus the path to node i (without one, every
    row follows ``generated``)."""
    if not sp.adjusts_logits:
        return logits
    out = np.array(logits, dtype=np.float32, copy=True)
    for tok, bias in sp.logit_bias:
        out[:, tok] += np.float32(bias)
    if not sp.penalized:
        return out
    n = sp.penalty_last_n if sp.penalty_last_n > 0 else len(generated) + out.shape[0]
    paths: list = [[]]
    if proposal is not None:
        for i in range(proposal.n):
            par = int(proposal.parents[i])
            paths.append((paths[par + 1] if par >= 0 else []) + [int(proposal.tokens[i])])
    tail = list(generated[-n:])
    for r in range(out.shape[0]):
        _penalize(out[r], (tail + (paths[r] if r < len(paths) else []))[-n:], sp)
    return out
