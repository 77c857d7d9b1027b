"""A generation that reaches the end of the context ends cleanly with finish_reason "length":
no exception, and the KV caches are not corrupted (the next generation is unaffected). Chains,
trees and sampling, on the fixture target with a tiny context."""
from __future__ import annotations

import pytest
from moa_cpp.testing.helpers import fixture_generator


@pytest.fixture(scope="module")
def fx(fixture_dir, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("MOA_CPP_CACHE", str(tmp_path_factory.mktemp("cache")))
    g, gen = fixture_generator(fixture_dir, tmp_path_factory.mktemp("ctx"), n_ctx=256)
    yield g, gen
    gen.close()
    mp.undo()


def _long_prompt(g, n_ctx: int) -> list:
    """A prompt that leaves ~30 positions of the context free."""
    ids = g["prompt_ids"].tolist()
    return (ids * (n_ctx // len(ids) + 1))[: n_ctx - 30]


@pytest.mark.parametrize("draft,temp", [("none", 0.0), ("chain:4", 0.0), ("tree:4,3,12", 0.0),
                                        ("chain:3", 0.9), ("tree:3,2,6", 0.9)])
def test_generation_ends_at_the_context_limit(fx, draft, temp):
    g, gen = fx
    n_ctx = gen.target.n_ctx
    prompt = _long_prompt(g, n_ctx)
    # EOG ignored: the generation must run into the context whatever text it makes
    r = gen.generate(prompt, max_tokens=1000, temperature=temp, seed=3, draft=draft, ignore_eos=True)
    assert r.finish_reason == "length"
    # every position of the context was used: the prompt, then each emitted token but the last
    # (which is sampled from the final position's logits and never needs a cell)
    assert len(prompt) + len(r.tokens) == n_ctx + 1, (len(prompt), len(r.tokens), n_ctx)
    if temp == 0.0:
        plain = gen.generate(prompt, max_tokens=1000, draft="none", ignore_eos=True)
        assert r.tokens == plain.tokens
    # the caches are intact: a short generation afterwards is the fixture's own greedy output
    again = gen.generate(g["prompt_ids"].tolist(), max_tokens=8, draft="chain:3")
    assert again.tokens == g["target_greedy"][:8].tolist()


def test_prompt_longer_than_the_context_is_a_clear_error(fx):
    g, gen = fx
    with pytest.raises(ValueError, match="does not fit the context"):
        gen.generate(g["prompt_ids"].tolist() * 40, max_tokens=4)
