"""N-gram (prompt lookup) and hybrid proposers, as pure data: what they draft from a token history,
how several proposals merge into one tree, the factory's validation. The real-model checks
(token-identical to plain decoding, the sampling law) are in test_lossless.py,
test_lossless_qwen.py and test_sampling_e2e.py."""
from __future__ import annotations

import numpy as np
import pytest

from moa_cpp.errors import InvalidArgumentError, MoaError
from moa_cpp.speculative.proposers import (HybridProposer, NgramProposer, make_proposer, merge,
                                           parse_spec_type)
from moa_cpp.speculative.proposers.ngram import MATCH_CAP, MAX_CANDIDATES, NgramIndex, match_class, trie
from moa_cpp.speculative.types import DraftConfig, Proposal, SamplingParams, SpecStats

SP = SamplingParams()


def propose_after(p, history, cfg=None):
    """Propose with ``history[:-1]`` verified and ``history[-1]`` as the root."""
    return p.propose(history[:-1], history[-1], len(history) - 1, SP, None, cfg)


def brute_force(seq, n_min, n_max, length):
    """The first continuation by definition: the longest key; among its (MAX_CANDIDATES most
    recent) occurrences the longest match with the text's end (capped at MATCH_CAP), the most
    recent among equals; self-extending. Returns (key length, match length, drafts)."""
    for n in range(min(n_max, len(seq) - 1), n_min - 1, -1):
        key = seq[len(seq) - n:]
        occ = [p for p in range(n, len(seq)) if seq[p - n:p] == key][-MAX_CANDIDATES:]
        if not occ:
            continue

        def match(p):
            m = n
            while m < MATCH_CAP and p - m - 1 >= 0 and seq[p - m - 1] == seq[len(seq) - m - 1]:
                m += 1
            return m
        p = max(occ, key=lambda q: (match(q), q))
        ext = list(seq)
        for i in range(length):
            ext.append(ext[p + i])
        return n, match(p), ext[len(seq):]
    return 0, 0, []


def test_chain_is_the_longest_most_recent_match():
    p = NgramProposer(DraftConfig("chain", chain=4))
    prop = propose_after(p, [5, 1, 2, 3, 4, 9, 1, 2])
    assert prop.tokens.tolist() == [3, 4, 9, 1] and p.last_key == 2 and prop.is_chain()
    # nothing matches: no drafts
    q = NgramProposer(DraftConfig("chain", chain=4))
    assert propose_after(q, [1, 2, 3, 4]).n == 0 and q.last_key == 0


def test_matches_brute_force_on_random_histories():
    rng = np.random.default_rng(0)
    for trial in range(300):
        # every third history long enough for a key to recur more than MAX_CANDIDATES times
        size = int(rng.integers(2, 40)) if trial % 3 else int(rng.integers(100, 300))
        seq = rng.integers(0, 4 if trial % 2 else 12, size=size).tolist()
        n_min, n_max = sorted(rng.integers(1, 5, size=2).tolist())
        p = NgramProposer(DraftConfig("chain", chain=5), n_min=n_min, n_max=n_max)
        prop = propose_after(p, seq)
        n, m, want = brute_force(seq, n_min, n_max, 5)
        assert prop.tokens.tolist() == want and p.last_key == n and p.last_match == m, (seq, n_min, n_max)
        assert p.context == match_class(m)


def test_the_longest_match_wins_over_the_most_recent():
    """Key [8, 1, 2] occurs twice; the older occurrence is preceded by the same 9 as the text's
    end, so its continuation (3) is proposed, not the most recent one's (4)."""
    p = NgramProposer(DraftConfig("chain", chain=1))
    assert propose_after(p, [9, 8, 1, 2, 3, 0, 8, 1, 2, 4, 5, 9, 8, 1, 2]).tokens.tolist() == [3]
    assert p.last_key == 3 and p.last_match == 4 and p.context == match_class(4) == 3


def test_periodic_text_is_drafted_in_full():
    p = NgramProposer(DraftConfig("chain", chain=6))
    assert propose_after(p, [7, 8, 7, 8, 7]).tokens.tolist() == [8, 7, 8, 7, 8, 7]


