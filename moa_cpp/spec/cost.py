"""Cost-aware draft length: measure the target's verify cost T(k) once per (model, device,
threads) and cache it, track acceptance online, and pick the chain length that maximises
expected tokens per second.

Expected tokens of a chain of k drafts with conditional acceptance a_d at depth d (given depth
d-1 accepted): E(k) = 1 + sum_{d<=k} prod_{j<=d} a_j. Cost: T(k+1) (one verification decode of
root + k drafts) + k * t_row (drafter rows) + t_commit. k = 0 is plain decoding.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ..target import Target


def _cache_file() -> Path:
    root = Path(os.environ.get("MOA_CPP_CACHE", Path.home() / ".cache" / "moa_cpp"))
    root.mkdir(parents=True, exist_ok=True)
    return root / "verify_cost.json"


def measure_verify_cost(target: Target, ks=(1, 2, 3, 4, 5, 6, 7, 8, 9), reps: int = 3, prefix: int = 64,
                        use_cache: bool = True) -> dict:
    """Median seconds of one decode of k tokens (all with logits) after a ``prefix``-token
    context, for each k; cached on disk per model file, size, threads and flash attention.
    Leaves the target's KV cache empty."""
    st = target.path.stat()
    key = (f"{target.path.resolve()}|{st.st_size}|{int(st.st_mtime)}|{os.cpu_count()}|t{target.n_threads}"
           f"|fa{int(target.flash_attn)}")
    cache = {}
    if use_cache and _cache_file().is_file():
        try:
            cache = json.loads(_cache_file().read_text())
        except ValueError:
            cache = {}
        if key in cache and all(str(k) in cache[key] for k in ks):
            return {int(k): float(v) for k, v in cache[key].items()}
    target.clear()
    ctx = np.full(prefix, 1, np.int32)
    target.decode(ctx, capture=False)
    times = {k: [] for k in ks}
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
        cache[key] = out
        _cache_file().write_text(json.dumps(cache))
    return out


@dataclass
class AcceptanceTracker:
    """Online estimate of the conditional acceptance rate per depth (EMA)."""

    prior: float = 0.5
    decay: float = 0.9
    rates: list = field(default_factory=list)

    def rate(self, d: int) -> float:
        """Conditional acceptance at depth d (1-based); deeper than observed: the last rate."""
        if not self.rates:
            return self.prior
        return self.rates[min(d, len(self.rates)) - 1]

    def update(self, proposed_depth: int, accepted: int) -> None:
        """One chain verification: depths 1..accepted accepted, depth accepted+1 rejected."""
        while len(self.rates) < proposed_depth:
            self.rates.append(self.rates[-1] if self.rates else self.prior)
        for d in range(1, min(accepted + 1, proposed_depth) + 1):
            hit = 1.0 if d <= accepted else 0.0
            self.rates[d - 1] = self.decay * self.rates[d - 1] + (1 - self.decay) * hit


def expected_tokens(rates: list, k: int) -> float:
    e, p = 1.0, 1.0
    for d in range(1, k + 1):
        p *= rates[d - 1]
        e += p
    return e


def best_chain_length(verify_cost: dict, tracker: AcceptanceTracker, t_row: float, t_commit: float,
                      k_max: int = 8) -> int:
    """The k in 0..k_max maximising E(k) / (T(k+1) + k t_row + t_commit); 0 = plain decoding."""
    rates = [tracker.rate(d) for d in range(1, k_max + 1)]
    best_k, best = 0, 1.0 / verify_cost[1]
    for k in range(1, k_max + 1):
        if k + 1 not in verify_cost:
            break
        speed = expected_tokens(rates, k) / (verify_cost[k + 1] + k * t_row + t_commit)
        if speed > best:
            best_k, best = k, speed
    return best_k
