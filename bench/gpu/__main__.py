"""python -m bench.gpu COMMAND: the GPU check's parts (bench/gpu_check.sh runs them on the device)."""
from bench.common import dispatch

COMMANDS = {
    "pack": ("bench.gpu.pack", "pack what the check needs for a bare offline CUDA machine, in stages"),
    "check": ("bench.gpu.check", "parity, lossless greedy and speed on one CUDA GPU (--dry-run: tiny, on the CPU)"),
}

if __name__ == "__main__":
    raise SystemExit(dispatch("gpu", COMMANDS, __doc__))
