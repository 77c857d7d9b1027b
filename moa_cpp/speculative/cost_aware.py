"""The cost-aware policy (``auto:KMAX``, the CLI default): :class:`CostAwarePolicy` picks the
chain length k in 0..KMAX that maximises expected tokens per second, from the target's measured
verify cost T(k) (:mod:`.verify_cost`) and the acceptance seen so far (:mod:`.acceptance`). k = 0
is plain decoding. It never costs speed where drafting cannot pay: when even an optimistic
acceptance estimate does not beat plain decoding, the whole generation runs plainly (no K/V
capture, no drafter), and without a measured T(k) it decodes plainly and asks for a measurement
later (:meth:`CostAwarePolicy.needs_calibration`), so the measurement never lands on a user's
first request.

A free proposer that reports a *context* per proposal (:class:`~moa_cpp.speculative.proposers.
ngram.NgramProposer`: the class of its match length) gets one acceptance estimate per context
and is priced after its lookup: the policy asks for the longest chain, the proposer looks it up,
and :meth:`CostAwarePolicy.fit` keeps the k drafts that pay *for that match* (none for a weak
one: then the cycle is a plain step). A 16-token match and a 1-token match differ by ~4x in
acceptance (module doc of ngram.py), so one global estimate drafts too little in a copy and too
much elsewhere. Such a policy never gives up for a generation: its lookups cost nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from moa_cpp.speculative.types import DraftConfig, NO_DRAFT
from moa_cpp.speculative.acceptance import AcceptanceEstimate, best_chain_length, ucb_capped
from moa_cpp.speculative.verify_cost import cached_verify_cost, calibrate_verify_cost

if TYPE_CHECKING:
    from moa_cpp.target.target import Target


def seat_model_sources(proposer, sit_out: bool = False) -> None:
    """A hybrid proposer's model sources take part in this generation (every policy's ``begin``
    seats them), or sit it out (``sit_out``: :meth:`~moa_cpp.speculative.proposers.hybrid.
    HybridProposer.sit_out`, no K/V capture, no drafter work). Other proposers: nothing to do."""
    sit = getattr(proposer, "sit_out", None)
    if sit is not None:
        sit(sit_out)


@dataclass(frozen=True)
class CostAwareSettings:
    """The cost-aware policy's knobs (defaults measured on SmolLM2 / Qwen2.5 on a 2-core CPU)."""

    # Acceptance prior when the proposer records none: a weak 50 % (it is learned online).
    default_prior: float = 0.5
    # How many observed cycles the prior is worth: a drafter's recorded held-out acceptance is
    # trusted like 12 cycles, the default guess like 2.
    recorded_prior_weight: float = 12.0
    default_prior_weight: float = 2.0
    # Exponential forgetting of acceptance counts per cycle: adapts within a generation (code
    # vs prose) while keeping ~50 cycles of memory.
    decay: float = 0.98
    # Optimism: the acceptance used for "could drafting pay?" is mean + optimism * std of the
    # Beta posterior (upper-confidence exploration; shrinks as cycles are observed).
    optimism: float = 1.0
    # Optimism at the start of a generation for a proposer with no recorded acceptance (1 = the
    # same as within a generation). Measured on Qwen2.5-Coder-1.5B Q4_K_M with the oracle at
    # 60-90 %: 2.0 made the policy explore where drafting barely pays and cost up to 20 %.
    unknown_prior_optimism: float = 1.0
    # Drafter cost per row before one is measured, as a fraction of T(1) (the shipped SmolLM2
    # drafter: ~0.15-0.2 T(1) on CPU).
    row_cost_prior: float = 0.2
    # Consecutive cycles in which not even the optimistic estimate pays that end drafting for
    # the rest of the generation (capture and drafter commits stop too: idle cycles are not
    # free for an MoA drafter) - once at least one drafting cycle was observed beyond the prior
    # (give_up_min_weight), else after twice as many. The estimate persists: the next
    # generation starts from it, so a good drafter with an unlucky start is tried again.
    give_up_after: int = 8
    give_up_min_weight: float = 3.0
    # Drafts per exploration probe (a cycle drafted only because the optimistic estimate pays).
    probe_chain: int = 1
    # Cap of the UCB growth factor sqrt(2 ln t): with forgetting (decay) the observation count
    # never grows past ~50 cycles, so an uncapped bonus would keep probing for ever.
    max_ucb_growth: float = 2.0
    # Drafting must beat plain decoding by this factor to be chosen (hysteresis against noise
    # in T(k) and timing).
    min_gain: float = 1.02
    # How many observed cycles a free proposer's per-context prior is worth (its priors were
    # measured on other text than the one at hand: adapt within a few cycles).
    context_prior_weight: float = 4.0


