"""Verifiers: pure NumPy in, NumPy out; randomness only from an explicit Generator.

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


def _sample(p: np.ndarray, rng: np.random.Generator) -> int:
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


def verify_sampling(proposal: Proposal, target_logits: np.ndarray, sp: SamplingParams,
                    rng: np.random.Generator) -> Verdict:
    """Distribution-preserving verification.

    At each node the children are tried in order (recursive rejection sampling over siblings):
    - a child drawn from a draft distribution q (``proposal.q``) is accepted with probability
      min(1, p(x) / q(x)); on rejection p <- norm(max(p - q, 0)) (speculative sampling);
    - a deterministic child (arg-max / top-k draft, q = point mass on x) is accepted with
      probability p(x); on rejection p <- norm(p with x removed).
    If every child is rejected, the bonus token is sampled from the residual p. Either way each
    emitted token is distributed exactly as the target's own sampling distribution.
    """
    children = proposal.children()
    path: list[int] = []
    row = 0
    while True:
        p = probs_from_logits(target_logits[row], sp)
        accepted = None
        for c in children[row]:
            x = int(proposal.tokens[c])
            q = proposal.q[c] if proposal.q is not None else None
            if q is None:
                if rng.random() < p[x]:
                    accepted = c
                    break
                p = p.copy()
                p[x] = 0.0
            else:
                qx = float(q[x])
                if qx > 0 and rng.random() < min(1.0, p[x] / qx):
                    accepted = c
                    break
                p = np.maximum(p - q, 0.0)
            s = p.sum()
            if s <= 0:          # numerically no residual mass left: fall back to the target
                p = probs_from_logits(target_logits[row], sp)
                break
            p = p / s
        if accepted is None:
            return Verdict(path, [int(proposal.tokens[i]) for i in path], _sample(p, rng))
        path.append(accepted)
        row = accepted + 1


def verify(proposal: Proposal, target_logits: np.ndarray, sp: SamplingParams,
           rng: Optional[np.random.Generator] = None) -> Verdict:
    """Greedy or sampling verification, by ``sp.temperature``."""
    if sp.greedy:
        return verify_greedy(proposal, target_logits)
    if rng is None:
        raise ValueError("sampling verification needs an explicit np.random.Generator")
    return verify_sampling(proposal, target_logits, sp, rng)
