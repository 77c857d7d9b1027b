"""Two DrafterStates of one DrafterModel used from two threads at the same time.

A server drives one state per sequence on its own thread, all sharing one model. Each state
owns everything a computation writes (caches, graph memory, scheduler, backend instances: the
ggml CPU backend reuses one work buffer for every graph it computes), and the model is
read-only after load, so concurrent use must give results bit-identical to the same calls
made one after the other.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from moa_cpp.convert import convert
from moa_cpp.drafter.drafter import DrafterModel, DrafterState

CYCLES = 8
PROMPT = 12


@pytest.fixture(scope="module")
def drafter_paths(fixture_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("threads")
    target = fixture_dir / "target-f32.gguf"
    # f16: the CPU backend converts activations for the matmuls in its work buffer, the scratch
    # two states would race on if they shared a backend.
    return {t: convert(fixture_dir / "drafter_hf", root / f"drafter-{t}.gguf", outtype=t, target_gguf=target,
                       progress=False) for t in ("f16", "f32")}, target


def run_script(state: DrafterState, seed: int, barrier: threading.Barrier | None = None) -> list[np.ndarray]:
    """Speculative-decoding-like cycles with random LSA inputs and tokens; every output."""
    m = state.model
    rng = np.random.default_rng(seed)
    V, L, W, d = m.n_target_vocab, m.n_target_layers, m.lsa_width, m.n_embd
    out: list[np.ndarray] = []

    def lsa(n: int) -> np.ndarray:
        return rng.standard_normal((n, L, W), dtype=np.float32)

    def toks(n: int) -> list[int]:
        return [int(t) for t in rng.integers(0, V, n)]

    out.append(state.commit(lsa(PROMPT), 0, debug=True).ekv)
    context = toks(PROMPT)
    for cycle in range(CYCLES):
        if barrier is not None:
            barrier.wait()     # line the threads up so that their calls overlap
        state.clear_drafts()
        pos = state.n_ca
        feed = context[state.n_sa:pos]
        hidden = np.empty((1, d), np.float32)
        if cycle % 2:
            state.feed(feed)                                  # separate entry points
            out.append(state.draft([toks(1)[0]], [pos], [-1], hidden=hidden))
        else:
            out.append(state.draft([toks(1)[0]], [pos], [-1], feed=feed, hidden=hidden))  # one graph
        out.append(hidden)
        out.append(state.draft(toks(2), [pos + 1, pos + 2]))               # chain below the root
        out.append(state.draft(toks(4), [pos + 1, pos + 1, pos + 2, pos + 3], [0, 0, 1, 3]))  # tree rows
        n_acc = int(rng.integers(1, 4))
        context += toks(n_acc)
        out.append(state.commit(lsa(n_acc), pos, debug=True).lsa_mean)
        if cycle == CYCLES // 2:
            state.rollback(state.n_ca - 1)                   # a rejected position
            del context[state.n_ca:]
    out.extend(state.ca_cache())
    out.append(np.array([state.n_ca, state.n_sa, state.n_drafts]))
    return out


@pytest.mark.parametrize("outtype,tli", [("f16", 0), ("f32", 1)])
def test_two_states_two_threads_match_sequential(drafter_paths, outtype, tli):
    paths, target = drafter_paths
    model = DrafterModel(paths[outtype], target, device="cpu", tli=tli)
    seeds = (1, 2)

    def new_state() -> DrafterState:
        return model.new_state(n_ctx=128, n_draft_max=16, n_batch=32)

    sequential = [run_script(new_state(), s) for s in seeds]
    assert not np.array_equal(sequential[0][0], sequential[1][0])  # the two scripts differ

    for _ in range(3):
        states = [new_state() for _ in seeds]
        barrier = threading.Barrier(len(seeds))
        results: list = [None] * len(seeds)
        errors: list = []

        def work(i: int) -> None:
            try:
                results[i] = run_script(states[i], seeds[i], barrier)
            except BaseException as e:  # reported below, in the main thread
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(seeds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for seq, conc in zip(sequential, results):
            assert len(seq) == len(conc)
            for a, b in zip(seq, conc):
                np.testing.assert_array_equal(a, b)   # bit-identical (NaN == NaN)


def test_native_calls_release_the_gil(drafter_paths, fixture_dir):
    """While one thread is inside a long native call, Python code keeps running in another."""
    paths, target = drafter_paths
    model = DrafterModel(paths["f32"], target, device="cpu", n_threads=1)
    st = model.new_state(n_ctx=64, n_draft_max=128, n_batch=32)
    st.commit(np.load(fixture_dir / "golden.npz")["lsa_in"], 0)
    n = 128
    rows = ([1] * n, [st.n_ca] * n, [-1] * n)    # 128 independent rows: a long LM head matmul
    st.draft(*rows)
    st.clear_drafts()

    def max_gap_ratio() -> float:
        """Longest stretch without a tick of this thread during the call, / the call's length."""
        span: list[float] = []

        def call() -> None:
            span.append(time.perf_counter())
            st.draft(*rows)
            span.append(time.perf_counter())
            st.clear_drafts()

        ticks: list[float] = []
        th = threading.Thread(target=call)
        th.start()
        while th.is_alive():
            ticks.append(time.perf_counter())
        th.join()
        t0, t1 = span
        inside = [t for t in ticks if t0 <= t <= t1]
        return float(np.diff([t0, *inside, t1]).max() / (t1 - t0))

    # With the GIL held for the call, this thread could not tick between its start and end at all
    # (ratio ~1). A few tries: the OS may deschedule the ticking thread on a busy machine.
    ratios = []
    for _ in range(3):
        ratios.append(max_gap_ratio())
        if ratios[-1] < 0.5:
            break
    assert min(ratios) < 0.5, ratios


def test_two_generators_share_one_drafter_model_across_threads(drafter_paths):
    """What the server does: one DrafterModel, one SpeculativeGenerator (own target context and
    drafter state) per thread. Concurrent generations equal sequential ones, greedy and sampled."""
    from moa_cpp.generator import SpeculativeGenerator
    from moa_cpp.target.target import Target

    paths, target_path = drafter_paths
    model = DrafterModel(paths["f16"], target_path)
    gens = [SpeculativeGenerator(Target.from_path(target_path, n_ctx=256, n_batch=64, flash_attn=False), model,
                                 draft=d) for d in ("chain:3", "tree:3,2,6")]
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5]]
    kw = [dict(max_tokens=24), dict(max_tokens=24, temperature=0.8, seed=5)]

    def job(i: int) -> list:
        return gens[i].generate(prompts[i], **kw[i]).tokens

    sequential = [job(0), job(1)]
    for _ in range(3):
        results: list = [None, None]
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, job(i))) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert results == sequential
    for g in gens:
        g.close()