class CostAwarePolicy:
    """Chain length 0..k_max per cycle from T(k) and the observed acceptance (see module doc).

    The acceptance estimate persists across generations of the same loop (same drafter and
    target); T(k) comes from the on-disk cache (:func:`measure_verify_cost`)."""

    adaptive = True

    def __init__(self, k_max: int = 8, settings: CostAwareSettings = CostAwareSettings()) -> None:
        self.k_max = k_max
        self.s = settings
        self.verify_cost: Optional[dict] = None
        self.acceptance: Optional[AcceptanceEstimate] = None
        self._calibrate = False
        self._idle = 0
        self._hopeless = False        # idle, and the optimism can no longer grow (choose)
        self._k_cap = k_max
        self._row_cost_prior = 0.0
        self._t = 0                   # cycles chosen so far (all generations): the UCB clock
        # per-context estimates of a free proposer that reports contexts (module doc), else None
        self.by_context: Optional[list] = None
        self._ctx = 0                 # the context of the cycle being verified

    @property
    def contextual(self) -> bool:
        """True when drafts are priced after the lookup, per context (:meth:`fit`)."""
        return self.by_context is not None

    def _init_acceptance(self, proposer) -> None:
        prior = getattr(proposer, "acceptance_prior", None)
        if prior:
            self.acceptance = AcceptanceEstimate(list(prior), self.s.recorded_prior_weight, self.s.decay)
        else:
            self.acceptance = AcceptanceEstimate([self.s.default_prior], self.s.default_prior_weight, self.s.decay)
        n_ctx = int(getattr(proposer, "contexts", 0) or 0)
        if n_ctx and getattr(proposer, "row_cost", None) == 0.0:
            priors = getattr(proposer, "context_priors", None) or [[self.s.default_prior]] * n_ctx
            self.by_context = [AcceptanceEstimate(list(pr), self.s.context_prior_weight, self.s.decay)
                               for pr in priors]

    def _rates(self, optimistic: bool, t: int = 0, optimism: Optional[float] = None) -> list:
        a = self.acceptance
        o = self.s.optimism if optimism is None else optimism
        return [a.optimistic(d, o, t, self.s.max_ucb_growth) if optimistic else a.mean(d)
                for d in range(1, self._k_cap + 1)]

    def _t_row(self, measured: Optional[float]) -> float:
        return measured if measured is not None else self._row_cost_prior

    def begin(self, target: Target, proposer, k_cap: Callable[[], int]) -> tuple[bool, str]:
        """Start of a generation: decide whether drafting could pay at all (see module doc).
        ``k_cap()`` gives the most drafts one verification may hold (exact batch rows - 1); it is
        only asked once T(k) is known, so a first run measures nothing."""
        if proposer is None:
            return False, "plain decoding: no drafter"
        seat_model_sources(proposer)
        if self.acceptance is None:
            self._init_acceptance(proposer)
        self._idle = 0
        self._hopeless = False
        if self.verify_cost is None:
            self.verify_cost = cached_verify_cost(target, range(1, self.k_max + 2))
        if self.verify_cost is None:
            self._calibrate = True
            return False, ("plain decoding: the verify cost T(k) of this target is not measured yet "
                           "(measured once, when no request waits, and cached)")
        self._k_cap = max(0, min(self.k_max, k_cap()))
        if self._k_cap == 0:
            return False, "plain decoding: batches of more than one row are not exact on this target"
        row_cost = getattr(proposer, "row_cost", None)
        self._row_cost_prior = row_cost if row_cost is not None else self.s.row_cost_prior * self.verify_cost[1]
        t = self.verify_cost
        if self.contextual:
            return True, self._contextual_plan()
        known = bool(getattr(proposer, "acceptance_prior", None))
        optimism = self.s.optimism * (1.0 if known else self.s.unknown_prior_optimism)
        k, gain = best_chain_length(t, self._rates(True, optimism=optimism), self._row_cost_prior, self._k_cap,
                                    self.s.min_gain)
        if k == 0:
            kk = min(3, self._k_cap)
            return False, (f"plain decoding: verifying {kk + 1} tokens costs {t[kk + 1] / t[1]:.1f}x one on this "
                           f"machine; at the drafter's expected acceptance ({self.acceptance.mean(1):.0%}) drafting "
                           "cannot pay")
        return True, (f"drafting (cost-aware): up to {k} drafts could give {gain:.2f}x; T({k + 1})/T(1) = "
                      f"{t[k + 1] / t[1]:.2f}, acceptance so far {self.acceptance.mean(1):.0%}")

    def _contextual_plan(self) -> str:
        """What the per-context estimates would draft now, weakest and strongest context."""
        t = self.verify_cost
        plans = []
        for c in (0, len(self.by_context) - 1):
            k, gain = self._priced(c)
            plans.append(f"{k} drafts ({gain:.2f}x)" if k else "none")
        return (f"drafting (cost-aware, by match length): up to {self._k_cap} drafts, priced after each lookup; "
                f"now a weakest match gets {plans[0]}, a strongest {plans[1]}; T({self._k_cap + 1})/T(1) = "
                f"{t[self._k_cap + 1] / t[1]:.2f}")

    def _priced(self, context: int) -> tuple[int, float]:
        """The chain length that pays for a lookup in ``context``, and its gain over plain (no
        exploration: the priors are measured, and a context priced out is not probed; a probe of
        1 draft cannot test the longer chain that would pay, and probing that chain instead lost
        2-5 % on the replays of bench/eval/policy_replay.py, with more prompts below 0.98x)."""
        est = self.by_context[context]
        return best_chain_length(self.verify_cost, [est.mean(d) for d in range(1, self._k_cap + 1)],
                                 self._row_cost_prior, self._k_cap, self.s.min_gain)

    def fit(self, context: int) -> int:
        """How many of a looked-up chain's drafts to verify, given its context (contextual
        policies: :meth:`choose` asked for the longest chain). 0: a plain step."""
        self._ctx = min(max(int(context), 0), len(self.by_context) - 1)
        return self._priced(self._ctx)[0]

    def choose(self, t_row: Optional[float]) -> DraftConfig:
        """This cycle's shape; NO_DRAFT may be returned repeatedly (see :meth:`gave_up`)."""
        self._t += 1
        if self.contextual:   # look up the longest chain; fit() prices it
            return DraftConfig("chain", chain=self._k_cap, budget=self._k_cap) if self._k_cap else NO_DRAFT
        tr = self._t_row(t_row)
        costs = self.verify_cost
        k, _ = best_chain_length(costs, self._rates(False), tr, self._k_cap, self.s.min_gain)
        if k == 0:
            # exploration (UCB): while the optimistic estimate says some chain could pay, probe
            # with the cheapest chain (depth 1 is what the estimate hinges on; optimistic long
            # chains measured 15-25 % slower on SmolLM2)
            k_opt, _ = best_chain_length(costs, self._rates(True, self._t), tr, self._k_cap, self.s.min_gain)
            self._idle = 0 if k_opt else self._idle + 1
            # While nothing is drafted, nothing that prices the optimistic estimate changes but the
            # UCB growth (acceptance moves only with verified drafts, T(k) is fixed, the measured
            # row cost only grows with idle drafter commits): once that growth is capped, not
            # paying now means not paying for the rest of the generation, and every idle cycle
            # until give_up_after would capture the target's K/V and commit the drafter for nothing.
            self._hopeless = not k_opt and ucb_capped(self._t, self.s.max_ucb_growth)
            k = min(k_opt, self.s.probe_chain)
        else:
            self._idle = 0
            self._hopeless = False
        # budget: a proposer merging several sources stays within the k drafts priced here
        return DraftConfig("chain", chain=k, budget=k) if k else NO_DRAFT

    def gave_up(self) -> bool:
        """True once drafting could not pay even optimistically for give_up_after cycles, with
        an acceptance estimate worth at least give_up_min_weight cycles (or for twice as many
        cycles). Never for a contextual policy (its lookups are free)."""
        if self.contextual:
            return False
        if self._hopeless:
            return True
        return self._idle >= self.s.give_up_after and (
            self.acceptance.weight_at(1) >= self.s.give_up_min_weight or self._idle >= 2 * self.s.give_up_after)

    def update(self, proposed: int, accepted: int) -> None:
        if proposed:
            self.acceptance.update(proposed, accepted)
            if self.contextual:
                self.by_context[self._ctx].update(proposed, accepted)

    def needs_calibration(self) -> bool:
        return self._calibrate

    def calibrate(self, target: Target) -> DraftConfig:
        """Measure and cache T(k) for k = 1..k_max + 1 and the exact batch size (once per model /
        build / threads: :func:`calibrate_verify_cost`)."""
        self.verify_cost = calibrate_verify_cost(target, self.k_max)
        self._calibrate = False
        return DraftConfig("auto", chain=self.k_max)
