"""``auto`` over a hybrid proposer with a free source (``--spec-type moa,ngram``, ``draft,ngram``):
:class:`HybridPolicy`, two :class:`~moa_cpp.speculative.cost_aware.CostAwarePolicy` (the merge,
and the free source alone priced per match) and the switch between them
(docs/llama-cpp.md#cost-aware-policy).
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Optional

from moa_cpp.speculative.types import DraftConfig
from moa_cpp.speculative.cost_aware import CostAwarePolicy, CostAwareSettings, seat_model_sources

if TYPE_CHECKING:
    from moa_cpp.target.target import Target


class HybridPolicy:
    """``auto`` for a hybrid that has a free source (``moa,ngram``, ``draft,ngram``): the merged
    proposal while the model sources' rows pay (a :class:`CostAwarePolicy` over the merge), else
    the free source alone, priced per match (a contextual one over that source; the cycles ask
    for ``free_only`` shapes). Before it, a drafter priced out at the start turned the free drafts
    off with it: ``draft,ngram`` on Qwen2.5-Coder-1.5B F16 decoded plainly (0.99x) where
    ``ngram`` alone gave 1.25x (bench/results/amd-epyc-2c/eval-run-qwen15-f16-grounded-hybrid).
    While the free source goes on alone, the model sources sit the generation out
    (:func:`~moa_cpp.speculative.cost_aware.seat_model_sources`): no K/V capture, no drafter
    commit, feed or row, so a cycle costs what the lookup's price says (before issue 41 part 4 the
    MoA drafter was kept in step all the same: ``moa,ngram`` at 0.91x of plain on SmolLM2 Q4_1).
    The merge is tried again at every generation's start (its estimate persists; the model
    sources catch up through the prefix cache's rewind)."""

    adaptive = True

    def __init__(self, k_max: int = 8, settings: CostAwareSettings = CostAwareSettings()) -> None:
        self.merged = CostAwarePolicy(k_max, settings)
        self.free = CostAwarePolicy(k_max, settings)
        self.active = self.merged
        self._begun: Optional[tuple] = None          # (target, proposer, k_cap) of this generation

    @property
    def contextual(self) -> bool:
        return self.active.contextual

    def begin(self, target: Target, proposer, k_cap: Callable[[], int]) -> tuple[bool, str]:
        self._begun = (target, proposer, k_cap)
        self.active = self.merged
        drafting, why = self.merged.begin(target, proposer, k_cap)
        if drafting or self.merged.needs_calibration():
            return drafting, why
        return self._free_only(why)

    def _free_only(self, why: str) -> tuple[bool, str]:
        target, proposer, k_cap = self._begun
        self.free.verify_cost = self.free.verify_cost or self.merged.verify_cost   # one T(k)
        drafting, why_free = self.free.begin(target, proposer.free_source, k_cap)
        if not drafting:
            return False, why
        self.active = self.free
        seat_model_sources(proposer, sit_out=True)
        return True, f"{why_free}; the drafter sits out ({why})"

    def choose(self, t_row: Optional[float]) -> DraftConfig:
        cfg = self.active.choose(t_row)
        if self.active is self.merged and cfg.mode == "none" and self.merged.gave_up():
            # the drafter's acceptance does not pay: the free source goes on alone
            if self._free_only("its acceptance did not pay")[0]:
                cfg = self.free.choose(None)
        return replace(cfg, free_only=True) if self.active is self.free and cfg.mode != "none" else cfg

    def gave_up(self) -> bool:
        return self.active.gave_up()

    def fit(self, context: int) -> int:
        return self.active.fit(context)

    def update(self, proposed: int, accepted: int) -> None:
        self.active.update(proposed, accepted)

    def needs_calibration(self) -> bool:
        return self.merged.needs_calibration()

    def calibrate(self, target: Target) -> DraftConfig:
        widest = self.merged.calibrate(target)
        self.free.verify_cost = self.merged.verify_cost
        return widest
