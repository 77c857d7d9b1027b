"""Plain data passed between proposer, scorer and verifier."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np


@dataclass
class Proposal:
    """Draft nodes below the root (the root itself is the last emitted token, not a draft).

    Nodes are in an order where parents precede children.
    """

    tokens: np.ndarray                 # int32 [n] target token ids
    parents: np.ndarray                # int32 [n] index of the parent node, -1 = the root
    depths: np.ndarray                 # int32 [n] 1 = child of the root
    scores: Optional[np.ndarray] = None    # float32 [n] cumulative draft log-prob (tree ranking)
    # Sampling only: the draft distribution each node was drawn from ("q"), per node, over the
    # target vocabulary; None for deterministic (arg-max / top-k) drafts.
    q: Optional[list] = None

    @property
    def n(self) -> int:
        return int(self.tokens.size)

    @staticmethod
    def empty() -> "Proposal":
        z = np.zeros(0, np.int32)
        return Proposal(z, z.copy(), z.copy(), np.zeros(0, np.float32))

    def prefix(self, k: int) -> "Proposal":
        """The first k nodes (ancestor-closed: parents precede children)."""
        if k >= self.n:
            return self
        cut = slice(0, max(0, k))
        return Proposal(self.tokens[cut], self.parents[cut], self.depths[cut],
                        None if self.scores is None else self.scores[cut],
                        None if self.q is None else self.q[cut])

    def children(self) -> list[list[int]]:
        """children[i + 1] = child node indices of node i; children[0] = the root's children."""
        ch: list[list[int]] = [[] for _ in range(self.n + 1)]
        for i, p in enumerate(self.parents.tolist()):
            ch[p + 1].append(i)
        return ch

    def is_chain(self) -> bool:
        return bool(np.all(self.parents == np.arange(-1, self.n - 1)))


@dataclass
class Verdict:
    """Outcome of verifying one proposal."""

    path: list[int]          # accepted node indices, root to leaf (may be empty)
    tokens: list[int]        # accepted draft tokens (= proposal.tokens[path])
    bonus: int               # the target's own token after the accepted path
    n_accepted: int = field(init=False)

    def __post_init__(self) -> None:
        self.n_accepted = len(self.path)
