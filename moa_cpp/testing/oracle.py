"""A proposer that knows the answer: offers a given continuation (e.g. the target's own greedy
output) with planted errors. For tests (long accepted runs, partial acceptance, rejection at
the root, EOS inside an accepted run) and for measuring the speed-up ceiling a trained drafter
approaches at a given per-token acceptance rate. Not a drafter: it reads no target state.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from moa_cpp.speculative.types import DraftConfig, Proposal, SamplingParams


class OracleProposer:
    """Proposes ``reference[i + 1 ..]`` after the root at generated index i; each drafted token
    is kept with probability ``accept_rate`` and otherwise replaced by a wrong token.

    ``alternatives[i]`` (optional): the wrong tokens to choose from at generated index i, e.g. the
    target's own runners-up there (its top-k without the right token). Plausible mistakes are
    what a wrong verifier would accept (a uniformly random id almost never is); without them a
    mistake is a uniformly random other id."""

    needs_capture = False
    name = "oracle"
    acceptance_prior = None   # unknown to the cost-aware policy: it learns it online
    row_cost = 0.0            # drafting costs (almost) nothing: an upper bound for a real drafter

    def __init__(self, reference: Sequence[int], prompt_len: int, accept_rate: float, n_vocab: int,
                 config: DraftConfig, seed: int = 0,
                 alternatives: Optional[Sequence[Sequence[int]]] = None) -> None:
        self.reference = list(map(int, reference))
        self.alternatives = [list(map(int, a)) for a in alternatives] if alternatives is not None else []
        self.prompt_len = prompt_len
        self.accept_rate = accept_rate
        self.n_vocab = n_vocab
        self.config = config
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def observe(self, lsa_in: np.ndarray, pos0: int) -> None:  # no state to keep
        pass

    def _token(self, idx: int) -> int:
        true = self.reference[idx] if 0 <= idx < len(self.reference) else int(self.rng.integers(self.n_vocab))
        if self.rng.random() < self.accept_rate:
            return true
        return self._wrong(idx, true)

    def _wrong(self, idx: int, true: int) -> int:
        alt = [t for t in self.alternatives[idx] if t != true] if 0 <= idx < len(self.alternatives) else []
        if alt:
            return int(alt[self.rng.integers(len(alt))])
        return int((true + 1 + self.rng.integers(self.n_vocab - 1)) % self.n_vocab)

    def propose(self, feed: Sequence[int], root: int, pos: int, sp: SamplingParams,
                rng: Optional[np.random.Generator] = None, config: Optional[DraftConfig] = None) -> Proposal:
        cfg = config or self.config
        i = pos - self.prompt_len            # generated index of the root
        if cfg.mode == "chain":
            toks = [self._token(i + d) for d in range(1, cfg.chain + 1)]
            return Proposal.chain(toks, draft_rows=len(toks))
        # tree: the (noisy) reference path plus one wrong sibling per level, within the budget;
        # the sibling order is random so that accepted paths leave the first-child path too
        toks, parents, depths = [], [], []
        parent = -1
        for d in range(1, cfg.depth + 1):
            if len(toks) + 2 > cfg.total:
                break
            t = self._token(i + d)
            wrong = self._wrong(i + d, t)
            pair = [t, wrong] if self.rng.random() < 0.5 else [wrong, t]
            toks += pair
            parents += [parent, parent]
            depths += [d, d]
            parent = len(toks) - 2 + pair.index(t)
        return Proposal(np.array(toks, np.int32), np.array(parents, np.int32), np.array(depths, np.int32),
                        draft_rows=len(toks))


def runners_up(step_logits: Sequence[np.ndarray], k: int = 4) -> list:
    """``alternatives`` for :class:`OracleProposer` from a plain run's per-step logits
    (``step_logits[j]`` = the row that produced generated token j + 1): at generated index
    j + 1, the target's k best tokens there (the right one is left out when drafting)."""
    alts: list = [[]]                      # generated token 0 comes from the prefill: never drafted
    for row in step_logits:
        row = np.asarray(row)
        alts.append([int(t) for t in np.argsort(-row, kind="stable")[: k + 1]])
    return alts
