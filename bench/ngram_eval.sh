#!/usr/bin/env bash
# Issue 23: where each proposer pays on this machine. One run_eval per target (all methods in one
# process, interleaved per prompt): llama-cpp-python's own generation and its prompt lookup, our
# plain loop, the MoA drafter, n-gram prompt lookup and the two merged, on the paper's six sets
# and on bench/prompts/grounded.jsonl (input-grounded prompts written for this repository).
#
#   bash bench/ngram_eval.sh [q4_1|q8_0]...      (default: q4_1 q8_0; PROMPTS=4 per set, TOKENS=128)
#
# Run it alone: other load slows llama.cpp's thread pool unevenly.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
PROMPTS=${PROMPTS:-4} TOKENS=${TOKENS:-128} THREADS=${THREADS:-2}
for quant in "${@:-q4_1 q8_0}"; do
    for q in $quant; do
        case $q in
        q4_1) model=$($PY -c "from moa_cpp import models; print(models.smollm2_path())") ;;
        q8_0) model=$($PY -c "from moa_cpp import models; print(models.smollm2_q8_0_path())") ;;
        *) echo "unknown target $q (q4_1 | q8_0)" >&2; exit 2 ;;
        esac
        $PY bench/run_eval.py -m "$model" -d moa_cpp/data/moa-smollm2-135m-instruct.gguf \
            --sets mt_bench humaneval gsm8k alpaca sum qa grounded --prompts "$PROMPTS" --max-tokens "$TOKENS" \
            --threads "$THREADS" --variants chain:4 --ngram auto:8 chain:4 tree:4,3,12 --hybrid auto:8 chain:4 \
            --name "issue23-smollm2-$q"
    done
done
