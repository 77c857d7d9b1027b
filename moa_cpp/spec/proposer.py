"""Proposers: the MoA drafter as a chain or an EAGLE-2 dynamic tree (moa-architecture.md §13, §14).

A proposer owns the drafter's SA bookkeeping: every cycle's first call feeds the tokens that
became verified since the last cycle (K/V only) and drafts the root row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..drafter import DrafterState
from .proposal import Proposal
from .verify import SamplingParams, probs_from_logits


@dataclass(frozen=True)
class DraftConfig:
    """How much to draft per cycle.

    mode "chain": ``chain`` tokens drafted one after another.
    mode "tree": EAGLE-2 dynamic tree with ``depth`` draft levels, ``topk`` children per expanded
    node and frontier width, ``total`` nodes verified (the paper: 6, 8, 62).
    mode "auto": a chain whose length (0..``chain``) is chosen every cycle from the measured
    verify cost T(k) and the acceptance observed so far (:mod:`moa_cpp.spec.cost`).
    mode "none": no drafts (plain decoding through the same loop).
    """

    mode: str = "chain"
    chain: int = 3
    depth: int = 6
    topk: int = 8
    total: int = 62

    def __post_init__(self) -> None:
        if self.mode not in ("chain", "tree", "none", "auto"):
            raise ValueError(f"draft mode {self.mode!r}: expected chain, tree, auto or none")
        if self.mode in ("chain", "auto") and self.chain < 1:
            raise ValueError("chain length must be >= 1")
        if self.mode == "tree" and (self.depth < 1 or self.topk < 1 or self.total < 1):
            raise ValueError("tree depth, topk and total must be >= 1")

    @property
    def max_nodes(self) -> int:
        return {"chain": self.chain, "auto": self.chain, "tree": self.total, "none": 0}[self.mode]

    @property
    def max_draft_rows(self) -> int:
        """Drafter rows per cycle (for sizing the drafter state)."""
        if self.mode in ("chain", "auto"):
            return self.chain
        if self.mode == "tree":
            return 1 + self.topk * max(0, self.depth - 1)
        return 0


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def topk_desc(v: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, descending, ties by lower index."""
    k = min(k, v.size)
    idx = np.argpartition(-v, k - 1)[:k]
    return idx[np.lexsort((idx, -v[idx]))]


@dataclass
class TreeTrace:
    """Every candidate of the last dynamic tree (for checks against the reference)."""

    cand_tokens: np.ndarray
    cand_scores: np.ndarray
    cand_parents: np.ndarray
    selected: np.ndarray


