"""The settings of one training run (:class:`TrainSettings`, recorded in checkpoints and the
snapshot config) and its LR schedule (:func:`lr_at`): linear warm-up to ``lr`` over ``min(50, 5 %)``
of the steps, then linear decay to ``lr * min_lr_ratio`` at the end (see
:mod:`moa_cpp.train.trainer`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["TrainSettings", "lr_at"]


@dataclass
class TrainSettings:
    """Optimisation settings (recorded in checkpoints and the snapshot config)."""

    seed: int = 0
    steps: Optional[int] = None         # exact step count (deterministic); else from minutes/epochs
    minutes: Optional[float] = None     # wall-clock budget for the optimisation loop
    epochs: float = 4.0                 # upper bound on passes over the training split
    batch_tokens: int = 2048            # tokens per step (sequences packed up to this, padded)
    lr: float = 6e-4                    # peak LR (paper: 20 x 3e-5)
    min_lr_ratio: float = 0.05          # final LR = lr * ratio (paper: base = peak / 20)
    warmup: int = 50                    # paper: 50 steps; capped at 5 % of the run
    weight_decay: float = 0.0
    optimizer: str = "adamw"            # or "muon" (`moa-cpp train`'s default): Muon for the layers' 2-D weights
    clip: float = 1.0
    ce_weight: float = 0.1
    t_min: int = 6
    t_max: int = 14
    staircase_until: float = 0.5        # staircase probability reaches 0 at this run fraction
    batching: str = "random"            # "random": packed in shuffled order; "bucket": by length (less padding)
    holdout: int = 12                   # held-out greedy samples for the acceptance estimate
    eval_every: int = 50
    ckpt_every: int = 50
    threads: int = 1                   # 1 measured faster than 2 on the shared 2-core box
    bf16: bool = True                   # CPU autocast bf16 for the matmuls (F32 master weights)
    init_std: float = 0.02
    draft_vocab: int = 0                # > 0: reduced draft vocabulary of this many tokens
    tli: int = 0                        # target layer inference N (features need resid_layer = L - N)
    init_from_target: bool = False      # SA from target layer 0, CA from the last layer (sizes must match)
    device: str = "cpu"                 # "cpu" or "cuda[:i]" (resolve "auto" with resolve_device)
    skip_padding: bool = True           # no LSA on padded rows (exact; 16-32 % of rows)
    muon_ns_steps: int = 5              # Newton-Schulz iterations of Muon's orthogonalisation
    loss_max_depth: int = 0             # > 0: loss only on rows at depth < this (what chains/trees draft)
    mask_off_target: bool = False       # no loss on rows whose draft path holds a token the target would not pick
    init_from: Optional[str] = None     # the drafter GGUF a continuation started from (recorded only)


def lr_at(step: int, total: int, s: TrainSettings) -> float:
    """Warm-up then linear decay (module docstring)."""
    warm = max(1, min(s.warmup, total // 20))
    if step < warm:
        return s.lr * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    return s.lr * (1.0 - (1.0 - s.min_lr_ratio) * min(1.0, frac))
