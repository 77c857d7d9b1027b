"""The training loss of the recipe (docs/training.md#recipe, :func:`loss_fn`) and the rows it may leave out
(:func:`off_target_rows`, :func:`off_path_rows`: draft paths holding a token the target would not
have chosen)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from moa_cpp.train.devices import autocast
from moa_cpp.train.masks import bounded_masks
from moa_cpp.train.model import MoaDrafter

__all__ = ["loss_fn", "off_path_rows", "off_target_rows"]


def loss_fn(model: MoaDrafter, b: dict[str, torch.Tensor], T: torch.Tensor, stair: torch.Tensor,
            ce_weight: float, bf16: bool, skip_padding: bool = True,
            max_depth: int = 0, mask_off_target: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss over response positions (docs/training.md#recipe): TLI 0 ``0.1 * softCE + SmoothL1(z, h)``; TLI N
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
    with autocast(bf16, dt):
        z = model(b["tokens"], b["lsa"], sa, ca, valid=b.get("valid") if skip_padding else None)
        u = model.head_input(z, b["lsa"], start)
    sel = b["response"]
    if max_depth > 0:
        sel = sel & (torch.arange(sel.shape[1], device=sel.device)[None, :] - start < max_depth)
    if mask_off_target:
        with autocast(bf16, dt):
            sel = sel & ~off_target_rows(model, b, start)
    ur = u[sel].float()
    hr = b["hidden"][sel]
    with autocast(bf16, dt):
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
