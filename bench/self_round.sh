#!/usr/bin/env bash
# Issue 43 item 4: one more round of the SmolLM2 drafter lineage on self-written answers (the
# target's own chat answers, written by llama.cpp: the recipe that won issue 43's A/B), continuing
# from BASE. The round draws ShareGPT turns (every turn with its context, SEED's order) that no
# earlier round, the shipped drafter or the common held-out set holds, and keeps its prompt list
# next to its drafter (bench/data/round-ROUND-self/{drafter.gguf,prompts.jsonl}) so that later
# rounds and scoring exclude it on any machine.
#   ROUND=c11 BASE=bench/data/round-c10-self/drafter.gguf SEED=12 GEN_MIN=25 SHORT_MIN=10 MINUTES=35 \
#       bash bench/self_round.sh
#   ROUND=c12 BASE=bench/data/round-c11-self/drafter.gguf SEED=14 GEN_MIN=25 SHORT_MIN=12 MINUTES=35 \
#       bash bench/self_round.sh   (GEN_MIN + SHORT_MIN + MINUTES + ~10 min of scoring, 2 cores, run alone)
#   ROUND=c13 BASE=bench/data/round-c12b-self/drafter.gguf SEED=15 GEN_MIN=25 SHORT_MIN=10 SHORT_PROMPTS=self \
#       REPLAY="out/self/c11-short/data out/sva/self/data" CODE_SHARE=0.5 MINUTES=25 bash bench/self_round.sh
#   ROUND=c14 BASE=bench/data/round-c13-self/drafter.gguf SEED=16 GEN_MIN=15 SHORT_MIN=20 SHORT_PROMPTS=self \
#       MAX_NEW=96 CODE_SHARE=0.5 MINUTES=25 bash bench/self_round.sh
#   ROUND=c15 BASE=bench/data/round-c14-self/drafter.gguf SEED=17 GEN_MIN=10 SHORT_MIN=25 SHORT_PROMPTS=tasks \
#       MAX_NEW=96 CODE_SHARE=0.5 MINUTES=30 bash bench/self_round.sh
#   ROUND=c16 BASE=bench/data/round-c15-self/drafter.gguf SEED=18 GEN_MIN=15 SHORT_MIN=25 SHORT_PROMPTS=tasks \
#       STARTS=bench/data/round-c16-self/starts.jsonl PROMPT_TOKENS=800 SHORT_PARALLEL=8 MAX_NEW=96 \
#       CODE_SHARE=0.5 MINUTES=30 bash bench/self_round.sh   (not shipped: docs/training.md)
# PARALLEL (default 4) sequences share the 8192-cell context while answers are written: 4 leaves a
# turn 1792 tokens of context (16, the trainer's default, leaves 256 and skips ~90 % of ShareGPT's
# later turns, so a drafter never sees a long context; CNN/DM's 450-1200-token articles are where
# it is weakest). Long contexts are slow to answer (~40 response tok/s against ~155), so SHORT_MIN
# more minutes write answers 16 at a time as well (a second dataset, trained on with --extra-data);
# CODE_SHARE (e.g. 0.5; default: as drawn) makes that share of the turns of both stages ones ShareGPT
# answered with code (chat answers carry little code: HumanEval's tau fell over rounds c10-c11).
# SHORT_PROMPTS=self: the short stage's prompts are written by the target itself (its chat template's
# user prefix, then it samples the user turn: `moa-cpp train` without --prompts), since after round
# c11 ShareGPT has no unseen turn that fits 256 tokens (default: sharegpt, the same draw as stage 1).
# SHORT_PROMPTS=tasks: as self, each prompt begun with an opening of moa_cpp/train/starts/tasks.jsonl
# (code, arithmetic, documents to summarise, questions, writing: `--prompt-starts tasks`), so that the
# target's own prompts hold the kinds of task users bring (round c14's were mostly chat).
# STARTS (default tasks): another list of openings for SHORT_PROMPTS=tasks (a shipped name or a .jsonl
# file; repeat a line to weight it); PROMPT_TOKENS (default 320) caps those self-written turns and
# SHORT_PARALLEL (default 16) sets how many sequences of the short stage (any SHORT_PROMPTS) share the
# context while prompts are written and answered: longer documents need fewer (8 leave a turn 1024 -
# MAX_NEW tokens).
# MAX_NEW (default 256): both stages cut answers there. The evaluation sets score an answer's first
# 64 tokens, where held-out tau is ~0.36 lower than over whole answers (round c13), so a smaller cap
# (e.g. 96) puts more answer starts in each minute of generation.
# REPLAY: data directories of earlier rounds trained on again (e.g. "out/self/c11-short/data
# out/sva/self/data": round c12 trained on long contexts alone and lost 0.11 on short held-out turns).
# A second held-out set drawn the same way (HELDOUT_LONG, 4 sequences, seed 13,
# greedy) scores long contexts; it is made once, excluding every round so far, and committed.
# Writes out/self/ROUND/ (data, features, checkpoint, train.log) and
# bench/results/issue43-ROUND-self-{heldout-s8,heldout-long-s13}.json (held-out tau of BASE and the
# new drafter on each set).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python MOA=.venv/bin/moa-cpp
ROUND=${ROUND:?ROUND names this round, e.g. c11}
BASE=${BASE:?BASE: the drafter GGUF this round continues}
SEED=${SEED:?SEED: a ShareGPT order no earlier round used}
GEN_MIN=${GEN_MIN:-25} MAX_NEW=${MAX_NEW:-256} SHORT_MIN=${SHORT_MIN:-10} SHORT_PROMPTS=${SHORT_PROMPTS:-sharegpt} CODE_SHARE=${CODE_SHARE:-} MINUTES=${MINUTES:-35} EPOCHS=${EPOCHS:-4} THREADS=${THREADS:-2} PARALLEL=${PARALLEL:-4}
STARTS=${STARTS:-tasks} PROMPT_TOKENS=${PROMPT_TOKENS:-320} SHORT_PARALLEL=${SHORT_PARALLEL:-16}
HELDOUT=bench/data/heldout-s8 HELDOUT_LONG=bench/data/heldout-long-s13
OUT=out/self/$ROUND KEEP=bench/data/round-$ROUND-self
# what the shipped drafter and rounds c1-c9 read (regenerated in seconds), then every committed
# self-written round's prompt list
SEEN=($(ROUND=c10 bash bench/continue_train.sh lists | tail -1))
for d in bench/data/round-*-self; do [ "$d" = "$KEEP" ] || SEEN+=("$d/prompts.jsonl"); done
mkdir -p $OUT
quiet() {  # LOG, command...: the command's log without tqdm's progress lines
    local log=$1; shift
    "$@" 2>&1 | tr '\r' '\n' | grep -v "%|" > "$log"
}
# 0. the long-context held-out set (once: ~8 min; a later round finds it committed)
test -f $HELDOUT_LONG/data/manifest.json || quiet $OUT/heldout-long.log $MOA train --target smollm2 --prompts sharegpt \
    --sharegpt-turns all --seed 13 --n-samples 200 --greedy-fraction 1 --n-parallel 4 --data-minutes 10 \
    --gen-threads $THREADS --exclude-prompts $HELDOUT/data "${SEEN[@]}" --out $HELDOUT_LONG --data-only
