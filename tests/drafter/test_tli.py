"""Target layer inference (TLI N > 0) against an independent numpy reference.

The reference runs the target's last N layers (weights read from target-f32.gguf with gguf-py,
q/k rows un-permuted to HF order) on the drafter's CA output z, train-consistently
(docs/drafter.md#tli): each drafted row's attention sees the target's own K/V of the
verified prompt (golden target_k / target_v) plus the k/v of the drafted rows on its path.
Tolerance: relative error 1e-4 of the logits (F32 everywhere).
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from moa_cpp.convert import convert
from moa_cpp.drafter.drafter import Drafter
from moa_cpp.format.arch import unpermute_rows
from moa_cpp.errors import MismatchError


def _rms(x, w, eps):
    return w * x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps)


def _rope_neox(x, pos, base):
    # x: [n, H, D]
    D = x.shape[-1]
    inv = base ** (-np.arange(0, D // 2, dtype=np.float64) * 2 / D)
    ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]            # [n, D/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


_unpermute = unpermute_rows


class RefTarget:
    def __init__(self, path):
        r = gguf.GGUFReader(str(path))
        self.t = {t.name: np.array(t.data, dtype=np.float64) for t in r.tensors}
        f = lambda k: r.fields[k].parts[-1][0]
        self.H = int(f("llama.attention.head_count"))
        self.Hkv = int(f("llama.attention.head_count_kv"))
        self.L = int(f("llama.block_count"))
        self.eps = float(f("llama.attention.layer_norm_rms_epsilon"))
        self.base = float(f("llama.rope.freq_base"))

    def run(self, z, pos, n_tli, ctx_k, ctx_v):
        """z [n, d] rows forming a chain (row i sees rows 0..i); ctx_k/v [L, Hkv, S, D]."""
        g = z.astype(np.float64)
        n = g.shape[0]
        for l in range(self.L - n_tli, self.L):
            b = f"blk.{l}."
            a = _rms(g, self.t[b + "attn_norm.weight"], self.eps)
            wq = _unpermute(self.t[b + "attn_q.weight"], self.H)
            wk = _unpermute(self.t[b + "attn_k.weight"], self.Hkv)
            D = wq.shape[0] // self.H
            q = _rope_neox((a @ wq.T).reshape(n, self.H, D), pos, self.base)
            k = _rope_neox((a @ wk.T).reshape(n, self.Hkv, D), pos, self.base)
            v = (a @ self.t[b + "attn_v.weight"].T).reshape(n, self.Hkv, D)
            out = np.zeros((n, self.H, D))
            for i in range(n):
                for h in range(self.H):
                    kh = h // (self.H // self.Hkv)
                    keys = np.concatenate([ctx_k[l, kh], k[: i + 1, kh]], 0)
                    vals = np.concatenate([ctx_v[l, kh], v[: i + 1, kh]], 0)
                    s = keys @ q[i, h] / np.sqrt(D)
                    p = np.exp(s - s.max())
                    out[i, h] = (p / p.sum()) @ vals
            g = g + out.reshape(n, -1) @ self.t[b + "attn_output.weight"].T
            m = _rms(g, self.t[b + "ffn_norm.weight"], self.eps)
            gate, up = m @ self.t[b + "ffn_gate.weight"].T, m @ self.t[b + "ffn_up.weight"].T
            g = g + (gate / (1 + np.exp(-gate)) * up) @ self.t[b + "ffn_down.weight"].T
        h = _rms(g, self.t["output_norm.weight"], self.eps)
        head = self.t.get("output.weight", self.t["token_embd.weight"])
        return h @ head.T


@pytest.mark.parametrize("n_tli", [1, 2])
def test_tli_matches_numpy_reference(fixture_dir, tmp_path, n_tli):
    g = np.load(fixture_dir / "golden.npz")
    target = fixture_dir / "target-f32.gguf"
    path = convert(fixture_dir / "drafter_hf", tmp_path / f"tli{n_tli}.gguf", outtype="f32", target_gguf=target,
                   tli=n_tli, progress=False)
    d = Drafter(path, target, n_ctx=64)
    assert d.model.tli == n_tli
    d.commit(g["lsa_in"], 0)
    S = int(g["prompt_ids"].size)
    root = int(g["root_token"])
    n_embd = d.model.n_embd
    z0 = np.empty((1, n_embd), np.float32)
    lg0 = d.draft([root], [S], [-1], feed=g["prompt_ids"], hidden=z0)
    t1 = int(lg0[0].argmax())
    z1 = np.empty((1, n_embd), np.float32)
    lg1 = d.draft([t1], [S + 1], hidden=z1)

    # z (the CA output) is the TLI-0 drafter's LM-head input: same SA/CA weights.
    d0 = Drafter(convert(fixture_dir / "drafter_hf", tmp_path / "tli0.gguf", outtype="f32", target_gguf=target,
                         progress=False), target, n_ctx=64)
    d0.commit(g["lsa_in"], 0)
    z0_ref = np.empty((1, n_embd), np.float32)
    d0.draft([root], [S], [-1], feed=g["prompt_ids"], hidden=z0_ref)
    np.testing.assert_allclose(z0, z0_ref, rtol=0, atol=1e-5 * np.abs(z0_ref).max())

    ref = RefTarget(target).run(np.concatenate([z0, z1]), [S, S + 1], n_tli, g["target_k"], g["target_v"])
    got = np.concatenate([lg0, lg1])
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel < 1e-4, rel
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    # the TLI head differs from the TLI-0 head (output_norm + N layers actually ran)
    assert np.abs(got[0] - d0.draft([t1], [S + 1])[0]).max() > 1e-3


def test_tli_tree_rows_see_only_their_path(fixture_dir, tmp_path):
    """Two siblings drafted in one call give the same logits as each drafted alone."""
    g = np.load(fixture_dir / "golden.npz")
    target = fixture_dir / "target-f32.gguf"
    path = convert(fixture_dir / "drafter_hf", tmp_path / "tli1.gguf", outtype="f32", target_gguf=target, tli=1,
                   progress=False)
    d = Drafter(path, target, n_ctx=64)
    S = int(g["prompt_ids"].size)
    d.commit(g["lsa_in"], 0)
    lg = d.draft([int(g["root_token"])], [S], [-1], feed=g["prompt_ids"])
    a, b = np.argsort(lg[0])[-2:]
    both = d.draft([int(a), int(b)], [S + 1, S + 1], [0, 0])
    d.clear_drafts()
    d.draft([int(g["root_token"])], [S], [-1])
    only_b = d.draft([int(b)], [S + 1], [0])
    np.testing.assert_allclose(both[1], only_b[0], rtol=0, atol=1e-4 * np.abs(only_b).max())


def test_tli_out_of_range(fixture_dir, tmp_path):
    target = fixture_dir / "target-f32.gguf"
    path = convert(fixture_dir / "drafter_hf", tmp_path / "t.gguf", outtype="f32", target_gguf=target,
                   progress=False)
    with pytest.raises(MismatchError, match="below the target layer count"):
        Drafter(path, target, tli=99)
