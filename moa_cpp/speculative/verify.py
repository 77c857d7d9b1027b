"""Verifiers: pure NumPy in, NumPy out; randomness only from explicit draws (a DrawCursor or a Generator).

Row 0 of ``target_logits`` is the root's row (it predicts depth-1 tokens); row ``i + 1`` is node
``i``'s row (it predicts node i's children).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .types import Proposal, SamplingParams, Verdict


def probs_from_logits(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """The sampling distribution as float64 [V], in llama.cpp's (and llama-cpp-python's) chain
    order: top-k, top-p, min-p on the untempered distribution, then the temperature over the
    tokens left. (Logit bias and penalties come before, on the rows: ``penalties.adjust_rows``.)"""
    x = np.asarray(logits, dtype=np.float64)
    keep = np.isfinite(x)
    if sp.top_k and 0 < sp.top_k < x.size:
        kth = np.partition(x, -sp.top_k)[-sp.top_k]
        keep &= x >= kth
    if sp.top_p < 1.0 or sp.min_p > 0.0:
        z = np.where(keep, x, -np.inf)
        p = np.exp(z - z.max())
        p /= p.sum()
        if sp.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            c = np.cumsum(p[order])
            top = np.zeros_like(keep)
            top[order[c - p[order] < sp.top_p]] = True       # smallest prefix with mass >= top_p
            keep &= top
        if sp.min_p > 0.0:
            keep &= p >= sp.min_p * p.max()                  # the most likely token always stays
    z = np.where(keep, x / sp.temperature, -np.inf)
    p = np.exp(z - z.max())
    return p / p.sum()


def _sample(p: np.ndarray, rng) -> int:
    """One draw from ``p``: a :class:`~moa_cpp.speculative.draws.DrawCursor` (the generation's
    draw for the next token) or a ``numpy.random.Generator``."""
    if hasattr(rng, "sample"):
        return int(rng.sample(p))
    return int(rng.choice(p.size, p=p))


def verify_greedy(proposal: Proposal, target_logits: np.ndarray, sp: SamplingParams = SamplingParams(),
                  rng: Optional[np.random.Generator] = None) -> Verdict:
    """Longest path whose every token equals the target's arg-max at its parent's row; ties
    between equally long paths go to the first in node order. Bonus = arg-max at the last
    accepted row. Output is token-identical to plain greedy decoding."""
    am = np.asarray(target_logits).argmax(-1)
    children = proposal.children()
    path: list[int] = []
    row = 0                                      # the root's row
    while True:
        want = int(am[row])
        nxt = next((c for c in children[row] if int(proposal.tokens[c]) == want), None)
        if nxt is None:
            break
        path.append(nxt)
        row = nxt + 1
    return Verdict(path, [int(proposal.tokens[i]) for i in path], int(am[row]))


def verify_sampling(proposal: Proposal, target_logits: np.ndarray, sp: SamplingParams, rng) -> Verdict:
    """Distribution-preserving verification (llama.cpp's rule): at each row of the path, the
    target's token is sampled from its own distribution with one draw, and the child that drafted
    it is followed; the first row whose token no child drafted ends the path (that token is the
    bonus). Every emitted token is sampled from the target's distribution at its row, so the law
    is the target's whatever was drafted. With ``rng`` a cursor of the generation's draws
    (:mod:`~moa_cpp.speculative.draws`), token j is chosen by the same draw as in plain sampling:
    the text is plain sampling's. A deterministic child (top-k, n-gram) is taken with probability
    p(x), as recursive rejection sampling takes it; a child a drafter sampled from q with the same
    draw is taken where both inverse CDFs meet (``proposal.q`` is not needed)."""
    children = proposal.children()
    path: list[int] = []
    row = 0
    while True:
        t = _sample(probs_from_logits(target_logits[row], sp), rng)
        nxt = next((c for c in children[row] if int(proposal.tokens[c]) == t), None)
        if nxt is None:
            return Verdict(path, [int(proposal.tokens[i]) for i in path], t)
        path.append(nxt)
        row = nxt + 1


def verify(proposal: Proposal, target_logits: np.ndarray, sp: SamplingParams, rng=None) -> Verdict:
    """Greedy or sampling verification, by ``sp.temperature``."""
    if sp.greedy:
        return verify_greedy(proposal, target_logits)
    if rng is None:
        raise ValueError("sampling verification needs its draws (a DrawCursor or np.random.Generator)")
    return verify_sampling(proposal, target_logits, sp, rng)
