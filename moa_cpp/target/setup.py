"""Loading a target GGUF and the parameters of its llama.cpp context, for
:class:`moa_cpp.target.context.TargetContext` (docs/llama-cpp.md#own-context): the backend's one-time
start, the model parameters (offload, rpc-servers, mmap/mlock, repacking), the context
parameters (sizes, threads, flash attention, unified KV cache, cache type) and the native K/V
capture installed as the eval callback.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import llama_cpp

from moa_cpp.drafter.native import ffi, lib
from moa_cpp.errors import FormatError, InvalidArgumentError, MoaError, MoaIOError
from moa_cpp.target.llama_log import llama_errors, log_chosen, set_llama_log

ROPE_TYPES = {
    llama_cpp.LLAMA_ROPE_TYPE_NONE: "none",
    llama_cpp.LLAMA_ROPE_TYPE_NORM: "norm",
    llama_cpp.LLAMA_ROPE_TYPE_NEOX: "neox",
    llama_cpp.LLAMA_ROPE_TYPE_MROPE: "mrope",
    llama_cpp.LLAMA_ROPE_TYPE_VISION: "vision",
}
CACHE_TYPES = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}

_backend_ready = False


def default_threads() -> int:
    """Every core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def ensure_backend() -> None:
    """``llama_backend_init``, once per process."""
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True


def load_model(p: Path, *, n_gpu_layers: int, use_mmap: bool, use_mlock: bool, repack: bool,
               rpc: Optional[Sequence[str]], verbose: Optional[bool]) -> Any:
    """The ``llama_model_p`` of the GGUF ``p`` (see :meth:`TargetContext.from_path` for the
    arguments). Raises MoaIOError (no such file), FormatError (not a whole GGUF file: what is
    wrong with it, :func:`moa_cpp.format.check.gguf_problem`), MoaError (llama.cpp refused it)."""
    if not p.is_file():
        raise MoaIOError(f"target model not found: {p}")
    ensure_backend()
    if verbose is not None or not log_chosen():
        set_llama_log(bool(verbose))
    from moa_cpp.target.devices import check_offload
    check_offload(n_gpu_layers, rpc)
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers
    mparams.use_mmap = use_mmap
    mparams.use_mlock = use_mlock
    mparams.use_extra_bufts = repack
    devices = None
    if rpc:
        from moa_cpp.target.rpc import rpc_device_list
        devices = rpc_device_list(rpc)          # kept alive until the model is loaded
        mparams.devices = ctypes.cast(devices, ctypes.c_void_p)
    llama_errors()                      # forget older lines: only this load's are reported
    model = llama_cpp.llama_model_load_from_file(str(p).encode("utf-8"), mparams)
    del devices
    if not model:
        said = llama_errors()
        from moa_cpp.format.check import gguf_problem
        problem = gguf_problem(p)           # the file itself, in words (only now: a good file costs nothing)
        if problem is not None:
            raise FormatError(f"llama.cpp could not load the model {p}: {problem}")
        raise MoaError(f"llama.cpp could not load the model {p} (not a GGUF, unsupported architecture or "
                       f"truncated file; pass verbose=True for llama.cpp's log){said}")
    return model


def check_context_args(n_ctx: int, n_batch: int, n_seq_max: int, cache_type: str) -> None:
    """Refuse what llama.cpp would reject, or abort the process on."""
    if cache_type not in CACHE_TYPES:
        raise InvalidArgumentError(f"cache_type must be one of {sorted(CACHE_TYPES)}, got {cache_type!r}")
    if n_batch <= 0 or n_ctx <= 0 or n_seq_max <= 0:
        raise InvalidArgumentError("n_ctx, n_batch and n_seq_max must be positive")
    if n_seq_max > n_batch:
        # llama.cpp reserves max(n_outputs, n_seq_max) output rows and asserts (aborts the
        # process) when that exceeds n_batch (llama-context.cpp output_reserve).
        raise InvalidArgumentError(f"n_seq_max ({n_seq_max}) must be <= n_batch ({n_batch})")


def context_params(n_ctx: int, n_batch: int, n_ubatch: int, n_seq_max: int, threads: int, *,
                   flash_attn: bool, kv_unified: bool, cache_type: str) -> Any:
    """``llama_context_params`` of a target context (no eval callback: :func:`capture_callback`)."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = n_batch
    params.n_ubatch = n_ubatch
    params.n_seq_max = n_seq_max
    params.n_threads = threads
    params.n_threads_batch = threads
    params.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                              else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    # Unified: coupled sequences (tree verification) need it; it also keeps batch order. Split
    # (one stream of n_ctx / n_seq_max cells per sequence) suits independent sequences (batched
    # data generation): each row attends only its own stream instead of every used cell.
    params.kv_unified = kv_unified
    params.type_k = params.type_v = CACHE_TYPES[cache_type]
    params.no_perf = True
    return params


def capture_callback(cap: Any) -> tuple:
    """(callback, user data): the native ``moa_capture_eval_cb`` itself as ``cb_eval`` -- no
    Python per graph node -- with the capture ``cap`` as its user data. The caller keeps both
    ctypes objects for as long as the context lives."""
    addr = int(ffi.cast("uintptr_t", lib.moa_capture_eval_cb))
    return (llama_cpp.ggml_backend_sched_eval_callback(addr),
            ctypes.c_void_p(int(ffi.cast("uintptr_t", cap))))
