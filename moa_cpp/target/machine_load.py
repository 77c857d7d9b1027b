"""How much CPU *other* processes took while this one measured something (:class:`OthersCPU`).

A timing taken while another process competes for the cores is not the machine's: llama.cpp's
worker threads spin at every barrier, and a core taken from one of them stalls the others (on
the 2-core CPU, with a test suite running next to it, the verify cost T(2) of SmolLM2 measured
the same as T(1), 0.21 s instead of 0.011 and 0.018 s; the cost-aware policy then drafted where
drafting costs a quarter of the speed, for the whole life of a server: issue 42). Measurements
that decide something for later (:func:`moa_cpp.speculative.verify_cost.calibrate_verify_cost`)
ask this first whether they may be trusted.

Linux only (``/proc/stat``); elsewhere :attr:`OthersCPU.cores` is None (unknown).
"""
from __future__ import annotations

import os
import time
from typing import Optional


def _busy_seconds() -> Optional[float]:
    """CPU-seconds every process has used since boot (all cores), or None where unknown."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(v) < 8:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = v
    # steal: a hypervisor gave the core to another machine; not ours either
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class OthersCPU:
    """``with OthersCPU() as load: ...`` then ``load.cores``: the average number of cores other
    processes kept busy meanwhile (None where unknown); ``load.seconds``: the wall time."""

    def __init__(self) -> None:
        self.cores: Optional[float] = None
        self.seconds = 0.0

    def __enter__(self) -> "OthersCPU":
        self._busy, self._own, self._t = _busy_seconds(), _own_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t
        busy = _busy_seconds()
        if busy is None or self._busy is None or self.seconds <= 0:
            return
        others = (busy - self._busy) - (_own_seconds() - self._own)
        # clock-tick granularity: a short window may read slightly negative
        self.cores = max(0.0, others / self.seconds)
