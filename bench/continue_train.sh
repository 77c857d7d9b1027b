#!/usr/bin/env bash
# Issue 22: training that accumulates. Every run starts from a drafter GGUF (--init-from) and is
# scored on ONE common held-out set (bench/heldout_tau.py) against the drafter it started from.
#
#   bash bench/continue_train.sh lists            the prompt lists of every round before ROUND (seconds each)
#   bash bench/continue_train.sh prepare          held-out set, what the shipped drafter trained on,
#                                                 this round's data + features (~20 min on 2 cores)
#   bash bench/continue_train.sh ab [NAME...]     equal wall-clock A/Bs (MINUTES, default 5, each)
#                                                 from BASE, on this round's data and features
#   bash bench/continue_train.sh long NAME[+NAME...]   the winners for MINUTES (default 60) -> out/cont/ROUND-long
#   bash bench/continue_train.sh score RUN...     common held-out tau of BASE and each RUN (dir or GGUF)
#
# BASE (default: the shipped drafter) is what runs continue from; ROUND (default c1) names this
# round's data (SEED, default 1: ShareGPT answers no earlier round drew with its seed) and FIXED
# (default 1300) teacher-forced answers. REPORT names bench/results/REPORT.{json,md,png}.
# HELDOUT is the common held-out set: greedy answers to ShareGPT prompts of the HELDOUT_SEED order.
# From round c6 on it is heldout-s8 (HELDOUT_N=320 answers, seed 8, drawn after excluding every
# prompt the shipped drafter (out/cont/base-trained-on) and the rounds in ROUNDS before this one
# trained on, so none is dropped at scoring); rounds c1-c5 used out/heldout160 (HELDOUT=out/heldout160
# HELDOUT_SEED=7 HELDOUT_N=160: 69 of its 160 survived the drop) and issue 22's first rows out/heldout.
# Training is CPU-bound: run this alone (other load slows llama.cpp and torch alike).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
MOA=".venv/bin/moa-cpp"
BASE=${BASE:-moa_cpp/data/moa-smollm2-135m-instruct.gguf}
ROUND=${ROUND:-c1} SEED=${SEED:-1} FIXED=${FIXED:-1300}
SRC=out/cont/$ROUND
# the common held-out set is committed (bench/data/heldout-s8, 0.4 MB): every machine scores on the
# same answers (greedy answers regenerated on another CPU can differ) and no session spends ~25 min
# regenerating it; `prepare` still generates a set that is missing (another HELDOUT)
HELDOUT_DEFAULT=out/heldout-s8; test -f bench/data/heldout-s8/data/manifest.json && HELDOUT_DEFAULT=bench/data/heldout-s8
HELDOUT=${HELDOUT:-$HELDOUT_DEFAULT} HELDOUT_SEED=${HELDOUT_SEED:-8} HELDOUT_N=${HELDOUT_N:-320}
# every continuation round so far: name=seed:answers[:turns] (prepare regenerates their prompt lists,
# ~15 s each, so that scoring can drop them on a new machine); turns: ShareGPT's first answers (the
# default) or all answers with their context (TURNS=all: round c9 on, the first answers are used up)
ROUNDS=${ROUNDS:-"c1=1:1300 c2=2:3000 c3=3:4000 c4=4:3000 c5=5:6000 c6=6:6000 c7=7:2000 c8=9:6000 c9=10:6000:all"}
TURNS=${TURNS:-first}
DATA="--target smollm2 --n-samples 0 --fixed-answers $FIXED --seed $SEED --sharegpt-turns $TURNS"
# rounds after c3 never draw a held-out prompt (c1-c3 predate --exclude-prompts: scoring drops theirs);
# c4 and c5 excluded the seed-7 set's
exclude_heldout() {
    case $1 in c1|c2|c3) ;; c4|c5) echo "--exclude-prompts out/heldout160/data";; *) echo "--exclude-prompts $HELDOUT/data";; esac
}
DATA="$DATA $(exclude_heldout $ROUND)"
declare -A FLAGS=([rewarm]="--lr 2e-3" [nowarm]="--warmup 0" [ns3]="--muon-ns-steps 3" [padlsa]="--lsa-on-padding"
                  [ce0.3]="--ce-weight 0.3" [t5]="--t-range 5 5" [lr1e-3]="--lr 1e-3" [lr5e-4]="--lr 5e-4"
                  [d4]="--loss-max-depth 4" [d8]="--loss-max-depth 8"
                  [offmask]="--mask-off-target")
mode=${1:?usage: lists | prepare | ab [NAME...] | long NAME | score RUN...}; shift

score() {  # REPORT, runs...
    local report=$1; shift
    local exclude=(out/cont/base-trained-on)
    for r in $ROUNDS; do test -d out/cont/${r%%=*} && exclude+=(out/cont/${r%%=*}); done
    $PY bench/heldout_tau.py --heldout $HELDOUT/data "$BASE" "$@" --exclude "${exclude[@]}" \
        --out bench/results/$report.json
}

