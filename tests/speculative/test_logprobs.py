"""Token logprobs from the verification rows (issue 25 item 1): the loop reports, for every
emitted token, the log-softmax of the row that chose it; under speculation these are the rows
of the verification batch, bit-identical to single-token decodes on SmolLM2 (flash attention,
<= 63 rows), so speculative and plain generations report the same numbers. llama-cpp-python's
own ``logprobs`` (its float32 log-softmax) is the outside reference."""
from __future__ import annotations

import numpy as np
import pytest

from moa_cpp.speculative.loop import token_logprobs

PROMPT = "The capital of France is Paris. The capital of Italy is"


def test_token_logprobs_is_log_softmax_with_sorted_top():
    rng = np.random.default_rng(3)
    rows = rng.normal(0, 3, size=(4, 50)).astype(np.float32)
    rows[2, [7, 9]] = 20.0                                  # a tie: the lower id first
    toks = [1, 5, 9, 0]
    out = token_logprobs(rows, toks, 3)
    for row, tok, lp in zip(rows.astype(np.float64), toks, out):
        ref = row - np.log(np.exp(row - row.max()).sum()) - row.max()
        assert lp.token == tok and lp.logprob == pytest.approx(ref[tok], abs=1e-12)
        ids = [i for i, _ in lp.top]
        assert ids == sorted(range(50), key=lambda i: (-row[i], i))[:3]
        assert all(v == pytest.approx(ref[i], abs=1e-12) for i, v in lp.top)
    assert [i for i, _ in out[2].top][:2] == [7, 9]
    assert token_logprobs(rows, toks, 0)[0].top == ()


@pytest.fixture(scope="module")
def gens():
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    spec = SpeculativeGenerator.from_paths(defaults.default_target(), defaults.default_drafter(), draft="chain:4",
                                           n_threads=1)
    plain = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_threads=1)
    yield spec, plain
    spec.close()
    plain.close()


def _run(gen, ignore_eos=True, **kw):
    toks, lps = [], []
    for p in gen.stream_steps(PROMPT, max_tokens=24, logprobs=4, ignore_eos=ignore_eos, **kw):
        toks += p.tokens
        lps += p.logprobs
    return toks, lps, gen.last_stats


@pytest.mark.model
def test_speculative_logprobs_equal_plain_and_llama_cpp_python(gens):
    spec, plain = gens
    ts, ls, st = _run(spec)
    tp, lp, _ = _run(plain)
    assert st.accepted > 0                                   # drafts really were verified
    assert ts == tp and [x.token for x in ls] == ts and len(ls) == len(ts)
    for a, b in zip(ls, lp):                                 # the same rows, bit for bit
        assert a.logprob == b.logprob and a.top == b.top
        assert a.top[0][0] == a.token and a.top[0][1] == a.logprob       # greedy: the chosen token leads
    from llama_cpp import Llama

    from moa_cpp.models import defaults
    llm = Llama(model_path=defaults.default_target(), n_ctx=512, n_threads=1, flash_attn=True, verbose=False,
                logits_all=True)
    ref = llm.create_completion(PROMPT, max_tokens=24, temperature=0, logprobs=4)["choices"][0]["logprobs"]
    # the same distribution as llama-cpp-python's: with end-of-generation tokens allowed (ignore_eos
    # masks them, and their mass leaves the normalisation)
    te, le, _ = _run(spec, ignore_eos=False)
    n = len(ref["token_logprobs"])
    assert n >= 8 and len(le) == n
    assert np.allclose([x.logprob for x in le], ref["token_logprobs"], atol=1e-4)
    assert "".join(ref["tokens"]) == spec.target.detokenize(te)


@pytest.mark.model
def test_sampled_tokens_get_their_rows_logprobs(gens):
    """Under sampling the emitted token need not lead its row; its logprob is still its own."""
    spec, plain = gens
    ts, ls, _ = _run(spec, temperature=1.0, seed=5)
    tp, lp, _ = _run(plain, temperature=1.0, seed=5)
    assert [x.token for x in ls] == ts and all(x.logprob <= 0 for x in ls)
    assert any(x.top[0][0] != x.token for x in ls + lp)      # some token was not its row's argmax
    for x in ls:
        assert x.logprob <= x.top[0][1] + 1e-12


@pytest.mark.model
def test_stop_string_drops_the_logprobs_after_the_cut(gens):
    spec, _ = gens
    full, lps, _ = _run(spec)
    text = spec.target.detokenize(full)
    stop = text[len(text) // 2: len(text) // 2 + 3]
    pieces, got = [], []
    for p in spec.stream_steps(PROMPT, max_tokens=24, logprobs=0, ignore_eos=True, stop=[stop]):
        pieces.append(p.text)
        got += p.logprobs
    cut = "".join(pieces)
    assert spec.last_stats.finish_reason == "stop" and cut == text[:text.index(stop)]
    joined = b"".join(spec.target.token_bytes(x.token) for x in got).decode("utf-8", "replace")
    assert joined.startswith(cut) and len(joined) - len(spec.target.token_bytes(got[-1].token)) < len(cut)
