#!/usr/bin/env bash
# Issue 43 items 1 and 4: self-written answers (the target's own chat answers, written by llama.cpp:
# the paper's recipe) vs ShareGPT's answers read by teacher forcing, continuing the shipped SmolLM2
# drafter. Both arms draw from the same ShareGPT turns (SEED, every turn with its context), none
# that an earlier round or the common held-out set holds (bench/continue_train.sh lists), the same
# number of answers and the same optimisation steps: the A/B isolates what the data teaches. What
# each costs is reported apart (writing answers takes llama.cpp minutes, teacher forcing seconds).
#   bash bench/self_vs_sharegpt_ab.sh       (~35 min on 2 cores: GEN_MIN of generation on 2 threads,
#                                            then both arms side by side on 1 thread each)
# Scored on the committed common held-out set (bench/heldout_tau.py: the target's own greedy answers
# to unseen ShareGPT prompts, 320 conversations, paired) and on the 10 own prompts
# (bench/train_tau.py, the real verifier). Writes out/sva/{self,sharegpt}/ and
# bench/results/issue43-self-vs-sharegpt{,-heldout}.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python MOA=.venv/bin/moa-cpp
BASE=${BASE:-moa_cpp/data/moa-smollm2-135m-instruct.gguf}
SEED=${SEED:-11} GEN_MIN=${GEN_MIN:-6} STEPS=${STEPS:-250}
HELDOUT=bench/data/heldout-s8
# out/cont/<every round before c10>/ and out/cont/base-trained-on: what the shipped drafter read
SEEN=($(ROUND=c10 bash bench/continue_train.sh lists | tail -1))
DRAW="--target smollm2 --prompts sharegpt --sharegpt-turns all --seed $SEED --exclude-prompts $HELDOUT/data ${SEEN[*]}"
mkdir -p out/sva

# 1. the target writes its own answers (its sampling mix: greedy and sampled, as every self-distilled run)
SELF="--n-samples 2000 --data-minutes $GEN_MIN --gen-threads 2"
test -f out/sva/self/data/manifest.json || $MOA train $DRAW $SELF --out out/sva/self --data-only 2>&1 | tr '\r' '\n' | grep -v "%|" > out/sva/self-data.log
n=$($PY -c "import json; print(json.load(open('out/sva/self/data/manifest.json'))['n_samples'])")
# 2. as many ShareGPT answers, teacher-forced
test -f out/sva/sharegpt/data-fixed/manifest.json || $MOA train $DRAW --out out/sva/sharegpt --n-samples 0 \
    --fixed-answers $n --data-only 2>&1 | tr '\r' '\n' | grep -v "%|" > out/sva/sharegpt-data.log

# 3. both arms side by side, one thread each, the same steps from the shipped drafter
for arm in self sharegpt; do
    data=$SELF; [ $arm = sharegpt ] && data="--n-samples 0 --fixed-answers $n"      # (the data is reused)
    test -f out/sva/$arm/report.json || $MOA train $DRAW $data --out out/sva/$arm --init-from "$BASE" \
        --steps $STEPS --epochs 50 --eval-every 0 --outtype q8_0 --threads 1 2>&1 | tr '\r' '\n' \
        | grep -v "%|" > out/sva/$arm-train.log &
done
wait

# 4. scores: the held-out set (drops every conversation whose prompt a compared drafter trained on)
$PY bench/heldout_tau.py --heldout $HELDOUT/data "$BASE" out/sva/self/drafter.gguf out/sva/sharegpt/drafter.gguf \
    --exclude "${SEEN[@]}" out/sva/self out/sva/sharegpt --threads 2 --out bench/results/issue43-self-vs-sharegpt-heldout.json
$PY bench/train_tau.py "$BASE" --threads 2 > out/sva/tau-shipped.json
for arm in self sharegpt; do $PY bench/train_tau.py out/sva/$arm/drafter.gguf --threads 2 > out/sva/tau-$arm.json; done
$PY - <<'EOF'
import json, sys
rows = {}
for arm in ("shipped", "self", "sharegpt"):
    t = json.load(open(f"out/sva/tau-{arm}.json"))
    row = {"chain4_tau_own_prompts": round(t["moa"]["tau"], 3), "identical_outputs": t["identical_outputs"]}
    if arm != "shipped":
        rep = json.load(open(f"out/sva/{arm}/report.json"))
        d = "data" if arm == "self" else "data-fixed"
        man = json.load(open(f"out/sva/{arm}/{d}/manifest.json"))
        row.update(steps=rep["steps"], answers=man["n_samples"], tokens=man["n_tokens"],
                   response_tokens=man.get("n_response_tokens"), data_seconds=round(man.get("seconds", 0), 1),
                   seconds=rep.get("seconds"))
    rows[arm] = row
json.dump(rows, open("bench/results/issue43-self-vs-sharegpt.json", "w"), indent=2)
print(json.dumps(rows, indent=2))
EOF
