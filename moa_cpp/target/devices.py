"""Which ggml backend devices this build can use, and what ``-ngl`` / ``--device`` will do with them.

llama-cpp-python is built for one set of backends (``scripts/setup.sh``: CPU + RPC; with
``MOA_CUDA=1``: CUDA too), and the native drafter runs on the same ggml, so both see the same
devices. A user who asks for a GPU that this build lacks hears it:

- the drafter (``--device cuda`` / ``gpu`` / ``CUDA0``): an error naming the devices there are
  (raised by the native library, ``moa_model_load``);
- the target (``-ngl N``): a warning, as llama.cpp itself gives, and the layers stay on the CPU
  (a command line written for a GPU machine still runs on a laptop).
"""
from __future__ import annotations

import sys
import warnings
from typing import Optional, Sequence

_warned: set = set()


def _devices() -> list[tuple[str, str, bool]]:
    """(name, backend, is a GPU of this machine) of every ggml backend device, in ggml's order."""
    from moa_cpp.drafter.native import ffi, lib
    return [(ffi.string(lib.moa_device_name(i)).decode(), ffi.string(lib.moa_device_backend(i)).decode(),
             bool(lib.moa_device_is_local_gpu(i))) for i in range(lib.moa_device_count())]


def list_devices() -> list[str]:
    """Names of the ggml backend devices ("CPU", "CUDA0", "RPC[host:port]", ...), in ggml's order."""
    return [name for name, _, _ in _devices()]


def local_gpus() -> list[str]:
    """Names of this machine's GPU devices (RPC devices, which live on other machines, left out)."""
    return [name for name, _, gpu in _devices() if gpu]


def gpu_offload_supported() -> bool:
    """True when this build has a local GPU to hold offloaded target layers (llama.cpp's own
    ``llama_supports_gpu_offload`` also says yes for a CPU build with the RPC backend)."""
    return bool(local_gpus())


def check_offload(n_gpu_layers: int, rpc: Optional[Sequence[str]] = None) -> bool:
    """Warn (once per process) when ``n_gpu_layers`` asks for offload that this build cannot do.
    Returns whether the layers will really be offloaded."""
    if n_gpu_layers == 0:
        return False
    if rpc or gpu_offload_supported():
        return True
    if "ngl" not in _warned:
        _warned.add("ngl")
        warnings.warn(f"n_gpu_layers={n_gpu_layers}: this llama-cpp-python build has no GPU backend "
                      f"(devices: {', '.join(list_devices())}); the target runs on the CPU. For CUDA: "
                      f"MOA_CUDA=1 bash scripts/setup.sh", RuntimeWarning, stacklevel=3)
    return False


def describe() -> str:
    """One line per device, for ``moa-cpp generate --list-devices``."""
    devs = _devices()
    lines = [f"  {name:<12} backend {backend}" + ("  (GPU)" if gpu else "") for name, backend, gpu in devs]
    offload = "yes" if any(gpu for _, _, gpu in devs) else "no (CPU-only build: MOA_CUDA=1 bash scripts/setup.sh for CUDA)"
    return "devices (drafter: --device NAME / auto / cpu / gpu):\n" + "\n".join(lines) + \
        f"\ntarget GPU offload (-ngl): {offload}"


if __name__ == "__main__":  # python -m moa_cpp.target.devices
    print(describe())
    sys.exit(0)
