"""Facts about target architectures (llama.cpp's ``general.architecture``), in one table.

:data:`TARGET_ARCHS` has one :class:`TargetArch` row per architecture moa_cpp treats specially;
every Python layer reads it: the converter (:data:`~moa_cpp.convert.target_gguf.NORM_ROPE_ARCHS`,
:data:`~moa_cpp.convert.layouts.SNAPSHOT_MODEL_TYPES`, the embedding scale it records), the
trainer's torch target (which architectures it runs, which Q/K rows it un-permutes), the
runtime's and the bundle's embedding scale. Its C++ twin is ``native/src/moa-target-arch.cpp``
(the loader's embedding scale and TLI check, the capture's K/V node names);
``tests/format/test_arch_tables.py`` checks that both know the same architectures with the same facts,
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
           "by_snapshot_model_type", "unpermute_rows", "unpermute_last_axis", "llama_kind",
           "drafter_refusal", "speculation_refusal"]


@dataclass(frozen=True)
class TargetArch:
    """What moa_cpp does differently for one target architecture."""

    name: str                   # general.architecture, as llama.cpp spells it
    qk_permuted: bool = False   # NORM RoPE: llama.cpp's converter permuted Q/K rows per head
    sqrt_embd_scale: bool = False  # layer-0 input = sqrt(n_embd) * token_embd row (Gemma)
    tli: bool = False           # the native TLI can run its decoder layers (plain llama block)
    capture: bool = False       # the K/V capture is checked against transformers (tests/format/test_archs.py)
    torch_target: bool = False  # moa_cpp.train.target_torch.TorchTarget implements its forward
    snapshot_model_type: Optional[str] = None  # HF config model_type of a Format B training
    #                             snapshot for this target that the converter accepts (None: none)
    builtin_chat_template: Optional[str] = None  # llama.cpp built-in template for GGUFs of this
    #                             family without tokenizer.chat_template (some Gemma-3 files)


TARGET_ARCHS: tuple[TargetArch, ...] = (
    TargetArch("llama", qk_permuted=True, tli=True, capture=True, torch_target=True, snapshot_model_type="llama"),
    TargetArch("mistral3", qk_permuted=True, capture=True),
    TargetArch("granite", qk_permuted=True, capture=True),
    TargetArch("deci", qk_permuted=True),
    # llama.cpp runs qwen2 with NEOX rope: its converter left the Q/K rows in HF order.
    TargetArch("qwen2", capture=True, torch_target=True, snapshot_model_type="qwen2"),
    # Every Gemma architecture llama.cpp 0.3.36 knows.
    TargetArch("gemma", sqrt_embd_scale=True, builtin_chat_template="gemma", capture=True),
    TargetArch("gemma2", sqrt_embd_scale=True, builtin_chat_template="gemma", capture=True),
    TargetArch("gemma3", sqrt_embd_scale=True, builtin_chat_template="gemma", capture=True),
    TargetArch("gemma3n", sqrt_embd_scale=True, builtin_chat_template="gemma"),
    TargetArch("gemma-embedding", sqrt_embd_scale=True, builtin_chat_template="gemma"),
    TargetArch("gemma4", sqrt_embd_scale=True, builtin_chat_template="gemma"),
    TargetArch("gemma4-assistant", sqrt_embd_scale=True, builtin_chat_template="gemma"),
    # K/V capture checked against transformers on tiny checkpoints (tests/format/test_archs.py)
    TargetArch("qwen3", capture=True),
    TargetArch("qwen3moe", capture=True),
    TargetArch("qwen2moe", capture=True),
    TargetArch("phi3", capture=True),
    TargetArch("gpt-oss", capture=True),
    TargetArch("olmo2", capture=True),
    TargetArch("olmo", qk_permuted=True, capture=True),
    TargetArch("granitemoe", qk_permuted=True, capture=True),
    TargetArch("smollm3", qk_permuted=True, capture=True),
    TargetArch("glm4", capture=True),
    TargetArch("stablelm", capture=True),
    TargetArch("starcoder2", capture=True),
    TargetArch("seed_oss", capture=True),
    TargetArch("command-r", capture=True),
    TargetArch("arcee", qk_permuted=True, capture=True),
    TargetArch("ernie4_5", capture=True),
    TargetArch("gpt2", capture=True),
    TargetArch("gptneox", capture=True),
    TargetArch("bloom", capture=True),
    TargetArch("lfm2", capture=True),
    TargetArch("qwen3next", capture=True),
)

_BY_NAME = {a.name: a for a in TARGET_ARCHS}


def llama_kind(arch: str) -> tuple[str, str]:
    """(kind, why) of ``arch`` in the vendored llama.cpp (:mod:`moa_cpp.format.llama_archs`, generated from
    its source); an architecture it does not know: ("unknown", why)."""
    from moa_cpp.format.llama_archs import LLAMA_ARCHS

    return LLAMA_ARCHS.get(arch, ("unknown", "not an architecture of the llama.cpp that moa_cpp links"))


def drafter_refusal(arch: str) -> Optional[str]:
    """Why the MoA drafter cannot follow a target of ``arch`` (one line), or None: the drafter
    reads the K/V of attention layers, which ``attention`` and ``hybrid`` targets have."""
    kind, why = llama_kind(arch)
    # unknown: a name the linked llama.cpp does not have (it will not load such a file anyway)
    return None if kind in ("attention", "hybrid", "unknown") else f"{arch}: {why}"


def speculation_refusal(arch: str, recurrent: bool = False, hybrid: bool = False,
                        rollback_limit: Optional[int] = None) -> Optional[str]:
    """Why no draft of any kind can be verified on ``arch`` (one line), or None. A rejected draft
    is rolled back by removing KV cells; a recurrent state cannot be cut back that way, only
    through llama.cpp's per-token snapshots of it (``rollback_limit`` > 0: the target's
    :attr:`~moa_cpp.target.context.TargetContext.rollback_limit`, None where not known)."""
    kind, why = llama_kind(arch)
    stateful = recurrent or hybrid or kind in ("recurrent", "hybrid")
    if stateful and rollback_limit:
        return None
    if recurrent or kind == "recurrent":
        return f"{arch}: a recurrent model: a rejected draft cannot be rolled back"
    from moa_cpp.format.llama_archs import RS_ROLLBACK

    if (hybrid or kind == "hybrid") and arch in RS_ROLLBACK:
        # llama.cpp snapshots this state, the caller does not use them (a continuous-batching slot)
        return (f"{arch}: a hybrid model (recurrent layers): continuous batching does not roll its recurrent state "
                "back (--no-cont-batching verifies drafts)")
    if hybrid or kind == "hybrid":
        return (f"{arch}: a hybrid model (recurrent layers): llama.cpp keeps no per-token snapshots of its "
                "recurrent state, so a rejected draft cannot be rolled back")
    return None


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
