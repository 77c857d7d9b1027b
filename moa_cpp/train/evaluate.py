"""Held-out acceptance estimate of a drafter under training (:func:`eval_acceptance`) and the
held-out split it runs on (:func:`heldout_split`).

On held-out greedy samples, with CA bounded at every 5th position (a chain-4 cycle: root + 4
drafts), the drafter's argmax at each row is compared with the target's; ``tau`` = 1 + mean run of
agreements from each boundary (<= 4), the expected tokens per target call of greedy chain-4
speculation if llama.cpp's target agreed with the F32 one. TLI N > 0 runs the target's last N
layers on ``z`` as the engine does (docs/drafter.md#tli).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from moa_cpp.train.batches import make_batch
from moa_cpp.train.data import Dataset
from moa_cpp.train.devices import autocast
from moa_cpp.train.features import FeatureStore, OnlineFeatures
from moa_cpp.train.masks import bounded_masks
from moa_cpp.train.model import MoaDrafter

__all__ = ["eval_acceptance", "heldout_split"]


@torch.no_grad()
def eval_acceptance(model: MoaDrafter, ds: Dataset, fs: "FeatureStore | OnlineFeatures", idx: list[int],
                    depth: int = 4, bf16: bool = False,
                    per_sample: Optional[list[tuple[int, int]]] = None,
                    first: Optional[int] = None) -> dict[str, float]:
    """Held-out greedy chain-``depth`` acceptance estimate (module docstring). ``per_sample``, when
    given, receives (accepted drafts, cycles) of each sample in ``idx`` (for bootstrap intervals).
    ``first``: only chains that start within a response's first ``first`` tokens (what a benchmark
    capped at that many new tokens sees)."""
    model.eval()
    dev = model.embed.device
    runs: list[int] = []
    agree = np.zeros(depth)
    count = np.zeros(depth)
    for j in idx:
        n_before = len(runs)
        b = make_batch(ds, fs, [j], dev)
        resp = b["response"]
        T = torch.tensor([depth + 1], device=dev)
        sa, ca, start = bounded_masks(resp, T, torch.tensor([False], device=dev))
        with autocast(bf16, dev.type):
            z = model(b["tokens"], b["lsa"], sa, ca)
            u = model.head_input(z, b["lsa"], start)
        dr = model.draft_ids(u[0].float())
        tg = model.logits(b["hidden"][0]).argmax(-1)
        ok = (dr == tg).cpu().numpy()
        st = start[0].cpu().numpy()
        S = len(ok)
        # chain starts at every verified position b inside/just before the response
        p0 = int(ds.prompt_len[j]) - 1
        for bpos in range(p0, S - depth - 1 if first is None else min(S - depth - 1, p0 + first)):
            if st[bpos] != bpos:
                continue
            run = 0
            for k in range(1, depth + 1):
                count[k - 1] += 1
                if ok[bpos + k]:
                    agree[k - 1] += 1
                    run += 1
                else:
                    break
            runs.append(run)
        if per_sample is not None:
            per_sample.append((int(sum(runs[n_before:])), len(runs) - n_before))
    model.train()
    res = {"tau": 1.0 + (float(np.mean(runs)) if runs else 0.0), "cycles": float(len(runs))}
    for k in range(depth):
        res[f"acc@{k + 1}"] = float(agree[k] / max(count[k], 1))
    return res


def heldout_split(ds: Dataset, n: int, seed: int) -> list[int]:
    """The held-out samples of a run: ``n`` (at most a fifth) of the greedy self-distilled ones,
    seeded; all samples are candidates when none is greedy (teacher-forced data only)."""
    greedy = np.flatnonzero(ds.greedy)
    if len(greedy) == 0:
        greedy = np.arange(len(ds))
    rng = np.random.default_rng(seed)
    return sorted(rng.permutation(greedy)[: min(n, max(0, len(greedy) // 5))].tolist())
