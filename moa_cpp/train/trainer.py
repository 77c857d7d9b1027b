"""The training recipe of docs/training.md#recipe, scaled to a CPU-sized run.

Per step (teacher forcing, one forward over whole sequences):

- features of the frozen target (:class:`~moa_cpp.train.target_torch.TorchTarget`, computed once
  per sample and cached as F16 K/V rows + F32 post-norm hidden states);
- training masks (:mod:`moa_cpp.train.masks`): ``T ~ U{t_min..t_max}`` per sequence, staircase SA
  with probability ``max(0, 1 - progress / 0.5)`` (the paper's ``1 - epoch / (E/2)`` with progress
  = step / total steps);
- loss over response positions: ``0.1 * softCE(p_target, q_drafter) + SmoothL1(z, h)`` (TLI 0);
- AdamW beta (0.9, 0.95), weight decay 0, grad-norm clip 1.0; LR: linear warm-up to ``lr`` over
  ``min(50, 5 %)`` of the steps, then linear decay to ``lr / 20`` at the end (the paper's
  "zero-peak-constant" 0 -> 20x base -> base, with the decay stretched over the whole run because
  our runs are a few epochs, not 40). ``optimizer="muon"``
  (:func:`~moa_cpp.train.optim.make_optimizer`) swaps AdamW for Muon on the layers' 2-D weights,
  same LR schedule.

Held-out acceptance estimate: :func:`~moa_cpp.train.evaluate.eval_acceptance` after every
``eval_every`` steps.

The parts, one module each: :mod:`~moa_cpp.train.settings` (settings, LR schedule),
:mod:`~moa_cpp.train.devices` (device, bf16), :mod:`~moa_cpp.train.optim` (AdamW / Muon),
:mod:`~moa_cpp.train.features` (target features), :mod:`~moa_cpp.train.packing` (which samples share
a batch), :mod:`~moa_cpp.train.batches` (a batch's tensors), :mod:`~moa_cpp.train.loss`,
:mod:`~moa_cpp.train.evaluate`; this module keeps the loop (:class:`Trainer`).

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
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import torch

from moa_cpp.atomic import write_atomic
from moa_cpp.format.drafter_spec import DrafterSpec
from moa_cpp.errors import InvalidArgumentError
from moa_cpp.train.batches import make_batch
from moa_cpp.train.data import Dataset
from moa_cpp.train.evaluate import eval_acceptance, heldout_split
from moa_cpp.train.features import FeatureStore, OnlineFeatures
from moa_cpp.train.loss import loss_fn
from moa_cpp.train.model import MoaDrafter
from moa_cpp.train.optim import make_optimizer
from moa_cpp.train.packing import bucket_by_length, pack_batches, padding_share
from moa_cpp.train.settings import TrainSettings, lr_at
from moa_cpp.train.target_torch import TorchTarget
if TYPE_CHECKING:
    from moa_cpp.train.init_from import DrafterWeights
from moa_cpp.train.vocab import draft_vocab, vocab_coverage

__all__ = ["Trainer", "TrainSettings"]


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
            order = bucket_by_length(order, self.lens)
        elif self.s.batching != "random":
            raise ValueError(f"batching {self.s.batching!r}: use random or bucket")
        batches = pack_batches(order, self.lens, self.s.batch_tokens)
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
        state = {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                 "total": self.total, "settings": asdict(self.s), "history": self.history}
        write_atomic(self.ckpt, lambda tmp: torch.save(state, tmp))

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
            b = make_batch(self.ds, self.fs, batch_ids, self.device)
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
