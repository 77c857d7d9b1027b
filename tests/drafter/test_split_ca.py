"""The split drafter of client-server mode (issue 11): the server computes the CA K/V of verified
tokens (``compute_ca``), the client appends them (``append_ca``). A split commit must leave the
same CA cache as a single-device commit: bit for bit in f32, within f16 rounding through f16;
on every golden fixture and on the real SmolLM2 drafter with captured K/V."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import fixture_dirs
from moa_cpp.convert import convert
from moa_cpp.drafter.drafter import Drafter, DrafterModel, DrafterState
from moa_cpp.errors import InvalidArgumentError, MoaError


def _fixture_model(fixture_dir, tmp_path, **kw):
    target = fixture_dir / "target-f32.gguf"
    path = convert(fixture_dir / "drafter_hf", tmp_path / "d.gguf", outtype="f32", target_gguf=target, progress=False,
                   **kw)
    return DrafterModel(path, target), target


@pytest.mark.parametrize("fixture", fixture_dirs(), ids=lambda p: p.name)
def test_split_commit_equals_commit_bit_for_bit(fixture, tmp_path):
    g = np.load(fixture / "golden.npz")
    model, _ = _fixture_model(fixture, tmp_path)
    whole, server, client = (DrafterState(model, n_ctx=64, n_batch=8) for _ in range(3))  # n_batch 8: chunked
    lsa = g["lsa_in"]
    n = lsa.shape[0]
    whole.commit(lsa, 0)
    k, v = server.compute_ca(lsa, 0)
    assert k.shape == (n, model.ca_kv_heads, model.head_dim) and server.n_ca == 0      # scratch untouched
    client.append_ca(k, v, 0)
    assert client.n_ca == n
    for a, b in zip(whole.ca_cache(), client.ca_cache()):
        np.testing.assert_array_equal(a, b)
    # the golden CA cache of the reference implementation, as the parity test checks commit
    np.testing.assert_allclose(client.ca_cache()[0], g["ca_k"], rtol=0, atol=1e-4 * np.abs(g["ca_k"]).max())
    # drafting on the client equals drafting on the single device
    root = int(g["root_token"])
    la = whole.draft([root], [n], [-1], feed=g["prompt_ids"])
    lb = client.draft([root], [n], [-1], feed=g["prompt_ids"])
    np.testing.assert_array_equal(la, lb)


@pytest.mark.parametrize("fixture", fixture_dirs(), ids=lambda p: p.name)
def test_split_commit_in_cycles_and_through_f16(fixture, tmp_path):
    """Verified tokens arrive a few per cycle (and a rollback truncates): the split cache follows
    the single-device one; sent as f16, it stays within f16 rounding and drafts the same argmax."""
    g = np.load(fixture / "golden.npz")
    model, _ = _fixture_model(fixture, tmp_path)
    whole, server, c32, c16 = (DrafterState(model, n_ctx=64) for _ in range(4))
    lsa = g["lsa_in"]
    n = lsa.shape[0]
    cuts = [0, 6, 7, 10, n]
    for a, b in zip(cuts, cuts[1:]):
        whole.commit(lsa[a:b], a)
        k, v = server.compute_ca(lsa[a:b], a)
        c32.append_ca(k, v, a)
        c16.append_ca(k.astype(np.float16), v.astype(np.float16), a)
    # a rollback to position 9 then re-commit of the rest (a rejected cycle)
    whole.commit(lsa[9:], 9)
    k, v = server.compute_ca(lsa[9:], 9)
    c32.append_ca(k, v, 9)
    c16.append_ca(k.astype(np.float16), v.astype(np.float16), 9)
    for a, b, c in zip(whole.ca_cache(), c32.ca_cache(), c16.ca_cache()):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(c, a, rtol=2 ** -10, atol=1e-6)
    root = int(g["root_token"])
    la = whole.draft([root], [n], [-1], feed=g["prompt_ids"])
    l16 = c16.draft([root], [n], [-1], feed=g["prompt_ids"])
    assert la.argmax() == l16.argmax()


def test_split_commit_bad_arguments(fixture_dir, tmp_path):
    model, _ = _fixture_model(fixture_dir, tmp_path)
    s = DrafterState(model, n_ctx=16)
    k = np.zeros((2, model.ca_kv_heads, model.head_dim), np.float32)
    with pytest.raises(InvalidArgumentError):
        s.append_ca(k, k, 1)                     # a gap: pos0 > n_ca
    with pytest.raises(InvalidArgumentError):
        s.append_ca(k[:, :1], k[:, :1], 0)       # wrong shape
    with pytest.raises(MoaError):
        s.append_ca(np.zeros((17, model.ca_kv_heads, model.head_dim)), np.zeros((17, model.ca_kv_heads,
                                                                                  model.head_dim)), 0)  # > n_ctx
    with pytest.raises(InvalidArgumentError):
        s.compute_ca(np.zeros((2, 3, 5), np.float32), 0)
    assert s.n_ca == 0


def test_split_needs_tli_0(fixture_dir, tmp_path):
    model, _ = _fixture_model(fixture_dir, tmp_path, tli=1)
    s = DrafterState(model, n_ctx=16)
    g = np.load(fixture_dir / "golden.npz")
    with pytest.raises(InvalidArgumentError, match="TLI"):
        s.compute_ca(g["lsa_in"], 0)


@pytest.mark.model
def test_split_commit_on_smollm2_with_captured_kv():
    from moa_cpp.models import defaults
    from moa_cpp.target.target import Target
    tp = defaults.default_target()
    with Target.from_path(tp, n_ctx=256, n_threads=2) as tgt:
        ids = tgt.tokenize("The quick brown fox jumps over the lazy dog. " * 3)
        tgt.decode(ids, capture=True)
        lsa = tgt.captured_lsa_in()
    d = Drafter(defaults.default_drafter(), tp, n_ctx=256)
    server = DrafterState(d.model, n_ctx=256)
    client = DrafterState(d.model, n_ctx=256)
    d.commit(lsa, 0)
    k, v = server.compute_ca(lsa, 0)
    assert 2 * k.shape[1] * k.shape[2] * 2 == 768        # f16 bytes per verified token on the wire (spec: 768 B)
    client.append_ca(k, v, 0)
    for a, b in zip(d.ca_cache(), client.ca_cache()):
        np.testing.assert_array_equal(a, b)
    n = len(ids)
    np.testing.assert_array_equal(d.draft([int(ids[-1])], [n], [-1], feed=ids),
                                  client.draft([int(ids[-1])], [n], [-1], feed=ids))
