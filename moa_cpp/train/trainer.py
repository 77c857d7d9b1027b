"""The training recipe of moa-architecture.md §21, scaled to a CPU-sized run.

Per step (teacher forcing, one forward over whole sequences):

- features of the frozen target (:class:`~moa_cpp.train.target_torch.TorchTarget`, computed once
  per sample and cached as F16 K/V rows + F32 post-norm hidden states);
- masks of §21.3 (:mod:`moa_cpp.train.masks`): ``T ~ U{t_min..t_max}`` per sequence, staircase SA
  with probability ``max(0, 1 - progress / 0.5)`` (the paper's ``1 - epoch / (E/2)`` with progress
  = step / total steps);
- loss over response positions: ``0.1 * softCE(p_target, q_drafter) + SmoothL1(z, h)`` (TLI 0);
- AdamW beta (0.9, 0.95), weight decay 0, grad-norm clip 1.0; LR: linear warm-up to ``lr`` over
  ``min(50, 5 %)`` of the steps, then linear decay to ``lr / 20`` at the end (the paper's
  "zero-peak-constant" 0 -> 20x base -> base, with the decay stretched over the whole run because
  our runs are a few epochs, not 40). ``optimizer="muon"`` (``make_optimizer``) swaps AdamW for
  Muon on the layers' 2-D weights, same LR schedule.

Held-out acceptance estimate (``eval_acceptance``): on held-out greedy samples, with CA bounded at
every 5th position (a chain-4 cycle: root + 4 drafts), the drafter's argmax at each row is
compared with the target's; ``tau`` = 1 + mean run of agreements from each boundary (<= 4), the
expected tokens per target call of greedy chain-4 speculation if llama.cpp's target agreed with
the F32 one. TLI N > 0 runs the target's last N layers on ``z`` as the engine does (§10.3).

Deterministic for a fixed ``steps`` (seeded init, data order, T and staircase draws; CPU torch
kernels are deterministic at a fixed thread count). ``minutes`` instead chooses ``steps`` from the
measured speed of the first 5 steps and re-estimates it every 10 steps, so the loop ends near the
budget (recorded in the checkpoint; a resumed run keeps the last estimate).

Device: ``TrainSettings.device`` ("cpu" or "cuda[:i]"). The model is built and initialised on the
CPU (same seeded weights on every device), then moved; batches, masks and draws follow it. On CUDA
the run is seeded but not bit-reproducible (cuBLAS / SDPA kernels choose their own reductions).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..drafter_spec import DrafterSpec
from ..errors import InvalidArgumentError
from .data import Dataset
from .masks import bounded_masks
from .model import MoaDrafter
from .target_torch import TargetFeatures, TorchTarget
if TYPE_CHECKING:
    from .init_from import DrafterWeights
from .vocab import draft_vocab, vocab_coverage

__all__ = ["TrainSettings", "FeatureStore", "OnlineFeatures", "compute_features", "Trainer", "eval_acceptance",
           "heldout_split", "lr_at", "padding_share", "resolve_bf16", "resolve_device"]


def resolve_device(name: str = "auto") -> str:
    """``"auto"`` -> ``"cuda"`` when torch sees a CUDA device, else ``"cpu"``; ``"cuda[:i]"`` without
    one raises ``ValueError`` (a clear message instead of torch's lazy-init error mid-run)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: this torch build sees no CUDA device "
                             f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
        idx = torch.device(name).index
        if idx is not None and idx >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s)")
        return name
    if name != "cpu":
        raise ValueError(f"device {name!r}: use auto, cpu or cuda[:i]")
    return name


def resolve_bf16(mode: str, device: str) -> bool:
    """``"on"`` / ``"off"``, or ``"auto"``: bf16 autocast where the hardware computes bf16 natively
    (a CUDA device that supports it; a CPU whose torch kernels use AVX512_BF16 or AMX). On an
    AVX2-only CPU (this project's Zen 3 machines) bf16 autocast is emulated: the SmolLM2 target ran
    at 68 tok/s vs 335 tok/s in F32 (2 threads), where an AVX512_BF16 machine had run it ~5x faster
    than F32."""
    if mode in ("on", "off"):
        return mode == "on"
    if mode != "auto":
        raise ValueError(f"bf16 {mode!r}: use auto, on or off")
    if device.startswith("cuda"):
        return bool(torch.cuda.is_bf16_supported())
    return cpu_has_native_bf16()


