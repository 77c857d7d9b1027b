"""Features of the frozen target for training: :func:`compute_features` runs the torch target
over every sample once and keeps them (:class:`FeatureStore`: F16 K/V rows + F32 post-norm hidden
states, optionally cached on disk); :class:`OnlineFeatures` computes them per batch instead."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from moa_cpp.train.data import Dataset
from moa_cpp.train.devices import autocast
from moa_cpp.train.target_torch import TargetFeatures, TorchTarget

__all__ = ["FeatureStore", "OnlineFeatures", "cache_matches", "compute_features"]


def cache_matches(cache_dir: Path, n_tokens: int, source: str) -> bool:
    """Whether ``cache_dir`` holds finished features of ``n_tokens`` tokens from ``source``
    ("torch": the PyTorch target, "llama": llama.cpp; caches from before the key are torch's)."""
    done = cache_dir / "done.json"
    if not done.is_file():
        return False
    meta = json.loads(done.read_text())
    return meta.get("n_tokens") == n_tokens and meta.get("source", "torch") == source


class FeatureStore:
    """Cached target features of a dataset: F16 LSA rows ``[tokens, L, W]`` + F32 hidden ``[tokens, d]``
    (+ for TLI N the F16 residual stream entering target layer ``L - N``, ``[tokens, d]``)."""

    def __init__(self, lsa: np.ndarray, hidden: np.ndarray, resid: Optional[np.ndarray] = None) -> None:
        self.lsa, self.hidden, self.resid = lsa, hidden, resid


class OnlineFeatures:
    """Target features computed per batch instead of cached (``--features online``): the GPU
    recipe's choice (no host cache of ~23 KB per token for SmolLM2, the target runs beside the
    drafter on the device) and a CPU option for single-pass runs over large teacher-forced data."""

    def __init__(self, tt: TorchTarget, bf16: bool = True, resid_layer: Optional[int] = None) -> None:
        self.tt, self.bf16, self.resid_layer = tt, bf16, resid_layer

    def batch(self, toks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(lsa [B, S, L, W], hidden [B, S, d], resid or None) of right-padded ``toks`` (padding is
        harmless: the target is causal), F32, on the target's device."""
        with autocast(self.bf16, toks.device.type):
            out = self.tt(toks.to(self.tt.embed.device), resid_layer=self.resid_layer)
        resid = out.resid.float() if self.resid_layer is not None else None
        return out.lsa_in.float(), out.hidden.float(), resid


def _groups(ds: Dataset, max_tokens: int):
    """Samples grouped by similar length into padded batches of at most ``max_tokens`` tokens."""
    lens = np.diff(ds.offsets)
    order = np.argsort(lens)
    i = 0
    while i < len(order):
        S = int(lens[order[i]])
        grp = [order[i]]
        i += 1
        while i < len(order):
            S2 = int(lens[order[i]])
            if S2 * (len(grp) + 1) > max_tokens:
                break
            grp.append(order[i])
            S = S2
            i += 1
        toks = torch.zeros(len(grp), S, dtype=torch.long)
        for r, j in enumerate(grp):
            s = ds.sample(j)
            toks[r, :len(s)] = torch.from_numpy(s.astype(np.int64))
        yield grp, toks


def _f16(x: torch.Tensor) -> np.ndarray:
    return x.float().cpu().numpy().astype(np.float16)


def _target_pass(tt: TorchTarget, ds: Dataset, max_tokens: int, bf16: bool, resid_layer: Optional[int],
                 desc: str, store: Callable[[TargetFeatures, int, int, int], None]) -> float:
    """One target forward over every sample; ``store(out, row, a, b)`` keeps tokens ``a:b`` of
    batch row ``row``. Returns the seconds taken."""
    from tqdm import tqdm

    t0 = time.time()
    dev = tt.embed.device
    with tqdm(total=len(ds.tokens), desc=desc, unit="tok", mininterval=5) as bar:
        for grp, toks in _groups(ds, max_tokens):
            with autocast(bf16, dev.type):
                out = tt(toks.to(dev), resid_layer=resid_layer)
            for r, j in enumerate(grp):
                a, b = int(ds.offsets[j]), int(ds.offsets[j + 1])
                store(out, r, a, b)
                bar.update(b - a)
    return time.time() - t0


def compute_features(tt: TorchTarget, ds: Dataset, cache_dir: Optional[Path] = None,
                     log: Callable[[str], None] = print, max_tokens: int = 4096, bf16: bool = True,
                     resid_layer: Optional[int] = None) -> FeatureStore:
    """Run the torch target over every sample once (cached in ``cache_dir`` when given).

    ``bf16``: bf16 autocast (the reference also ran its target in bf16, docs/drafter.md#target-kv); ~5x faster on
    this CPU. Runs on ``tt``'s device (move it with ``tt.to("cuda")``); features are stored on the host.
    ``resid_layer``: also keep the residual stream entering that layer (TLI N: ``L - N``); with a
    cache holding the rest already, only that is computed (another target pass).
    """
    n_tok = len(ds.tokens)
    L, W, d = tt.n_layer, tt.lsa_width, tt.embed.shape[1]
    resid_name = f"resid-{resid_layer}.npy"
    resid = np.empty((n_tok, d), dtype=np.float16) if resid_layer is not None else None

    def store_resid(out: TargetFeatures, r: int, a: int, b: int) -> None:
        resid[a:b] = _f16(out.resid[r, :b - a])

    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        if cache_matches(cache_dir, n_tok, "torch"):
            fs = FeatureStore(np.load(cache_dir / "lsa.npy", mmap_mode="r"), np.load(cache_dir / "hidden.npy"))
            if resid_layer is not None:
                if not (cache_dir / resid_name).is_file():
                    secs = _target_pass(tt, ds, max_tokens, bf16, resid_layer,
                                        f"target residual (layer {resid_layer})", store_resid)
                    np.save(cache_dir / resid_name, resid)
                    log(f"features: residual of layer {resid_layer} for {n_tok} tokens in {secs:.0f}s")
                fs.resid = np.load(cache_dir / resid_name)
            return fs
        (cache_dir / "done.json").unlink(missing_ok=True)   # a cache being rewritten is never reused
        lsa = np.lib.format.open_memmap(cache_dir / "lsa.npy", mode="w+", dtype=np.float16, shape=(n_tok, L, W))
    else:
        lsa = np.empty((n_tok, L, W), dtype=np.float16)
    hidden = np.empty((n_tok, d), dtype=np.float32)

    def store_all(out: TargetFeatures, r: int, a: int, b: int) -> None:
        lsa[a:b] = _f16(out.lsa_in[r, :b - a])
        hidden[a:b] = out.hidden[r, :b - a].float().cpu().numpy()
        if resid is not None:
            store_resid(out, r, a, b)

    secs = _target_pass(tt, ds, max_tokens, bf16, resid_layer, "target features", store_all)
    log(f"features: {n_tok} tokens in {secs:.0f}s ({n_tok / max(secs, 1e-9):.0f} tok/s)")
    if cache_dir is not None:
        lsa.flush()
        np.save(cache_dir / "hidden.npy", hidden)
        if resid is not None:
            np.save(cache_dir / resid_name, resid)
        (cache_dir / "done.json").write_text(json.dumps({"n_tokens": n_tok, "source": "torch"}))
    return FeatureStore(lsa, hidden, resid)
