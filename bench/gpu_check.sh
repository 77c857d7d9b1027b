#!/usr/bin/env bash
# GPU check (issue 13) on a bare, offline NVIDIA machine lent through the device tool.
#
# Here (CPU machine, network):  python -m bench.gpu pack          -> .gpu/s1 .. .gpu/sN (<= 40 MiB each)
# There, one call per stage, back to back (the machine keeps files while it stays warm):
#     bash bench/gpu_check.sh        carry [".gpu/s1"]   files the parts, starts the CUDA build (background)
#     bash bench/gpu_check.sh        carry [".gpu/s2"]   ...
#     bash bench/gpu_check.sh        carry [".gpu/sN"]   last part: waits for the build, runs bench/gpu/check.py,
#                                                        writes $OUT/gpu_check.{json,md} + logs
# Dry run (CPU, CI: tests/train/test_gpu_check.py): MOA_GPU_DRY_RUN=1 bash bench/gpu_check.sh OUTDIR
#
# The build (bench/gpu/build.sh): the carried wheels (cffi, pycparser, gguf, diskcache) into a --target
# site, llama-cpp-python 0.3.36 from the trimmed source with GGML_CUDA=ON GGML_RPC=ON for the GPU's
# compute capability only, and libmoa against it (MOA_CPP_LIB); ~4-6 min on 16 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${MOA_GPU_DRY_RUN:-0}" = 1 ]; then
    OUTDIR=${1:-out/gpu-check}
    exec "${PYTHON:-.venv/bin/python}" -m bench.gpu.check --dry-run --out "$OUTDIR"
fi
OUTDIR=${OUT:-${1:-out/gpu-check}}
STORE=${MOA_GPU_STORE:-/root/moa-gpu}
mkdir -p "$STORE/parts" "$OUTDIR"
STAGES=${MOA_GPU_STAGES:-.gpu}
for d in "$STAGES"/s*; do
    [ -d "$d" ] && cp -f "$d"/* "$STORE/parts/"
done
[ -f "$STORE/parts/manifest.json" ] || { echo "no stage carried: carry .gpu/s1 (python -m bench.gpu pack)" >&2; exit 2; }
missing=$(python3 -c "from pathlib import Path; from bench.gpu import pack; print(' '.join(pack.reassemble(Path('$STORE'))))")
if [ ! -e "$STORE/build.started" ] && [ -f "$STORE/files/llama-src.tar.gz" ]; then
    touch "$STORE/build.started"
    # a new session: the build outlives this call (the device tool ends the call's other processes)
    setsid nohup bash bench/gpu/build.sh "$STORE" > "$STORE/build.log" 2>&1 < /dev/null &
    echo "build started (log: $STORE/build.log)"
fi
if [ -n "$missing" ]; then
    echo "waiting for the next stage: still missing $missing"
    exit 0
fi
echo "all parts here; waiting for the build"
for _ in $(seq 1 600); do
    [ -e "$STORE/build.done" ] && break
    sleep 1
done
cp "$STORE/build.log" "$OUTDIR/build.log" 2>/dev/null || true
[ -e "$STORE/build.done" ] || { echo "build not done after 10 min" >&2; tail -20 "$STORE/build.log"; exit 1; }
rc=$(cat "$STORE/build.done")
[ "$rc" = 0 ] || { echo "build failed ($rc)" >&2; tail -40 "$STORE/build.log"; exit 1; }
export PYTHONPATH="$STORE/site" MOA_CPP_LIB="$STORE/moa-build/libmoa.so" PYTHONUNBUFFERED=1
mkdir -p "$STORE/fixture"
tar xf "$STORE/files/fixture.tar" -C "$STORE/fixture"
model=$(python3 -c "import json; print(json.load(open('$STORE/parts/manifest.json'))['model'])")
set -o pipefail
python3 -m bench.gpu.check --model "$STORE/files/$model" --fixture "$STORE/fixture/moa-ref-tiny" \
    --prompts "$STORE/files/eval_prompts.json" --work "$STORE" --out "$OUTDIR" 2>&1 | tee "$OUTDIR/gpu_check.log"
