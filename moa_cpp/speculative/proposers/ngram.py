"""N-gram drafts (prompt lookup): the tokens that followed an earlier occurrence of the text's
latest n tokens are proposed as its continuation (Saxena's prompt lookup decoding, llama.cpp's
``ngram-simple``, vLLM's ``ngram``). Free to draft (a dictionary lookup, no model row), so it
pays where output repeats its input: code edits, extraction, summaries, rewrites.

The lookup runs over everything verified so far (prompt + generated) plus the root. Longer keys
are tried first (``n_max`` down to ``n_min``); among the occurrences of the longest key that
matches, the one whose preceding text agrees with the text's end for longest (its *match
length*, counted back up to :data:`MATCH_CAP` tokens) comes first, the most recent among equals
(suffix decoding's idea: the longer the agreement, the likelier the copy goes on; on the greedy
outputs of ``bench/eval/policy_replay.py`` it raised the tokens an 8-draft chain would accept per
cycle by ~12 %). A chain proposes the first continuation; a tree merges several distinct
continuations (``topk`` of them, in that order) into one trie, shared prefixes once. A
continuation that runs into the end of the text goes on with its own tokens (``abcabc`` ->
``abc...``), so repetition loops are drafted in full.

The match length is also what the cost-aware policy conditions its acceptance estimate on
(:attr:`NgramProposer.context`): a match of 16+ tokens is accepted ~7 tokens deep, a 1-token
match less than half the time, so one global estimate drafts too little in a copy and too much
elsewhere.

Drafts are deterministic (no draft distribution): under sampling each is a point mass, which the
verifier's sibling rejection keeps exact (:func:`moa_cpp.speculative.verify.verify_sampling`).
"""
from __future__ import annotations

import bisect
from typing import Optional, Sequence

import numpy as np

from moa_cpp.errors import InvalidArgumentError, MoaError
from moa_cpp.speculative.types import DraftConfig, Proposal, SamplingParams

DEFAULT_N_MIN = 1
DEFAULT_N_MAX = 3
# How far back a match is followed (its length ranks occurrences and sets the policy's context),
# and how many of a key's most recent occurrences are compared: bounds a lookup to ~2,000 token
# compares however often a key recurs.
MATCH_CAP = 64
MAX_CANDIDATES = 32
# The match-length classes the cost-aware policy keeps an acceptance estimate for: 1, 2, 3,
# 4-7, 8-15, 16+ tokens (class index = position in this tuple of lower bounds).
MATCH_CLASSES = (1, 2, 3, 4, 8, 16)


def match_class(length: int) -> int:
    """The index of ``length``'s class in :data:`MATCH_CLASSES` (0 for no match)."""
    return max(0, bisect.bisect_right(MATCH_CLASSES, length) - 1)


