"""Scorer: ONE target decode over the root and every draft node, with K/V capture.

Chains run in sequence 0. Trees use llama.cpp's multi-sequence batches over the unified KV
cache (docs/llama-cpp.md#batch-verification): every leaf gets its own sequence id and each node belongs to the
sequences of the leaves below it, so a node attends exactly to the context, its ancestors and
itself; verified tokens (the root, any carried tokens) belong to sequence 0 and every leaf.

Bit-exactness needs more than the right attention set: llama.cpp's attention visits KV cells in
cell order, and a different order rounds differently (measured: up to ~1 logit on SmolLM2
Q4_1, enough to flip near-ties). Plain decoding keeps cells in position order, so the scorer
does too: the batch is laid out as [carry, root, main path (first child of each node), other
nodes], and after verification only the root and the accepted prefix of the main path are kept
(contiguous cells right after the context). Accepted nodes off the main path are dropped and
returned as ``carry``: the next verification batch re-decodes them ahead of its root.
"""
from __future__ import annotations


from typing import Optional

import numpy as np

from moa_cpp.target.target import Target
from moa_cpp.speculative.types import Proposal, Scores, Verdict


def main_path(proposal: Proposal) -> list[int]:
    """Root's first child, its first child, ... (proposers order children best-first)."""
    children = proposal.children()
    path, row = [], 0
    while children[row]:
        node = children[row][0]
        path.append(node)
        row = node + 1
    return path


class TargetScorer:
    """Verification decodes and the target-side commit (KV bookkeeping)."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def score(self, carry: list, root: int, pos: int, proposal: Proposal, capture: bool,
              max_rows: Optional[int] = None) -> Scores:
        """Decode ``carry`` (positions pos-len(carry)..pos-1), the root at ``pos`` and the nodes,
        in one batch of at most ``max_rows`` rows (the caller caps the nodes; a carry too long for
        it is decoded ahead, in exact-sized chunks: rows of larger batches could round differently)."""
        if max_rows is not None and len(carry) + 1 + proposal.n > max_rows:
            head = len(carry) + 1 + proposal.n - max_rows
            if head > len(carry):
                raise ValueError(f"{proposal.n} draft nodes do not fit a {max_rows}-row verification batch")
            for off in range(0, head, max_rows):
                chunk = carry[off: min(head, off + max_rows)]
                p0 = pos - len(carry) + off
                self.target.decode(chunk, np.arange(p0, p0 + len(chunk), dtype=np.int32), capture=False,
                                   logits="last")
            carry = carry[head:]
        n, c = proposal.n, len(carry)
        if n == 0 or proposal.is_chain():
            # a chain (most cycles): carry, root, drafts at consecutive positions, in order
            tokens = np.empty(c + 1 + n, np.int32)
            tokens[:c] = carry
            tokens[c] = root
            tokens[c + 1:] = proposal.tokens
            batch_row = np.arange(c, c + n + 1, dtype=np.int64)
            logits = self.target.decode(tokens, np.arange(pos - c, pos + n + 1, dtype=np.int32), capture=capture)
            return Scores(logits[c:] if c else logits, batch_row, n, list(range(n)), None)
        main = main_path(proposal)
        on_main = set(main)
        order = main + [i for i in range(n) if i not in on_main]          # batch order of the nodes
        tokens = np.array(list(carry) + [root] + [int(proposal.tokens[i]) for i in order], np.int32)
        positions = np.array([pos - c + j for j in range(c + 1)] + [pos + int(proposal.depths[i]) for i in order],
                             np.int32)
        batch_row = np.empty(n + 1, np.int64)
        batch_row[0] = c
        for r, i in enumerate(order):
            batch_row[i + 1] = c + 1 + r
        children = proposal.children()
        leaves = [i for i in range(n) if not children[i + 1]]
        if len(leaves) + 1 > self.target.n_seq_max:
            raise ValueError(f"tree has {len(leaves)} leaves; the target context has {self.target.n_seq_max} sequences")
        node_seqs: list[set] = [set() for _ in range(n)]
        leaf_seq: dict = {}
        for k, leaf in enumerate(leaves):
            s = k + 1
            node = leaf
            while node >= 0:
                node_seqs[node].add(s)
                leaf_seq.setdefault(node, s)
                node = int(proposal.parents[node])
            self.target.seq_cp(0, s, -1, -1)      # the context is visible to every leaf sequence
        verified = [0] + list(range(1, len(leaves) + 1))   # sequence 0 first: the mask uses the first id
        seq_ids = [verified] * (c + 1) + [sorted(node_seqs[i]) for i in order]
        logits = self.target.decode(tokens, positions, seq_ids=seq_ids, capture=capture)
        return Scores(logits[batch_row], batch_row, len(main), main, leaf_seq)

    def commit(self, pos: int, proposal: Proposal, scores: Scores, verdict: Verdict) -> list:
        """Keep the root and the accepted main-path prefix; return the accepted tokens that must
        be re-decoded ahead of the next root (the carry)."""
        a = verdict.n_accepted
        m = 0
        while m < a and m < len(scores.main) and verdict.path[m] == scores.main[m]:
            m += 1
        if scores.leaf_seq is not None:
            if m:
                self.target.seq_cp(scores.leaf_seq[verdict.path[m - 1]], 0, pos + 1, pos + m + 1)
            for s in set(scores.leaf_seq.values()):
                self.target.seq_rm(s, -1, -1)
        self.target.rollback(pos + m + 1)
        return verdict.tokens[m:]
