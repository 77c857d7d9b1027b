"""Prompt-cache reuse (issue 25 item 4): a prompt that shares a prefix with what a generator's
caches hold decodes only the rest, in the target and in the drafter.

On SmolLM2 here batches of up to 63 rows compute every row bit for bit as a single-token decode
does (64+ rows take another kernel: logits differ by up to ~1). With ``n_ubatch`` 32 every batch
is such a batch, so a reused prefix holds exactly the K/V a fresh prefill computes: the answers
of a multi-turn chat (MoA drafting, chains and trees) must equal those of a fresh context token
for token, and the drafter's CA cache must equal a fresh one's. With larger ubatches a reused
prefix's K/V differ from a fresh prefill's in the last bits, as in llama.cpp's own prompt cache
(bench/serve/prompt_cache.py counts the answers that change).
"""
from __future__ import annotations

import numpy as np
import pytest

from moa_cpp import SpeculativeGenerator
from moa_cpp.models import defaults
from moa_cpp.testing.helpers import drafting_default_generator
from moa_cpp.speculative.proposers import moa_state

pytestmark = pytest.mark.model

EXACT = dict(n_batch=512, n_ubatch=32)       # every decode <= 63 rows: batch-invariant here
TURNS = ["What is the capital of France?", "And of Germany?", "Tell me a fact about Berlin.",
         "Write a haiku about it."]


@pytest.fixture(scope="module")
def gens():
    spec = drafting_default_generator(n_ctx=1024, n_threads=2, target_options=EXACT)
    fresh = SpeculativeGenerator.from_paths(defaults.default_target(), defaults.default_drafter(), n_ctx=1024,
                                            n_threads=2, target_options=EXACT)
    yield spec, fresh
    spec.close()
    fresh.close()


def _ca(gen, n):
    k, v = moa_state(gen.proposer).ca_cache()
    return k[:, :n], v[:, :n]


def test_chat_turns_reuse_the_prefix_exactly(gens):
    spec, fresh = gens
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    prev_len = 0
    for i, turn in enumerate(TURNS):
        msgs.append({"role": "user", "content": turn})
        draft = "chain:4" if i % 2 else "tree:4,4,16"
        r = spec.generate(msgs, chat=True, max_tokens=40, draft=draft)
        ref = fresh.generate(msgs, chat=True, max_tokens=40, draft=draft, cache_prompt=False)
        assert r.tokens == ref.tokens, (i, r.text, ref.text)
        st = r.stats
        assert ref.stats.n_cached == 0
        if i == 0:
            assert st.n_cached == 0
        else:
            # the previous turn's prompt and most of its answer were in the caches
            assert prev_len <= st.n_cached < st.n_prompt
            assert st.drafted > 0
        # the drafter's CA cache of the prompt is the one a fresh prefill leaves
        for a, b in zip(_ca(spec, st.n_prompt), _ca(fresh, st.n_prompt)):
            np.testing.assert_array_equal(a, b)
        prev_len = st.n_prompt
        msgs.append({"role": "assistant", "content": r.text})


def test_what_invalidates_the_cache(gens):
    spec, fresh = gens
    p = "The quick brown fox jumps over the lazy dog. The dog"
    spec.generate(p, max_tokens=8)
    r = spec.generate(p + " sleeps.", max_tokens=8)
    assert r.stats.n_cached >= len(spec.encode(p, False)) - 1
    spec.target.clear()                         # someone else wrote the KV cache
    r = spec.generate(p, max_tokens=8)
    assert r.stats.n_cached == 0
    spec.target.rollback(3)                     # ... or dropped part of it
    r2 = spec.generate(p, max_tokens=8)
    assert r2.stats.n_cached == 0 and r2.tokens == r.tokens
    r3 = spec.generate(p, max_tokens=8, cache_prompt=False)
    assert r3.stats.n_cached == 0 and r3.tokens == r.tokens
    other = spec.generate("Completely different words here.", max_tokens=8)
    assert other.stats.n_cached <= 1            # BOS at most
    # the whole prompt cached: its last token is decoded again (its row gives the first token)
    spec.generate(p, max_tokens=8)
    again = spec.generate(p, max_tokens=8)
    assert again.stats.n_cached == again.stats.n_prompt - 1 and again.tokens == r.tokens
    # a generation that did not draft leaves the drafter empty: the next drafting one re-decodes
    spec.generate(p, max_tokens=8, draft="none")
    d = spec.generate(p + " sleeps.", max_tokens=8, draft="chain:3")
    assert d.stats.n_cached == 0 and d.stats.drafted > 0
    ref = fresh.generate(p + " sleeps.", max_tokens=8, draft="chain:3", cache_prompt=False)
    assert d.tokens == ref.tokens


def test_ngram_and_plain_reuse(gens):
    """Proposers without target K/V (n-gram) keep their index of the prefix; plain decoding
    reuses the target's cache alone."""
    _, fresh = gens
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, n_ctx=1024, n_threads=2,
                                          spec_type="ngram", draft="chain:4", target_options=EXACT)
    try:
        text = "def add(a, b):\n    return a + b\n\nRewrite add with type hints:\n"
        r1 = gen.generate(text, max_tokens=24)
        r2 = gen.generate(text + r1.text + "\nNow subtract:\n", max_tokens=24)
        assert r2.stats.n_cached > len(gen.encode(text, False))
        ref = fresh.generate(text + r1.text + "\nNow subtract:\n", max_tokens=24, draft="none", cache_prompt=False)
        assert r2.tokens == ref.tokens
    finally:
        gen.close()


def test_server_sends_a_chat_to_the_session_holding_it():
    """`moa-cpp serve --parallel 2`: two conversations alternate; each next turn goes to the
    session whose caches hold its earlier turns (usage.prompt_tokens_details.cached_tokens) --
    the second conversation's first turn goes to the other session although the first one's
    holds the shared system prompt -- and `cache_prompt: false` decodes the whole prompt."""
    from moa_cpp.testing.server_proc import ServerProc
    srv = ServerProc("--parallel", "2", "--draft", "none", "-ub", "32")
    try:
        chats = {"a": [{"role": "user", "content": "Tell me about cats."}],
                 "b": [{"role": "user", "content": "Explain the rules of chess briefly."}]}
        for turn in range(2):
            for name, msgs in chats.items():
                st, _, r = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 16, "temperature": 0})
                assert st == 200, r
                cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
                if turn == 0:     # a fresh session: nothing cached
                    assert cached == 0, r["usage"]
                else:     # the whole earlier exchange (but the last answer token, never decoded)
                    assert cached >= r["usage"]["prompt_tokens"] - 24, (name, r["usage"])
                msgs += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "Go on."}]
        st, _, r = srv.post("/v1/chat/completions", {"messages": chats["a"], "max_tokens": 4, "temperature": 0,
                                                     "cache_prompt": False})
        assert st == 200 and r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        assert srv.terminate() == 0