# the prompt lists of the rounds before ROUND and of what the shipped drafter trained on (sets `seen`):
# scoring drops their conversations, later rounds and A/Bs exclude them
lists() {
    # the prompts of earlier rounds (teacher-forced answers: no generation, seconds each)
    seen=(out/cont/base-trained-on)
    for r in $ROUNDS; do
        name=${r%%=*} spec=${r#*=}
        [ "$name" = "$ROUND" ] && break
        seen+=(out/cont/$name)
        test -f out/cont/$name/data-fixed/prompts.jsonl && continue
        excl=$(exclude_heldout $name) n=${spec#*:} turns=first
        case $n in *:*) turns=${n#*:} n=${n%%:*};; esac
        # the set a round excluded may be missing on a new machine: then the first n + 160 of the same
        # seeded order (the draw minus at most 160 excluded prompts, topped up) is a superset of its prompts
        if [ -n "$excl" ] && [ ! -f "${excl#--exclude-prompts }/manifest.json" ]; then excl="" n=$((n + 160)); fi
        $MOA train --target smollm2 --out out/cont/$name --n-samples 0 --fixed-answers $n --seed ${spec%%:*} \
            --sharegpt-turns $turns --data-only $excl
    done
    # what the shipped drafter trained on (a GGUF does not list its prompts): its 1,200 teacher-forced
    # answers (seed 0) and, for its 153 self-distilled answers, the first 400 ShareGPT prompts of the
    # seed-0 order its data stage walked through (a superset)
    mkdir -p out/cont/base-trained-on
    test -f out/cont/base-trained-on/data-fixed/prompts.jsonl || $MOA train --target smollm2 \
        --out out/cont/base-trained-on --n-samples 0 --fixed-answers 1200 --seed 0 --data-only
    $PY - <<'EOF'
import json, numpy as np
from moa_cpp.train.prompts import load_prompts
prompts, _ = load_prompts(["sharegpt"], seed=0, log=lambda s: None)
order = np.random.default_rng(0).permutation(len(prompts))          # generate_dataset's order
with open("out/cont/base-trained-on/prompts.jsonl", "w") as f:
    for j in order[:400]:
        f.write(json.dumps({"prompt": prompts[int(j)]}) + "\n")
EOF
}

case $mode in
lists)
    lists
    echo "${seen[@]}"            # last line: the lists' directories (bench/self_vs_sharegpt_ab.sh reads it)
    ;;
prepare)
    lists
    # the common held-out set (greedy answers, ~2.5 s each); the seed-7 set predates the exclusion
    # (scoring drops what rounds drew of it), later sets exclude every earlier round's prompts
    excl=(); [ "$HELDOUT_SEED" = 7 ] || excl=(--exclude-prompts "${seen[@]}")
    test -f $HELDOUT/data/manifest.json || $MOA train --target smollm2 --out $HELDOUT --prompts sharegpt \
        --seed $HELDOUT_SEED --n-samples $HELDOUT_N --greedy-fraction 1 --data-only \
        --data-minutes $((HELDOUT_N / 10 + 4)) "${excl[@]}"
    # this round's data and features (a 0-step continuation computes and caches the features)
    test -f $SRC/features/done.json || $MOA train $DATA --out $SRC --init-from "$BASE" --steps 0 --eval-every 0
    ;;
ab)
    MIN=${MINUTES:-5}
    NAMES=("$@"); [ ${#NAMES[@]} -gt 0 ] || NAMES=(rewarm nowarm ns3 padlsa)
    RUNS=()
    for name in "${NAMES[@]}"; do
        out=out/cont/$ROUND-ab/$name; RUNS+=($out)
        test -f $out/report.json && { echo "$name: reusing $out"; continue; }
        flags=""; for part in ${name//+/ }; do flags="$flags ${FLAGS[$part]?unknown variant $part}"; done
        mkdir -p $out
        for d in data-fixed features; do ln -sfn "$(realpath $SRC/$d)" $out/$d; done
        echo "$name:$flags"
        $MOA train $DATA --out $out --init-from "$BASE" --minutes $MIN --epochs 50 --eval-every 0 --outtype q8_0 \
            $flags 2>&1 | tr '\r' '\n' | grep --line-buffered -v "%|" > $out/train.log
    done
    score ${REPORT:-issue22-$ROUND-ab} "${RUNS[@]}"
    ;;
long)
    MIN=${MINUTES:-60}
    name=${1:?long NAME}; out=out/cont/$ROUND-long
    flags=""; for part in ${name//+/ }; do flags="$flags ${FLAGS[$part]?unknown variant $part}"; done
    mkdir -p $out
    for d in data-fixed features; do ln -sfn "$(realpath $SRC/$d)" $out/$d; done
    $MOA train $DATA --out $out --init-from "$BASE" --minutes $MIN --epochs 50 --eval-every 100 --outtype q8_0 \
        $flags 2>&1 | tr '\r' '\n' | grep --line-buffered -v "%|" > $out/train.log
    score ${REPORT:-issue22-$ROUND-long} $out/drafter.gguf
    ;;
score)
    score ${REPORT:-issue22-score} "$@"
    ;;
*)
    echo "unknown mode $mode" >&2; exit 2
    ;;
esac
