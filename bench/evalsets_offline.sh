#!/usr/bin/env bash
# Issue 43 item 4: why is held-out tau over an answer's first 64 tokens (~2.0, bench/heldout_tau.py
# --first 64) so far above chain-4 tau on the evaluation sets (~1.6, bench/run_eval.py)? Either the
# prompts differ, or the two ways of counting do (the offline estimate starts a chain at every
# position and labels with the F32 torch target; the real loop starts one only where the previous
# cycle ended, verified by the quantized target). This scores the offline estimate ON the
# evaluation prompts (the first PROMPTS of each set, as run_eval takes them): the Q4_1 target writes
# greedy 64-token answers (scoring data only, under out/: never a training set), then heldout_tau
# scores DRAFTERS on them. Equal numbers would put the gap in the prompts; run_eval's tau on the same
# prompts (Q4_1 target) against this one is the part the counting makes.
#   bash bench/evalsets_offline.sh bench/data/round-c13-self/drafter.gguf   (~3 min, 2 cores)
#   NAME=issue43-c15-evalsets-offline-first64 bash bench/evalsets_offline.sh C14.gguf C15.gguf
# NAME (default issue43-evalsets-offline-first64) names the results under bench/results/, so that
# one round's comparison does not overwrite another's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python MOA=.venv/bin/moa-cpp
PROMPTS=${PROMPTS:-10} OUT=out/evalsets-offline-$PROMPTS THREADS=${THREADS:-2}
NAME=${NAME:-issue43-evalsets-offline-first64}
[ $# -ge 1 ] || { echo "usage: bash bench/evalsets_offline.sh DRAFTER.gguf..." >&2; exit 2; }
mkdir -p $OUT
$PY - "$OUT/prompts.jsonl" "$PROMPTS" <<'PYEOF'
import json, sys
sys.path.insert(0, "bench")
from _common import EVAL_DIR, EVAL_SETS, eval_prompts
with open(sys.argv[1], "w") as f:
    for p in eval_prompts(EVAL_DIR, EVAL_SETS, int(sys.argv[2])):
        f.write(json.dumps({"prompt": p}) + "\n")
PYEOF
# 4 sequences leave each prompt 1,984 tokens (CNN/DM's articles; run_eval keeps 1,784 of them)
test -f $OUT/data/manifest.json || $MOA train --target smollm2 --prompts $OUT/prompts.jsonl --eval-dir none \
    --n-samples $((PROMPTS * 6)) --greedy-fraction 1 --max-new-tokens 64 --n-parallel 4 --data-minutes 30 \
    --gen-threads $THREADS --out $OUT --data-only
$PY bench/heldout_tau.py --heldout $OUT/data "$@" --first 64 --threads $THREADS \
    --out bench/results/$NAME.json
