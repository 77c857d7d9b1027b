#!/usr/bin/env bash
# Set up ./.venv with everything moa_cpp needs, from the project's own files.
# llama-cpp-python==0.3.36 is built from source the first time (~5-8 min on 2 cores);
# pip caches the built wheel, so later runs take seconds.
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
python -m pip install -q "llama-cpp-python==0.3.36" "scikit-build-core>=0.10" cmake ninja
# The trainer's torch: the CPU build on this machine's disk (a bare "torch" would pull a
# multi-GB CUDA build); everything else installs from pyproject's extras.
python -m pip install -q "torch==2.13.0"
python -m pip install -q --no-build-isolation -e ".[test,models,train,bench]"
python -c "import moa_cpp.drafter as d, moa_cpp._native as n; print('moa_cpp ready:', n.LIBRARY_PATH)"
