"""Where and in what precision training runs: the torch device (``resolve_device``), bf16 autocast
where the hardware computes bf16 natively (``resolve_bf16``, ``cpu_has_native_bf16``) and the
autocast context every forward pass of the recipe uses (``autocast``)."""
from __future__ import annotations

import torch

__all__ = ["autocast", "cpu_has_native_bf16", "resolve_bf16", "resolve_device"]


def resolve_device(name: str = "auto") -> str:
    """``"auto"`` -> ``"cuda"`` when torch sees a CUDA device, else ``"cpu"``; ``"cuda[:i]"`` without
    one raises ``ValueError`` (a clear message instead of torch's lazy-init error mid-run)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: this torch build sees no CUDA device "
                             f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
        idx = torch.device(name).index
        if idx is not None and idx >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s)")
        return name
    if name != "cpu":
        raise ValueError(f"device {name!r}: use auto, cpu or cuda[:i]")
    return name


def resolve_bf16(mode: str, device: str) -> bool:
    """``"on"`` / ``"off"``, or ``"auto"``: bf16 autocast where the hardware computes bf16 natively
    (a CUDA device that supports it; a CPU whose torch kernels use AVX512_BF16 or AMX). On an
    AVX2-only CPU (this project's Zen 3 machines) bf16 autocast is emulated: the SmolLM2 target ran
    at 68 tok/s vs 335 tok/s in F32 (2 threads), where an AVX512_BF16 machine had run it ~5x faster
    than F32."""
    if mode in ("on", "off"):
        return mode == "on"
    if mode != "auto":
        raise ValueError(f"bf16 {mode!r}: use auto, on or off")
    if device.startswith("cuda"):
        return bool(torch.cuda.is_bf16_supported())
    return cpu_has_native_bf16()


def cpu_has_native_bf16() -> bool:
    """The CPU flags (Linux ``/proc/cpuinfo``) list ``avx512_bf16`` or ``amx_bf16``; False when
    unknown (torch's ``get_cpu_capability`` stops at "AVX512" and cannot tell)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False

def autocast(enabled: bool, device_type: str = "cpu"):
    """bf16 autocast of the matmuls on ``device_type`` (master weights stay F32)."""
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=enabled)
