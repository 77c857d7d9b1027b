"""The target's verify cost T(k): the wall time of one verification decode of k rows (all with
logits, capture on), measured once per model file, build and thread count and cached on disk
(:mod:`moa_cpp.target.calibration`); the cost-aware policies' input (docs/llama-cpp.md#verify-cost).

- :func:`calibrate_verify_cost`: what the CLI and the server run when nobody waits (T(k) from the
  exactness search's own decodes, the rest timed apart, T(1) also from plain decoding's back-to-back
  one-token decodes);
- :func:`cached_verify_cost`: the cached table, never decoding;
- :func:`verify_cost_from_timings`: timings by row count -> a non-decreasing T(k);
- :func:`measure_verify_cost`: the standalone benchmark form (``bench/costs/curves.py``).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from moa_cpp.target import calibration as calibration_cache
from moa_cpp.target.machine_load import OthersCPU

if TYPE_CHECKING:
    from moa_cpp.target.target import Target

log = logging.getLogger("moa_cpp")


def _store(target: Target, cost: dict, replace: bool = False) -> None:
    """Store T(k); ``replace``: this measurement is the whole table (a calibration: never mix the
    sizes of two measurements made under different conditions), else merge it into the entry."""
    calibration_cache.store("verify_cost", target, {str(k): v for k, v in cost.items()}, merge=not replace)


def cached_verify_cost(target: Target, ks: Sequence[int] = ()) -> Optional[dict]:
    """The cached T(k) of this target (model file, threads, build), or None if any of ``ks``
    (default: k = 1, 2) was never measured, or the table's T(1) was not timed as plain decoding
    pays it (a calibration before :func:`_plain_step_times`: its T(1) could be 25-50 % high, see
    there; measured again once). Never decodes."""
    if calibration_cache.lookup(T1_TABLE, target) != T1_METHOD:
        return None
    entry = calibration_cache.lookup("verify_cost", target)
    if entry is None or not all(str(k) in entry for k in (ks or (1, 2))):
        return None
    return {int(k): float(v) for k, v in entry.items()}


def verify_cost_from_timings(timings: dict, upto: int) -> dict:
    """T(k) for k = 1..``upto`` from decode timings by row count (``{b: [seconds, ...]}``, e.g.
    :func:`moa_cpp.target.exactness.measure_exact_rows`'s): the fastest sample per size, made non-decreasing in k
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


# Calibration under load (moa_cpp/target/machine_load.py): a measurement during which other processes kept
# more than BUSY_CORES cores busy on average is not trusted; it is repeated (up to
# CALIBRATION_ATTEMPTS times, while one attempt takes under RETRY_MAX_S seconds), and if the
# machine stayed busy, the table measured earlier on a quiet machine is used instead (none: this
# one, stored with a mark that the next quiet measurement clears).
BUSY_CORES = 0.25
BUSY_TABLE = "verify_cost_busy"     # non-empty: the stored T(k) was measured on a busy machine
T1_TABLE = "verify_cost_t1"         # how T(1) was measured: tables without it are measured again
T1_METHOD = {"plain_steps": 12}
CALIBRATION_ATTEMPTS = 3
RETRY_MAX_S = 5.0
RETRY_PAUSE_S = 1.0


def calibrate_verify_cost(target: Target, k_max: int) -> dict:
    """T(k) for k = 1..k_max + 1 and the exact batch size, in one pass (cached on disk): the
    exactness measurement decodes every batch size 1..k_max + 1 anyway (up to its first inexact
    size), so its decodes are timed instead of decoding them again; only where the exact batch
    size was known already (cached, or declared) or the search stopped at an inexact size are the
    other sizes timed on their own (2 repetitions).
    SmolLM2-135M Q4_1 on 2 cores: 1.0 s on the AMD EPYC host (2.1 s with every size tested on all
    three windows; bench/costs/calibration.py).
    A machine busy with other processes meanwhile makes the timings worthless (see BUSY_CORES):
    then the measurement is repeated, and failing that the table measured on a quiet machine is
    kept."""
    need = k_max + 1
    cost: dict = {}
    for attempt in range(CALIBRATION_ATTEMPTS):
        if attempt:
            time.sleep(RETRY_PAUSE_S)
        with OthersCPU() as load:
            cost = _measure_for_calibration(target, need)
        if load.cores is None or load.cores <= BUSY_CORES:
            _store_calibration(target, cost, busy={})
            return cost
        log.info("T(k) measured while other processes kept %.2f cores busy: not trusted", load.cores)
        if load.seconds > RETRY_MAX_S:
            break
    if not calibration_cache.lookup(BUSY_TABLE, target):
        quiet = cached_verify_cost(target, range(1, need + 1))
        if quiet is not None:
            return quiet
    # nothing better: this measurement, marked as taken on a busy machine (the next quiet one replaces it)
    _store_calibration(target, cost, busy={"others_cores": round(float(load.cores or 0.0), 3)})
    return cost


def _store_calibration(target: Target, cost: dict, busy: dict) -> None:
    """A calibration's whole table, with its busy mark ({}: measured on a quiet machine) and how
    its T(1) was timed (:data:`T1_METHOD`)."""
    _store(target, cost, replace=True)
    calibration_cache.store(BUSY_TABLE, target, busy)
    calibration_cache.store(T1_TABLE, target, T1_METHOD)


# One-token decodes timed back to back, each at the next position, as plain decoding runs them
# (the first PLAIN_WARMUP not counted): the T(1) every other T(k) is priced against.
PLAIN_STEPS = T1_METHOD["plain_steps"]
PLAIN_WARMUP = 2


def _plain_step_times(target: Target, n: int = PLAIN_STEPS, prefix: int = 64) -> list:
    """Seconds of ``n`` successive one-token decodes after a ``prefix``-token context, as plain
    decoding pays them. The exactness search's own one-row decodes are few and follow a context
    prefill and rollbacks: on Qwen2.5-Coder-1.5B F16 they gave T(1) 71-83 ms where the loop's
    plain steps took 55-57 ms, so a 2-row verification (88-92 ms) was priced at 1.23 plain steps
    instead of 1.6, and ``-d`` under ``auto`` drafted at 0.78x of ``--no-draft`` (issue 43).
    Leaves the target's KV cache empty."""
    prefix = max(1, min(prefix, target.n_ctx - n - PLAIN_WARMUP - 1))     # a tiny context: a shorter prefix
    target.clear()
    target.decode(np.full(prefix, 1, np.int32), np.arange(prefix, dtype=np.int32), capture=False, logits="last")
    times = []
    for i in range(n + PLAIN_WARMUP):
        t0 = time.perf_counter()
        target.decode(np.full(1, 1, np.int32), np.array([prefix + i], dtype=np.int32), capture=False)
        times.append(time.perf_counter() - t0)
    target.clear()
    return times[PLAIN_WARMUP:]


def _measure_for_calibration(target: Target, need: int) -> dict:
    """One measurement of T(1..need) (:func:`calibrate_verify_cost`), not stored."""
    timings: dict = {}
    if target._max_exact_rows is None:
        from moa_cpp.target.exactness import exact_rows
        exact_rows(target, need, timings=timings)
    timings.setdefault(1, []).extend(_plain_step_times(target))   # T(1) is the fastest of all
    cost = verify_cost_from_timings(timings, need)
    missing = tuple(k for k in range(1, need + 1) if k not in cost)
    if missing:
        # the exactness search stopped early (an inexact size), or the batch size was known:
        # time the other sizes on their own (a target with no exact multi-row batch verifies in
        # full batches, so the policy needs them all)
        cost.update(measure_verify_cost(target, ks=missing, reps=2, use_cache=False))
        cost = verify_cost_from_timings({k: [v] for k, v in cost.items()}, need)
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
