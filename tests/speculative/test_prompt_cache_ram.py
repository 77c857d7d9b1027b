"""Copies of earlier generations' KV cells in RAM (PrefixCache.save / restore; llama-server's
--cache-ram): a prompt seen before, after other prompts replaced it in the KV cache, decodes only
its last token, and its answer and logprobs are bit for bit a fresh prefill's (issue 42: the one
user of a server asking the same questions again paid their prefill each time; llama-server
restores them)."""
from __future__ import annotations

import pytest

A = "Explain what a black hole is in simple terms, and why nothing can escape from it."
B = "Write a short poem about autumn leaves."
C = "How do I make a cup of green tea?"


@pytest.fixture(scope="module")
def gen():
    from moa_cpp.models import defaults
    from moa_cpp.generator import SpeculativeGenerator
    g = SpeculativeGenerator.from_paths(defaults.default_target(), defaults.default_drafter(), n_ctx=1024,
                                        n_threads=2, draft="none")
    yield g
    g.close()


def _ask(gen, q, cache=True, settle=True):
    toks, lps = [], []
    for p in gen.stream_steps(q, chat=True, max_tokens=24, logprobs=2, cache_prompt=cache):
        toks += p.tokens
        lps += [(x.token, x.logprob, x.top) for x in p.logprobs]
    if settle:
        gen.loop.settle()
    st = gen.last_stats
    return toks, lps, st.n_cached, st.n_prompt


def test_a_prompt_seen_before_is_restored_exactly(gen):
    pc = gen.loop.prefix
    pc._ram.clear()
    fresh = _ask(gen, A, cache=False, settle=False)
    assert fresh[2] == 0
    _ask(gen, A)                                      # a copy of A (prompt + answer)
    b = _ask(gen, B)                                  # B replaces A in the KV cache
    assert pc.ram_copies == 2 and b[2] < 30           # B shares only the chat template's head with A
    again = _ask(gen, A)
    assert again[2] == again[3] - 1                   # all but the last prompt token restored
    assert again[0] == fresh[0] and again[1] == fresh[1]
    # the KV cache itself still serves the conversation it holds (no restore needed)
    assert _ask(gen, A)[2] == again[3] - 1


def test_copies_stay_within_the_budget(gen):
    pc = gen.loop.prefix
    pc._ram.clear()
    old = pc.ram_bytes
    try:
        pc.ram_bytes = 0                              # off: no copy, B after A decodes A again
        _ask(gen, A)
        _ask(gen, B)
        assert pc.ram_copies == 0 and _ask(gen, A)[2] < 30
        pc.ram_bytes = old
        _ask(gen, B)
        one = sum(c.nbytes for c in pc._ram)
        pc.ram_bytes = int(one * 2.5)                 # room for two copies of this size
        _ask(gen, A)
        _ask(gen, C)
        assert pc.ram_copies == 2                     # the least recently used (B) went first
        assert [c.tokens.size for c in pc._ram] and all(not _is_prefix(gen, B, c.tokens) for c in pc._ram)
    finally:
        pc.ram_bytes = old
        pc._ram.clear()


def _is_prefix(gen, q, tokens) -> bool:
    ids = gen.encode(q, chat=True)
    return list(tokens[:len(ids) - 1]) == ids[:len(ids) - 1]


def test_a_capturing_drafter_never_restores():
    """A drafting MoA generation needs the drafter to hold every position the target keeps:
    a restored copy would skip them, so it decodes instead (and stays lossless)."""
    from moa_cpp.testing.helpers import drafting_default_generator
    g = drafting_default_generator(n_ctx=1024, n_threads=2)
    try:
        fresh = _ask(g, A, cache=False, settle=False)
        _ask(g, A)
        _ask(g, B)
        again = _ask(g, A)
        assert g.last_stats.drafted > 0
        assert again[2] < 30 and again[0] == fresh[0]
    finally:
        g.close()


def test_server_restores_a_users_earlier_prompt():
    """`moa-cpp serve` (one session, --cache-ram's default): A, then B, then A again; the third
    request decodes only A's last prompt token and answers as the first did."""
    from moa_cpp.testing.server_proc import ServerProc
    srv = ServerProc("--draft", "none")
    try:
        def ask(q):
            st, _, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": q}],
                                                         "max_tokens": 16, "temperature": 0})
            assert st == 200, r
            return r["choices"][0]["message"]["content"], r["usage"]
        first, _ = ask(A)
        ask(B)
        again, usage = ask(A)
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1, usage
        assert again == first
    finally:
        assert srv.terminate() == 0


def test_cache_ram_flag():
    import argparse
    from moa_cpp.errors import InvalidArgumentError
    from moa_cpp.server.settings import add_serve_arguments, settings_from_args
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    s = settings_from_args(p.parse_args(["-np", "4", "-cram", "1024"]))
    assert s.cache_ram_bytes() == 256 << 20
    assert settings_from_args(p.parse_args([])).cache_ram_bytes() == 8192 << 20
    assert settings_from_args(p.parse_args(["--cache-ram", "-1"])).cache_ram_bytes() >= 1 << 40
    with pytest.raises(InvalidArgumentError, match="--cache-ram"):
        settings_from_args(p.parse_args(["--cache-ram", "-2"]))
