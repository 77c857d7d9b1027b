"""The optimisers of a run (:func:`make_optimizer`): AdamW (beta 0.9/0.95) over every parameter,
or Muon for the layers' 2-D weights beside AdamW for the rest (:class:`Optimizers` steps both as
one, so the loop and checkpoints stay unchanged). ``_MuonF32`` runs Muon's orthogonalisation in
F32 on CPUs without bf16 instructions."""
from __future__ import annotations

import torch

from moa_cpp.train.settings import TrainSettings

__all__ = ["Optimizers", "make_optimizer"]


class Optimizers:
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


def make_optimizer(model: torch.nn.Module, s: TrainSettings) -> "torch.optim.Optimizer | Optimizers":
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
    return Optimizers([muon_cls(muon, lr=s.lr, weight_decay=s.weight_decay, adjust_lr_fn="match_rms_adamw",
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
