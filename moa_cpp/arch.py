"""Facts about target architectures (llama.cpp's ``general.architecture``), in one table.

:data:`TARGET_ARCHS` has one :class:`TargetArch` row per architecture moa_cpp treats specially;
every Python layer reads it: the converter (:data:`~moa_cpp.convert.target_gguf.NORM_ROPE_ARCHS`,
:data:`~moa_cpp.convert.layouts.SNAPSHOT_MODEL_TYPES`, the embedding scale it records), the
trainer's torch target (which architectures it runs, which Q/K rows it un-permutes), the
runtime's and the bundle's embedding scale. Its C++ twin is ``native/src/moa-target-arch.cpp``
(the loader's embedding scale and TLI check, the capture's K/V node names);
``tests/test_arch_tables.py`` checks that both know the same architectures with the same facts,
and that every layer's supported set is the table's.

An architecture not in the table gets :func:`lookup`'s defaults: embedding scale 1, Q/K rows not
permuted, no TLI, no torch target, no training snapshot.

Adding an architecture: a row here and a row in ``native/src/moa-target-arch.cpp``.

- :func:`embedding_scale`: llama.cpp's Gemma graphs multiply the token embedding by
  sqrt(n_embd) before layer 0 (src/models/gemma*.cpp: ``ggml_scale(inpL, sqrtf(n_embd))``);
  the drafter's SA input uses the same scale, the converter records it, the trainer applies it.
- :func:`unpermute_rows` / :func:`unpermute_last_axis`: llama.cpp's converter permutes the Q/K
  rows of NORM-RoPE models per head (``convert_hf_to_gguf.permute``): GGUF row 2i+j of a head
  holds HF row j*D/2+i. The trainer's torch target, the capture tests and TLI tests undo it
  (the native loader and capture do the same in C++, docs/drafter.md#k-permutation).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

__all__ = ["TargetArch", "TARGET_ARCHS", "lookup", "known", "embedding_scale", "names_where",
           "by_snapshot_model_type", "unpermute_rows", "unpermute_last_axis"]


@dataclass(frozen=True)
class TargetArch:
    """What moa_cpp does differently for one target architecture."""

    name: str                   # general.architecture, as llama.cpp spells it
    qk_permuted: bool = False   # NORM RoPE: llama.cpp's converter permuted Q/K rows per head
    sqrt_embd_scale: bool = False  # layer-0 input = sqrt(n_embd) * token_embd row (Gemma)
    tli: bool = False           # the native TLI can run its decoder layers (plain llama block)
    capture: bool = False       # the native K/V capture is verified on its llama.cpp graph
    torch_target: bool = False  # moa_cpp.train.target_torch.TorchTarget implements its forward
    snapshot_model_type: Optional[str] = None  # HF config model_type of a Format B training
    #                             snapshot for this target that the converter accepts (None: none)
    builtin_chat_template: Optional[str] = None  # llama.cpp built-in template for GGUFs of this
    #                             family without tokenizer.chat_template (some Gemma-3 files)


TARGET_ARCHS: tuple[TargetArch, ...] = (
    TargetArch("llama", qk_permuted=True, tli=True, capture=True, torch_target=True, snapshot_model_type="llama"),
    TargetArch("mistral", qk_permuted=True),
    TargetArch("granite", qk_permuted=True),
    TargetArch("deci", qk_permuted=True),
    # llama.cpp runs qwen2 with NEOX rope: its converter left the Q/K rows in HF order.
    TargetArch("qwen2", capture=True, torch_target=True, snapshot_model_type="qwen2"),
    # Every Gemma architecture llama.cpp 0.3.36 knows.
    TargetArch("gemma", sqrt_embd_scale=True, builtin_chat_template="gemma"),
    TargetArch("gemma2", sqrt_embd_scale=True, builtin_chat_template="gemma"),
    TargetArch("gemma3", sqrt_embd_scale=True, builtin_chat_template="gemma", capture=True),
    TargetArch("gemma3n", sqrt_embd_scale=True, builtin_chat_template="gemma"),
    TargetArch("gemma-embedding", sqrt_embd_scale=True, builtin_chat_template="gemma"),
    TargetArch("gemma4", sqrt_embd_scale=True, builtin_chat_template="gemma"),
    TargetArch("gemma4-assistant", sqrt_embd_scale=True, builtin_chat_template="gemma"),
)

_BY_NAME = {a.name: a for a in TARGET_ARCHS}


def lookup(arch: str) -> TargetArch:
    """The row of ``arch``, or the defaults (module docstring) under that name."""
    return _BY_NAME.get(arch) or TargetArch(arch)


def known(arch: str) -> bool:
    """Whether the table has a row for ``arch``."""
    return arch in _BY_NAME


def names_where(flag: str) -> tuple[str, ...]:
    """Names of the rows whose boolean field ``flag`` is set, in table order."""
    return tuple(a.name for a in TARGET_ARCHS if getattr(a, flag))


def by_snapshot_model_type(model_type: str) -> Optional[TargetArch]:
    """The row whose training snapshots carry HF ``model_type`` (None if the converter takes none)."""
    return next((a for a in TARGET_ARCHS if a.snapshot_model_type == model_type), None)


def embedding_scale(arch: str, n_embd: int) -> float:
    """Factor applied to token_embd rows before layer 0: sqrt(n_embd) for Gemma architectures
    (the rows with ``sqrt_embd_scale``), else 1."""
    return math.sqrt(n_embd) if lookup(arch).sqrt_embd_scale else 1.0


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """A GGUF Q or K weight ``[n_head * D, ...]`` back to HF row order: rows ``(head, D/2, 2)``
    -> ``(head, 2, D/2)``."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_last_axis(k: np.ndarray) -> np.ndarray:
    """The same permutation undone along the last axis of per-head vectors ``[..., D]``
    (K rows as llama.cpp computes them -> HF order)."""
    d = k.shape[-1]
    return k.reshape(*k.shape[:-1], d // 2, 2).swapaxes(-1, -2).reshape(k.shape)
