#!/usr/bin/env bash
# Set up ./.venv with everything moa_cpp needs, from the project's own files.
# llama-cpp-python==0.3.36 is built from source the first time (~5-8 min on 2 cores);
# pip caches the built wheel, so later runs take seconds.
#
#   bash scripts/setup.sh                  CPU (+ llama.cpp's RPC backend)
#   MOA_CUDA=1 bash scripts/setup.sh       CUDA too (needs nvcc); built for the GPUs present
#                                          (nvidia-smi's compute capability) unless
#                                          MOA_CUDA_ARCH (e.g. "90" or "80;86") says otherwise
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# Build requirements first: the native library is compiled against the *installed*
# llama-cpp-python (one ggml per process), so the build runs without isolation.
python -m pip install -q "scikit-build-core>=0.10" cmake ninja
# llama-cpp-python with llama.cpp's RPC backend (GGML_RPC=ON: `--rpc`, `moa-cpp rpc-server`).
# pip's wheel cache keys a source build on the sdist alone, not on CMAKE_ARGS (it would hand back
# a plain build), so this build is kept in a wheel cache of its own, keyed by its flags.
LLAMA_FLAGS="-DGGML_RPC=ON"
FLAVOUR=cpu-rpc
# Intel CPUs with AMX: the native build minus AMX (its kernels crash in this llama.cpp; see the script)
CPU_FLAGS=$(bash scripts/llama_cpu_flags.sh)
NO_AMX=0
if [ -n "$CPU_FLAGS" ]; then
  NO_AMX=1
  LLAMA_FLAGS="$LLAMA_FLAGS $CPU_FLAGS"
  FLAVOUR=cpu-rpc-noamx
fi
if [ "${MOA_CUDA:-0}" = 1 ]; then
  command -v nvcc >/dev/null || { echo "MOA_CUDA=1: nvcc not found (install the CUDA toolkit or put it on PATH)" >&2; exit 1; }
  ARCH="${MOA_CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d . | sort -u | paste -sd';' -)}"
  [ -n "$ARCH" ] || { echo "MOA_CUDA=1: no GPU seen by nvidia-smi; set MOA_CUDA_ARCH (e.g. 90)" >&2; exit 1; }
  LLAMA_FLAGS="$LLAMA_FLAGS -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH"   # keeps the no-AMX flags
  FLAVOUR="cuda${ARCH//;/-}-$FLAVOUR"
fi
WHEELS="${MOA_WHEEL_CACHE:-$HOME/.cache/moa_cpp/wheels}/$FLAVOUR"
# The installed build is kept if it has the wanted backends: RPC always, CUDA with MOA_CUDA=1
# (a CPU build is then replaced; a plain run keeps a CUDA build that is already there), and no AMX
# kernels on an AMX CPU (an AMX build is replaced).
has_build() { python -c "import sys, llama_cpp as l; i = l.llama_print_system_info(); sys.exit(0 if l.__version__ == '0.3.36' and l.llama_supports_rpc() and ('${MOA_CUDA:-0}' != '1' or b'CUDA' in i) and ('$NO_AMX' != '1' or b'AMX_INT8 = 1' not in i) else 1)" 2>/dev/null; }
if ! has_build; then
  whl=$(ls "$WHEELS"/llama_cpp_python-0.3.36-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$whl" ]; then
    echo "building llama-cpp-python==0.3.36 with $LLAMA_FLAGS (once: ~7 min on 2 cores, CUDA longer; kept in $WHEELS)"
    mkdir -p "$WHEELS"
    CMAKE_ARGS="$LLAMA_FLAGS ${CMAKE_ARGS:-}" python -m pip wheel -q --no-deps --no-cache-dir -w "$WHEELS" \
      "llama-cpp-python==0.3.36"
    whl=$(ls "$WHEELS"/llama_cpp_python-0.3.36-*.whl | head -n 1)
  fi
  python -m pip install -q --force-reinstall --no-deps "$whl"   # replaces a plain build
  python -m pip install -q "$whl"                                # its dependencies
fi
# The trainer's torch: the CPU build on this machine's disk (a bare "torch" would pull a
# multi-GB CUDA build); everything else installs from pyproject's extras.
python -m pip install -q "torch==2.13.0"
python -m pip install -q --no-build-isolation -e ".[test,models,train,bench,server]"
# Byte-compile the editable sources once, as pip does for a wheel install: where
# PYTHONDONTWRITEBYTECODE is set (CI images, sandboxes), every process would otherwise recompile
# moa_cpp (~40 ms of a one-shot `moa-cpp generate`, bench/process/startup.py). A stale .pyc is harmless:
# Python checks the source's mtime and compiles the newer source in memory.
python -m compileall -q moa_cpp > /dev/null
# llama.cpp's own HF -> GGUF converter (from the llama-cpp-python sdist), for tests/format/test_archs.py
bash scripts/llama_converter.sh
python -c "import moa_cpp.drafter.drafter as d, moa_cpp.drafter.native as n, moa_cpp.target.devices as v; print('moa_cpp ready:', n.LIBRARY_PATH, '| devices:', ', '.join(v.list_devices()))"