def cpu_has_native_bf16() -> bool:
    """The CPU flags (Linux ``/proc/cpuinfo``) list ``avx512_bf16`` or ``amx_bf16``; False when
    unknown (torch's ``get_cpu_capability`` stops at "AVX512" and cannot tell)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


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
    """Warm-up then linear decay (see module docstring)."""
    warm = max(1, min(s.warmup, total // 20))
    if step < warm:
        return s.lr * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    return s.lr * (1.0 - (1.0 - s.min_lr_ratio) * min(1.0, frac))


class _Optimizers:
    """Several optimisers stepped as one (Muon + AdamW): ``param_groups``, ``zero_grad``, ``step``,
    ``state_dict`` and ``load_state_dict`` span all, so the loop and checkpoints stay unchanged."""

    def __init__(self, opts: list) -> None:
        self.opts = opts

    @property
    def param_groups(self) -> list:
        return [g for o in self.opts for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None) -> None:
        for o in self.opts:
            o.step()

    def state_dict(self) -> dict:
        return {"parts": [o.state_dict() for o in self.opts]}

    def load_state_dict(self, state: dict) -> None:
        if len(state.get("parts", ())) != len(self.opts):
            raise ValueError("checkpoint optimiser state does not match --optimizer")
        for o, st in zip(self.opts, state["parts"]):
            o.load_state_dict(st)


def make_optimizer(model: torch.nn.Module, s: TrainSettings) -> "torch.optim.Optimizer | _Optimizers":
    """AdamW (beta 0.9/0.95) over every parameter, or ``muon``: torch's Muon (orthogonalised
    momentum; LR scaled to AdamW's update RMS, so one ``lr`` and schedule serve both) for the 2-D
    weights inside the three layers, AdamW for Ekv2E (input projection), the draft LM head, norms
    and biases, as Muon's authors advise for input/output layers."""
    adamw = dict(lr=s.lr, betas=(0.9, 0.95), weight_decay=s.weight_decay)
    if s.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), **adamw)
    if s.optimizer != "muon":
        raise ValueError(f"optimizer {s.optimizer!r}: use adamw or muon")
    if not hasattr(torch.optim, "Muon"):
        raise ValueError(f"--optimizer muon needs torch >= 2.9 (installed: {torch.__version__})")
    layers = ("self_attention.", "cross_attention.", "layer_self_attention.")
    muon, rest = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (muon if p.ndim == 2 and name.startswith(layers) else rest).append(p)
    muon_cls = torch.optim.Muon if s.bf16 else _MuonF32
    return _Optimizers([muon_cls(muon, lr=s.lr, weight_decay=s.weight_decay, adjust_lr_fn="match_rms_adamw",
                                 ns_steps=s.muon_ns_steps),
                        torch.optim.AdamW(rest, **adamw)])


def _newton_schulz_f32(grad: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int,
                       eps: float) -> torch.Tensor:
    """torch's ``_zeropower_via_newtonschulz`` (torch/optim/_muon.py, same quintic iteration and
    coefficients) in F32 instead of bf16."""
    a, b, c = ns_coefficients
    x = grad.float()
    if grad.size(0) > grad.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if grad.size(0) > grad.size(1) else x


