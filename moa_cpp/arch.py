"""Facts about target architectures that several parts of moa_cpp need, in one place.

- :func:`embedding_scale`: llama.cpp's Gemma graphs multiply the token embedding by
  sqrt(n_embd) before layer 0 (src/models/gemma*.cpp: ``ggml_scale(inpL, sqrtf(n_embd))``);
  the drafter's SA input uses the same scale, the converter records it, the trainer applies it.
- :func:`unpermute_rows` / :func:`unpermute_last_axis`: llama.cpp's converter permutes the Q/K
  rows of NORM-RoPE models per head (``convert_hf_to_gguf.permute``): GGUF row 2i+j of a head
  holds HF row j*D/2+i. The trainer's torch target, the capture tests and TLI tests undo it
  (the native loader and capture do the same in C++, moa-architecture.md §18).
"""
from __future__ import annotations

import math

import numpy as np


def embedding_scale(arch: str, n_embd: int) -> float:
    """Factor applied to token_embd rows before layer 0: sqrt(n_embd) for Gemma architectures
    (gemma, gemma2, gemma3, gemma3n, gemma-embedding), else 1."""
    return math.sqrt(n_embd) if arch.startswith("gemma") else 1.0


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
