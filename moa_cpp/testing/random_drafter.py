"""Randomly initialised MoA drafters sized for a real target GGUF (tests, benchmarks, and the
starting point of a trainer).

:func:`make_random_checkpoint` writes a Format-B-like training snapshot (docs/drafter.md#checkpoint-formats): the
target's ``config.json`` values plus the keys the converter reads for non-reference targets
(``head_dim``, ``layer_self_attention_num_attention_heads``, ``embedding_scale``) and a
``model.safetensors`` with the 29 drafter tensors (docs/gguf-format.md#tensors). :func:`make_random_drafter`
converts such a snapshot to a drafter GGUF.

Sizes come from :func:`moa_cpp.format.drafter_spec.spec_from_target` (defaults documented there).
Weights are ``N(0, std)``; RMSNorm weights ``1 + N(0, std)``; ``Ekv2E.bias`` ``N(0, std)``.

Example::

    from moa_cpp.testing.random_drafter import make_random_drafter
    make_random_drafter("SmolLM2-135M-Instruct.Q4_1.gguf", "rand-smollm2.gguf", outtype="q8_0")
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import numpy as np

# DrafterSpec and spec_from_target live in moa_cpp.format.drafter_spec (still importable from here)
from moa_cpp.format.drafter_spec import DrafterSpec, spec_from_target  # noqa: F401
from moa_cpp.errors import InvalidArgumentError

__all__ = ["DrafterSpec", "spec_from_target", "write_checkpoint", "make_random_checkpoint",
           "make_random_drafter"]


def write_checkpoint(spec: DrafterSpec, out_dir: str | os.PathLike[str], *, seed: int = 0,
                     std: float = 0.02) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (F32) of ``spec`` with random weights.

    Tensors are drawn in sorted-name order from one generator, so a seed fixes every value.
    """
    from safetensors.numpy import save_file

    bad = spec.problems()
    if bad:
        raise InvalidArgumentError("inconsistent drafter spec:\n  - " + "\n  - ".join(bad))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for name, shape in sorted(spec.hf_shapes().items()):
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        if name.endswith("layernorm.weight"):
            x += np.float32(1.0)  # RMSNorm weights start near identity, as in a trained layer
        tensors[name] = x
    cfg = spec.config() | {"moa_cpp_init": {"kind": "random", "seed": seed, "std": std,
                                            "spec": asdict(spec)}}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(tensors, str(out / "model.safetensors"))
    return out


def make_random_checkpoint(target_gguf: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                           sa_kv: Optional[int] = None, sa_ffn: Optional[int] = None,
                           ca_kv: Optional[int] = None, ca_ffn: Optional[int] = None,
                           lsa_heads: Optional[int] = None, lsa_kv: Optional[int] = None,
                           lsa_ffn: Optional[int] = None, seed: int = 0, std: float = 0.02) -> Path:
    """Write a random Format-B snapshot sized for ``target_gguf`` into ``out_dir``; returns it."""
    spec = spec_from_target(target_gguf, sa_kv=sa_kv, sa_ffn=sa_ffn, ca_kv=ca_kv, ca_ffn=ca_ffn,
                            lsa_heads=lsa_heads, lsa_kv=lsa_kv, lsa_ffn=lsa_ffn)
    return write_checkpoint(spec, out_dir, seed=seed, std=std)


def make_random_drafter(target_gguf: str | os.PathLike[str], out_gguf: str | os.PathLike[str],
                        outtype: str = "f16", **kw: Any) -> Path:
    """Random drafter GGUF for ``target_gguf`` (``kw``: :func:`make_random_checkpoint`'s options).

    The snapshot lives in a temporary directory; the conversion cross-checks it against the target.
    """
    from moa_cpp.convert import convert

    with tempfile.TemporaryDirectory(prefix="moa-random-") as tmp:
        ckpt = make_random_checkpoint(target_gguf, Path(tmp) / "snapshot", **kw)
        return convert(ckpt, out_gguf, outtype=outtype, target_gguf=target_gguf, progress=False)
