"""The on-disk cache of per-target measurements: one file, one target fingerprint.

Two measurements are made once per model file and settings and then reused by every process:

- ``verify_cost``: T(k), seconds of one verification decode of k rows
  (:mod:`moa_cpp.speculative.policy`, the cost-aware policy's input);
- ``exact_rows``: the largest decode batch whose rows equal single-token decodes bit for bit
  (:mod:`moa_cpp.target.exactness`, the lossless greedy bound);
- ``verify_cost_t1``: how the stored T(1) was measured (a table without it predates plain-step
  timing and is measured again: :func:`moa_cpp.speculative.verify_cost.cached_verify_cost`);
- ``verify_cost_busy``: non-empty when the stored T(k) was measured while other processes kept
  the cores busy (:func:`moa_cpp.speculative.verify_cost.calibrate_verify_cost`: such a table is
  never stored over one measured on a quiet machine, and the next quiet measurement replaces it).

Both depend on the same things (the model file, threads, flash attention, weight repacking,
offload, the llama.cpp build and the CPU it picked kernels for, batch arithmetic settings,
the core count), so both are keyed by one :func:`fingerprint` — two caches with two keys drift
apart. The file is ``calibration.json`` in :func:`moa_cpp.models.registry.cache_dir`:
``{fingerprint: {table: entry}}``. Writes are read-modify-write under a file lock and land by
atomic rename, so concurrent processes (a server's workers, a test run) never lose each other's
entries or read half a file.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import llama_cpp

from moa_cpp.atomic import write_text_atomic

if TYPE_CHECKING:  # pragma: no cover
    from moa_cpp.target.context import TargetContext

FILE_NAME = "calibration.json"
TABLES = ("verify_cost", "exact_rows", "verify_cost_busy", "verify_cost_t1")


def fingerprint(target: "TargetContext") -> str:
    """The settings a measurement of ``target`` depends on (see the module docstring)."""
    p = Path(target.path).resolve()
    st = p.stat()
    return (f"{p}|{st.st_size}|{st.st_mtime_ns}|t{target.n_threads}|fa{int(target.flash_attn)}"
            f"|repack{int(bool(getattr(target, 'repack', True)))}|llama-cpp-python {llama_cpp.__version__}"
            f"|{_device_tag(target)}{_batch_tag(target)}|cpus{os.cpu_count()}")


def _device_tag(target: "TargetContext") -> str:
    """Backend/device identity: CPU architecture, llama.cpp's system info (the ISA features its
    CPU kernels are chosen by), whether the build can offload to a GPU and, where the Target
    records it, how many layers it offloads."""
    try:
        info = llama_cpp.llama_print_system_info()
        info = info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)
        offload = int(bool(llama_cpp.llama_supports_gpu_offload()))
    except Exception:  # pragma: no cover - older bindings
        info, offload = "", "?"
    gpu = getattr(target, "n_gpu_layers", None)
    h = hashlib.sha256(info.encode()).hexdigest()[:12]
    return f"{platform.machine()}|sys:{h}|offload{offload}|ngl{gpu if gpu is not None else '?'}"


def _batch_tag(target: "TargetContext") -> str:
    """Settings that change batch arithmetic, only where they differ from the defaults (so the
    entries measured with the defaults stay valid): a quantized KV cache, a physical batch that
    splits a 63-row verification."""
    tag = ""
    if getattr(target, "cache_type", "f16") != "f16":
        tag += f"|kv{target.cache_type}"
    ub = getattr(target, "n_ubatch", None)
    if ub is not None and ub < 64:
        tag += f"|ub{ub}"
    return tag


def path() -> Path:
    from moa_cpp.models.registry import cache_dir
    return cache_dir() / FILE_NAME


def _read() -> dict:
    try:
        data = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def lookup(table: str, target: "TargetContext") -> Optional[dict]:
    """The ``table`` entry stored for ``target``, or None. Never decodes."""
    entry = _read().get(fingerprint(target), {})
    got = entry.get(table) if isinstance(entry, dict) else None
    return got if isinstance(got, dict) else None


def store(table: str, target: "TargetContext", entry: dict, *, merge: bool = False) -> None:
    """Store ``entry`` as ``target``'s ``table`` (``merge``: update the stored entry's keys
    instead of replacing it)."""
    assert table in TABLES, table
    key = fingerprint(target)
    with _locked():
        data = _read()
        row = data.get(key) if isinstance(data.get(key), dict) else {}
        old = row.get(table, {}) if merge and isinstance(row.get(table), dict) else {}
        row[table] = {**old, **entry}
        data[key] = row
        f = path()
        write_text_atomic(f, json.dumps(data, indent=1, sort_keys=True))   # readers never see half a file


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """An exclusive lock on the cache for a read-modify-write (POSIX; elsewhere the atomic
    rename alone: a concurrent writer may then drop an entry, which is only measured again)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    lock = path().with_name(FILE_NAME + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
