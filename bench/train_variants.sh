#!/usr/bin/env bash
# Issue 4 measurement table: TLI 0 / TLI 1, reduced / whole vocabulary, trained on the SAME data
# and features as the shipped drafter (out/default, made by the one command in docs/training.md),
# each for the same number of steps, so only the variant differs.
#   bash bench/train_variants.sh [STEPS]     (default 300; ~8-11 min per variant on 2 cores,
#   then the native evaluation: PROMPTS per set, default 10; EVAL variants, default
#   "chain:4 tree:4,4,16"; ~5 min per drafter). A variant whose drafter.gguf exists is not
#   retrained (delete it to retrain).
#
# Issue 12 data-source A/B at equal wall-clock (~14 min each on 2 cores), scored on one common
# held-out set (bench/heldout_tau.py):
#   bash bench/train_variants.sh datasource
#     A out/ab-self:  self-distilled answers to ShareGPT prompts, 6 min of generation, 6 min training
#     B out/ab-fixed: ShareGPT's own answers (teacher forcing), as many as the feature pass reads in
#                     A's generation + feature time (660), 6 min training
#
# Issue 12 recipe A/B at equal wall-clock: every variant trains MINUTES (default 6) on the data and
# features of out/default3 (the ShareGPT mix run of docs/training.md), one change each, scored on
# the common held-out set with paired bootstrap intervals vs the first row:
#   bash bench/train_variants.sh recipe [NAME...]     (default: every variant below)
# and at the full length of that run (34 min of optimisation; NAME+NAME combines variants),
# scored with out/default3 itself as the first row, then on the evaluation sets (~12 min each):
#   bash bench/train_variants.sh full NAME[+NAME...]
# (REPORT=name writes bench/results/name.{json,md,png} instead of issue12-recipe / issue12-full)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = recipe ] || [ "${1:-}" = full ]; then
    MODE=$1; shift
    SRC=out/default3 MIN=${MINUTES:-6} EVERY=0
    [ $MODE = full ] && MIN=${MINUTES:-34} EVERY=100
    test -f $SRC/features/done.json || { echo "run the ShareGPT mix of docs/training.md first ($SRC)" >&2; exit 1; }
    # data flags identical to out/default3's, so its data/, data-fixed/ and features/ are reused;
    # base = the recipe these A/Bs were measured against (AdamW, LSA FFN 384; the defaults until
    # the full-length lsa192+muon run made those the defaults), a variant's flags come after it
    M=".venv/bin/moa-cpp train --target smollm2 --prompts sharegpt --n-samples 3000 --data-minutes 5 \
       --fixed-answers 1200 --epochs 10 --draft-vocab 8192 --eval-every $EVERY --outtype q8_0 --minutes $MIN \
       --optimizer adamw --lsa-ffn 384"
    declare -A FLAGS=([base]="" [bucket]="--batching bucket" [t5]="--t-range 5 5" [t3-7]="--t-range 3 7"
                      [stair0]="--staircase-until 0" [lsa192]="--lsa-ffn 192" [lr1e-3]="--lr 1e-3"
                      [lr4e-3]="--lr 4e-3" [muon]="--optimizer muon")
    NAMES=("$@"); [ ${#NAMES[@]} -gt 0 ] || NAMES=(base bucket t5 stair0 lsa192)
    RUNS=(); [ $MODE = full ] && RUNS=($SRC)
    for name in "${NAMES[@]}"; do
        out=out/$MODE/$name; RUNS+=($out)
        test -f $out/report.json && { echo "$name: reusing $out"; continue; }
        flags=""; for part in ${name//+/ }; do flags="$flags ${FLAGS[$part]?unknown variant $part}"; done
        mkdir -p $out
        for d in data data-fixed features; do ln -sfn "$(realpath $SRC/$d)" $out/$d; done
        echo "$name:$flags"
        $M --out $out $flags 2>&1 | tr '\r' '\n' | grep -v "%|" > $out/train.log
    done
    .venv/bin/python bench/heldout_tau.py --heldout out/heldout/data "${RUNS[@]}" --out bench/results/${REPORT:-issue12-$MODE}.json
    [ $MODE = full ] || exit 0
    Q8=$(.venv/bin/python -c "from moa_cpp.models.registry import smollm2_q8_0_path; print(smollm2_q8_0_path())")
    for name in "${NAMES[@]}"; do
        res=bench/results/issue12-full-${name//+/-}-q8_0-t2.json
        test -f $res && continue
        .venv/bin/python bench/run_eval.py -m "$Q8" -d out/full/$name/drafter.gguf --variants chain:4 tree:4,4,16 \
            --skip pld default --prompts 10 --max-tokens 64 --threads 2 --name issue12-full-${name//+/-}-q8_0-t2 \
            --out $res > out/full/$name/eval.txt 2>&1
    done
    exit 0
fi
if [ "${1:-}" = datasource ]; then
    M=".venv/bin/moa-cpp train --target smollm2 --minutes 6 --epochs 10 --draft-vocab 8192 --eval-every 50 --outtype q8_0 \
       --optimizer adamw --lsa-ffn 384"    # the recipe of the time
    $M --out out/ab-self --prompts sharegpt --n-samples 3000 --data-minutes 6 > out/ab-self.log 2>&1
    $M --out out/ab-fixed --n-samples 0 --fixed-answers 660 > out/ab-fixed.log 2>&1
    .venv/bin/moa-cpp train --target smollm2 --out out/heldout --prompts sharegpt --seed 7 --n-samples 64 \
        --greedy-fraction 1 --data-only --data-minutes 4
    .venv/bin/python bench/heldout_tau.py --heldout out/heldout/data out/ab-self out/ab-fixed \
        --out bench/results/issue12-datasource.json
    exit 0
fi
STEPS=${1:-300}
SRC=out/default
test -f $SRC/data/manifest.json && test -f $SRC/features/done.json || { echo "run the default training first" >&2; exit 1; }
run() {  # name, extra flags...
    local name=$1; shift
    local out=out/variants/$name
    if test -f $out/drafter.gguf; then echo "$name: reusing $out/drafter.gguf"; return; fi
    mkdir -p $out
    ln -sfn "$(realpath $SRC/data)" $out/data
    ln -sfn "$(realpath $SRC/features)" $out/features
    # data flags identical to the default run, so its data/ and features/ are reused
    .venv/bin/moa-cpp train --target smollm2 --out $out --n-samples 900 --data-minutes 22 \
        --steps "$STEPS" --eval-every 100 --optimizer adamw --lsa-ffn 384 "$@" 2>&1 | tr '\r' '\n' | grep -v "it/s\]$\|step/s" > $out/train.log
}
run tli0-v8192 --draft-vocab 8192
run tli1-v8192 --draft-vocab 8192 --tli 1
run tli0-full
# SA from target layer 0, CA from the last target layer (so SA/CA take the target's FFN width)
run tli0-v8192-init --draft-vocab 8192 --init-from-target --sa-ffn 1536 --ca-ffn 1536

# native engine on the evaluation sets (benchmark only): greedy, Q8_0 target, 2 threads
Q8=$(.venv/bin/python -c "from moa_cpp.models.registry import smollm2_q8_0_path; print(smollm2_q8_0_path())")
for name in tli0-v8192 tli1-v8192 tli0-full tli0-v8192-init; do
    .venv/bin/python bench/run_eval.py -m "$Q8" -d out/variants/$name/drafter.gguf --variants ${EVAL:-chain:4 tree:4,4,16} \
        --prompts ${PROMPTS:-10} --max-tokens 64 --threads 2 --out bench/results/issue4-variant-$name.json \
        > out/variants/$name/eval.txt 2>&1
done
