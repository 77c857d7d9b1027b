"""Verifiers: pure NumPy in, NumPy out; randomness only from explicit draws (a DrawCursor or a Generator).

Row 0 of ``target_logits`` is the root's row (it predicts depth-1 tokens); row ``i + 1`` is node
``i``'s row (it predicts node i's children).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from moa_cpp.speculative.types import Proposal, SamplingParams, Verdict


def candidate_probs(logits: np.ndarray, sp: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The sampling distribution over its candidates: ``(ids, p)``, ids ascending, p float64 and
    normalised, in llama.cpp's (and llama-cpp-python's) chain order: top-k, top-p, min-p on the
    untempered distribution, then the temperature over the tokens left. (Logit bias and
    penalties come before, on the rows: ``penalties.adjust_rows``.)

    Only the candidates are sorted or exponentiated twice: with llama.cpp's defaults (top-k 40)
    a token costs an O(V) selection, not a vocabulary-wide sort and float64 vectors (the loop's
    own cost on GPU-speed decodes). Top-p without top-k sorts a growing prefix (the m most
    likely, all ties at the m-th included), which is exactly the stable full sort's prefix, so
    its running sums have the same bits; the prefix grows until its mass reaches top_p."""
    x = np.asarray(logits)
    if sp.top_k and 0 < sp.top_k < x.size:
        ids = np.argpartition(x, -sp.top_k)[-sp.top_k:]
        kth = x[ids].min()
        ids = np.flatnonzero(x >= kth)                      # every tie at the k-th stays (as before)
    else:
        ids = np.arange(x.size)
    xs = x[ids].astype(np.float64)
    fin = np.isfinite(xs)
    if not fin.all():
        ids, xs = ids[fin], xs[fin]
    if ids.size == 0:
        raise ValueError("no token has a finite logit")
    if sp.top_p < 1.0 or sp.min_p > 0.0:
        p = np.exp(xs - xs.max())
        p /= p.sum()
        keep = np.ones(ids.size, bool)
        if sp.top_p < 1.0:
            keep = _nucleus(p, sp.top_p)
        if sp.min_p > 0.0:
            keep &= p >= sp.min_p * p.max()                 # the most likely token always stays
        if not keep.all():
            ids, xs = ids[keep], xs[keep]
    z = xs / sp.temperature
    p = np.exp(z - z.max())
    return ids, p / p.sum()


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """Mask of the smallest stable-sorted prefix (probability descending, id ascending among
    ties) whose mass reaches ``top_p``: a token stays if the mass before it is below top_p."""
    n = p.size
    m = min(n, 64)
    while True:
        if m < n:
            thr = np.partition(p, n - m)[n - m]             # the m-th largest
            sel = np.flatnonzero(p >= thr)                  # a prefix of the stable sort, ties whole
        else:
            sel = np.arange(n)
        sel = sel[np.lexsort((sel, -p[sel]))]
        ps = p[sel]
        c = np.cumsum(ps)
        if sel.size == n or c[-1] >= top_p:
            keep = np.zeros(n, bool)
            keep[sel[c - ps < top_p]] = True
            return keep
        m *= 4


def probs_from_logits(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """:func:`candidate_probs` as a dense float64 [V] (zeros outside the candidates)."""
    ids, p = candidate_probs(logits, sp)
    out = np.zeros(np.asarray(logits).size)
    out[ids] = p
    return out


def sample_logits(logits: np.ndarray, sp: SamplingParams, u: float) -> int:
    """The token plain sampling chooses with uniform ``u``: the inverse CDF (tokens in id order)
    of :func:`probs_from_logits`, computed over the candidates only. The zeros between them add
    nothing to a running sum, so this equals ``draws.inverse_cdf(probs_from_logits(...), u)``
    bit for bit, except that u * total landing on the total by rounding takes the last candidate
    rather than the vocabulary's last token."""
    ids, p = candidate_probs(logits, sp)
    c = np.cumsum(p)
    return int(ids[min(int(np.searchsorted(c, u * c[-1], side="right")), ids.size - 1)])


def _sample(p: np.ndarray, rng) -> int:
    """One draw from ``p``: a :class:`~moa_cpp.speculative.draws.DrawCursor` (the generation's
    draw for the next token) or a ``numpy.random.Generator``."""
    if hasattr(rng, "sample"):
        return int(rng.sample(p))
    return int(rng.choice(p.size, p=p))


def _sample_row(logits: np.ndarray, sp: SamplingParams, rng) -> int:
    """One draw of the target's token at a row: a draw cursor's next uniform through
    :func:`sample_logits` (as plain sampling chooses it), else ``rng.choice`` over the dense row."""
    if hasattr(rng, "next_u"):
        return sample_logits(logits, sp, rng.next_u())
    return _sample(probs_from_logits(logits, sp), rng)


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
        t = _sample_row(target_logits[row], sp, rng)
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