def test_incremental_sync_equals_a_fresh_index():
    """Fed cycle by cycle (the previous root first in each feed, as the loop does), including
    cycles where nothing is proposed, the index equals one built from the whole text."""
    rng = np.random.default_rng(1)
    text = rng.integers(0, 6, size=120).tolist()
    p = NgramProposer(DraftConfig("chain", chain=3))
    pos, fed = 10, 0
    feed = text[:10]
    while pos < len(text) - 1:
        prop = p.propose(feed, text[pos], pos, SP)
        fresh = NgramProposer(DraftConfig("chain", chain=3))
        assert prop.tokens.tolist() == propose_after(fresh, text[:pos + 1]).tokens.tolist()
        step = int(rng.integers(1, 5))
        feed = text[pos:pos + step]            # the root and the tokens accepted after it
        pos += step
    assert p.index.seq == text[:len(p.index.seq)]


def test_out_of_step_feed_is_an_error():
    p = NgramProposer()
    p.propose([1, 2, 3], 4, 3, SP)
    with pytest.raises(MoaError, match="out of step"):
        p.propose([4], 5, 7, SP)


def test_tree_merges_distinct_continuations():
    p = NgramProposer(DraftConfig("tree", depth=3, topk=3, total=10))
    prop = propose_after(p, [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2])
    # the three continuations of (1, 2), most recent first, each 3 deep
    assert prop.tokens.tolist() == [5, 1, 2, 4, 1, 2, 3, 1, 2]
    assert prop.parents.tolist() == [-1, 0, 1, -1, 3, 4, -1, 6, 7]
    assert prop.depths.tolist() == [1, 2, 3] * 3
    # shared prefixes once, node budget respected
    assert trie([[1, 2, 3], [1, 2, 4], [1, 5]], 10) == ([1, 2, 3, 4, 5], [-1, 0, 1, 1, 0], [1, 2, 3, 3, 2])
    assert trie([[1, 2, 3], [4, 5]], 4)[0] == [1, 2, 3, 4]


def test_index_truncate_rebuilds():
    idx = NgramIndex(2)
    idx.extend([1, 2, 1, 2, 3])
    idx.truncate(3)
    fresh = NgramIndex(2)
    fresh.extend([1, 2, 1])
    assert idx.seq == fresh.seq and idx._next == fresh._next


def test_merge_shares_prefixes_and_records_sources():
    a = Proposal.chain([1, 2, 3])
    b = Proposal.chain([1, 2, 4, 5])
    m = merge([a, b], [0, 1], 10)
    assert m.tokens.tolist() == [1, 2, 3, 4, 5] and m.parents.tolist() == [-1, 0, 1, 1, 3]
    assert m.depths.tolist() == [1, 2, 3, 3, 4] and m.sources.tolist() == [3, 3, 1, 2, 2]
    # priority order first; a budget keeps the first source's drafts
    m = merge([a, b], [1, 0], 4)
    assert m.tokens.tolist() == [1, 2, 4, 5] and m.sources.tolist() == [3, 3, 2, 2]
    # a node whose parent was cut is dropped with it
    m = merge([Proposal.chain([9, 8]), b], [0, 1], 3)
    assert m.tokens.tolist() == [9, 8, 1] and m.parents.tolist() == [-1, 0, -1]


def test_merge_keeps_a_sampled_proposal_alone():
    q = [np.full(5, 0.2), np.full(5, 0.2)]
    sampled = Proposal.chain([1, 2], q)
    m = merge([Proposal.chain([3]), sampled], [0, 1], 10)
    assert m.tokens.tolist() == [1, 2] and m.q is q


class Fixed:
    """A proposer drafting a fixed chain (a stand-in for a model source)."""

    name, needs_capture, acceptance_prior, row_cost = "fixed", True, [0.6], None

    def __init__(self, toks):
        self.toks, self.observed = toks, 0

    def reset(self):
        pass

    def observe(self, lsa_in, pos0):
        self.observed += 1

    def propose(self, feed, root, pos, sp, rng=None, config=None):
        cfg = config or DraftConfig("chain", chain=len(self.toks))
        return Proposal.empty() if cfg.mode == "none" else Proposal.chain(self.toks[:cfg.max_nodes], draft_rows=2)


def test_hybrid_merges_and_prefers_a_confident_free_source():
    ng = NgramProposer()
    h = HybridProposer([Fixed([9, 9]), ng], ["moa", "ngram"], DraftConfig("chain", chain=2))
    assert h.needs_capture and h.acceptance_prior == [0.6] and h.name == "moa,ngram"
    hist = [4, 5, 6, 7, 4, 5]
    # key (4, 5) is 2 tokens long: the n-gram continuation goes first
    prop = propose_after(h, hist, DraftConfig("chain", chain=2))
    assert prop.tokens.tolist() == [6, 7, 9, 9] and prop.sources.tolist() == [2, 2, 1, 1]
    assert prop.draft_rows == 2
    # a budget (the cost-aware policy's k) keeps the preferred source's drafts only
    h.reset()
    prop = propose_after(h, hist, DraftConfig("chain", chain=2, budget=2))
    assert prop.tokens.tolist() == [6, 7]
    # a one-token key is not confident: the model source keeps its priority
    h.reset()
    prop = propose_after(h, [4, 5, 6, 3, 5], DraftConfig("chain", chain=2, budget=2))
    assert prop.tokens.tolist() == [9, 9] and ng.last_key == 1
    h.observe(np.zeros((1, 1)), 0)
    assert h.proposers[0].observed == 1


