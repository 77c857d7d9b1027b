"""Scorer: ONE target decode over the root and every draft node, with K/V capture.

Chains run in sequence 0. Trees use llama.cpp's multi-sequence batches over the unified KV
cache (integration spec §6): every leaf gets its own sequence id, the context is shared with
every leaf sequence, and each node belongs to the sequences of the leaves below it, so a node
attends exactly to the context, its ancestors and itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..target import Target
from .proposal import Proposal, Verdict


@dataclass
class Scores:
    logits: np.ndarray          # [1 + n, V]: row 0 = root, row i + 1 = node i
    leaf_seq: Optional[dict]    # tree only: node index -> sequence id of a leaf below it


class TargetScorer:
    """Verification decodes and the target-side commit (KV rollback)."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def score(self, root: int, pos: int, proposal: Proposal, capture: bool) -> Scores:
        tokens = np.concatenate([[root], proposal.tokens]).astype(np.int32)
        positions = (pos + np.concatenate([[0], proposal.depths])).astype(np.int32)
        if proposal.n == 0 or proposal.is_chain():
            return Scores(self.target.decode(tokens, positions, capture=capture), None)
        children = proposal.children()
        leaves = [i for i in range(proposal.n) if not children[i + 1]]
        if len(leaves) + 1 > self.target.n_seq_max:
            raise ValueError(f"tree has {len(leaves)} leaves; the target context has {self.target.n_seq_max} sequences")
        seqs: list[set] = [set() for _ in range(proposal.n + 1)]   # [0] = root
        leaf_seq = {}
        for k, leaf in enumerate(leaves):
            s = k + 1
            node = leaf
            while node >= 0:
                seqs[node + 1].add(s)
                leaf_seq.setdefault(node, s)
                node = int(proposal.parents[node])
            seqs[0].add(s)
            self.target.seq_cp(0, s, -1, -1)      # the context is visible to every leaf sequence
        logits = self.target.decode(tokens, positions, seq_ids=[sorted(s) for s in seqs], capture=capture)
        return Scores(logits, leaf_seq)

    def commit(self, pos: int, proposal: Proposal, scores: Scores, verdict: Verdict) -> None:
        """Keep the root and the accepted nodes (positions pos..pos+a) in sequence 0; drop the rest."""
        a = verdict.n_accepted
        if scores.leaf_seq is None:
            self.target.rollback(pos + a + 1)
            return
        if a:
            s = scores.leaf_seq[verdict.path[-1]]
            self.target.seq_cp(s, 0, pos, pos + a + 1)
        else:
            # the root alone: it belongs to every leaf sequence; give it back to sequence 0
            self.target.seq_cp(1, 0, pos, pos + 1)
        for s in set(scores.leaf_seq.values()):
            self.target.seq_rm(s, -1, -1)
        self.target.seq_rm(0, pos + a + 1, -1)
