"""Draft-shape policies: how much to draft each cycle.

- :class:`FixedPolicy`: the same chain or tree every cycle (``chain:N``, ``tree:D,K,T``).
- :class:`CostAwarePolicy` (``auto:KMAX``, the CLI default): the chain length k in 0..KMAX
  that maximises expected tokens per second, from the target's measured verify cost T(k) and
  the acceptance seen so far. k = 0 is plain decoding. It never costs speed where drafting
  cannot pay: when even an optimistic acceptance estimate does not beat plain decoding, the
  whole generation runs plainly (no K/V capture, no drafter), and without a measured T(k) it
  decodes plainly and asks for a measurement later (:meth:`CostAwarePolicy.needs_calibration`),
  so the measurement never lands on a user's first request.

A free proposer that reports a *context* per proposal (:class:`~moa_cpp.speculative.proposers.
ngram.NgramProposer`: the class of its match length) gets one acceptance estimate per context
and is priced after its lookup: the policy asks for the longest chain, the proposer looks it up,
and :meth:`CostAwarePolicy.fit` keeps the k drafts that pay *for that match* (none for a weak
one: then the cycle is a plain step). A 16-token match and a 1-token match differ by ~4x in
acceptance (module doc of ngram.py), so one global estimate drafts too little in a copy and too
much elsewhere. Such a policy never gives up for a generation: its lookups cost nothing.

Expected tokens of a chain of k drafts with conditional acceptance a_d at depth d (given depth
d-1 accepted): E(k) = 1 + sum_{d<=k} prod_{j<=d} a_j. Cost: T(k+1) (one verification decode of
root + k drafts) + k * t_row (drafter rows). Speed(k) = E(k) / cost(k); plain = 1 / T(1).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Protocol, Sequence

import numpy as np

from .. import calibration_cache
from ..target import Target
from .types import DraftConfig, NO_DRAFT


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


# ---------------------------------------------------------------------------- T(k) measurement

def _store(target: Target, cost: dict, replace: bool = False) -> None:
    """Store T(k); ``replace``: this measurement is the whole table (a calibration: never mix the
    sizes of two measurements made under different conditions), else merge it into the entry."""
    calibration_cache.store("verify_cost", target, {str(k): v for k, v in cost.items()}, merge=not replace)


def cached_verify_cost(target: Target, ks: Sequence[int] = ()) -> Optional[dict]:
    """The cached T(k) of this target (model file, threads, build), or None if any of ``ks``
    (default: k = 1, 2) was never measured. Never decodes."""
    entry = calibration_cache.lookup("verify_cost", target)
    if entry is None or not all(str(k) in entry for k in (ks or (1, 2))):
        return None
    return {int(k): float(v) for k, v in entry.items()}


def verify_cost_from_timings(timings: dict, upto: int) -> dict:
    """T(k) for k = 1..``upto`` from decode timings by row count (``{b: [seconds, ...]}``, e.g.
    :func:`moa_cpp.exactness.measure_exact_rows`'s): the fastest sample per size, made non-decreasing in k
    (pool-adjacent-violators: one noisy sample must not make a longer batch look cheaper than a
    shorter one), sizes between measured ones interpolated; none beyond the largest measured."""
    ks = sorted(k for k, v in timings.items() if v and 1 <= k <= upto)
    if not ks or ks[0] != 1:
        return {}
    # the fastest sample of each size: timing noise on a shared CPU only ever adds time
    fastest = [float(np.min(timings[k])) for k in ks]
    blocks: list = []                            # [sum, count] per pooled block
    for v in fastest:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s_, n_ = blocks.pop()
            blocks[-1][0] += s_
            blocks[-1][1] += n_
    fit = [b[0] / b[1] for b in blocks for _ in range(b[1])]
    full = np.interp(np.arange(1, ks[-1] + 1), ks, fit)
    return {k: float(full[k - 1]) for k in range(1, ks[-1] + 1)}


def calibrate_verify_cost(target: Target, k_max: int) -> dict:
    """T(k) for k = 1..k_max + 1 and the exact batch size, in one pass (cached on disk): the
    exactness measurement decodes every batch size 1..k_max + 1 anyway (up to its first inexact
    size), so its decodes are timed instead of decoding them again; only where the exact batch
    size was known already (cached, or declared) or the search stopped at an inexact size are the
    other sizes timed on their own (2 repetitions).
    SmolLM2-135M Q4_1 on 2 cores: 1.0 s on the AMD EPYC host (2.1 s with every size tested on all
    three windows; bench/calibration_profile.py)."""
    need = k_max + 1
    timings: dict = {}
    if target._max_exact_rows is None:
        from ..exactness import exact_rows
        exact_rows(target, need, timings=timings)
    cost = verify_cost_from_timings(timings, need)
    missing = tuple(k for k in range(1, need + 1) if k not in cost)
    if missing:
        # the exactness search stopped early (an inexact size), or the batch size was known:
        # time the other sizes on their own (a target with no exact multi-row batch verifies in
        # full batches, so the policy needs them all)
        cost.update(measure_verify_cost(target, ks=missing, reps=2, use_cache=False))
        cost = verify_cost_from_timings({k: [v] for k, v in cost.items()}, need)
    _store(target, cost, replace=True)
    return cost


def measure_verify_cost(target: Target, ks=(1, 2, 3, 4, 5, 6, 7, 8, 9), reps: int = 3, prefix: int = 64,
                        use_cache: bool = True) -> dict:
    """Median seconds of one decode of k tokens (all with logits) after a ``prefix``-token
    context, for each k; cached on disk per model file, size, threads, flash attention,
    offload, repacking and llama-cpp-python version. Leaves the target's KV cache empty."""
    if use_cache:
        hit = cached_verify_cost(target, ks)
        if hit is not None:
            return hit
    target.clear()
    target.decode(np.full(prefix, 1, np.int32), capture=False, logits="last")
    times: dict = {k: [] for k in ks}
    for r in range(reps + 1):                       # round 0 warms up
        for k in (ks if r % 2 else ks[::-1]):       # alternate the order: no drift bias
            t0 = time.perf_counter()
            target.decode(np.full(k, 1, np.int32), np.arange(prefix, prefix + k, dtype=np.int32), capture=True)
            dt = time.perf_counter() - t0
            target.rollback(prefix)
            if r:
                times[k].append(dt)
    target.clear()
    out = {k: float(np.median(v)) for k, v in times.items()}
    if use_cache:
        _store(target, out)
    return out


# ---------------------------------------------------------------------------- acceptance

@dataclass
class AcceptanceEstimate:
    """Conditional acceptance per draft depth as Beta posteriors with exponential forgetting.

    Depth d's estimate is ``(hits + w * prior_d) / (hits + misses + w)`` over the cycles that
    reached depth d, where ``prior_d`` is the recorded prior for that depth if there is one,
    else depth d-1's current estimate: a depth never drafted yet is expected to behave like the
    one above it (so a policy drafting 2 tokens at 95 % acceptance expects a 3rd to be right
    too, and tries it)."""

    prior: Sequence[float] = (0.5,)
    weight: float = 2.0
    decay: float = 0.98
    hits: list = field(default_factory=list)
    misses: list = field(default_factory=list)

    def _grow(self, depth: int) -> None:
        while len(self.hits) < depth:
            self.hits.append(0.0)
            self.misses.append(0.0)

    def _prior(self, d: int) -> float:
        if d - 1 < len(self.prior):
            return float(self.prior[d - 1])
        return self.mean(d - 1) if d > 1 else 0.5

    def mean(self, d: int) -> float:
        self._grow(d)
        h, m = self.hits[d - 1], self.misses[d - 1]
        return (h + self.weight * self._prior(d)) / (h + m + self.weight)

    def weight_at(self, d: int) -> float:
        """Cycles (decayed) plus prior weight behind depth d's estimate."""
        self._grow(d)
        return self.hits[d - 1] + self.misses[d - 1] + self.weight

    def optimistic(self, d: int, optimism: float, t: int = 0, max_growth: float = 2.0) -> float:
        """mean + a bonus, capped at 1. The bonus is optimism * the std of depth 1's Beta
        posterior, the same at every depth (deeper depths are rarely reached: a bonus from
        their own few observations would make long chains look good forever); with ``t``
        (cycles so far) it grows like sqrt(2 ln t) (UCB): an estimate that stops being updated
        because the policy stopped drafting becomes optimistic enough to be probed again."""
        p1 = self.mean(1)
        n1 = self.weight_at(1)
        grow = math.sqrt(2.0 * math.log(t)) if t > 1 else 1.0
        grow = min(max(1.0, grow), max_growth)
        return min(1.0, self.mean(d) + optimism * grow * math.sqrt(p1 * (1 - p1) / (n1 + 1)))

    def update(self, proposed_depth: int, accepted: int) -> None:
        """One chain verification: depths 1..accepted accepted, depth accepted + 1 rejected."""
        self._grow(proposed_depth)
        for d in range(len(self.hits)):
            self.hits[d] *= self.decay
            self.misses[d] *= self.decay
        for d in range(1, min(accepted + 1, proposed_depth) + 1):
            if d <= accepted:
                self.hits[d - 1] += 1.0
            else:
                self.misses[d - 1] += 1.0


def expected_tokens(rates: Sequence[float], k: int) -> float:
    """E(k) = 1 + sum_{d<=k} prod_{j<=d} a_j (the bonus token always counts)."""
    e, p = 1.0, 1.0
    for d in range(k):
        p *= rates[d]
        e += p
    return e


def best_chain_length(verify_cost: dict, rates: Sequence[float], t_row: float, k_max: int = 8,
                      min_gain: float = 1.0) -> tuple[int, float]:
    """The k in 0..k_max maximising E(k) / (T(k+1) + k t_row), and its speed relative to plain
    decoding (1.0 for k = 0). A chain is chosen only if it beats plain by ``min_gain``."""
    plain = 1.0 / verify_cost[1]
    best_k, best = 0, plain
    for k in range(1, k_max + 1):
        if k + 1 not in verify_cost:
            break
        speed = expected_tokens(rates, k) / (verify_cost[k + 1] + k * t_row)
        if speed > best and speed > plain * min_gain:
            best_k, best = k, speed
    return best_k, best / plain


# ---------------------------------------------------------------------------- policies

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
        if self.acceptance is None:
            self._init_acceptance(proposer)
        self._idle = 0
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
        2-5 % on the replays of bench/ngram_policy_sim.py, with more prompts below 0.98x)."""
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
            k = min(k_opt, self.s.probe_chain)
        else:
            self._idle = 0
        # budget: a proposer merging several sources stays within the k drafts priced here
        return DraftConfig("chain", chain=k, budget=k) if k else NO_DRAFT

    def gave_up(self) -> bool:
        """True once drafting could not pay even optimistically for give_up_after cycles, with
        an acceptance estimate worth at least give_up_min_weight cycles (or for twice as many
        cycles). Never for a contextual policy (its lookups are free)."""
        if self.contextual:
            return False
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


class HybridPolicy:
    """``auto`` for a hybrid that has a free source (``moa,ngram``, ``draft,ngram``): the merged
    proposal while the model sources' rows pay (a :class:`CostAwarePolicy` over the merge), else
    the free source alone, priced per match (a contextual one over that source; the cycles ask
    for ``free_only`` shapes). Before it, a drafter priced out at the start turned the free drafts
    off with it: ``draft,ngram`` on Qwen2.5-Coder-1.5B F16 decoded plainly (0.99x) where
    ``ngram`` alone gave 1.25x (bench/results/amd-epyc-2c/issue23-qwen15-f16-grounded128-hybrid).
    The merge is tried again at every generation's start (its estimate persists)."""

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


def make_policy(config: DraftConfig, proposer=None) -> Policy:
    """The policy of a draft setting: ``auto:K`` -> cost-aware (for a hybrid with a free source
    and a model source: :class:`HybridPolicy`), anything else fixed."""
    if config.mode != "auto":
        return FixedPolicy(config)
    free = getattr(proposer, "free_source", None)
    if free is not None and getattr(proposer, "row_cost", 0.0) != 0.0:
        return HybridPolicy(config.chain)
    return CostAwarePolicy(config.chain)