def test_a_long_match_drafts_alone_and_the_model_source_only_keeps_up():
    """A copy (a match of skip_models_at tokens) is drafted by the lookup alone: the model source
    is asked for no drafts that cycle (config none: it only takes in the feed), so it costs no
    drafter rows; a shorter match leaves both drafting. Under sampling the lookup's point-mass
    chain is then what is verified (exact: the verifier handles q=None drafts)."""
    class Counting(Fixed):
        def __init__(self, toks):
            super().__init__(toks)
            self.modes = []

        def propose(self, feed, root, pos, sp, rng=None, config=None):
            self.modes.append(config.mode)
            return super().propose(feed, root, pos, sp, rng, config)

    model = Counting([9, 9])
    ng = NgramProposer()
    h = HybridProposer([model, ng], ["draft", "ngram"], DraftConfig("chain", chain=2), skip_models_at=4)
    long_hist = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5]      # the end agrees with 5 tokens before 6
    prop = propose_after(h, long_hist, DraftConfig("chain", chain=2))
    assert ng.last_match >= 4 and model.modes == ["none"] and h.skipped == 1
    assert prop.tokens.tolist() == [6, 7] and prop.sources.tolist() == [2, 2]
    h.reset()
    prop = propose_after(h, [4, 5, 6, 7, 4, 5], DraftConfig("chain", chain=2))   # a 2-token match
    assert model.modes[-1] == "chain" and prop.tokens.tolist() == [6, 7, 9, 9] and h.skipped == 1
    # skip_models_at=0: every source drafts every cycle
    h0 = HybridProposer([Counting([9, 9]), NgramProposer()], ["draft", "ngram"], DraftConfig("chain", chain=2),
                        skip_models_at=0)
    prop = propose_after(h0, long_hist, DraftConfig("chain", chain=2))
    assert h0.proposers[0].modes == ["chain"] and prop.tokens.tolist() == [6, 7, 9, 9]


def test_stats_count_per_source():
    st = SpecStats()
    prop = merge([Proposal.chain([1, 2]), Proposal.chain([1, 3])], [0, 1], 10)
    st.record_sources(["moa", "ngram"], prop, [0, 2])          # accepted 1 (both), then 3 (ngram)
    assert st.by_source == {"moa": {"proposed": 2, "accepted": 1}, "ngram": {"proposed": 2, "accepted": 2}}
    st.record_sources(["ngram"], Proposal.chain([5, 6]), [0])
    assert st.by_source["ngram"] == {"proposed": 4, "accepted": 3}


@pytest.mark.parametrize("spec,kinds", [("moa", ("moa",)), ("ngram", ("ngram",)), (" moa , ngram ", ("moa", "ngram")),
                                        ("none", ()), ("", ()), (["draft", "ngram"], ("draft", "ngram"))])
def test_parse_spec_type(spec, kinds):
    assert parse_spec_type(spec) == kinds


@pytest.mark.parametrize("spec,msg", [("eagle", "unknown speculative type"), ("ngram,ngram", "twice"),
                                      ("moa,draft", "cannot be combined")])
def test_parse_spec_type_rejects(spec, msg):
    with pytest.raises(ValueError, match=msg):
        parse_spec_type(spec)


def test_factory_validates_what_each_type_needs():
    class T:
        n_ctx, n_batch = 64, 32
    assert make_proposer("none", T(), DraftConfig("chain", chain=2)) is None
    p = make_proposer("ngram", T(), DraftConfig("chain", chain=2))
    assert isinstance(p, NgramProposer) and p.row_cost == 0.0
    with pytest.raises(InvalidArgumentError, match="MoA drafter"):
        make_proposer("moa", T(), DraftConfig("chain", chain=2))
    with pytest.raises(InvalidArgumentError, match="draft model"):
        make_proposer("draft,ngram", T(), DraftConfig("chain", chain=2))
    with pytest.raises(InvalidArgumentError, match="n_min"):
        NgramProposer(n_min=3, n_max=2)
