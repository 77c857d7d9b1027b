"""Lossless at long contexts, and what "the target's own output" means there.

Measured (SmolLM2 Q4_1, flash attention, this CPU): once the KV cache holds more than ~256
positions, llama.cpp's *multi-threaded one-token decode* takes a split-KV attention path whose
reduction order depends on the thread count, so its logits differ from a 1-thread decode by up
to ~0.9. Rows of a multi-row batch (a verification batch) do not take that path: they equal the
1-thread one-token decode bit for bit, for any thread count. So speculative greedy output is
exactly llama.cpp's 1-thread greedy decoding; against multi-threaded plain decoding it can differ
where two tokens are within that margin (a near-tie), as multi-threaded plain decoding differs
from 1-thread plain decoding itself.

These tests pin that down: local and remote speculative greedy on a ~770-token chat prompt (an
eval-set summarization prompt, on which 2-thread plain decoding flips a near-tie at token 16)
equal to 1-thread plain greedy decoding, token for token. The row property they rest on is a
property of the CPU's kernels (it holds on the AVX2 and AVX-512 EPYCs here): it is measured first
(``row_property``) and the tests skip, with the measured differences, where it does not hold.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from moa_cpp.testing.server_proc import REPO, ServerProc

pytestmark = [pytest.mark.model, pytest.mark.slow]

EVAL = REPO.parent / "shared" / "data" / "eval" / "sum.jsonl"
MAX = 48


@pytest.fixture(scope="module")
def long_prompt() -> str:
    if EVAL.is_file():
        return json.loads(EVAL.read_text().splitlines()[0])["turns"][0]
    # without the eval sets: a long prompt of the same kind (the exactness claim is the same)
    return "Summarize: " + " ".join(f"Paragraph {i}: the committee met again and reviewed the budget, the "
                                    f"schedule and the staffing plan for site {i}." for i in range(40))


@pytest.fixture(scope="module")
def plain_1thread(long_prompt):
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    g = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_threads=1)
    ids = g.encode(long_prompt, chat=True)
    toks = g.generate(long_prompt, chat=True, max_tokens=MAX).tokens
    g.close()
    assert len(ids) > 300
    return toks


@pytest.fixture(scope="module")
def row_property() -> dict:
    """Measured on this CPU: at a 772-token context, do the rows of a 4-row batch equal
    one-token decodes of a 1-thread context bit for bit, with 1 and with 2 threads?"""
    from moa_cpp.models import defaults
    from moa_cpp.target.target import Target
    t1 = Target.from_path(defaults.default_target(), n_ctx=2048, n_threads=1)
    t2 = t1.sibling(n_threads=2)
    ids = np.random.default_rng(0).integers(100, 40000, 780).astype(np.int32)
    n = 772
    rows = {}
    for name, t in (("1", t1), ("2", t2)):
        t.clear()
        for off in range(0, n, t.n_batch):
            ch = ids[off: min(n, off + t.n_batch)]
            t.decode(ch, np.arange(off, off + ch.size, dtype=np.int32), logits="last")
        rows["single" + name] = np.array([t.decode(ids[n + i: n + i + 1], np.array([n + i], np.int32),
                                                   logits="all")[-1] for i in range(4)])
        t.rollback(n)
        rows["batch" + name] = np.array(t.decode(ids[n: n + 4], np.arange(n, n + 4, dtype=np.int32), logits="all"))
    t2.close()
    t1.close()
    d = {k: float(np.abs(rows[k] - rows["single1"]).max()) for k in ("batch1", "batch2", "single2")}
    print("\n[long context] max |x - 1-thread one-token decode|:", d)
    return d


def _needs_row_property(d: dict) -> None:
    if d["batch1"] or d["batch2"]:
        pytest.skip(f"measured on this CPU at 772 tokens: batch rows differ from 1-thread one-token decodes "
                    f"(1 thread {d['batch1']:.3g}, 2 threads {d['batch2']:.3g}), so speculative greedy is "
                    f"not 1-thread plain greedy here by construction")


def test_local_speculative_equals_one_thread_plain(long_prompt, plain_1thread, row_property):
    _needs_row_property(row_property)
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    g = SpeculativeGenerator.from_paths(defaults.default_target(), defaults.default_drafter(), draft="chain:4",
                                        n_threads=2)
    r = g.generate(long_prompt, chat=True, max_tokens=MAX)
    g.close()
    assert r.stats.drafted > 0
    assert r.tokens == plain_1thread


def test_remote_equals_one_thread_plain(long_prompt, plain_1thread, row_property):
    _needs_row_property(row_property)
    pytest.importorskip("msgpack")
    from moa_cpp.models import defaults
    from moa_cpp.remote.client import RemoteGenerator
    srv = ServerProc("--draft", "chain:4", "-t", "2")
    try:
        g = RemoteGenerator(srv.url, drafter=defaults.default_drafter(), target=defaults.default_target(),
                            draft="chain:4")
        r = g.generate(g.chat_prompt([{"role": "user", "content": long_prompt}]), max_tokens=MAX)
        g.close()
    finally:
        assert srv.terminate() == 0
    assert r.tokens == plain_1thread and r.stats.drafted > 0
