"""One training batch as tensors (:func:`make_batch`): right-padded token ids, the response and
valid masks, and the target features of those rows, from a :class:`~moa_cpp.train.features.FeatureStore`
(cached) or an :class:`~moa_cpp.train.features.OnlineFeatures` (the target runs on the batch)."""
from __future__ import annotations

import numpy as np
import torch

from moa_cpp.train.data import Dataset
from moa_cpp.train.features import FeatureStore, OnlineFeatures

__all__ = ["make_batch"]


def _tokens_and_mask(ds: Dataset, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded token ids [B, S] of samples ``idx``, the response mask (True from each
    prompt's end to the sample's end) and the valid mask (False on padding): what the cached and
    the online batches share."""
    lens = [int(ds.offsets[j + 1] - ds.offsets[j]) for j in idx]
    toks = torch.zeros(len(idx), max(lens), dtype=torch.long)
    resp = torch.zeros(len(idx), max(lens), dtype=torch.bool)
    valid = torch.arange(max(lens))[None, :] < torch.tensor(lens)[:, None]
    for r, j in enumerate(idx):
        toks[r, :lens[r]] = torch.from_numpy(ds.sample(j).astype(np.int64))
        resp[r, int(ds.prompt_len[j]):lens[r]] = True
    return toks, resp, valid


def make_batch(ds: Dataset, fs: "FeatureStore | OnlineFeatures", idx: list[int],
               device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Right-padded tensors of samples ``idx`` (built on the host, then moved to ``device``);
    with :class:`OnlineFeatures` the target runs on the batch instead."""
    if isinstance(fs, OnlineFeatures):
        return _online_batch(ds, fs, idx, device)
    toks, resp, valid = _tokens_and_mask(ds, idx)
    B, S = toks.shape
    L, W = fs.lsa.shape[1:]
    lsa = torch.zeros(B, S, L, W)
    hid = torch.zeros(B, S, fs.hidden.shape[1])
    resid = torch.zeros(B, S, fs.resid.shape[1]) if fs.resid is not None else None
    for r, j in enumerate(idx):
        a, b = int(ds.offsets[j]), int(ds.offsets[j + 1])
        lsa[r, :b - a] = torch.from_numpy(np.asarray(fs.lsa[a:b], dtype=np.float32))
        hid[r, :b - a] = torch.from_numpy(fs.hidden[a:b])
        if resid is not None:
            resid[r, :b - a] = torch.from_numpy(np.asarray(fs.resid[a:b], dtype=np.float32))
    out = {"tokens": toks, "lsa": lsa, "hidden": hid, "response": resp, "valid": valid}
    if resid is not None:
        out["resid"] = resid
    return {k: v.to(device, non_blocking=True) for k, v in out.items()}  # no-op on the CPU


def _online_batch(ds: Dataset, fs: OnlineFeatures, idx: list[int],
                  device: torch.device | str) -> dict[str, torch.Tensor]:
    toks, resp, valid = _tokens_and_mask(ds, idx)
    toks, resp, valid = toks.to(device), resp.to(device), valid.to(device)
    lsa, hid, resid = fs.batch(toks)
    out = {"tokens": toks, "lsa": lsa.to(device), "hidden": hid.to(device), "response": resp, "valid": valid}
    if resid is not None:
        out["resid"] = resid.to(device)
    return out
