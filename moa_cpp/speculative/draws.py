"""The random draws of a sampled generation, addressed by the index of the token they choose.

Plain sampling chooses token j of a generation with one uniform u_j: the inverse CDF of the
target's distribution p (tokens in id order) at u_j. Speculative sampling here uses the same u_j
for the same token whatever was drafted: the verifier samples the target's token at each row of
the accepted path with its own u_j and follows the child that drafted it (llama.cpp's rule), so a
seeded generation's text is plain sampling's, drafting on or off, any draft shape or drafter state
(issue 41). A drafter that samples its drafts (a chain from q) draws depth i's draft with the
same u_j, from q's inverse CDF: where q is close to p both pick the same token, so acceptance
stays close to speculative sampling's min(1, p/q) rule while the text stays plain sampling's.

The uniforms are one seeded stream, read in blocks (u_j is the j-th number of
``np.random.default_rng(seed)``); ``seed=None`` takes fresh entropy.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

_BLOCK = 256


def inverse_cdf(p: np.ndarray, u: float) -> int:
    """The token whose CDF interval holds ``u`` (tokens in id order; p need not be normalised)."""
    c = np.cumsum(np.asarray(p, dtype=np.float64))
    return int(min(np.searchsorted(c, u * c[-1], side="right"), c.size - 1))


class Draws:
    """u_0, u_1, ...: the uniforms of one sampled generation."""

    def __init__(self, seed: Optional[int]) -> None:
        self._rng = np.random.default_rng(seed)
        self._u = np.empty(0)

    def u(self, j: int) -> float:
        while j >= self._u.size:
            self._u = np.concatenate([self._u, self._rng.random(_BLOCK)])
        return float(self._u[j])

    def sample(self, p: np.ndarray, j: int) -> int:
        """Token j from the distribution ``p``."""
        return inverse_cdf(p, self.u(j))

    def at(self, j: int) -> "DrawCursor":
        """A cursor whose successive draws choose tokens j, j + 1, ..."""
        return DrawCursor(self, j)


class DrawCursor:
    """Successive draws from token ``j`` on, with a ``numpy.random.Generator``-like face for
    drafters (``choice(n, p=q)``, ``random()``) and the verifier (``sample(p)``)."""

    def __init__(self, draws: Draws, j: int) -> None:
        self.draws, self.j0, self.j = draws, j, j

    def sample(self, p: np.ndarray) -> int:
        t = self.draws.sample(p, self.j)
        self.j += 1
        return t

    def next_u(self) -> float:
        """The uniform of the token this cursor chooses next (the verifier samples the target's
        row with it through ``verify.sample_logits``)."""
        u = self.draws.u(self.j)
        self.j += 1
        return u

    def choice(self, n: int, p: np.ndarray) -> int:
        if p is None or len(p) != n:
            raise ValueError("DrawCursor.choice needs p over the n choices")
        return self.sample(p)

    def random(self) -> float:
        u = self.draws.u(self.j)
        self.j += 1
        return u

    def fresh(self) -> "DrawCursor":
        """The same draws from the start (another drafter of a hybrid drafts the same tokens)."""
        return DrawCursor(self.draws, self.j0)