class NgramIndex:
    """Every n-gram (n = 1..n_max) of a growing token sequence -> the positions that followed it,
    oldest first. Appending a token costs n_max dictionary updates; a lookup is one read."""

    def __init__(self, n_max: int) -> None:
        self.n_max = n_max
        self.seq: list[int] = []
        self._next: dict = {}          # tuple of n tokens -> [positions p: seq[p-n:p] == key]

    def append(self, tok: int) -> None:
        j = len(self.seq)
        self.seq.append(int(tok))
        # position j now exists: it continues every n-gram that ends just before it
        for n in range(1, min(self.n_max, j) + 1):
            self._next.setdefault(tuple(self.seq[j - n:j]), []).append(j)

    def extend(self, toks: Sequence[int]) -> None:
        for t in toks:
            self.append(t)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens (rare: a rewind; rebuilds the index)."""
        if n >= len(self.seq):
            return
        keep = self.seq[:n]
        self.seq, self._next = [], {}
        self.extend(keep)

    def continuations(self, n_min: int, n_max: int, length: int, limit: int) -> list[tuple[int, int, list]]:
        """Up to ``limit`` distinct continuations of the sequence's end, ``length`` tokens each, as
        (key length, match length, tokens): the longest matching key first; within a key, the
        longest match (see module doc), then the most recent occurrence."""
        seq, out, seen = self.seq, [], set()
        for n in range(min(n_max, len(seq) - 1), n_min - 1, -1):
            starts = self._next.get(tuple(seq[len(seq) - n:]))
            if not starts:
                continue
            recent = starts[-MAX_CANDIDATES:]
            ranked = sorted(((self._match(p, n), p) for p in recent), key=lambda mp: (-mp[0], -mp[1]))
            for m, p in ranked:
                cont = self._continue(p, length)
                key = tuple(cont)
                if key not in seen:
                    seen.add(key)
                    out.append((n, m, cont))
                    if len(out) >= limit:
                        return out
        return out

    def _match(self, p: int, n: int) -> int:
        """How many tokens before position ``p`` equal the sequence's last ones (>= ``n``, the
        key already matched; at most MATCH_CAP)."""
        seq, end, m = self.seq, len(self.seq), n
        while m < MATCH_CAP and p - m - 1 >= 0 and seq[p - m - 1] == seq[end - m - 1]:
            m += 1
        return m

    def _continue(self, p: int, length: int) -> list[int]:
        """seq[p:p+length], going on with its own tokens past the end (periodic text)."""
        seq, end = self.seq, len(self.seq)
        cont: list[int] = []
        for i in range(length):
            q = p + i
            cont.append(seq[q] if q < end else cont[q - end])
        return cont


def trie(continuations: Sequence[Sequence[int]], max_nodes: int) -> tuple[list, list, list]:
    """Merge continuations into one tree, in order (shared prefixes once): (tokens, parents,
    depths) with parents before children, at most ``max_nodes`` nodes."""
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    child: dict = {}                    # (parent node, token) -> node
    for cont in continuations:
        node = -1
        for d, tok in enumerate(cont):
            nxt = child.get((node, tok))
            if nxt is None:
                if len(tokens) >= max_nodes:
                    break
                nxt = len(tokens)
                child[(node, tok)] = nxt
                tokens.append(int(tok))
                parents.append(node)
                depths.append(d + 1)
            node = nxt
    return tokens, parents, depths


class NgramProposer:
    """Prompt-lookup drafts over the verified text (see module doc); a Proposer of the loop.

    ``DraftConfig`` chain/auto: one continuation of up to ``chain`` tokens; tree: up to ``topk``
    distinct continuations of ``depth`` tokens merged into at most ``total`` nodes. Nothing
    matches: an empty proposal (the loop then decodes plainly)."""

    name = "ngram"
    contexts = len(MATCH_CLASSES)   # the cost-aware policy keeps an estimate per match-length class
    needs_capture = False     # reads no target state
    acceptance_prior = None   # learned online by the cost-aware policy
    # per match-length class: conditional acceptance at depths 1 and 2 (deeper: the depth above's
    # estimate), measured on SmolLM2's greedy answers to 320 held-out ShareGPT prompts
    # (bench/data/heldout-s8; not an eval set) with 8-draft chains; learned online from there
    context_priors = ((0.23, 0.58), (0.57, 0.68), (0.67, 0.75), (0.79, 0.84), (0.89, 0.90), (0.98, 0.98))
    row_cost = 0.0            # a lookup, not a model row: the policy counts drafts as free
    # deterministic and reads only the tokens: a batched slot's plain run may look up each next
    # cycle on the engine's decode thread (moa_cpp.speculative.loop._Lookahead)
    engine_lookup = True

    def __init__(self, config: DraftConfig = DraftConfig("chain", chain=4), *, n_min: int = DEFAULT_N_MIN,
                 n_max: int = DEFAULT_N_MAX) -> None:
        if not 1 <= n_min <= n_max:
            raise InvalidArgumentError(f"n-gram sizes: need 1 <= n_min <= n_max, got n_min {n_min}, n_max {n_max}")
        self.config = config
        self.n_min, self.n_max = int(n_min), int(n_max)
        self.index = NgramIndex(self.n_max)
        self._verified = 0              # tokens of index.seq that are verified (the rest: the root)
        self.last_key = 0               # key length behind the last proposal's first draft (0: none)
        self.last_match = 0             # its match length (see module doc; 0: none)

    def reset(self) -> None:
        """Forget everything (a new generation)."""
        self.index = NgramIndex(self.n_max)
        self._verified = self.last_key = self.last_match = 0

    def rewind(self, n: int) -> int:
        """Keep the verified tokens < ``n`` (a reused prompt prefix); returns how many are kept."""
        m = min(int(n), self._verified)
        self.index.truncate(m)
        self._verified, self.last_key, self.last_match = m, 0, 0
        return m

    @property
    def context(self) -> int:
        """The last proposal's match-length class (:func:`match_class`; 0 if none): the context
        the cost-aware policy conditions its acceptance estimate on."""
        return match_class(self.last_match)

    def observe(self, lsa_in: np.ndarray, pos0: int) -> None:  # reads no target state
        pass

    def sync(self, feed: Sequence[int], root: int, pos: int) -> None:
        """Bring the text to verified + [root]: ``feed`` = tokens verified since the last call
        (the previous root first), ``pos`` = the root's position."""
        if self._verified + len(feed) != pos:
            raise MoaError(f"NgramProposer out of step: {self._verified + len(feed)} verified tokens known, the root "
                           f"is at position {pos} (call reset() before a new generation)")
        seq = self.index.seq
        keep = self._verified
        # the previous root is normally feed[0]: keep it (and its index entries) when it is
        if len(seq) > keep and feed and seq[keep] == int(feed[0]):
            keep += 1
            feed = feed[1:]
        self.index.truncate(keep)
        self.index.extend(feed)
        self.index.append(root)
        self._verified = pos

    def propose(self, feed: Sequence[int], root: int, pos: int, sp: SamplingParams,
                rng: Optional[np.random.Generator] = None, config: Optional[DraftConfig] = None) -> Proposal:
        cfg = config or self.config
        self.sync(feed, root, pos)
        self.last_key = self.last_match = 0
        if cfg.mode == "none":
            return Proposal.empty()
        tree = cfg.mode == "tree"
        found = self.index.continuations(self.n_min, self.n_max, cfg.depth if tree else cfg.chain,
                                         cfg.topk if tree else 1)
        if not found:
            return Proposal.empty()
        self.last_key, self.last_match = found[0][0], found[0][1]
        if not tree:
            return Proposal.chain(found[0][2])
        tokens, parents, depths = trie([c for _, _, c in found], cfg.total)
        return Proposal(np.array(tokens, np.int32), np.array(parents, np.int32), np.array(depths, np.int32))

    def __repr__(self) -> str:
        return f"NgramProposer(n {self.n_min}..{self.n_max}, {self.config})"
