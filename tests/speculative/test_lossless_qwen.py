"""Lossless greedy speculation on a K-quant target: Qwen2.5-Coder-0.5B-Instruct Q4_K_M.

On this quantization llama.cpp computes rows of larger batches differently from single-token
decodes (measured: 2-3 row batches bit-identical, 4+ rows differ by up to ~0.5 in the logits
with weight repacking on). The loop therefore caps every verification batch at the target's
measured exact size (:attr:`Target.max_exact_rows`), which makes speculative greedy output equal
plain greedy output token by token, with no near-tie allowance. Checked with an oracle proposer
(long accepted runs, rejections at every depth) in chains longer than the cap and trees. That a
batch one row larger is not exact is tested in test_exactness.py."""
from __future__ import annotations

import pytest

from moa_cpp.speculative.loop import SpeculativeLoop
from moa_cpp.speculative.types import DraftConfig, SamplingParams
from moa_cpp.target.target import Target
from moa_cpp.speculative.proposers import HybridProposer, NgramProposer
from moa_cpp.testing.oracle import OracleProposer

pytestmark = [pytest.mark.model, pytest.mark.slow]

PROMPTS = ["def quicksort(xs):", "# Read a CSV file with pandas and print the mean of each column\n",
           "The difference between a list and a tuple in Python is"]
CHAT = ["Write a Python function that reverses a string.", "What does `git rebase` do? One sentence."]
MAX_TOKENS = 32


def _run(loop, ids, cfg=None):
    toks, st = [], None
    for ev in loop.run(ids, MAX_TOKENS, SamplingParams(), cfg):
        toks += ev.tokens
        st = ev.stats
    return toks, st


@pytest.fixture(scope="module")
def qwen(qwen05b_path):
    t = Target.from_path(qwen05b_path, n_ctx=512, n_batch=128, n_threads=2)
    prompts = [t.tokenize(p).tolist() for p in PROMPTS]
    prompts += [t.tokenize(t.apply_chat_template([{"role": "user", "content": p}]), add_bos=False,
                           special=True).tolist() for p in CHAT]
    plain = SpeculativeLoop(t, None, DraftConfig("none"))
    refs = [_run(plain, ids) for ids in prompts]
    yield t, prompts, refs
    t.close()


def test_batches_are_capped_at_the_measured_exact_size(qwen):
    t, prompts, _ = qwen
    r = t.max_exact_rows
    assert 2 <= r < 63, r            # K-quant rows differ in large batches: the cap is real here
    # the loop caps verification at exactly r rows, whatever the draft shape asks for
    loop = SpeculativeLoop(t, None, DraftConfig("none"))
    assert loop.batch_rows(DraftConfig("chain", chain=8)) == r
    assert loop.batch_rows(DraftConfig("tree", depth=4, topk=2, total=8)) == r


@pytest.mark.parametrize("rate", [0.8, 1.0])
def test_oracle_speculation_is_token_identical(qwen, rate):
    t, prompts, refs = qwen
    seen_rows = []
    for cfg in (DraftConfig("chain", chain=2), DraftConfig("chain", chain=6), DraftConfig("tree", depth=4, topk=2, total=8)):
        for i, (ids, (ref, st)) in enumerate(zip(prompts, refs)):
            reference = ref + ([st.eog_token] if st.finish_reason == "stop" else [])
            loop = SpeculativeLoop(t, OracleProposer(reference, len(ids), rate, t.n_vocab, cfg, seed=i), cfg)
            loop.on_cycle = lambda pos, root, p, sc, v: seen_rows.append(sc.logits.shape[0])
            toks, sst = _run(loop, ids, cfg)
            assert toks == ref, f"{cfg} prompt {i}: diverged from plain greedy at token " \
                                f"{next(k for k in range(min(len(toks), len(ref))) if toks[k] != ref[k])}"
            if rate == 1.0:
                assert sst.tau > 1.5
    assert max(seen_rows) == t.max_exact_rows       # verification batches filled up to the cap


def test_ngram_and_hybrid_are_token_identical(qwen):
    """Prompt lookup alone and merged with an oracle (rate 0.8) into one tree, on the K-quant
    target: every verification batch within the exact cap, output equal to plain greedy."""
    t, prompts, refs = qwen
    seen_rows, accepted = [], {"ngram": 0, "oracle": 0}
    for cfg in (DraftConfig("chain", chain=4), DraftConfig("tree", depth=4, topk=2, total=8)):
        for i, (ids, (ref, st)) in enumerate(zip(prompts, refs)):
            reference = ref + ([st.eog_token] if st.finish_reason == "stop" else [])
            for prop in (NgramProposer(cfg),
                         HybridProposer([OracleProposer(reference, len(ids), 0.8, t.n_vocab, cfg, seed=i),
                                         NgramProposer(cfg)], ["oracle", "ngram"], cfg)):
                loop = SpeculativeLoop(t, prop, cfg)
                loop.on_cycle = lambda pos, root, p, sc, v: seen_rows.append(sc.logits.shape[0])
                toks, sst = _run(loop, ids, cfg)
                assert toks == ref, f"{prop} prompt {i}: diverged from plain greedy"
                for k in accepted:
                    accepted[k] += sst.by_source.get(k, {"accepted": 0})["accepted"]
    assert max(seen_rows) <= t.max_exact_rows
    assert accepted["ngram"] > 0 and accepted["oracle"] > 0