class MoAProposer:
    """Drafts with a :class:`DrafterState` (chain or dynamic tree)."""

    needs_capture = True   # the loop must capture the target's K/V for observe()

    def __init__(self, state: DrafterState, config: DraftConfig) -> None:
        self.state = state
        self.config = config
        d2t = state.model.d2t()
        self._d2t = d2t  # reduced draft vocabulary -> target ids (None: identity)
        self.last_tree: Optional[TreeTrace] = None
        self.draft_rows = 0          # drafter rows run by the last propose (stats)

    def reset(self) -> None:
        """Forget everything (a new generation)."""
        self.state.rollback(0)

    def observe(self, lsa_in: np.ndarray, pos0: int) -> None:
        """Commit verified tokens' K/V (LSA -> CA cache) at positions pos0.."""
        self.state.commit(lsa_in, pos0)

    def _ids(self, draft_ids: np.ndarray) -> np.ndarray:
        return draft_ids.astype(np.int32) if self._d2t is None else self._d2t[draft_ids]

    def propose(self, feed: Sequence[int], root: int, pos: int, sp: SamplingParams,
                rng: Optional[np.random.Generator] = None, config: Optional[DraftConfig] = None) -> Proposal:
        """Draft below ``root`` (at position ``pos``) after feeding ``feed`` (positions
        ``n_sa..pos-1``, the tokens verified since the last cycle)."""
        cfg = config or self.config
        st = self.state
        st.clear_drafts()
        if cfg.mode == "none":
            st.feed(feed)
            self.draft_rows = 0
            return Proposal.empty()
        logits = st.draft([root], [pos], [-1], feed=feed)
        self.draft_rows = 1
        if cfg.mode == "chain":
            return self._chain(logits[0], pos, cfg, sp, rng)
        return self._tree(logits[0], pos, cfg)

    def _chain(self, logits: np.ndarray, pos: int, cfg: DraftConfig, sp: SamplingParams,
               rng: Optional[np.random.Generator]) -> Proposal:
        tokens, qs = [], []
        for i in range(cfg.chain):
            if sp.greedy or rng is None:
                tok = int(self._ids(np.array([int(np.argmax(logits))]))[0])
                qs = None
            else:
                q = probs_from_logits(logits, sp)
                if self._d2t is not None:
                    full = np.zeros(self.state.model.n_target_vocab)
                    full[self._d2t] = q
                    q = full
                tok = int(rng.choice(q.size, p=q))
                qs.append(q)
            tokens.append(tok)
            if i + 1 < cfg.chain:
                logits = self.state.draft([tok], [pos + i + 1])[0]
                self.draft_rows += 1
        n = len(tokens)
        return Proposal(np.array(tokens, np.int32), np.arange(-1, n - 1, dtype=np.int32),
                        np.arange(1, n + 1, dtype=np.int32), None, qs)

    def _tree(self, root_logits: np.ndarray, pos: int, cfg: DraftConfig) -> Proposal:
        """EAGLE-2 dynamic tree, as the reference builds it (§13.2)."""
        K = cfg.topk
        lp = log_softmax(root_logits)
        first = topk_desc(lp, K)
        cand_tok = [self._ids(first)]
        cand_score = [lp[first].astype(np.float32)]
        cand_parent = [np.full(first.size, -1, np.int64)]       # candidate index of the parent
        frontier = np.arange(first.size)                          # candidate indices, by score desc
        row_of: dict[int, int] = {}                               # candidate -> drafter row (root row = 0)
        n_rows = 1
        offset = first.size
        all_tok = np.concatenate(cand_tok)
        all_score = np.concatenate(cand_score)
        for level in range(2, cfg.depth + 1):
            toks = all_tok[frontier]
            parents = [0 if int(p) < 0 else row_of[int(p)] for p in np.concatenate(cand_parent)[frontier]]
            logits = self.state.draft(toks, [pos + level - 1] * len(toks), parents)
            for j, c in enumerate(frontier):
                row_of[int(c)] = n_rows + j
            n_rows += len(toks)
            lps = log_softmax(logits)
            new_tok, new_score, new_parent = [], [], []
            for s, c in enumerate(frontier):
                kids = topk_desc(lps[s], K)
                new_tok.append(self._ids(kids))
                new_score.append(all_score[c] + lps[s][kids])
                new_parent.append(np.full(kids.size, c, np.int64))
            nt, ns, npar = np.concatenate(new_tok), np.concatenate(new_score).astype(np.float32), np.concatenate(new_parent)
            cand_tok.append(nt)
            cand_score.append(ns)
            cand_parent.append(npar)
            all_tok = np.concatenate(cand_tok)
            all_score = np.concatenate(cand_score)
            frontier = offset + topk_desc(ns, K)
            offset += nt.size
        self.draft_rows = n_rows
        parent_c = np.concatenate(cand_parent)
        total = min(cfg.total, all_tok.size)
        # Rank by (score desc, index asc): a parent always outranks its children, so the
        # selection is ancestor-closed (§13.3).
        sel = np.sort(np.lexsort((np.arange(all_score.size), -all_score))[:total])
        node_of = {int(c): i for i, c in enumerate(sel)}
        parents = np.array([-1 if parent_c[c] < 0 else node_of[int(parent_c[c])] for c in sel], np.int32)
        depths = np.zeros(sel.size, np.int32)
        for i, p in enumerate(parents):
            depths[i] = 1 if p < 0 else depths[p] + 1
        self.last_tree = TreeTrace(all_tok, all_score, parent_c, sel)
        return Proposal(all_tok[sel].astype(np.int32), parents, depths, all_score[sel].astype(np.float32))