DRAW="--target smollm2 --prompts sharegpt --sharegpt-turns all --seed $SEED
      --exclude-prompts $HELDOUT/data $HELDOUT_LONG/data ${SEEN[*]}"

# 1. the target writes its answers (its sampling mix: 70 % greedy, the rest sampled)
# (the data settings are repeated in step 2 so that it reuses this dataset)
SELF="--n-parallel $PARALLEL --max-new-tokens $MAX_NEW --n-samples 20000 --data-minutes $GEN_MIN --gen-threads $THREADS ${CODE_SHARE:+--code-share $CODE_SHARE}"
test -f $OUT/data/manifest.json || quiet $OUT/data.log $MOA train $DRAW $SELF --out $OUT --data-only
# 1b. short contexts, 16 at a time (the same order, minus what 1 drew)
# (none may be left: after round c11 no unseen ShareGPT turn fits 256 tokens; the round then trains on 1
# alone, unless SHORT_PROMPTS=self has the target write the prompts too)
EXTRA=()
[ -z "${REPLAY:-}" ] || EXTRA=(--extra-data $REPLAY)
case $SHORT_PROMPTS in
    sharegpt) SHORT=($DRAW $OUT/data ${CODE_SHARE:+--code-share $CODE_SHARE}) ;;
    self) SHORT=(--target smollm2 --seed $SEED) ;;
    tasks) SHORT=(--target smollm2 --seed $SEED --prompt-starts $STARTS --max-prompt-tokens $PROMPT_TOKENS) ;;
    *) echo "SHORT_PROMPTS: sharegpt, self or tasks, not $SHORT_PROMPTS" >&2; exit 2 ;;
esac
if [ "$SHORT_MIN" != 0 ]; then
    test -f $OUT-short/data/manifest.json || quiet $OUT-short-data.log $MOA train "${SHORT[@]}" --n-parallel $SHORT_PARALLEL \
        --max-new-tokens $MAX_NEW --n-samples 20000 --data-minutes $SHORT_MIN --gen-threads $THREADS \
        --out $OUT-short --data-only || tail -1 $OUT-short-data.log >&2
    if test -f $OUT-short/data/manifest.json; then EXTRA=(--extra-data ${REPLAY:-} $OUT-short/data); fi
fi
# 2. continue BASE on them (features are computed by the first run and cached in $OUT/features)
test -f $OUT/report.json || quiet $OUT/train.log $MOA train $DRAW $SELF "${EXTRA[@]}" --out $OUT --init-from "$BASE" \
    --minutes $MINUTES --epochs $EPOCHS --eval-every 0 --outtype q8_0 --threads $THREADS
mkdir -p $KEEP
cp $OUT/drafter.gguf $KEEP/drafter.gguf
cat $OUT/data/prompts.jsonl $(test -f $OUT-short/data/manifest.json && echo $OUT-short/data/prompts.jsonl) \
    > $KEEP/prompts.jsonl     # (what REPLAY holds is in earlier rounds' lists)
# 3. both held-out sets, paired with the shipped drafter: it (unless it is BASE or the new drafter:
# the same file would be scored twice), BASE and the new drafter (drops every conversation whose
# prompt any of them trained on)
SHIPPED=moa_cpp/data/moa-smollm2-135m-instruct.gguf RUNS=("$BASE" $KEEP/drafter.gguf)
cmp -s $SHIPPED "$BASE" || cmp -s $SHIPPED $KEEP/drafter.gguf || RUNS=($SHIPPED "${RUNS[@]}")
for h in $HELDOUT $HELDOUT_LONG; do
    $PY bench/heldout_tau.py --heldout $h/data "${RUNS[@]}" --exclude "${SEEN[@]}" \
        --threads $THREADS --out bench/results/issue43-$ROUND-self-$(basename $h).json
done
# 4. the common set over each answer's first 64 tokens (what the evaluation sets score)
$PY bench/heldout_tau.py --heldout $HELDOUT/data "${RUNS[@]}" --exclude "${SEEN[@]}" --first 64 \
    --threads $THREADS --out bench/results/issue43-$ROUND-self-$(basename $HELDOUT)-first64.json
