"""Several proposers as one (``--spec-type moa,ngram``): their drafts merged into one
verification tree, shared prefixes once, so a cycle accepts whichever source guessed right.

Every source drafts the cycle's shape; the merge keeps the sources in priority order, each
proposal in its own order (parents first), so a cut at the end drops the least likely drafts:
the loop cuts what exceeds the exact batch size, and a node budget (``DraftConfig.budget``, set
by the cost-aware policy to the k drafts it priced) cuts the merge. Priority: a free source with
a confident match this cycle (an n-gram key of ``confident_n`` tokens or more) first, else the
order given (``moa,ngram``: the drafter first). A free source whose match this cycle is long
(``skip_models_at`` tokens of agreement or more: ~0.9 of such drafts are accepted on held-out
answers, docs/llama-cpp.md) drafts alone: the model sources only take in the verified tokens, so
a copy costs no drafter time. So does a confident free match that fills the cycle's budget on its
own (greedy): the merge would cut every model draft that is not also on it.

Where the model sources cannot pay at all (the cost-aware policy's choice, :meth:`HybridProposer.
sit_out`), they sit the generation out: not drafting, not taking in the verified tokens, and no
target K/V captured for them (:attr:`HybridProposer.needs_capture` is False), so the lookups cost
what plain decoding does plus the lookup; the next generation's :meth:`HybridProposer.rewind`
catches them up.

Each node records which sources proposed it (:attr:`Proposal.sources`, a bit per source in
:attr:`names` order) so the loop's statistics count proposed / accepted per source.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from moa_cpp.speculative.types import DraftConfig, Proposal, SamplingParams


def merge(proposals: Sequence[Proposal], order: Sequence[int], max_nodes: int) -> Proposal:
    """One tree from several proposals (each parents-before-children): proposals in ``order``,
    each in its own node order, at most ``max_nodes`` nodes. A node whose path from the root
    spells the same tokens as an existing node is that node (its source bit is added). Sampling
    drafts (``q`` set) are not merged: a draft drawn from q must be verified against q alone, so
    the first such proposal is returned as it is."""
    for s in order:
        if proposals[s].q is not None and proposals[s].n:
            out = proposals[s].prefix(max_nodes)
            out.sources = np.full(out.n, 1 << s, np.int64)
            return out
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    sources: list[int] = []
    child: dict = {}                                      # (merged parent, token) -> merged node
    for s in order:
        p = proposals[s]
        node_of: dict = {}                                # its node -> merged node
        for i in range(p.n):
            par = int(p.parents[i])
            if par >= 0 and par not in node_of:
                continue                                  # its parent did not fit
            mp = -1 if par < 0 else node_of[par]
            tok = int(p.tokens[i])
            m = child.get((mp, tok))
            if m is None:
                if len(tokens) >= max_nodes:
                    continue
                m = len(tokens)
                child[(mp, tok)] = m
                tokens.append(tok)
                parents.append(mp)
                depths.append(1 if mp < 0 else depths[mp] + 1)
                sources.append(0)
            sources[m] |= 1 << s
            node_of[i] = m
    return Proposal(np.array(tokens, np.int32), np.array(parents, np.int32), np.array(depths, np.int32),
                    draft_rows=sum(p.draft_rows for p in proposals), sources=np.array(sources, np.int64),
                    warmup_s=sum(p.warmup_s for p in proposals))


def _own(rng):
    """Each source drafts with the same draws (a DrawCursor from the next token on): depth i's
    sampled draft takes the draw that will choose token i, in every source alike."""
    return rng.fresh() if hasattr(rng, "fresh") else rng


class HybridProposer:
    """Proposers merged into one tree a cycle (see module doc); a Proposer of the loop."""

    def __init__(self, proposers: Sequence, names: Sequence[str], config: DraftConfig = DraftConfig("chain", chain=4), *,
                 confident_n: int = 2, skip_models_at: int = 8) -> None:
        if len(proposers) < 2 or len(proposers) != len(names):
            raise ValueError("a hybrid needs two or more proposers, one name each")
        self.proposers = list(proposers)
        self.names = list(names)
        self.config = config
        self.confident_n = confident_n
        self.skip_models_at = skip_models_at      # 0: every source drafts every cycle
        self.skipped = 0                          # cycles the model sources sat out (a statistic)
        self._captures = any(getattr(p, "needs_capture", False) for p in self.proposers)
        self._models_out = False                  # the model sources sit this generation out (sit_out)
        # the first source's prior (the MoA drafter's recorded acceptance) stands for the merge
        self.acceptance_prior = getattr(self.proposers[0], "acceptance_prior", None)
        self.row_cost = None            # measured: the drafter rows of the model sources

    @property
    def needs_capture(self) -> bool:
        """The loop captures the target's K/V for a source that reads it (the MoA drafter), unless
        the model sources sit the generation out (:meth:`sit_out`)."""
        return self._captures and not self._models_out

    def sit_out(self, out: bool = True) -> None:
        """The model sources sit out (the rest of) this generation (``out``), or take part again:
        sitting out, they neither draft nor take in the verified tokens, and the loop captures no
        K/V for them, so they cost nothing. Their state then lags behind the text; the next
        generation's :meth:`rewind` keeps only what every source holds (the loop re-decodes the
        rest with capture where a drafter needs it). Set by the cost-aware policy where their
        rows cannot pay (:func:`~moa_cpp.speculative.cost_aware.seat_model_sources`)."""
        self._models_out = bool(out)

    @property
    def free_source(self):
        """The first free source (prompt lookup), or None: what drafts alone when the model
        sources do not pay (``DraftConfig.free_only``, the cost-aware HybridPolicy)."""
        return next((p for p in self.proposers if p.row_cost == 0.0), None)

    @property
    def context(self) -> int:
        """The free source's context of this cycle (its match-length class), for a policy that
        prices its drafts per match."""
        return getattr(self.free_source, "context", 0)

    @property
    def name(self) -> str:
        return ",".join(self.names)

    def reset(self) -> None:
        for p in self.proposers:
            p.reset()

    def rewind(self, n: int) -> int:
        """Every source keeps what all of them know (they share one feed); a source that cannot
        rewind (an oracle) starts over, and so do the others then."""
        m = min(p.rewind(n) if hasattr(p, "rewind") else 0 for p in self.proposers)
        for p in self.proposers:
            if hasattr(p, "rewind"):
                p.rewind(m)
            else:
                p.reset()
        return m

    def observe(self, lsa_in: np.ndarray, pos0: int) -> None:
        if self._models_out:
            return
        for p in self.proposers:
            if getattr(p, "needs_capture", False):
                p.observe(lsa_in, pos0)

    def propose(self, feed: Sequence[int], root: int, pos: int, sp: SamplingParams,
                rng: Optional[np.random.Generator] = None, config: Optional[DraftConfig] = None) -> Proposal:
        cfg = config or self.config
        # a chain-only source (a draft model) drafts a chain as deep as the tree
        chain = DraftConfig("chain", chain=cfg.depth) if cfg.mode == "tree" else cfg
        free = [s for s, p in enumerate(self.proposers) if p.row_cost == 0.0]
        props: list = [None] * len(self.proposers)
        for s in free:                     # lookups first: a long match spares the models' rows
            props[s] = self.proposers[s].propose(feed, root, pos, sp, _own(rng), cfg)
        confident = next((s for s in free if getattr(self.proposers[s], "last_key", 0) >= self.confident_n
                          and props[s].n), None)
        alone = cfg.free_only or bool(self.skip_models_at) and any(
            props[s].n and getattr(self.proposers[s], "last_match", 0) >= self.skip_models_at for s in free) or (
            # a confident match that fills the budget: the merge would keep none of the models'
            # (deterministic) drafts that are not on it, so their rows would be paid for nothing
            sp.greedy and confident is not None and 0 < cfg.budget <= props[confident].n)
        self.skipped += alone and len(free) < len(props) and not self._models_out
        for s, p in enumerate(self.proposers):
            if props[s] is None:
                if self._models_out:       # not fed either: it lags (sit_out)
                    props[s] = Proposal.empty()
                    continue
                c = DraftConfig("none") if alone else chain if getattr(p, "chains_only", False) else cfg
                props[s] = p.propose(feed, root, pos, sp, _own(rng), c)
        if cfg.mode == "none":
            return Proposal.empty()
        order = list(range(len(props)))
        if confident is not None:
            order.remove(confident)
            order.insert(0, confident)
        return merge(props, order, cfg.budget or sum(p.n for p in props))

    def __repr__(self) -> str:
        return f"HybridProposer({self.name}, {self.config})"
