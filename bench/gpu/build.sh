#!/usr/bin/env bash
# Offline CUDA build for the GPU check (started by bench/gpu_check.sh; writes STORE/build.done = exit code).
#   bash bench/gpu/build.sh STORE
# STORE/files holds llama-src.tar.gz (bench/gpu/pack.py's trimmed llama-cpp-python 0.3.36) and wheels/.
set -uo pipefail
cd "$(dirname "$0")/.."
STORE=$1
finish() { echo "$1" > "$STORE/build.done"; exit "$1"; }
t0=$(date +%s)
ARCH=${MOA_CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)}
echo "CUDA architecture $ARCH; $(nproc) cores; $(nvcc --version | tail -n 1)"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$STORE/site" "$STORE"/files/wheels/*.whl || finish 10
mkdir -p "$STORE/src"
tar xzf "$STORE/files/llama-src.tar.gz" -C "$STORE/src" || finish 11
# LLAVA_BUILD=OFF: the multimodal library is not used here and doubles the build
# the host CPU's flags too (no AMX kernels on an AMX host: scripts/llama_cpu_flags.sh)
CMAKE_ARGS="-DGGML_CUDA=ON -DGGML_RPC=ON -DLLAVA_BUILD=OFF -DCMAKE_CUDA_ARCHITECTURES=$ARCH $(bash scripts/llama_cpu_flags.sh)" \
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$STORE/site" \
    "$STORE/src/llama_cpp_python-0.3.36" || finish 12
echo "llama-cpp-python built in $(( $(date +%s) - t0 )) s"
cmake -S . -B "$STORE/moa-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMOA_LLAMA_CPP_DIR="$STORE/site/llama_cpp" -DPython_EXECUTABLE="$(command -v python3)" || finish 13
cmake --build "$STORE/moa-build" -j "$(nproc)" || finish 14
PYTHONPATH="$STORE/site" MOA_CPP_LIB="$STORE/moa-build/libmoa.so" python3 -m moa_cpp.target.devices || finish 15
echo "all built in $(( $(date +%s) - t0 )) s"
finish 0
