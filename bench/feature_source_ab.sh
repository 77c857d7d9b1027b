#!/usr/bin/env bash
# Issue 43 item 1: a drafter trained on llama.cpp's features vs one trained on the PyTorch target's,
# at equal wall-clock. Same data (FIXED teacher-forced ShareGPT answers, default 300), from scratch,
# the same seed and recipe; each source gets BUDGET minutes (default 10) of features + optimisation:
# its feature pass runs first (and is timed), the optimisation gets the rest. Scored by the real
# verifier (the trainer's own held-out estimate compares each drafter with its own labels, so it
# cannot judge the labels): bench/train_tau.py (10 own prompts, chain 4, native engine).
#   bash bench/feature_source_ab.sh [TARGET]     (default smollm2: SmolLM2-135M Q4_1; ~35 min on 2 cores)
# Writes out/fab/{torch,llama}/ and bench/results/issue43-feature-ab.json.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${1:-smollm2} FIXED=${FIXED:-300} BUDGET=${BUDGET:-10} THREADS=${THREADS:-2}
TGT=$(.venv/bin/python -c "from moa_cpp.train.cli import _target_path; print(_target_path('$TARGET'))")
M=".venv/bin/moa-cpp train --target $TGT --prompts sharegpt --n-samples 0 --fixed-answers $FIXED --epochs 50 \
   --draft-vocab 8192 --eval-every 0 --outtype q8_0 --threads $THREADS --seed 0"
RES=(); mkdir -p out/fab
for src in torch llama; do
    feat=out/fab/feat-$src run=out/fab/$src
    # 1. the feature pass, timed (one optimisation step so the run stops right after it)
    test -f $feat/report.json || $M --feature-source $src --out $feat --steps 1 2>&1 | tr '\r' '\n' | grep -v "%|" > $feat.log
    t_feat=$(.venv/bin/python -c "import json; print(json.load(open('$feat/report.json'))['seconds']['features'])")
    # 2. the optimisation on those features, for the rest of the budget
    minutes=$(.venv/bin/python -c "print(round($BUDGET - $t_feat / 60, 2))")
    echo "$src: features ${t_feat}s, optimisation ${minutes} min"
    mkdir -p $run
    for d in data-fixed features; do ln -sfn "$(realpath $feat/$d)" $run/$d; done
    test -f $run/report.json || $M --feature-source $src --out $run --minutes $minutes 2>&1 | tr '\r' '\n' | grep -v "%|" > $run.log
    .venv/bin/python bench/train_tau.py $run/drafter.gguf -m $TGT --threads $THREADS > $run/tau.json
    RES+=("$src" "$t_feat" "$minutes")
done
.venv/bin/python - "${RES[@]}" <<'EOF'
import json, sys
a = sys.argv[1:]
rows = {}
for i in range(0, len(a), 3):
    src, t_feat, minutes = a[i], float(a[i + 1]), float(a[i + 2])
    rep = json.load(open(f"out/fab/{src}/report.json"))
    tau = json.load(open(f"out/fab/{src}/tau.json"))
    rows[src] = {"feature_seconds": round(t_feat, 1), "train_minutes": minutes, "steps": rep["steps"],
                 "tokens": rep["tokens"], "chain4_tau_own_prompts": round(tau["moa"]["tau"], 3),
                 "identical_outputs": tau["identical_outputs"], "speedup": round(tau["speedup"], 3)}
json.dump(rows, open("bench/results/issue43-feature-ab.json", "w"), indent=2)
print(json.dumps(rows, indent=2))
EOF
