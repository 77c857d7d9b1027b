"""The MoA drafter in PyTorch (TLI 0), with the reference's tensor names (docs/gguf-format.md#tensors).

One forward covers a whole teacher-forced sequence (docs/training.md#recipe): every position ``i`` gets a CA
key/value from the target's K/V at ``i`` (LSA -> mean -> Ekv2E -> CA input norm -> k/v, RoPE ``i``)
and a query row from ``token_embd[x_i]`` (SA -> CA -> target LM head, no final norm). The masks
(:mod:`moa_cpp.train.masks`) decide what each row sees; with the T-step-bounded CA mask this is
the training computation of the reference, and with "row ``n`` sees CA keys ``< n``" it is exactly
the engine's inference computation for the root (the parity test).

Parameter names are those of the reference's training snapshot (``self_attention.*``,
``cross_attention.*``, ``layer_self_attention.*``, ``Ekv2E.*``), so :meth:`MoaDrafter.save` writes
a Format-B snapshot that ``moa_cpp.convert.convert`` accepts; the frozen embedding / LM head are
buffers and are not saved.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from moa_cpp.format.drafter_spec import DrafterSpec
from moa_cpp.train.target_torch import TorchTarget, apply_rope, rope_cos_sin

__all__ = ["MoaDrafter", "DecoderLayer", "spec_from_config"]


class RMSNorm(nn.Module):
    """``w * x / sqrt(mean(x^2) + eps)`` (docs/drafter.md#numerics)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    """Llama attention projections (no biases); the forward lives in the layers below."""

    def __init__(self, width: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(width, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(width, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(width, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, width, bias=False)


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, width: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, ffn, bias=False)
        self.up_proj = nn.Linear(width, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


_SDPA_MAX_BATCH = 65_535    # batch x heads limit of SDPA's CUDA kernels (grid dimension)


def _heads(x: torch.Tensor, n: int, d: int) -> torch.Tensor:
    """``[..., S, n*d]`` -> ``[..., n, S, d]``."""
    return x.view(*x.shape[:-1], n, d).transpose(-3, -2)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """SDPA with GQA (KV head j serves query heads j*g..j*g+g-1) and a boolean mask (True = visible)."""
    g = q.shape[-3] // k.shape[-3]
    if g > 1:
        k = k.repeat_interleave(g, dim=-3)
        v = v.repeat_interleave(g, dim=-3)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class DecoderLayer(nn.Module):
    """Pre-norm Llama decoder layer (SA and LSA; docs/drafter.md#lsa, #sa)."""

    def __init__(self, width: int, heads: int, kv_heads: int, head_dim: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(width, eps)
        self.self_attn = Attention(width, heads, kv_heads, head_dim)
        self.mlp = MLP(width, ffn)
        self.post_attention_layernorm = RMSNorm(width, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: Optional[torch.Tensor]) -> torch.Tensor:
        at = self.self_attn
        a = self.input_layernorm(x)
        q = apply_rope(_heads(at.q_proj(a), at.heads, at.head_dim), cos, sin)
        k = apply_rope(_heads(at.k_proj(a), at.kv_heads, at.head_dim), cos, sin)
        v = _heads(at.v_proj(a), at.kv_heads, at.head_dim)
        o = _attend(q, k, v, mask).transpose(-3, -2)
        x = x + at.o_proj(o.reshape(*o.shape[:-2], -1))
        return x + self.mlp(self.post_attention_layernorm(x))


class CrossAttentionLayer(DecoderLayer):
    """CA layer (docs/drafter.md#ca-cache, #ca): query from the SA output, K/V from the normed Ekv2E output, one
    shared ``input_layernorm``; K RoPE at the verified token's position, Q at the row's."""

    def kv(self, e: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        at = self.self_attn
        u = self.input_layernorm(e)
        return (apply_rope(_heads(at.k_proj(u), at.kv_heads, at.head_dim), cos, sin),
                _heads(at.v_proj(u), at.kv_heads, at.head_dim))

    def forward_ca(self, h: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        at = self.self_attn
        q = apply_rope(_heads(at.q_proj(self.input_layernorm(h)), at.heads, at.head_dim), cos, sin)
        o = _attend(q, k, v, mask).transpose(-3, -2)
        z = h + at.o_proj(o.reshape(*o.shape[:-2], -1))
        return z + self.mlp(self.post_attention_layernorm(z))


def spec_from_config(cfg: dict[str, Any]) -> DrafterSpec:
    """The :class:`DrafterSpec` recorded in a snapshot ``config.json`` written by :meth:`MoaDrafter.save`."""
    return DrafterSpec(**cfg["moa_cpp_init"]["spec"])


class MoaDrafter(nn.Module):
    """The trainable drafter plus the frozen target embedding / LM head (buffers, not saved)."""

    def __init__(self, spec: DrafterSpec, embed: torch.Tensor, lm_head: Optional[torch.Tensor] = None,
                 d2t: Optional[Any] = None) -> None:
        """``d2t``: target ids of a reduced draft vocabulary (None: draft over the whole target
        vocabulary with the frozen target LM head). With it the drafter owns a trainable head
        ``draft_lm_head`` [V_draft, d], initialised from the target's LM-head rows."""
        super().__init__()
        s = spec
        self.spec = s
        W, D, Dl = s.lsa_width, s.head_dim, s.lsa_head_dim
        self.self_attention = DecoderLayer(s.d, s.n_head, s.sa_kv, D, s.sa_ffn, s.rms_eps)
        self.cross_attention = CrossAttentionLayer(s.d, s.n_head, s.ca_kv, D, s.ca_ffn, s.rms_eps)
        self.layer_self_attention = DecoderLayer(W, s.lsa_heads, s.lsa_kv, Dl, s.lsa_ffn, s.rms_eps)
        self.Ekv2E = nn.Linear(W, s.d, bias=True)
        self.tli = 0  # target layer inference N (attach_tli)
        self.register_buffer("embed", embed.detach().float(), persistent=False)
        self.register_buffer("lm_head", (embed if lm_head is None else lm_head).detach().float(), persistent=False)
        if d2t is None:
            self.d2t: Optional[torch.Tensor] = None
        else:
            ids = torch.as_tensor(np.asarray(d2t), dtype=torch.long)
            self.register_buffer("d2t", ids)  # persistent: saved with the weights
            self.draft_lm_head = nn.Linear(s.d, len(ids), bias=False)
            # the target's own logits restricted to the draft vocabulary (soft labels)
            self.register_buffer("lm_head_draft", self.lm_head[ids].clone(), persistent=False)
            self._init_draft_head()

    def _init_draft_head(self) -> None:
        with torch.no_grad():
            self.draft_lm_head.weight.copy_(self.lm_head_draft)

    # ------------------------------------------------------------------ init / io

    def init_weights(self, seed: int, std: float = 0.02) -> None:
        """Reference init: N(0, std) for every Linear weight (biases 0); RMSNorm weights 1.

        (The reference also draws RMSNorm weights from N(0, 0.02), "a quirk", docs/training.md#recipe; a unit
        norm trains faster from scratch and is what a converged layer looks like.)"""
        g = torch.Generator().manual_seed(seed)
        for name, p in sorted(self.named_parameters()):
            with torch.no_grad():
                if name.startswith("draft_lm_head."):
                    continue  # initialised from the target's rows
                if name.endswith("layernorm.weight"):
                    p.fill_(1.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    _FROM_TARGET = {"attn_norm": "input_layernorm.weight", "attn_q": "self_attn.q_proj.weight",
                    "attn_k": "self_attn.k_proj.weight", "attn_v": "self_attn.v_proj.weight",
                    "attn_output": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
                    "ffn_gate": "mlp.gate_proj.weight", "ffn_up": "mlp.up_proj.weight",
                    "ffn_down": "mlp.down_proj.weight"}

    def init_from_target(self, target: "TorchTarget", sa_layer: int = 0, ca_layer: int = -1) -> None:
        """Start SA from target layer ``sa_layer`` (it reads token embeddings, like layer 0) and CA
        from target layer ``ca_layer`` (its output feeds the LM head, like the last layer). Needs
        the SA/CA sizes of a target layer (``sa_ffn = ca_ffn =`` the target's FFN width, KV heads
        as the target's). LSA and Ekv2E keep the random init."""
        for mod, li in ((self.self_attention, sa_layer), (self.cross_attention, ca_layer)):
            src = target.layers[li]
            params = dict(mod.named_parameters())
            for t_name, hf in self._FROM_TARGET.items():
                w = getattr(src, t_name).data
                if params[hf].shape != w.shape:
                    raise ValueError(f"init from target layer {li}: {hf} is {tuple(params[hf].shape)}, the target's "
                                     f"{t_name} is {tuple(w.shape)} (use the target's FFN width and KV heads)")
                with torch.no_grad():
                    params[hf].copy_(w)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The 29 trainable tensors under their HF names (docs/gguf-format.md#tensors), plus ``draft_lm_head.weight``
        and the int64 ``d2t`` (absolute target ids) with a reduced draft vocabulary. Host copies on
        every device (``.cpu()`` alone would alias the live parameters of a CPU model)."""
        return {k: v.detach().to("cpu", dtype=v.dtype if k == "d2t" else torch.float32, copy=True).contiguous()
                for k, v in self.state_dict().items()}

    def load_hf(self, tensors: dict[str, Any]) -> None:
        """Load the 29 tensors (numpy or torch) of a Format A/B checkpoint (+ the reduced head)."""
        sd = {k.removeprefix("model."): (torch.as_tensor(np.asarray(v)).long() if k == "d2t"
                                         else torch.as_tensor(np.asarray(v)).float())
              for k, v in tensors.items()}
        self.load_state_dict(sd, strict=True)

    def save(self, out_dir: str | os.PathLike[str], extra: Optional[dict[str, Any]] = None) -> Path:
        """Write a Format-B snapshot (``config.json`` + F32 ``model.safetensors``) to ``out_dir``."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        cfg = self.spec.config() | {"moa_cpp_init": {"kind": "trained", "spec": asdict(self.spec)}}
        if extra:
            cfg["moa_cpp_train"] = extra
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        save_file(self.hf_state_dict(), str(out / "model.safetensors"))
        return out

    # ------------------------------------------------------------------ forward

    def _lsa_pooled(self, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """LSA over ``rows`` ``[N, L, W]`` (one sequence of L layer rows per position, no mask,
        docs/drafter.md#lsa), mean over the layers -> ``[N, W]``. SDPA's CUDA kernels fail once batch x heads
        passes 65,535 (a 16k-token GPU batch has 16k LSA "sequences"): run in chunks under it."""
        step = max(1, _SDPA_MAX_BATCH // self.spec.lsa_heads)
        if rows.shape[0] <= step:
            return self.layer_self_attention(rows, cos, sin, None).mean(dim=1)
        return torch.cat([self.layer_self_attention(rows[i:i + step], cos, sin, None).mean(dim=1)
                          for i in range(0, rows.shape[0], step)])

    def ca_kv(self, lsa_in: torch.Tensor, positions: torch.Tensor,
              valid: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """CA keys/values of verified tokens: ``lsa_in`` ``[B, S, L, W]`` -> K, V ``[B, h_ca, S, D]``.
        ``valid`` ``[B, S]``: False marks right padding (its LSA is skipped)."""
        s = self.spec
        B, S, L, W = lsa_in.shape
        pos_l = torch.arange(L, device=lsa_in.device)
        cos, sin = rope_cos_sin(pos_l, s.lsa_head_dim, s.rope_theta)
        rows = lsa_in.reshape(B * S, L, W)
        if valid is not None and not bool(valid.all()):
            # padding follows every real row and no real row attends it (CA masks, loss on
            # response rows only): its LSA is wasted work (16-32 % of a batch's rows). Padded
            # rows get Ekv2E(0) = the bias instead.
            keep = valid.reshape(-1)
            kept = self._lsa_pooled(rows[keep], cos, sin)
            pooled = kept.new_zeros(B * S, W).index_put((keep.nonzero(as_tuple=True)[0],), kept)
        else:
            pooled = self._lsa_pooled(rows, cos, sin)
        e = self.Ekv2E(pooled).view(B, S, s.d)
        cos, sin = rope_cos_sin(positions, s.head_dim, s.rope_theta)
        return self.cross_attention.kv(e, cos[:, None], sin[:, None])

    def forward(self, tokens: torch.Tensor, lsa_in: torch.Tensor, sa_mask: torch.Tensor,
                ca_mask: torch.Tensor, positions: Optional[torch.Tensor] = None,
                valid: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Drafter output ``z`` ``[B, S, d]`` (feed :meth:`logits`).

        Args:
            tokens: ``[B, S]`` token ids (row ``i`` is the token at position ``i``).
            lsa_in: ``[B, S, L, W]`` target K/V rows of every position (HF layout).
            sa_mask / ca_mask: ``[B, 1, S, S]`` booleans, True = row may see column.
            positions: ``[B, S]`` absolute positions (default ``0..S-1``).
            valid: ``[B, S]`` False on right padding (never attended by a real row): its LSA is skipped.
        """
        B, S = tokens.shape
        if positions is None:
            positions = torch.arange(S, device=tokens.device).expand(B, S)
        kc, vc = self.ca_kv(lsa_in, positions, valid)
        cos, sin = rope_cos_sin(positions, self.spec.head_dim, self.spec.rope_theta)
        cos, sin = cos[:, None], sin[:, None]
        x = F.embedding(tokens, self.embed) * self.spec.embedding_scale
        h = self.self_attention(x, cos, sin, sa_mask)
        return self.cross_attention.forward_ca(h, kc, vc, cos, sin, ca_mask)

    def attach_tli(self, target: "TorchTarget", n: int) -> None:
        """Train for target layer inference N (docs/drafter.md#tli): the target's last ``n`` layers and its
        ``output_norm`` (frozen, not saved: the engine reads them from the target GGUF) run on
        ``z`` before the LM head (:meth:`head_input`)."""
        if not 0 < n < target.n_layer:
            raise ValueError(f"tli {n}: must be in 1..{target.n_layer - 1}")
        self.__dict__["_tli_target"] = target  # plain attribute: not a submodule, never in state_dict
        self.tli = n

    def head_input(self, z: torch.Tensor, lsa_in: torch.Tensor, start: torch.Tensor,
                   positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The LM head's input: ``z`` at TLI 0; at TLI N the post-norm output of the target's last N
        layers run on ``z`` train-consistently with the engine (docs/drafter.md#tli): row ``i`` attends the
        target's own K/V (from ``lsa_in``) of positions ``j <= start(i)`` and the drafted rows
        ``start(i) < j <= i`` (the root and its path at inference)."""
        if self.tli == 0:
            return z
        tg = self.__dict__["_tli_target"]
        B, S, _ = z.shape
        if positions is None:
            positions = torch.arange(S, device=z.device).expand(B, S)
        cos, sin = rope_cos_sin(positions, tg.head_dim, tg.rope_theta)
        cos, sin = cos[:, None], sin[:, None]
        j = torch.arange(S, device=z.device)
        ctx = j[None, None, :] <= start[:, :, None]                                   # [B, S, S]
        own = (j[None, None, :] > start[:, :, None]) & (j[None, :] <= j[:, None])[None]
        mask = torch.cat([ctx, own], dim=-1)[:, None]                                 # [B, 1, S, 2S]
        Hk, D = tg.n_head_kv, tg.head_dim
        g = z
        for li in range(tg.n_layer - self.tli, tg.n_layer):
            kv = lsa_in[:, :, li].reshape(B, S, Hk, 2 * D)   # head-major K | V rows (docs/drafter.md#target-kv)
            g = tg.layer_forward(li, g, cos, sin, kv[..., :D].transpose(1, 2), kv[..., D:].transpose(1, 2), mask)
        return tg.final_norm(g)

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """Target LM head on ``z`` over the whole target vocabulary (TLI 0: no output norm, docs/drafter.md#lm-head)."""
        return z @ self.lm_head.T

    def draft_logits(self, z: torch.Tensor) -> torch.Tensor:
        """The drafter's logits: its own head over the draft vocabulary, else the target head."""
        return self.draft_lm_head(z) if self.d2t is not None else self.logits(z)

    def label_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The target's logits from its post-norm hidden ``h``, restricted to the draft vocabulary
        (their softmax is the target distribution renormalised over the draft tokens)."""
        return h @ (self.lm_head_draft if self.d2t is not None else self.lm_head).T

    def draft_ids(self, z: torch.Tensor) -> torch.Tensor:
        """Greedy draft tokens as target ids."""
        a = self.draft_logits(z).argmax(-1)
        return self.d2t[a] if self.d2t is not None else a
