"""Proposers: the MoA drafter as a chain or an EAGLE-2 dynamic tree (docs/drafter.md#tree, docs/drafter.md#chain).

A proposer owns the drafter's SA bookkeeping: every cycle's first call feeds the tokens that
became verified since the last cycle (K/V only) and drafts the root row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from moa_cpp.drafter.drafter import DrafterState
from moa_cpp.speculative.types import DraftConfig, Proposal, SamplingParams
from moa_cpp.speculative.verify import probs_from_logits


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

    name = "moa"
    needs_capture = True   # the loop must capture the target's K/V for observe()
    row_cost = None        # seconds per drafter row: measured by the loop as it drafts

    def __init__(self, state: DrafterState, config: DraftConfig) -> None:
        self.state = state
        self.config = config
        d2t = state.model.d2t()
        self._d2t = d2t  # reduced draft vocabulary -> target ids (None: identity)
        self.last_tree: Optional[TreeTrace] = None
        # expected conditional acceptance per depth, if the drafter GGUF records one (the
        # trainer's held-out estimate); None: the cost-aware policy starts from its default
        # read by the native loader with the rest of the GGUF (gguf-py's import alone cost a
        # one-shot `moa-cpp generate` ~60 ms)
        self.acceptance_prior = state.model.acceptance()

    def reset(self) -> None:
        """Forget everything (a new generation)."""
        self.state.rollback(0)

    def rewind(self, n: int) -> int:
        """Keep positions < ``n`` (a reused prompt prefix); returns m <= n: the positions whose
        CA entries and SA context both survive (the loop observes and feeds from m on)."""
        st = self.state
        st.rollback(n)
        m = min(st.n_ca, st.n_sa)
        st.rollback(m)
        return m

    def observe(self, lsa_in: np.ndarray, pos0: int) -> None:
        """Commit verified tokens' K/V (LSA -> CA cache) at positions pos0.."""
        self.state.commit(lsa_in, pos0)

    def target_ids(self, draft_ids: np.ndarray) -> np.ndarray:
        """Drafter vocabulary ids -> target ids (the same with no reduced draft vocabulary)."""
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
            return Proposal.empty()
        logits = st.draft([root], [pos], [-1], feed=feed)
        if cfg.mode == "chain":
            return self._chain(logits[0], pos, cfg, sp, rng)
        return self._tree(logits[0], pos, cfg)

    def _chain(self, logits: np.ndarray, pos: int, cfg: DraftConfig, sp: SamplingParams,
               rng: Optional[np.random.Generator]) -> Proposal:
        tokens, qs, rows = [], [], 1
        for i in range(cfg.chain):
            if sp.greedy or rng is None:
                j = int(logits.argmax())
                tok = j if self._d2t is None else int(self._d2t[j])
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
                # row i + 1, child of row i (the root's row is 0): a view, read before the next step
                logits = self.state.draft_next(tok, pos + i + 1, i)
                rows += 1
        return Proposal.chain(tokens, qs, draft_rows=rows)

    def _tree(self, root_logits: np.ndarray, pos: int, cfg: DraftConfig) -> Proposal:
        """EAGLE-2 dynamic tree, as the reference builds it (docs/drafter.md#tree)."""
        K = cfg.topk
        lp = log_softmax(root_logits)
        first = topk_desc(lp, K)
        cand_tok = [self.target_ids(first)]
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
                new_tok.append(self.target_ids(kids))
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
        parent_c = np.concatenate(cand_parent)
        total = min(cfg.total, all_tok.size)
        # Rank by (score desc, index asc): a parent always outranks its children, so the
        # selection is ancestor-closed (docs/drafter.md#tree).
        sel = np.sort(np.lexsort((np.arange(all_score.size), -all_score))[:total])
        node_of = {int(c): i for i, c in enumerate(sel)}
        parents = np.array([-1 if parent_c[c] < 0 else node_of[int(parent_c[c])] for c in sel], np.int32)
        depths = np.zeros(sel.size, np.int32)
        for i, p in enumerate(parents):
            depths[i] = 1 if p < 0 else depths[p] + 1
        self.last_tree = TreeTrace(all_tok, all_score, parent_c, sel)
        return Proposal(all_tok[sel].astype(np.int32), parents, depths, all_score[sel].astype(np.float32),
                        draft_rows=n_rows)
