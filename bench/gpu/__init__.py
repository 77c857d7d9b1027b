"""the GPU check's parts (bench/gpu_check.sh runs them on the device)."""