if hasattr(torch.optim, "Muon"):   # torch >= 2.9 (older ones still train with AdamW)
    class _MuonF32(torch.optim.Muon):
        """Muon whose orthogonalisation runs in F32: torch's runs in bf16, which CPUs without bf16
        instructions emulate (measured on the 2-core AVX2 EPYC: a 1024-token step 40 s instead of
        3 s). Used when training runs without bf16 (``--bf16 auto`` on such a CPU)."""

        def step(self, closure=None):  # noqa: D102
            from torch.optim import _muon

            orig, _muon._zeropower_via_newtonschulz = _muon._zeropower_via_newtonschulz, _newton_schulz_f32
            try:
                return super().step(closure)
            finally:
                _muon._zeropower_via_newtonschulz = orig


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
        with _autocast(self.bf16, toks.device.type):
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
            with _autocast(bf16, dev.type):
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

    ``bf16``: bf16 autocast (the reference also ran its target in bf16, spec §3.4); ~5x faster on
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
        done = cache_dir / "done.json"
        if done.is_file() and json.loads(done.read_text()).get("n_tokens") == n_tok:
            fs = FeatureStore(np.load(cache_dir / "lsa.npy", mmap_mode="r"), np.load(cache_dir / "hidden.npy"))
            if resid_layer is not None:
                if not (cache_dir / resid_name).is_file():
                    secs = _target_pass(tt, ds, max_tokens, bf16, resid_layer,
                                        f"target residual (layer {resid_layer})", store_resid)
                    np.save(cache_dir / resid_name, resid)
                    log(f"features: residual of layer {resid_layer} for {n_tok} tokens in {secs:.0f}s")
                fs.resid = np.load(cache_dir / resid_name)
            return fs
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
        (cache_dir / "done.json").write_text(json.dumps({"n_tokens": n_tok}))
    return FeatureStore(lsa, hidden, resid)


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


def _batch(ds: Dataset, fs: "FeatureStore | OnlineFeatures", idx: list[int],
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


def _pack(order: np.ndarray, lens: np.ndarray, batch_tokens: int) -> list[list[int]]:
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


def _bucket(order: np.ndarray, lens: np.ndarray, window: int = BUCKET_WINDOW) -> np.ndarray:
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


def _autocast(enabled: bool, device_type: str = "cpu"):
    """bf16 autocast of the matmuls on ``device_type`` (master weights stay F32)."""
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=enabled)


