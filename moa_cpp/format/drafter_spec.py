"""The shape of an MoA drafter for a given target: :class:`DrafterSpec` (every size a drafter
checkpoint needs, checked for consistency) and :func:`spec_from_target` (sized from a target
GGUF's metadata). Used by the random-drafter writer, the trainer and the converter tests.

Default sizes (each can be overridden):

- SA / CA KV heads: the target's ``H_kv`` (``gcd(H, H_kv)`` if that did not divide ``H``).
- SA / CA FFN: ``1.5 * d``; LSA FFN: ``1.5 * W`` (the published Llama-3-8B drafter's ratios),
  rounded to a multiple of 32 so that ``q8_0`` applies to every ``ffn_down``.
- LSA query heads: the target's ``H`` when ``W / H`` is an even integer (the reference
  construction); otherwise the fewest heads whose head dim ``W / h`` is even and <= 64 (64 is
  the published drafter's LSA head dim). SmolLM2-135M: W = 384, H = 9 -> 6 heads x 64.
- LSA KV heads: ``gcd(lsa_heads, H_kv)`` (= 8 for Llama-3-8B, as published).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Optional

from moa_cpp.errors import InvalidArgumentError
from moa_cpp.format.names import tensor_map

__all__ = ["DrafterSpec", "spec_from_target", "MAX_LSA_HEAD_DIM"]

MAX_LSA_HEAD_DIM = 64  # LSA head dim of the published Llama-3-8B drafter
_QBLOCK = 32           # Q8_0 / Q4_0 block: FFN sizes that are multiples keep every matrix quantizable


@dataclass(frozen=True)
class DrafterSpec:
    """Everything a snapshot needs: the target's sizes and the drafter's own hyper-parameters."""

    d: int                  # target hidden size = SA/CA width
    n_head: int             # target query heads = SA/CA query heads
    head_dim: int           # target head dim = SA/CA head dim (Gemma-3: 256, not d / H)
    target_kv: int          # target KV heads; W = 2 * target_kv * head_dim
    target_layers: int      # target L (LSA sequence length)
    rms_eps: float
    rope_theta: float
    vocab_size: int
    embedding_scale: float  # target's layer-0 embedding scale (Gemma: sqrt(d))
    sa_kv: int
    sa_ffn: int
    ca_kv: int
    ca_ffn: int
    lsa_heads: int
    lsa_kv: int
    lsa_ffn: int

    @property
    def lsa_width(self) -> int:
        """W = 2 * H_kv * head_dim (docs/drafter.md#target-kv)."""
        return 2 * self.target_kv * self.head_dim

    @property
    def lsa_head_dim(self) -> int:
        return self.lsa_width // self.lsa_heads

    def problems(self) -> list[str]:
        """Every inconsistency that would make the converter or the runtime reject the drafter."""
        bad: list[str] = []
        W = self.lsa_width
        for name, heads, kv in (("sa", self.n_head, self.sa_kv), ("ca", self.n_head, self.ca_kv),
                                ("lsa", self.lsa_heads, self.lsa_kv)):
            if kv <= 0 or heads % kv:
                bad.append(f"{name}: {heads} query heads not a positive multiple of {kv} KV heads")
        if self.lsa_heads <= 0 or W % self.lsa_heads or (W // self.lsa_heads) % 2:
            bad.append(f"lsa_heads {self.lsa_heads}: W = {W} / lsa_heads must be an even integer (RoPE)")
        if self.head_dim % 2:
            bad.append(f"head_dim {self.head_dim} is odd (RoPE)")
        for name in ("sa_ffn", "ca_ffn", "lsa_ffn", "d", "n_head", "target_layers", "vocab_size"):
            if getattr(self, name) <= 0:
                bad.append(f"{name} must be positive")
        return bad

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF tensor name -> PyTorch shape ``[out, in]`` of the 29 tensors (docs/drafter.md#shapes)."""
        d, W, D, Dl = self.d, self.lsa_width, self.head_dim, self.lsa_head_dim
        mods = {"self_attention.": (d, self.n_head * D, self.sa_kv * D, self.sa_ffn),
                "cross_attention.": (d, self.n_head * D, self.ca_kv * D, self.ca_ffn),
                "layer_self_attention.": (W, self.lsa_heads * Dl, self.lsa_kv * Dl, self.lsa_ffn)}
        out: dict[str, tuple[int, ...]] = {}
        for p, (width, q, kv, ffn) in mods.items():
            out.update({
                p + "input_layernorm.weight": (width,), p + "post_attention_layernorm.weight": (width,),
                p + "self_attn.q_proj.weight": (q, width), p + "self_attn.k_proj.weight": (kv, width),
                p + "self_attn.v_proj.weight": (kv, width), p + "self_attn.o_proj.weight": (width, q),
                p + "mlp.gate_proj.weight": (ffn, width), p + "mlp.up_proj.weight": (ffn, width),
                p + "mlp.down_proj.weight": (width, ffn),
            })
        out["Ekv2E.weight"] = (d, W)
        out["Ekv2E.bias"] = (d,)
        assert set(out) == set(tensor_map().values())  # the one name table stays authoritative
        return out

    def config(self) -> dict[str, Any]:
        """``config.json`` of a Format B snapshot: the target's config (model_type "llama") plus
        the non-reference keys the converter reads (layouts.derive_hparams)."""
        return {
            "architectures": ["MOASpec"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": self.d, "num_attention_heads": self.n_head, "num_key_value_heads": self.target_kv,
            "head_dim": self.head_dim, "num_hidden_layers": self.target_layers,
            "rms_norm_eps": self.rms_eps, "rope_theta": self.rope_theta, "rope_scaling": None,
            "vocab_size": self.vocab_size, "attention_bias": False, "mlp_bias": False,
            "torch_dtype": "float32",
            "layer_self_attention_num_attention_heads": self.lsa_heads,
            "embedding_scale": self.embedding_scale,
        }


def _round_block(x: float) -> int:
    return max(_QBLOCK, int(round(x / _QBLOCK)) * _QBLOCK)


def _default_lsa_heads(W: int, H: int) -> int:
    if W % H == 0 and (W // H) % 2 == 0:
        return H  # the reference construction
    # Fewest heads with an even head dim <= 64; h = W / 2 (head dim 2) always qualifies.
    return next(h for h in range(1, W + 1) if W % h == 0 and (W // h) % 2 == 0 and W // h <= MAX_LSA_HEAD_DIM)


def spec_from_target(target_gguf: str | os.PathLike[str], *, sa_kv: Optional[int] = None,
                     sa_ffn: Optional[int] = None, ca_kv: Optional[int] = None, ca_ffn: Optional[int] = None,
                     lsa_heads: Optional[int] = None, lsa_kv: Optional[int] = None,
                     lsa_ffn: Optional[int] = None) -> DrafterSpec:
    """A drafter spec sized from the target GGUF's metadata (defaults: module docstring).

    Raises InvalidArgumentError listing every inconsistency of the chosen sizes.
    """
    from moa_cpp.convert.target_gguf import read_target

    tg = read_target(target_gguf)
    H, kv, D = tg.head_count, tg.head_count_kv, tg.key_length
    W = 2 * kv * D
    ctx_kv = kv if H % kv == 0 else math.gcd(H, kv)
    lh = lsa_heads if lsa_heads is not None else _default_lsa_heads(W, H)
    spec = DrafterSpec(
        d=tg.n_embd, n_head=H, head_dim=D, target_kv=kv, target_layers=tg.block_count,
        rms_eps=float(tg.rms_eps if tg.rms_eps is not None else 1e-5),
        rope_theta=float(tg.rope_theta if tg.rope_theta is not None else 10000.0),
        vocab_size=int(tg.vocab_size or 0), embedding_scale=tg.embedding_scale,
        sa_kv=sa_kv if sa_kv is not None else ctx_kv, sa_ffn=sa_ffn or _round_block(1.5 * tg.n_embd),
        ca_kv=ca_kv if ca_kv is not None else ctx_kv, ca_ffn=ca_ffn or _round_block(1.5 * tg.n_embd),
        lsa_heads=lh, lsa_kv=lsa_kv if lsa_kv is not None else math.gcd(lh, kv),
        lsa_ffn=lsa_ffn or _round_block(1.5 * W),
    )
    bad = spec.problems()
    if bad:
        raise InvalidArgumentError(f"drafter sizes for {target_gguf}:\n  - " + "\n  - ".join(bad))
    return spec


