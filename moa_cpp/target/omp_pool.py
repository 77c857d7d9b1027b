"""One-off llama.cpp work (calibration, start-up measurements) on a thread that ends with it, so that
the OpenMP threads it started end too.

Why (issue 42): ggml's CPU backend runs every multi-threaded graph in an OpenMP parallel region
(libgomp, in the builds llama-cpp-python ships). libgomp keeps a pool of worker threads *per
thread that opened a region*, alive until that thread exits, and counts every pool's workers. Once
they outnumber the usable cores, it stops spinning at its barriers and sleeps on futexes instead
(its "throttled" spin count: ~100 spins instead of ~300,000), in every pool. So a process in which
two long-lived threads have each decoded with 2 threads on a 2-core CPU (``moa-cpp serve``
calibrating on its main thread, then generating on its session thread) pays a sleep and a wake-up
per region and per barrier for the rest of its life: SmolLM2-135M Q4_1 plain decoding went from
9 ms to 17 ms per token (perf: a quarter of all samples in the kernel's task switch, against ~1 %
in ``llama-server``, which decodes on one thread only).

:func:`run_in_passing_thread` runs a function on a fresh thread and joins it: when that thread
exits, libgomp frees its pool (``gomp_free_thread``), and the thread that later generates is the
only one holding a pool.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

_R = TypeVar("_R")


def run_in_passing_thread(fn: Callable[..., _R], *args: Any, **kwargs: Any) -> _R:
    """``fn(*args, **kwargs)`` on a new thread that exits when it returns (its OpenMP pool with
    it); returns its result or raises its exception here. The caller waits, so the objects it
    hands over are used by one thread at a time, as before."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:   # re-raised on the caller's thread
            out["error"] = e

    t = threading.Thread(target=run, name="moa-passing", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
