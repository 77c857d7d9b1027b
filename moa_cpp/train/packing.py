"""Which samples share a batch: greedy packing up to a token budget (:func:`pack_batches`),
optionally after sorting windows of the shuffled order by length (:func:`bucket_by_length`), and
the padding that leaves (:func:`padding_share`)."""
from __future__ import annotations

import numpy as np

__all__ = ["BUCKET_WINDOW", "bucket_by_length", "pack_batches", "padding_share"]


def pack_batches(order: np.ndarray, lens: np.ndarray, batch_tokens: int) -> list[list[int]]:
    """Greedy packing of samples (in ``order``) into batches of at most ``batch_tokens`` padded tokens."""
    out: list[list[int]] = []
    cur: list[int] = []
    mx = 0
    for j in order:
        m = max(mx, int(lens[j]))
        if cur and m * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, mx = [], 0
            m = int(lens[j])
        cur.append(int(j))
        mx = m
    if cur:
        out.append(cur)
    return out


BUCKET_WINDOW = 64


def bucket_by_length(order: np.ndarray, lens: np.ndarray, window: int = BUCKET_WINDOW) -> np.ndarray:
    """``order`` with each run of ``window`` samples sorted by length (stable), so that packing puts
    samples of similar length together and pads less; which samples share a window stays random,
    and the batches are shuffled afterwards. A window of 64 holds ~16 batches of 1024 tokens."""
    out = np.asarray(order).copy()
    for a in range(0, len(out), window):
        w = out[a:a + window]
        out[a:a + window] = w[np.argsort(lens[w], kind="stable")]
    return out


def padding_share(batches: list[list[int]], lens: np.ndarray) -> float:
    """Share of padded tokens in right-padded ``batches`` (rows padded to their longest sample)."""
    padded = sum(max(int(lens[j]) for j in b) * len(b) for b in batches)
    return 1.0 - sum(int(lens[j]) for b in batches for j in b) / max(padded, 1)
