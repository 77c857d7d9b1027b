"""The target's verify cost T(k): the wall time of one verification decode of k rows (all with
logits, capture on), measured once per model file, build and thread count and cached on disk
(:mod:`moa_cpp.calibration_cache`); the cost-aware policies' input (docs/llama-cpp.md#verify-cost).

- :func:`calibrate_verify_cost`: what the CLI and the server run when nobody waits (T(k) from the
  exactness search's own decodes, the rest timed apart);
- :func:`cached_verify_cost`: the cached table, never decoding;
- :func:`verify_cost_from_timings`: timings by row count -> a non-decreasing T(k);
- :func:`measure_verify_cost`: the standalone benchmark form (``bench/cost_curves.py``).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from .. import calibration_cache

if TYPE_CHECKING:
    from ..target import Target


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
