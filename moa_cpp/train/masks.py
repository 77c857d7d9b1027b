"""T-step-bounded attention masks for teacher-forced drafter training (docs/drafter.md#training-masks).

Position ``i`` is *verified* if it is a prompt (or padding) position or ``i % T == 0``;
``start(i)`` is the last verified position ``<= i``. CA row ``i`` sees keys ``j <= start(i)``
(the first row after a boundary is the engine's root, the k-th is a depth-k draft). SA is causal,
or "staircase" (only ``start(i) < j <= i`` plus ``j = i``) for sequences drawn into that mode.
Masks are boolean, True = visible, shaped ``[B, 1, S, S]`` for ``scaled_dot_product_attention``.
"""
from __future__ import annotations

import torch

__all__ = ["bounded_masks", "block_starts"]


def block_starts(response: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """``start(i)`` ``[B, S]`` for response masks ``[B, S]`` (bool) and per-sequence ``T`` ``[B]``."""
    B, S = response.shape
    idx = torch.arange(S, device=response.device).expand(B, S)
    verified = (~response) | (idx % T[:, None] == 0)
    marks = torch.where(verified, idx, torch.full_like(idx, -1))
    return torch.cummax(marks, dim=1).values


def bounded_masks(response: torch.Tensor, T: torch.Tensor,
                  staircase: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SA mask, CA mask (``[B, 1, S, S]`` bool) and ``start`` (``[B, S]``).

    Args:
        response: ``[B, S]`` True where the token is a response token (padding: False).
        T: ``[B]`` block length per sequence (spec: ``T ~ U{6..14}``).
        staircase: ``[B]`` bool, sequences whose SA mask is the staircase.
    """
    B, S = response.shape
    start = block_starts(response, T)
    j = torch.arange(S, device=response.device)
    i = j[:, None]
    causal = (j[None, :] <= i)[None]                              # [1, S, S]
    ca = j[None, None, :] <= start[:, :, None]                    # [B, S, S]
    stair = ((j[None, None, :] > start[:, :, None]) & causal) | (j[None, :] == i)[None]
    sa = torch.where(staircase[:, None, None], stair, causal.expand(B, S, S))
    return sa[:, None], ca[:, None], start
