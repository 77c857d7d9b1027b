"""Continuous batching's engine (moa_cpp/target/slots.py): slots of one context decoded in one
batch give each slot the logits and K/V it gets alone, bit for bit, on a real model."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from moa_cpp.models import registry as models
from moa_cpp.errors import InvalidArgumentError
from moa_cpp.target.target import Target
from moa_cpp.target.slots import BatchEngine
from moa_cpp.target.ubatch_order import split_equal_order

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3,
         "Once upon a time in a land far away, there lived",
         "def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)\n# now"]


def test_split_equal_order_lays_out_equal_runs():
    # seqs 0 and 1 with 3 and 1 tokens: a ubatch of one token each, then seq 0's other two
    assert split_equal_order([0, 0, 0, 1], 512) == ([0, 3, 1, 2], [2, 2])
    # a gap in the sequence ids (0, 2) is not one run: seq 0 first, then seq 2
    assert split_equal_order([0, 2, 2], 512) == ([0, 1, 2], [1, 2])
    # n_ubatch caps the tokens per ubatch: 2 seqs x 2 tokens, then the rest
    order, sizes = split_equal_order([0] * 5 + [1] * 5, 4)
    assert sizes == [4, 4, 2] and sorted(order) == list(range(10))


@pytest.fixture(scope="module")
def targets():
    p = models.smollm2_path()
    ref = Target.from_path(p, n_ctx=1024, n_threads=2)
    base = Target.from_path(p, n_ctx=3 * 1024, n_threads=2, n_seq_max=3, kv_unified=False)
    yield ref, BatchEngine(base, 3, 63)
    ref.close()
    base.close()


def _run(t, toks, slot, steps=16):
    """Prefill, then verification batches of 1..5 rows (different per slot), keeping one row."""
    t.clear()
    lg = t.decode(toks, np.arange(len(toks)), capture=True)
    out = [(lg, t.captured_lsa_in())]
    n, tok = len(toks), int(np.argmax(lg[-1]))
    for i in range(steps):
        k = 1 + (i * (slot + 1)) % 5
        rows = [tok] + [(tok + j) % 1000 for j in range(1, k)]
        lg = t.decode(rows, np.arange(n, n + k), capture=True)
        out.append((lg, t.captured_lsa_in()))
        t.rollback(n + 1)
        n, tok = n + 1, int(np.argmax(lg[0]))
    return out


def _on_slots(engine, n, work):
    """``work(i)`` for slots 0..n-1 at once, one thread each (as the server's sessions run)."""
    got: list = [None] * n
    errors: list = []

    def slot(i):
        engine.enter(i)
        try:
            got[i] = work(i)
        except BaseException as e:     # reported below
            errors.append(e)
        finally:
            engine.leave(i)
    threads = [threading.Thread(target=slot, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    return got


def _concurrently(engine, ids):
    return _on_slots(engine, len(ids), lambda i: _run(engine.slot(i), ids[i], i))


def test_batched_slots_get_their_solo_rows_bit_for_bit(targets):
    ref, engine = targets
    ids = [ref.tokenize(x) for x in TEXTS]
    solo = [_run(ref, x, s) for s, x in enumerate(ids)]
    batches0, calls0 = engine.batches, engine.calls
    got = _concurrently(engine, ids)
    # the three slots really shared decodes (17 steps each; the prefills do not fit one call)
    assert engine.batches - batches0 <= 17 + 2
    assert engine.calls - calls0 < 3 * 17
    _assert_same(solo, got)


def _assert_same(want, got):
    for i in range(len(got)):
        for step, ((l0, c0), (l1, c1)) in enumerate(zip(want[i], got[i])):
            assert np.array_equal(l0, l1), f"slot {i} step {step}: logits differ from the solo decode"
            assert np.array_equal(c0, c1), f"slot {i} step {step}: captured K/V differ from the solo decode"


def test_slot_keeps_to_its_sequence(targets):
    ref, engine = targets
    s0, s1 = engine.slot(0), engine.slot(1)
    s0.clear()
    s1.clear()
    s1.decode(ref.tokenize("hello there"), capture=False)
    n1 = s1.n_past
    s0.decode(ref.tokenize("a b c d e f"), capture=False)
    s0.rollback(2)
    assert s0.n_past == 2 and s1.n_past == n1          # the other slot's cells are untouched
    s0.clear()
    assert s0.n_past == 0 and s1.n_past == n1
    with pytest.raises(InvalidArgumentError, match="one sequence"):
        s0.decode([1, 2], [0, 1], seq_ids=[[0, 1], [1]])
    with pytest.raises(InvalidArgumentError, match="no-cont-batching"):
        s0.seq_cp(0, 1)
    assert s0.n_ctx == 1024 and s0.n_vocab == ref.n_vocab


# ---------------------------------------------------------------- padded batches (moa_cpp/target/batch_pad.py)


class _PaddedSolo:
    """A context of its own whose one-row decodes get a dummy second row (then removed): the
    rows a padded engine gives a slot, alone or in company."""

    def __init__(self, t):
        self.t, self._lsa = t, None

    def clear(self):
        self.t.clear()

    def rollback(self, n):
        self.t.rollback(n)

    def captured_lsa_in(self):
        return self._lsa

    def decode(self, toks, pos, capture=True):
        toks, pos = [int(x) for x in toks], np.asarray(pos)
        if len(toks) > 1:
            lg = self.t.decode(toks, pos, capture=capture)
            self._lsa = self.t.captured_lsa_in()
            return lg
        lg = self.t.decode(toks * 2, np.append(pos, pos[-1] + 1), capture=capture)
        self._lsa = self.t.captured_lsa_in()[:1]
        self.t.rollback(int(pos[-1]) + 1)
        return lg[:1]


def _differs(a, b) -> bool:
    return any(not np.array_equal(x[0], y[0]) for x, y in zip(a, b))


def test_padded_engine_is_exact_where_one_row_decodes_are_not():
    """SmolLM2 F16 on the CPU: a one-row decode differs from the same row in a batch (exact batch
    size 1), while batches of 2+ rows agree (padded_exact_rows). Unpadded, sharing decodes changes
    a slot's rows; padded (pad_rows=2), three slots in company and one alone get the rows of a
    padded context of their own, logits and captured K/V bit for bit."""
    from moa_cpp.target.batch_pad import padded_exact_rows
    p = models.smollm2_f16_path()
    ref = Target.from_path(p, n_ctx=1024, n_threads=2)
    base = Target.from_path(p, n_ctx=3 * 1024, n_threads=2, n_seq_max=3, kv_unified=False)
    try:
        assert ref.exact_rows(8) == 1
        assert padded_exact_rows(base, 2, 16) == 16
        ids = [ref.tokenize(x) for x in TEXTS]
        # unpadded: in company a slot's one-row steps become rows of a larger batch
        plain = BatchEngine(base, 3, 16)
        solo = [_run(ref, x, s) for s, x in enumerate(ids)]
        assert any(_differs(a, b) for a, b in zip(solo, _concurrently(plain, ids)))
        padded = BatchEngine(base, 3, 16, pad_rows=2)
        want = [_run(_PaddedSolo(ref), x, s) for s, x in enumerate(ids)]
        _assert_same(want, _concurrently(padded, ids))
        _assert_same(want, _concurrently(padded, ids[:1]))
    finally:
        ref.close()
        base.close()


# ---------------------------------------------------------------------------- plain runs (issue 59)

RUN_SETTINGS = [dict(temperature=0.0), dict(temperature=0.8, seed=3), dict(temperature=0.0, stop=["the"])]


def _generate_on_slots(engine, gens, prompts, kws, max_tokens) -> list:
    """Every slot's generation at once."""
    return _on_slots(engine, len(gens), lambda i: gens[i].generate(prompts[i], chat=True, max_tokens=max_tokens,
                                                                   **kws[i]))


def test_plain_runs_give_plain_decoding_answers(targets, monkeypatch):
    """A batched slot that decodes plainly hands the decoding to the engine's decode thread
    (PlainRun): greedy, seeded sampling and a stop string that ends a run early give the answers
    of plain decoding on a context of its own, and the next turn reuses the caches the runs left."""
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.target.slots import SlotTarget
    ref, engine = targets
    prompts = [f"Write one sentence about {x}." for x in ("cats", "the sea", "bread")]
    ref_gen = SpeculativeGenerator(ref)
    want = [ref_gen.generate(p, chat=True, max_tokens=40, **kw) for p, kw in zip(prompts, RUN_SETTINGS)]
    assert want[2].stats.finish_reason == "stop", "the stop string must end a run early"
    runs = []
    real = SlotTarget.plain_run
    monkeypatch.setattr(SlotTarget, "plain_run", lambda self, *a, **k: runs.append(self.seq) or real(self, *a, **k))
    gens = [SpeculativeGenerator(engine.slot(i)) for i in range(3)]
    for turn in range(2):
        got = _generate_on_slots(engine, gens, prompts, RUN_SETTINGS, 40)
        for w, g in zip(want, got):
            assert g.tokens == w.tokens and g.text == w.text and g.stats.finish_reason == w.stats.finish_reason
        if turn:
            assert all(g.stats.n_cached > 0 for g in got), "the second turn reuses the prompt's cells"
    assert sorted(set(runs)) == [0, 1, 2], "every slot decoded through a plain run"


# forced chains: on SmolLM2 Q4_1 the cost-aware default finds that no draft pays (its verify
# batches cost 2.4x+ a row) and decodes plainly without lookups
LOOKAHEAD_SETTINGS = [dict(temperature=0.0, draft="chain:8"), dict(temperature=0.0, draft="chain:4"),
                      dict(temperature=0.8, seed=5, draft="chain:4")]


def test_ngram_slots_look_up_on_the_decode_thread_and_answer_as_plain_decoding(targets, monkeypatch):
    """N-gram drafting slots run the cycles that find nothing as plain runs whose decode thread
    looks up each next cycle (loop._Lookahead), and hand the first drafts found back to the
    slot's thread: the answers (greedy, seeded sampling) equal plain decoding's, drafts were found by runs and verified, twice (the second
    turn on the caches the first left)."""
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.target import slots as target_slots
    from moa_cpp.speculative import loop
    from moa_cpp.target.slots import SlotTarget
    ref, engine = targets
    # the slot threads woken after every token: a run's tokens are taken in many steps while it
    # still decodes and looks up (the server's case), not all at its end
    monkeypatch.setattr(target_slots, "WAKE_S", 0.0)
    prompts = ["Count from 1 to 20, separated by commas.",
               "Write a Python function that adds two numbers, then the same function again with a docstring.",
               "List the days of the week, then list them again in reverse order."]
    ref_gen = SpeculativeGenerator(ref)
    gen_kw = [{k: v for k, v in kw.items() if k != "draft"} for kw in LOOKAHEAD_SETTINGS]
    want = [ref_gen.generate(p, chat=True, max_tokens=64, **kw) for p, kw in zip(prompts, gen_kw)]
    found, probed = [], []
    real_call = loop._Lookahead.__call__

    def counted(self, tok, pos):
        hit = real_call(self, tok, pos)
        probed.append(pos)
        if hit:
            found.append(pos)
        return hit
    monkeypatch.setattr(loop._Lookahead, "__call__", counted)
    # while a run lives, only the decode thread may look up: a lookup from the slot's thread
    # then races the run's (the proposer's text out of step)
    real_propose, overlaps = loop.SpeculativeLoop._propose, []

    def propose(self, g, cfg, at=None):
        if at is None and g.run is not None:
            overlaps.append(g.n)
        return real_propose(self, g, cfg, at)
    monkeypatch.setattr(loop.SpeculativeLoop, "_propose", propose)
    runs = []
    real = SlotTarget.plain_run
    monkeypatch.setattr(SlotTarget, "plain_run",
                        lambda self, *a, **k: runs.append((self.seq, k.get("probe") is not None)) or real(self, *a, **k))
    gens = [SpeculativeGenerator(engine.slot(i), spec_type="ngram", draft=LOOKAHEAD_SETTINGS[i].get("draft"))
            for i in range(3)]
    for turn in range(2):
        got = _generate_on_slots(engine, gens, prompts, gen_kw, 64)
        for w, g in zip(want, got):
            assert g.tokens == w.tokens and g.text == w.text and g.stats.finish_reason == w.stats.finish_reason
        assert sum(g.stats.drafted for g in got) > 0 and sum(g.stats.accepted for g in got) > 0
        if turn == 0:
            first = got
    assert runs and all(p for _, p in runs), f"every plain run of an n-gram slot looked ahead: {runs}"
    assert found and len(probed) > len(found), "runs looked up cycles, and some found drafts to hand back"
    assert not overlaps, f"the slot's thread looked up drafts while its run lived (at {overlaps[:5]})"
    # the lookups are the slot thread's own: without runs, the same drafts, acceptance and steps
    monkeypatch.setattr(loop.SpeculativeLoop, "_lookahead_runs", lambda self, g: False)
    for i in range(3):
        engine.enter(i)
        try:
            g = SpeculativeGenerator(engine.slot(i), spec_type="ngram", draft=LOOKAHEAD_SETTINGS[i]["draft"]) \
                .generate(prompts[i], chat=True, max_tokens=64, **gen_kw[i])
        finally:
            engine.leave(i)
        a, b = first[i].stats, g.stats
        assert g.tokens == first[i].tokens
        assert (a.drafted, a.accepted, a.accept_lengths) == (b.drafted, b.accepted, b.accept_lengths), i
