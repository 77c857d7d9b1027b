"""Target K/V capture (native moa_capture_* + moa_cpp.target.target.Target).

Oracles: the golden HF K/V of the moa-ref-tiny fixture, and, on real models, the KV cache
content itself read back through llama.cpp's sequence-state API (F32 cache: exact copies).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, List

import numpy as np
import pytest

from moa_cpp.testing.kv_state import parse_seq_state, read_seq_state
from moa_cpp.models import registry as models
from moa_cpp.drafter.native import ffi, lib
from moa_cpp.format.arch import unpermute_last_axis
from moa_cpp.errors import CacheFullError, InvalidArgumentError, MoaError, MoaIOError
from moa_cpp.target.target import Target

# README: llama.cpp (F32 cache) vs HF K/V max |diff| ~6e-6 for values up to ~6.
GOLDEN_ATOL = 2e-5


@pytest.fixture(scope="module")
def golden(fixture_dir: Path) -> dict:
    """moa-ref-tiny's golden arrays (conftest's fixture_dir honours MOA_FIXTURE_DIR)."""
    return dict(np.load(fixture_dir / "golden.npz"))


@pytest.fixture(scope="module")
def tiny_path(fixture_dir: Path) -> Path:
    return fixture_dir / "target-f32.gguf"


unpermute = unpermute_last_axis


def decode_chunks(tgt: Target, ids: np.ndarray, sizes: List[int]) -> np.ndarray:
    """Decode ids in consecutive chunks; return the concatenated LSA inputs [n, L, W]."""
    out, start = [], 0
    for s in sizes:
        tgt.decode(ids[start:start + s])
        out.append(tgt.captured_lsa_in())
        start += s
    assert start == len(ids)
    return np.concatenate(out)


def lsa_to_kv(x: np.ndarray, n_head_kv: int, head_dim: int):
    """[n, L, H*2D] -> K, V [L, H, n, D]."""
    x = x.reshape(x.shape[0], x.shape[1], n_head_kv, 2, head_dim).transpose(3, 1, 2, 0, 4)
    return x[0], x[1]


# ---------------------------------------------------------------- fixture target (golden)

def test_capture_equals_golden_one_decode(tiny_path: Path, golden: dict) -> None:
    with Target.from_path(tiny_path, n_ctx=128, cache_type="f32", flash_attn=False) as tgt:
        assert (tgt.arch, tgt.rope_type, tgt.n_layer, tgt.n_head_kv, tgt.head_dim) == ("llama", "norm", 4, 2, 16)
        logits = tgt.decode(golden["prompt_ids"])
        k, v = tgt.captured_kv()
        lsa_in = tgt.captured_lsa_in()
    assert logits.shape == (15, 49152)
    assert np.abs(k - golden["target_k"]).max() < GOLDEN_ATOL
    assert np.abs(v - golden["target_v"]).max() < GOLDEN_ATOL
    assert np.abs(lsa_in - golden["lsa_in"]).max() < GOLDEN_ATOL
    assert int(np.argmax(logits[-1])) == int(golden["root_token"])


@pytest.mark.parametrize("sizes,n_ubatch", [([4, 5, 6], None), ([1] * 15, None), ([15], 4), ([9, 6], 2)],
                         ids=["chunks", "token-by-token", "ubatch4", "chunks+ubatch2"])
def test_capture_equals_golden_chunked(tiny_path: Path, golden: dict, sizes: List[int], n_ubatch) -> None:
    with Target.from_path(tiny_path, n_ctx=128, n_batch=16, n_ubatch=n_ubatch, n_seq_max=16, cache_type="f32", flash_attn=False) as tgt:
        lsa_in = decode_chunks(tgt, golden["prompt_ids"], sizes)
        assert tgt.n_past == 15
    assert np.abs(lsa_in - golden["lsa_in"]).max() < GOLDEN_ATOL


def test_from_llama_shares_the_model(tiny_path: Path, golden: dict) -> None:
    import llama_cpp
    llm = llama_cpp.Llama(model_path=str(tiny_path), n_ctx=128, verbose=False)
    with Target.from_llama(llm, cache_type="f32", flash_attn=False) as tgt:
        assert tgt.path == tiny_path and tgt.n_layer == 4
        tgt.decode(golden["prompt_ids"])
        lsa_in = tgt.captured_lsa_in()
    assert np.abs(lsa_in - golden["lsa_in"]).max() < GOLDEN_ATOL
    assert llm.tokenize(b"The quick", add_bos=False) == [504, 2365]  # the Llama still works


def test_captured_rows_subset_and_order(tiny_path: Path, golden: dict) -> None:
    with Target.from_path(tiny_path, n_ctx=128) as tgt:
        tgt.decode(golden["prompt_ids"])
        full = tgt.captured_lsa_in()
        sub = tgt.captured_lsa_in([14, 0, 3, 3])
        with pytest.raises(InvalidArgumentError, match="out of range"):
            tgt.captured_lsa_in([15])
    np.testing.assert_array_equal(sub, full[[14, 0, 3, 3]])


def test_f16_cache_capture_layer0_exact(tiny_path: Path, golden: dict) -> None:
    """Capture reads F32 K/V before the cache cast; layer 0 does not depend on the cache."""
    with Target.from_path(tiny_path, n_ctx=128, cache_type="f16", flash_attn=False) as tgt:
        tgt.decode(golden["prompt_ids"])
        k, v = tgt.captured_kv()
    assert np.abs(k[0] - golden["target_k"][0]).max() < GOLDEN_ATOL
    assert np.abs(v[0] - golden["target_v"][0]).max() < GOLDEN_ATOL


def test_rollback_and_redecode(tiny_path: Path, golden: dict) -> None:
    ids = golden["prompt_ids"]
    with Target.from_path(tiny_path, n_ctx=128, cache_type="f32", flash_attn=False) as tgt:
        first = tgt.decode(ids)
        tgt.rollback(10)
        assert tgt.n_past == 10
        again = tgt.decode(ids[10:])
        lsa_in = tgt.captured_lsa_in()
    np.testing.assert_allclose(again, first[10:], atol=1e-4)
    assert np.abs(lsa_in - golden["lsa_in"][10:]).max() < GOLDEN_ATOL


def test_tree_rows_see_only_their_sequence(tiny_path: Path, golden: dict) -> None:
    """Two sibling tokens at the same position in sequences 1 and 2 (a 2-leaf tree) get the
    logits and K/V they get when decoded alone after the prompt."""
    ids = golden["prompt_ids"]
    a, b = 100, 200
    with Target.from_path(tiny_path, n_ctx=128, cache_type="f32", flash_attn=False) as tgt:
        tgt.decode(ids)
        ref = []
        for tok in (a, b):
            ref.append((tgt.decode([tok])[0], tgt.captured_lsa_in()[0]))
            tgt.rollback(15)
        tgt.seq_cp(0, 1)
        tgt.seq_cp(0, 2)
        logits = tgt.decode([a, b], positions=[15, 15], seq_ids=[1, 2])
        lsa_in = tgt.captured_lsa_in()
    for i in range(2):
        np.testing.assert_allclose(logits[i], ref[i][0], atol=1e-4)
        np.testing.assert_allclose(lsa_in[i], ref[i][1], atol=1e-5)


# ---------------------------------------------------------------- disabled capture, errors

def test_disabled_callback_asks_for_nothing() -> None:
    cap = lib.moa_capture_init(4, False)
    try:
        dummy = ffi.new("char[1024]")  # never read while disabled
        lib.moa_capture_set_enabled(cap, False)
        assert lib.moa_capture_eval_cb(dummy, True, cap) is False
        assert lib.moa_capture_eval_cb(dummy, False, cap) is True  # false would abort the graph
        assert lib.moa_capture_n_rows(cap) == 0
        assert lib.moa_capture_n_head_kv(cap) == 0 and lib.moa_capture_head_dim(cap) == 0
    finally:
        lib.moa_capture_free(cap)


def test_decode_without_capture(tiny_path: Path, golden: dict) -> None:
    ids = golden["prompt_ids"]
    with Target.from_path(tiny_path, n_ctx=128) as tgt:
        with_cap = tgt.decode(ids)
        tgt.clear()
        without = tgt.decode(ids, capture=False)
        assert tgt.n_captured == 0
        assert tgt.captured_lsa_in().shape == (0, 4, 64)
    with Target.from_path(tiny_path, n_ctx=128, install_callback=False) as plain:
        no_cb = plain.decode(ids, capture=False)
        with pytest.raises(InvalidArgumentError):
            plain.decode(ids, capture=True)
    np.testing.assert_allclose(without, with_cap, atol=1e-5)
    np.testing.assert_allclose(no_cb, with_cap, atol=1e-5)


def test_capture_init_rejects_bad_layer_count() -> None:
    assert lib.moa_capture_init(0, False) == ffi.NULL
    assert lib.moa_last_status() == lib.MOA_ERR_INVALID_ARGUMENT
    assert b"n_layer" in ffi.string(lib.moa_last_error())


def test_seq_max_above_batch_rejected(tiny_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="n_seq_max"):
        Target.from_path(tiny_path, n_batch=16, n_seq_max=64)


def test_missing_model_raises() -> None:
    with pytest.raises(MoaIOError, match="not found"):
        Target.from_path("/nonexistent/model.gguf")


@pytest.mark.parametrize("make", [lambda src: b"not a gguf file" * 100,
                                  lambda src: src.read_bytes()[: len(src.read_bytes()) // 2]],
                         ids=["garbage", "truncated"])
def test_bad_model_raises(tmp_path: Path, tiny_path: Path, make: Callable[[Path], bytes]) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(make(tiny_path))
    with pytest.raises(MoaError, match="could not load"):
        Target.from_path(bad)


def test_decode_errors(tiny_path: Path) -> None:
    with Target.from_path(tiny_path, n_ctx=32, n_batch=16, n_seq_max=16) as tgt:
        with pytest.raises(InvalidArgumentError):
            tgt.decode(list(range(17)))  # > n_batch
        with pytest.raises(InvalidArgumentError):
            tgt.decode([10**6])
        with pytest.raises(InvalidArgumentError):
            tgt.decode([1, 2], seq_ids=[0, 16])
        for _ in range(tgt.n_ctx // 16):  # llama.cpp pads n_ctx (to 256 here)
            tgt.decode(list(range(16)))
        with pytest.raises(CacheFullError):
            tgt.decode(list(range(16)))
        assert tgt.n_past == tgt.n_ctx  # a failed decode leaves the cache as it was
        tgt.rollback(0)
        assert tgt.decode([5]).shape == (1, tgt.n_vocab)


# ---------------------------------------------------------------- real models vs KV cache

def _model_path(getter: Callable[[], Path]) -> Path:
    try:
        return getter()
    except models.ModelNotInstalledError as e:
        pytest.skip(str(e))


PROMPT = ("Speculative decoding drafts several tokens with a small model and verifies them with the "
          "large one in a single batched forward pass, which keeps the output distribution unchanged.")


@pytest.mark.model
@pytest.mark.parametrize("getter,expect", [
    (models.smollm2_path, dict(arch="llama", rope_type="norm", n_layer=30, n_head_kv=3, head_dim=64)),
    (models.gemma3_270m_path, dict(arch="gemma3", rope_type="neox", n_layer=18, n_head_kv=1, head_dim=256)),
], ids=["smollm2-q4_1", "gemma3-270m-q4_k_m"])
@pytest.mark.parametrize("flash_attn", [False, True], ids=["noFA", "FA"])
def test_capture_equals_kv_cache(getter: Callable[[], Path], expect: dict, flash_attn: bool) -> None:
    path = _model_path(getter)
    with Target.from_path(path, n_ctx=512, n_batch=64, n_ubatch=16, cache_type="f32", flash_attn=flash_attn) as tgt:
        assert {k: getattr(tgt, k) for k in expect} == expect
        ids = tgt.tokenize(PROMPT, add_bos=True)
        assert 30 < len(ids) < 64
        # Three decodes: a multi-ubatch chunk, a small chunk, one token.
        sizes = [len(ids) - 5, 4, 1]
        lsa_in = decode_chunks(tgt, ids, sizes)
        blocks = parse_seq_state(read_seq_state(tgt.context, 0))
        swa_pattern = int(tgt.meta(f"{tgt.arch}.attention.sliding_window_pattern") or 6)
    k_cap, v_cap = lsa_to_kv(lsa_in, tgt.n_head_kv, tgt.head_dim)  # HF layout [L, H, n, D]

    # Which cache holds which layers: one cache, or iSWA base (full attention) then SWA.
    if len(blocks) == 1:
        layer_sets = [list(range(tgt.n_layer))]
    else:
        assert tgt.arch == "gemma3" and len(blocks) == 2
        # llama.cpp gemma3: load_swa_pattern(ml, 6): layer il is SWA unless il % 6 == 5.
        is_swa = [il % swa_pattern < swa_pattern - 1 for il in range(tgt.n_layer)]
        layer_sets = [[il for il in range(tgt.n_layer) if not is_swa[il]], [il for il in range(tgt.n_layer) if is_swa[il]]]
    for blk, layers in zip(blocks, layer_sets):
        np.testing.assert_array_equal(blk.pos, np.arange(len(ids)))
        assert blk.v_trans == (not flash_attn), "V is stored transposed exactly when flash attention is off"
        assert len(blk.k) == len(layers)
        for k_cache, v_cache, il in zip(blk.k, blk.v, layers):
            k_cache = k_cache.reshape(len(ids), tgt.n_head_kv, tgt.head_dim).transpose(1, 0, 2)
            v_cache = v_cache.reshape(len(ids), tgt.n_head_kv, tgt.head_dim).transpose(1, 0, 2)
            if tgt.rope_type == "norm":
                k_cache = unpermute(k_cache)
            scale_k = max(1.0, float(np.abs(k_cache).max()))
            scale_v = max(1.0, float(np.abs(v_cache).max()))
            assert np.abs(k_cap[il] - k_cache).max() <= 1e-5 * scale_k, f"layer {il} K"
            assert np.abs(v_cap[il] - v_cache).max() <= 1e-5 * scale_v, f"layer {il} V"


@pytest.mark.model
def test_quantized_cache_rows_are_unrotated_and_answers_are_llama_cpps() -> None:
    """A q8_0 KV cache: llama.cpp rotates K/V (Hadamard) before writing them, as llama-server's
    `-ctk q8_0` does by default. The capture undoes the rotation (layer 0's K/V, which no cached
    value has touched yet, equal an f16 cache's), the target decodes as llama-cpp-python's own
    q8_0 context does (greedy, token for token), and MoA drafting on it stays lossless."""
    import llama_cpp

    from moa_cpp.models.defaults import DEFAULT_DRAFTER
    from moa_cpp.drafter.drafter import DrafterModel, DrafterState
    from moa_cpp.speculative.loop import SpeculativeLoop
    from moa_cpp.speculative.proposers import MoAProposer
    from moa_cpp.speculative.types import DraftConfig, SamplingParams

    path = models.smollm2_path()
    kv = {}
    for ct in ("f16", "q8_0"):
        with Target.from_path(path, n_ctx=256, cache_type=ct) as tgt:
            ids = [int(t) for t in tgt.tokenize("The quick brown fox jumps over the lazy dog. " * 4)]
            tgt.decode(ids)
            kv[ct] = tgt.captured_kv()
    for a, b in zip(kv["f16"], kv["q8_0"]):
        assert np.abs(a[0]).max() > 0.1
        assert np.abs(a[0] - b[0]).max() < 1e-5          # rotated rows would differ by ~the values

    prompt = "Write a Python function that reverses a string."
    with Target.from_path(path, n_ctx=512, cache_type="q8_0") as tgt:
        ids = [int(t) for t in tgt.tokenize(prompt)]

        def run(loop, cfg):
            toks = []
            for ev in loop.run(ids, 32, SamplingParams(ignore_eos=True), cfg):
                toks += ev.tokens
            return toks

        plain = run(SpeculativeLoop(tgt, None, DraftConfig("none")), None)
        drafter = DrafterModel(str(DEFAULT_DRAFTER), str(path))
        state = DrafterState(drafter, n_ctx=512, n_draft_max=64, n_batch=64)
        cfg = DraftConfig("chain", chain=4)
        assert run(SpeculativeLoop(tgt, MoAProposer(state, cfg), cfg), cfg) == plain
    llm = llama_cpp.Llama(str(path), n_ctx=512, type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0,
                          flash_attn=True, n_threads=2, verbose=False)
    ref = []
    for tok in llm.generate(ids, temp=0.0, top_k=1):
        ref.append(int(tok))
        if len(ref) == len(plain):
            break
    assert ref == plain
