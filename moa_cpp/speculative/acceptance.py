"""What the cost-aware policies expect of a chain: conditional acceptance per draft depth
(:class:`AcceptanceEstimate`, Beta posteriors with forgetting), the expected tokens of a chain
(:func:`expected_tokens`) and the chain length that maximises tokens per second given the target's
verify cost T(k) and a drafter row's cost (:func:`best_chain_length`). Pure arithmetic, no model.

Expected tokens of a chain of k drafts with conditional acceptance a_d at depth d (given depth
d-1 accepted): E(k) = 1 + sum_{d<=k} prod_{j<=d} a_j. Cost: T(k+1) (one verification decode of
root + k drafts) + k * t_row (drafter rows). Speed(k) = E(k) / cost(k); plain = 1 / T(1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence


def ucb_growth(t: int, max_growth: float = 2.0) -> float:
    """The optimism's growth factor after ``t`` cycles: sqrt(2 ln t) (UCB), within [1, max_growth]."""
    grow = math.sqrt(2.0 * math.log(t)) if t > 1 else 1.0
    return min(max(1.0, grow), max_growth)


def ucb_capped(t: int, max_growth: float = 2.0) -> bool:
    """True once :func:`ucb_growth` can grow no more (t >= exp(max_growth^2 / 2): t >= 8 at 2.0)."""
    return ucb_growth(t, max_growth) >= max_growth or max_growth <= 1.0


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
        grow = ucb_growth(t, max_growth)
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
