"""The frozen target re-run in PyTorch from its GGUF weights (training features, docs/training.md#features).

The weights are read with gguf-py and dequantized with ``gguf.quants.dequantize`` to F32; the
``attn_q`` / ``attn_k`` rows that llama.cpp's converter permuted per head for NORM rope
(docs/drafter.md#k-permutation) are un-permuted back to HF order, so the forward below is the plain HF
Llama forward (rotate-half RoPE) and its K is in HF layout, exactly what the drafter's LSA reads.

Scope: the architectures ``moa_cpp.format.arch``'s table marks ``torch_target``: ``"llama"`` (SmolLM2,
Llama-2/3 without rope scaling, no ``rope_freqs``) and ``"qwen2"`` (Qwen2 / Qwen2.5: Q/K/V biases;
llama.cpp runs it with NEOX rope, so its converter left the rows in HF order and nothing is
un-permuted; the table's ``qk_permuted`` says which). Other architectures raise
:class:`NotImplementedError`; for them use the llama.cpp capture path
(:meth:`moa_cpp.target.target.Target.captured_lsa_in`).

Why a second implementation of the target: llama.cpp does not expose the post-norm hidden state
through :class:`~moa_cpp.target.target.Target`, and this path also runs on a CUDA box without llama.cpp.
llama.cpp quantizes activations (Q8) for its quantized matmuls, so its K/V and logits differ
slightly from this F32 forward; tests/train/test_train.py states the measured differences.

Example::

    tt = TorchTarget.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    out = tt.forward(torch.tensor([[1, 2, 3]]))
    out.lsa_in.shape   # [1, 3, 30, 384]  (batch, tokens, layers, W) HF layout
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from moa_cpp.format.arch import lookup, names_where, unpermute_rows

__all__ = ["TargetFeatures", "TorchTarget", "rope_cos_sin", "apply_rope", "unpermute_rows"]


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """HF rotate-half cos/sin tables ``[..., head_dim]`` for integer ``positions``."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim))
    ang = positions.to(torch.float64)[..., None] * inv
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE; ``x`` ``[B, heads, S, D]``, ``cos``/``sin`` broadcastable ``[B, 1, S, D]``."""
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


@dataclass
class TargetFeatures:
    """Per-token outputs of :meth:`TorchTarget.forward` (B = batch, S = tokens)."""

    lsa_in: torch.Tensor    # [B, S, L, W] per-layer post-RoPE K | V, head-major, HF layout (docs/drafter.md#target-kv)
    hidden: torch.Tensor    # [B, S, d] post-final-norm last hidden state
    logits: Optional[torch.Tensor]  # [B, S, V] (None unless requested)
    resid: Optional[torch.Tensor] = None  # [B, S, d] residual stream entering layer ``resid_layer`` (TLI)


class TorchTarget(torch.nn.Module):
    """A llama / qwen2 GGUF target as a frozen PyTorch module (F32 weights)."""

    def __init__(self, weights: dict[str, np.ndarray], *, n_layer: int, n_head: int, n_head_kv: int,
                 head_dim: int, rms_eps: float, rope_theta: float) -> None:
        super().__init__()
        self.n_layer, self.n_head, self.n_head_kv, self.head_dim = n_layer, n_head, n_head_kv, head_dim
        self.rms_eps, self.rope_theta = rms_eps, rope_theta
        self.embed = torch.nn.Parameter(torch.from_numpy(weights["token_embd.weight"]), requires_grad=False)
        out = weights.get("output.weight")
        self.lm_head = (self.embed if out is None
                        else torch.nn.Parameter(torch.from_numpy(out), requires_grad=False))
        self.output_norm = torch.nn.Parameter(torch.from_numpy(weights["output_norm.weight"]), requires_grad=False)
        self.layers = torch.nn.ModuleList()
        for i in range(n_layer):
            m = torch.nn.Module()
            for k in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                      "ffn_gate", "ffn_up", "ffn_down"):
                setattr(m, k, torch.nn.Parameter(torch.from_numpy(weights[f"blk.{i}.{k}.weight"]),
                                                 requires_grad=False))
            for k in ("attn_q", "attn_k", "attn_v"):     # qwen2: Q/K/V biases (zeros elsewhere)
                b = weights.get(f"blk.{i}.{k}.bias")
                rows = getattr(m, k).shape[0]
                setattr(m, f"{k}_b", torch.nn.Parameter(torch.from_numpy(b) if b is not None else torch.zeros(rows),
                                                        requires_grad=False))
            self.layers.append(m)

    @property
    def lsa_width(self) -> int:
        """W = 2 * H_kv * head_dim."""
        return 2 * self.n_head_kv * self.head_dim

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> "TorchTarget":
        """Load and dequantize a llama / qwen2 GGUF (llama's permuted Q/K rows back in HF order)."""
        import gguf

        r = gguf.GGUFReader(str(path))

        def field(key: str, default=None):
            f = r.fields.get(key)
            return default if f is None else f.contents()

        arch = field("general.architecture")
        row = lookup(str(arch))
        if not row.torch_target:
            raise NotImplementedError(f"TorchTarget supports {' / '.join(names_where('torch_target'))} GGUFs only, "
                                      f"not {arch!r}; use the llama.cpp capture path for this target")
        if field(f"{arch}.rope.scaling.type") not in (None, "none"):
            raise NotImplementedError("TorchTarget: rope scaling is not implemented")
        permuted = row.qk_permuted              # llama.cpp's converter permuted Q/K rows (NORM rope)
        n_layer = int(field(f"{arch}.block_count"))
        n_head = int(field(f"{arch}.attention.head_count"))
        n_kv = int(field(f"{arch}.attention.head_count_kv", n_head))
        d = int(field(f"{arch}.embedding_length"))
        head_dim = int(field(f"{arch}.attention.key_length", d // n_head))
        eps = float(field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5))
        theta = float(field(f"{arch}.rope.freq_base", 10000.0))
        weights: dict[str, np.ndarray] = {}
        for t in r.tensors:
            if t.name == "rope_freqs.weight":
                raise NotImplementedError("TorchTarget: rope_freqs (llama3 rope scaling) is not implemented")
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            shape = tuple(int(x) for x in reversed(list(t.shape)))
            w = np.ascontiguousarray(w.reshape(shape))
            if permuted and t.name.endswith("attn_q.weight"):
                w = np.ascontiguousarray(unpermute_rows(w, n_head))
            elif permuted and t.name.endswith("attn_k.weight"):
                w = np.ascontiguousarray(unpermute_rows(w, n_kv))
            weights[t.name] = w
        return cls(weights, n_layer=n_layer, n_head=n_head, n_head_kv=n_kv, head_dim=head_dim,
                   rms_eps=eps, rope_theta=theta)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions: Optional[torch.Tensor] = None,
                want_logits: bool = False, resid_layer: Optional[int] = None) -> TargetFeatures:
        """Causal forward of ``tokens`` ``[B, S]`` (right padding is harmless: causal mask).

        Returns per-layer post-RoPE K/V (HF layout) as LSA input rows, the post-norm hidden state,
        optionally the logits and the residual stream entering layer ``resid_layer`` (pre-norm;
        ``hidden_states[-1-N]`` of HF for ``resid_layer = L - N``, the TLI-N regression target).
        """
        B, S = tokens.shape
        if positions is None:
            positions = torch.arange(S, device=tokens.device).expand(B, S)
        H, Hk, D = self.n_head, self.n_head_kv, self.head_dim
        cos, sin = rope_cos_sin(positions, D, self.rope_theta)
        cos, sin = cos[:, None], sin[:, None]
        x = F.embedding(tokens, self.embed)
        kv_rows = []
        resid = None
        for li, m in enumerate(self.layers):
            if li == resid_layer:
                resid = x
            a = _rms(x, m.attn_norm, self.rms_eps)
            q = (a @ m.attn_q.T + m.attn_q_b).view(B, S, H, D).transpose(1, 2)
            k = (a @ m.attn_k.T + m.attn_k_b).view(B, S, Hk, D).transpose(1, 2)
            v = (a @ m.attn_v.T + m.attn_v_b).view(B, S, Hk, D).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            kv_rows.append(torch.cat([k, v], dim=-1).transpose(1, 2).reshape(B, S, 2 * Hk * D))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=(H != Hk))
            x = x + o.transpose(1, 2).reshape(B, S, H * D) @ m.attn_output.T
            f = _rms(x, m.ffn_norm, self.rms_eps)
            x = x + (F.silu(f @ m.ffn_gate.T) * (f @ m.ffn_up.T)) @ m.ffn_down.T
        h = _rms(x, self.output_norm, self.rms_eps)
        return TargetFeatures(lsa_in=torch.stack(kv_rows, dim=2), hidden=h,
                              logits=(h @ self.lm_head.T) if want_logits else None, resid=resid)

    def layer_forward(self, li: int, g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      k_ctx: torch.Tensor, v_ctx: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Target layer ``li`` on rows ``g`` ``[B, S, d]`` (differentiable w.r.t. ``g``; weights frozen).

        Keys/values are ``[k_ctx | the rows' own k]`` along the sequence axis (``k_ctx``/``v_ctx``
        ``[B, Hk, S_ctx, D]``, post-RoPE), ``mask`` ``[B, 1, S, S_ctx + S]`` (True = visible): the
        TLI layers of docs/drafter.md#tli, where the context is the target's own K/V.
        """
        m = self.layers[li]
        B, S, _ = g.shape
        H, Hk, D = self.n_head, self.n_head_kv, self.head_dim
        a = _rms(g, m.attn_norm, self.rms_eps)
        q = apply_rope((a @ m.attn_q.T + m.attn_q_b).view(B, S, H, D).transpose(1, 2), cos, sin)
        k = apply_rope((a @ m.attn_k.T + m.attn_k_b).view(B, S, Hk, D).transpose(1, 2), cos, sin)
        v = (a @ m.attn_v.T + m.attn_v_b).view(B, S, Hk, D).transpose(1, 2)
        k = torch.cat([k_ctx.to(k.dtype), k], dim=2)
        v = torch.cat([v_ctx.to(v.dtype), v], dim=2)
        if H != Hk:
            k = k.repeat_interleave(H // Hk, dim=1)
            v = v.repeat_interleave(H // Hk, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        g = g + o.transpose(1, 2).reshape(B, S, H * D) @ m.attn_output.T
        f = _rms(g, m.ffn_norm, self.rms_eps)
        return g + (F.silu(f @ m.ffn_gate.T) * (f @ m.ffn_up.T)) @ m.ffn_down.T

    def final_norm(self, g: torch.Tensor) -> torch.Tensor:
        """The target's ``output_norm``."""
        return _rms(g, self.output_norm, self.rms_eps)
