"""Draft-shape policies: how much to draft each cycle, and :func:`make_policy`, the one place that
picks the policy of a draft setting. The roles live in their own modules; every public name is
importable from here:

- :class:`Policy` (what the loop asks a policy) and :class:`FixedPolicy` (the same chain or tree
  every cycle: ``chain:N``, ``tree:D,K,T``): here;
- :class:`~moa_cpp.speculative.cost_aware.CostAwarePolicy` (``auto:KMAX``, the CLI default) and
  its knobs :class:`~moa_cpp.speculative.cost_aware.CostAwareSettings`: :mod:`.cost_aware`;
- :class:`~moa_cpp.speculative.hybrid_policy.HybridPolicy` (``auto`` over ``moa,ngram`` /
  ``draft,ngram``): :mod:`.hybrid_policy`;
- the acceptance arithmetic (:class:`AcceptanceEstimate`, :func:`expected_tokens`,
  :func:`best_chain_length`): :mod:`.acceptance`;
- the target's verify cost T(k) (:func:`calibrate_verify_cost`, :func:`cached_verify_cost`,
  :func:`measure_verify_cost`, :func:`verify_cost_from_timings`): :mod:`.verify_cost`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Protocol

from moa_cpp.speculative.acceptance import AcceptanceEstimate, best_chain_length, expected_tokens
from moa_cpp.speculative.cost_aware import CostAwarePolicy, CostAwareSettings, seat_model_sources
from moa_cpp.speculative.hybrid_policy import HybridPolicy
from moa_cpp.speculative.types import DraftConfig
from moa_cpp.speculative.verify_cost import (cached_verify_cost, calibrate_verify_cost, measure_verify_cost,
                          verify_cost_from_timings)

if TYPE_CHECKING:
    from moa_cpp.target.target import Target

__all__ = ["AcceptanceEstimate", "CostAwarePolicy", "CostAwareSettings", "FixedPolicy", "HybridPolicy", "Policy",
           "best_chain_length", "cached_verify_cost", "calibrate_verify_cost", "expected_tokens", "make_policy",
           "measure_verify_cost", "verify_cost_from_timings"]


class Policy(Protocol):
    """What the loop asks a draft policy: at the start of a generation whether to draft at all
    (:meth:`begin`), every cycle the shape (:meth:`choose`) and whether to stop drafting for the
    rest of the generation (:meth:`gave_up`), after it what was accepted (:meth:`update`).
    ``adaptive``: the shape changes per cycle (the statistics count the choices). Calibration:
    what it needs measured before it can draft (:meth:`needs_calibration`, :meth:`calibrate`,
    which returns the widest shape it may choose: the loop measures that shape's exact batch).
    ``contextual``: :meth:`choose` asks for the longest chain and :meth:`fit` prices the looked-up
    drafts by the proposer's context (free proposers that report one; module doc)."""

    adaptive: bool
    contextual: bool

    def begin(self, target: Target, proposer, k_cap: Callable[[], int]) -> tuple[bool, str]: ...
    def choose(self, t_row: Optional[float]) -> DraftConfig: ...
    def gave_up(self) -> bool: ...
    def update(self, proposed: int, accepted: int) -> None: ...
    def fit(self, context: int) -> int: ...
    def needs_calibration(self) -> bool: ...
    def calibrate(self, target: Target) -> Optional[DraftConfig]: ...


class FixedPolicy:
    """The same draft shape every cycle."""

    adaptive = False
    contextual = False

    def __init__(self, config: DraftConfig) -> None:
        self.config = config

    def begin(self, target: Target, proposer, k_cap: Callable[[], int]) -> tuple[bool, str]:
        """Start of a generation: (draft at all?, why)."""
        seat_model_sources(proposer)
        if self.config.mode == "none" or proposer is None:
            return False, "plain decoding (no drafts asked for)"
        return True, f"drafting {self.config} every cycle (fixed)"

    def choose(self, t_row: Optional[float]) -> DraftConfig:
        return self.config

    def gave_up(self) -> bool:
        return False

    def fit(self, context: int) -> int:
        raise NotImplementedError("a fixed policy drafts its shape as looked up")

    def update(self, proposed: int, accepted: int) -> None:
        pass

    def needs_calibration(self) -> bool:
        return False

    def calibrate(self, target: Target) -> Optional[DraftConfig]:
        return None


def make_policy(config: DraftConfig, proposer=None) -> Policy:
    """The policy of a draft setting: ``auto:K`` -> cost-aware (for a hybrid with a free source
    and a model source: :class:`HybridPolicy`), anything else fixed."""
    if config.mode != "auto":
        return FixedPolicy(config)
    free = getattr(proposer, "free_source", None)
    if free is not None and getattr(proposer, "row_cost", 0.0) != 0.0:
        return HybridPolicy(config.chain)
    return CostAwarePolicy(config.chain)