def loss_fn(model: MoaDrafter, b: dict[str, torch.Tensor], T: torch.Tensor, stair: torch.Tensor,
            ce_weight: float, bf16: bool, skip_padding: bool = True,
            max_depth: int = 0, mask_off_target: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss over response positions (spec §21.2): TLI 0 ``0.1 * softCE + SmoothL1(z, h)``; TLI N
    ``0.1 * softCE + 0.5 * SmoothL1(final, h) + 0.5 * SmoothL1(z, resid_{L-N})``, where ``final``
    is the post-norm output of the target's last N layers run on ``z`` (:meth:`MoaDrafter.head_input`).
    ``skip_padding``: no LSA on right padding (exact: no real row attends it). ``max_depth`` > 0:
    loss only on rows less than ``max_depth`` past their block start (the row at a start is the
    engine's root; row k drafts depth k + 1), the depths inference drafts: with ``T ~ U{6..14}``
    about half the rows train depths 5-13 that a chain of 4 never uses. ``mask_off_target``
    (GRIFFIN's idea): no loss on a row whose path since its block start holds a teacher-forced token
    the target would not have chosen (its greedy choice over the draft vocabulary): at inference such
    a path is rejected at verification before that row is ever used."""
    sa, ca, start = bounded_masks(b["response"], T, stair)
    dt = b["tokens"].device.type
    with _autocast(bf16, dt):
        z = model(b["tokens"], b["lsa"], sa, ca, valid=b.get("valid") if skip_padding else None)
        u = model.head_input(z, b["lsa"], start)
    sel = b["response"]
    if max_depth > 0:
        sel = sel & (torch.arange(sel.shape[1], device=sel.device)[None, :] - start < max_depth)
    if mask_off_target:
        with _autocast(bf16, dt):
            sel = sel & ~off_target_rows(model, b, start)
    ur = u[sel].float()
    hr = b["hidden"][sel]
    with _autocast(bf16, dt):
        with torch.no_grad():
            p = torch.softmax(model.label_logits(hr).float(), dim=-1)
        logq = torch.log_softmax(model.draft_logits(ur).float(), dim=-1)
    ce = -(p * logq).sum(-1).mean()
    feat = F.smooth_l1_loss(ur, hr, reduction="none").mean(-1).mean()
    if model.tli:
        feat = 0.5 * feat + 0.5 * F.smooth_l1_loss(z[sel].float(), b["resid"][sel], reduction="none").mean(-1).mean()
    loss = ce_weight * ce + feat
    return loss, {"loss": float(loss.detach()), "ce": float(ce.detach()), "feat": float(feat.detach())}


@torch.no_grad()
def off_target_rows(model: MoaDrafter, b: dict[str, torch.Tensor], start: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` True on response rows whose path ``start(i) < j <= i`` holds a token the target
    would not have chosen greedily after ``j - 1`` (argmax of its logits over the draft vocabulary)."""
    pick = model.label_logits(b["hidden"][:, :-1]).argmax(-1)
    if model.d2t is not None:
        pick = model.d2t[pick]
    return off_path_rows(b["tokens"], b["response"], pick, start)


def off_path_rows(tokens: torch.Tensor, response: torch.Tensor, pick: torch.Tensor,
                  start: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` True on response rows whose path ``start(i) < j <= i`` holds a token other than
    ``pick[:, j - 1]`` (``pick``: ``[B, S - 1]``, the target's greedy choice after each position)."""
    off = torch.zeros_like(response)
    off[:, 1:] = response[:, 1:] & (tokens[:, 1:] != pick)
    n_off = torch.cumsum(off.long(), dim=1)
    return response & (n_off - torch.gather(n_off, 1, start.clamp(min=0)) > 0)


@torch.no_grad()
def eval_acceptance(model: MoaDrafter, ds: Dataset, fs: "FeatureStore | OnlineFeatures", idx: list[int],
                    depth: int = 4, bf16: bool = False,
                    per_sample: Optional[list[tuple[int, int]]] = None) -> dict[str, float]:
    """Held-out greedy chain-``depth`` acceptance estimate (module docstring). ``per_sample``, when
    given, receives (accepted drafts, cycles) of each sample in ``idx`` (for bootstrap intervals)."""
    model.eval()
    dev = model.embed.device
    runs: list[int] = []
    agree = np.zeros(depth)
    count = np.zeros(depth)
    for j in idx:
        n_before = len(runs)
        b = _batch(ds, fs, [j], dev)
        resp = b["response"]
        T = torch.tensor([depth + 1], device=dev)
        sa, ca, start = bounded_masks(resp, T, torch.tensor([False], device=dev))
        with _autocast(bf16, dev.type):
            z = model(b["tokens"], b["lsa"], sa, ca)
            u = model.head_input(z, b["lsa"], start)
        dr = model.draft_ids(u[0].float())
        tg = model.logits(b["hidden"][0]).argmax(-1)
        ok = (dr == tg).cpu().numpy()
        st = start[0].cpu().numpy()
        S = len(ok)
        # chain starts at every verified position b inside/just before the response
        for bpos in range(int(ds.prompt_len[j]) - 1, S - depth - 1):
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


class Trainer:
    """Owns the model, optimiser, data split and checkpoints of one run directory."""

    def __init__(self, spec: DrafterSpec, tt: TorchTarget, ds: Dataset, fs: "FeatureStore | OnlineFeatures",
                 out_dir: Path, settings: TrainSettings, log: Callable[[str], None] = print,
                 init: "Optional[DrafterWeights]" = None) -> None:
        """``settings.draft_vocab`` > 0 chooses a reduced draft vocabulary from the training split
        (:func:`moa_cpp.train.vocab.draft_vocab`). ``init`` (:func:`moa_cpp.train.init_from.read_drafter`):
        start from that drafter's weights and keep its draft vocabulary (its head rows belong to it)."""
        self.s = settings
        self.ds, self.fs, self.out, self.log = ds, fs, Path(out_dir), log
        self.out.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(settings.threads)
        torch.manual_seed(settings.seed)
        if not ds.greedy.any():
            log("train: no greedy self-distilled samples; held-out estimate on teacher-forced samples")
        self.heldout = heldout_split(ds, settings.holdout, settings.seed)
        held = set(self.heldout)
        self.train_idx = np.asarray([i for i in range(len(ds)) if i not in held])
        if self.train_idx.size == 0:
            # nothing to batch: the step loop would look for a first batch for ever
            raise InvalidArgumentError(
                f"no training samples ({len(ds)} in the dataset, {len(held)} held out): the data stage produced "
                "nothing to train on (prompts too long for the context, or --n-samples too small?)")
        self.d2t: Optional[np.ndarray] = None
        self.init = init
        if init is not None:
            self.d2t = init.d2t
            if self.d2t is not None:
                log(f"train: draft vocabulary of {init.path.name}: {len(self.d2t)} tokens (covers "
                    f"{vocab_coverage(ds, self.heldout, self.d2t):.1%} of held-out response tokens)")
        elif settings.draft_vocab:
            self.d2t = draft_vocab(ds, self.train_idx, tt.embed.shape[0], settings.draft_vocab)
            log(f"train: reduced draft vocabulary {len(self.d2t)} of {tt.embed.shape[0]} tokens "
                f"(covers {vocab_coverage(ds, self.heldout, self.d2t):.1%} of held-out response tokens)")
        # built and initialised on the host (same seeded weights on every device), then moved
        self.model = MoaDrafter(spec, tt.embed.data.cpu(),
                                None if tt.lm_head is tt.embed else tt.lm_head.data.cpu(), d2t=self.d2t)
        self.model.init_weights(settings.seed, settings.init_std)
        if init is not None:
            self.model.load_hf(init.tensors)
            log(f"train: continuing {init.path.name} ({init.steps} steps, {init.token_passes} token passes "
                f"recorded{'' if init.recorded else ': the file has no training record'})")
        elif settings.init_from_target:
            self.model.init_from_target(tt)
        self.model.to(settings.device)
        # the concrete device ("cuda" -> "cuda:0"), so it compares equal to the target's
        self.device = self.model.embed.device
        if settings.tli:
            if (fs.resid_layer if isinstance(fs, OnlineFeatures) else fs.resid) is None:
                raise ValueError(f"TLI {settings.tli} needs features with resid_layer = {tt.n_layer - settings.tli}")
            if tt.embed.device != self.device:
                raise ValueError(f"TLI {settings.tli}: the target is on {tt.embed.device}, training on {self.device}")
            self.model.attach_tli(tt, settings.tli)
        self.opt = make_optimizer(self.model, settings)
        self.lens = np.diff(ds.offsets)
        self._epoch_cache: dict[int, list[list[int]]] = {}
        self.step = 0
        self.total: Optional[int] = settings.steps
        self.history: list[dict] = []
        self.ckpt = self.out / "checkpoint.pt"

    # ------------------------------------------------------------------ data order

    def _batches_of_epoch(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng(self.s.seed * 1000 + epoch)
        order = rng.permutation(self.train_idx)
        if self.s.batching == "bucket":
            order = _bucket(order, self.lens)
        elif self.s.batching != "random":
            raise ValueError(f"batching {self.s.batching!r}: use random or bucket")
        batches = _pack(order, self.lens, self.s.batch_tokens)
        return [batches[k] for k in rng.permutation(len(batches))]

    def _epoch(self, epoch: int) -> list[list[int]]:
        """``_batches_of_epoch``, packed once per epoch."""
        if epoch not in self._epoch_cache:
            self._epoch_cache[epoch] = self._batches_of_epoch(epoch)
        return self._epoch_cache[epoch]

    def steps_per_epoch(self) -> int:
        """Batches in epoch 0 (later epochs pack differently and may have one more or less)."""
        return len(self._epoch(0))

    def batch_at(self, step: int) -> tuple[int, list[int]]:
        """(epoch, sample ids) of ``step``: the epochs' batch lists one after another. (Indexing
        every epoch with epoch 0's length crashed once a later epoch packed into fewer batches.)"""
        epoch, first = 0, 0
        while True:
            batches = self._epoch(epoch)
            if step < first + len(batches):
                return epoch, batches[step - first]
            epoch, first = epoch + 1, first + len(batches)

    def _draws(self, step: int, n: int, progress: float) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.s.seed * 7919 + step)
        T = torch.randint(self.s.t_min, self.s.t_max + 1, (n,), generator=g)
        p_stair = max(0.0, 1.0 - progress / self.s.staircase_until) if self.s.staircase_until > 0 else 0.0
        stair = torch.rand(n, generator=g) < p_stair
        return T, stair

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> None:
        tmp = self.ckpt.with_suffix(".tmp")
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "total": self.total, "settings": asdict(self.s), "history": self.history}, tmp)
        os.replace(tmp, self.ckpt)

    def try_resume(self) -> bool:
        if not self.ckpt.is_file():
            return False
        st = torch.load(self.ckpt, weights_only=False, map_location=self.device)
        self.model.load_state_dict(st["model"])
        self.opt.load_state_dict(st["opt"])
        self.step, self.total, self.history = st["step"], st["total"], st["history"]
        self.log(f"train: resumed at step {self.step}/{self.total}")
        return True

    # ------------------------------------------------------------------ loop

    def evaluate(self) -> dict[str, float]:
        return eval_acceptance(self.model, self.ds, self.fs, self.heldout, bf16=self.s.bf16)

    def run(self) -> dict:
        """Train to the end (resuming if a checkpoint exists); returns the final summary."""
        from tqdm import tqdm

        s = self.s
        spe = self.steps_per_epoch()
        max_steps = int(math.ceil(s.epochs * spe))
        resumed = self.try_resume()
        if not resumed:
            ev = self.evaluate()
            self.history.append({"step": 0, "tokens": 0, **ev})
            pad = padding_share(self._epoch(0), self.lens)
            self.log(f"train: init held-out tau {ev['tau']:.3f}  {spe} steps/epoch ({s.batching} batches, "
                     f"{pad:.0%} padding), held-out {len(self.heldout)} samples")
        t_start = time.time()
        calib_at = self.step + 5
        # a budgeted run re-estimates its step count every 10 steps: the first 5 steps alone
        # (warm-up) mis-estimated 6-minute runs by up to 18 %
        budgeted = self.total is None
        total_guess = self.total or max_steps
        bar = tqdm(total=total_guess, initial=self.step, desc="train", unit="step", mininterval=2)
        # the latest held-out estimate until the loop makes a new one (a 0-step run keeps it)
        last = {k2: v for k2, v in (self.history[-1] if self.history else {}).items()
                if k2 == "tau" or k2.startswith("acc@")}
        tokens_seen = self.history[-1].get("tokens", 0) if self.history else 0
        while self.total is None or self.step < self.total:
            _, batch_ids = self.batch_at(self.step)
            total = self.total or total_guess
            progress = self.step / max(1, total)
            b = _batch(self.ds, self.fs, batch_ids, self.device)
            T, stair = (t.to(self.device) for t in self._draws(self.step, len(batch_ids), progress))
            for g in self.opt.param_groups:
                g["lr"] = lr_at(self.step, total, s)
            loss, parts = loss_fn(self.model, b, T, stair, s.ce_weight, s.bf16, s.skip_padding,
                                   s.loss_max_depth, s.mask_off_target)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.clip)
            self.opt.step()
            self.step += 1
            tokens_seen += int(b["response"].sum())
            last = parts | {"gn": float(gn), "lr": self.opt.param_groups[0]["lr"]}
            if budgeted and self.step >= calib_at and (self.step - calib_at) % 10 == 0:
                first = self.total is None
                per = (time.time() - t_start) / (self.step - (calib_at - 5))
                budget = s.minutes * 60 if s.minutes else float("inf")
                self.total = int(min(max_steps, self.step + max(0, (budget - (time.time() - t_start)) / per)))
                bar.total = self.total
                if first:
                    self.log(f"train: {per:.2f}s/step -> {self.total} steps ({self.total / spe:.2f} epochs), "
                             "re-estimated every 10 steps")
            if (s.eval_every and self.step % s.eval_every == 0) or self.step == self.total:
                ev = self.evaluate()
                self.history.append({"step": self.step, "tokens": tokens_seen, **parts, **ev})
                # the held-out tau and per-depth acceptance: `moa-cpp train` records acc@k in the GGUF
                last.update({k2: v for k2, v in ev.items() if k2 == "tau" or k2.startswith("acc@")})
            if self.step % s.ckpt_every == 0 or self.step == self.total:
                self.save_checkpoint()
            bar.set_postfix({k2: f"{v:.3g}" for k2, v in last.items() if k2 in ("loss", "ce", "feat", "lr", "tau")})
            bar.update(1)
        bar.close()
        summary = {"steps": self.step, "epochs": self.step / spe, "final": last, "history": self.history,
                   "train_seconds_this_run": time.time() - t_start}
        (self.out / "history.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary
