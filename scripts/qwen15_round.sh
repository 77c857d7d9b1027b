#!/usr/bin/env bash
# One continued round of the Qwen2.5-Coder-1.5B drafter lineage (docs/training.md, "Qwen2.5-Coder-1.5B
# drafter"), niced so that it can run beside other work; pause it for benchmarks with
#   kill -STOP <pid> ... kill -CONT <pid>      (the pid is in out/qwen15/ROUND.pid)
#
#   ROUND=q4 SEED=3 ANSWERS=600 MINUTES=50 LATER=q3=2:600 bash scripts/qwen15_round.sh
#
# INIT (default: the lineage's latest checkpoint, moa_cpp/data/lineage/qwen2.5-coder-1.5b.gguf) is
# the drafter this round continues; the new drafter replaces that checkpoint when the round ends
# (INSTALL=0: not), with its record beside it (.json): commit both, so that the next session's
# round continues from it (earlier rounds are not kept: their commands are).
#
# Regenerates (seconds each, --data-only) the prompt lists of the earlier rounds (LATER: rounds after
# q2 as name=seed:answers) and of the common held-out set so that this round draws none of them, trains ROUND from INIT, then scores INIT and
# the new drafter on the common held-out set (48 answers no round trains on).
set -euo pipefail
cd "$(dirname "$0")/.."
MOA=.venv/bin/moa-cpp
PY=.venv/bin/python
ROUND=${ROUND:?ROUND (e.g. q3)} SEED=${SEED:?SEED (a seed no earlier round used)}
ANSWERS=${ANSWERS:-600} MINUTES=${MINUTES:-60}
LINEAGE=moa_cpp/data/lineage/qwen2.5-coder-1.5b
INIT=${INIT:-$LINEAGE.gguf}
T=qwen2.5-coder-1.5b
mkdir -p out/qwen15
echo $$ > out/qwen15/$ROUND.pid
data() {  # out, then the data arguments of a round as it was run (docs/training.md)
  local out=$1; shift
  [ -d "out/qwen15/$out/data-fixed" ] || nice -n 19 $MOA train --target $T --out "out/qwen15/$out" --n-samples 0 \
    --code-share 0.5 --threads 2 --feature-source torch --data-only "$@"
}
data q1 --fixed-answers 500
data heldout --fixed-answers 16 --seed 7 --exclude-prompts out/qwen15/q1/data-fixed
data q2 --fixed-answers 600 --seed 1 --exclude-prompts out/qwen15/q1/data-fixed out/qwen15/heldout/data-fixed
data heldout48 --fixed-answers 48 --seed 11 --exclude-prompts out/qwen15/q1/data-fixed out/qwen15/q2/data-fixed
# rounds after q2: name=seed:answers (their prompts are excluded from later rounds too)
excl=(out/qwen15/q1/data-fixed out/qwen15/q2/data-fixed out/qwen15/heldout48/data-fixed)
for r in ${LATER:-}; do
  name=${r%%=*}; rest=${r#*=}
  data "$name" --fixed-answers "${rest#*:}" --seed "${rest%%:*}" --exclude-prompts "${excl[@]}"
  excl+=(out/qwen15/$name/data-fixed)
done
nice -n 19 $MOA train --target $T --out out/qwen15/$ROUND --init-from "$INIT" --n-samples 0 --fixed-answers $ANSWERS \
  --code-share 0.5 --seed $SEED --minutes $MINUTES --epochs 12 --eval-every 100 --outtype q8_0 --threads 2 \
  --feature-source torch --exclude-prompts "${excl[@]}"
nice -n 19 $MOA train eval --heldout out/qwen15/heldout48/data-fixed --target $T "$INIT" \
  out/qwen15/$ROUND/drafter.gguf --exclude out/qwen15/q1 --threads 2 \
  --out bench/results/train/qwen2.5-coder-1.5b-$ROUND-heldout48.json
if [ "${INSTALL:-1}" = 1 ]; then
  mkdir -p "$(dirname "$LINEAGE")"
  cp "out/qwen15/$ROUND/drafter.gguf" "$LINEAGE.gguf.tmp" && mv "$LINEAGE.gguf.tmp" "$LINEAGE.gguf"
  ROUND=$ROUND SEED=$SEED ANSWERS=$ANSWERS MINUTES=$MINUTES INIT=$INIT LATER="${LATER:-}" $PY - "$LINEAGE.json" <<'PYEOF'
import json, os, sys
path = sys.argv[1]
rec = json.load(open(path)) if os.path.exists(path) else {"target": "qwen2.5-coder-1.5b", "rounds": []}
res = json.load(open(f"bench/results/train/qwen2.5-coder-1.5b-{os.environ['ROUND']}-heldout48.json"))
rec["rounds"].append({k.lower(): os.environ[k] for k in ("ROUND", "SEED", "ANSWERS", "MINUTES", "INIT", "LATER")}
                     | {"heldout48": [{"run": r["run"], "tau": r["tau"], "tau_ci95": r.get("tau_ci95"),
                                       "token_passes": r.get("token_passes")} for r in res["rows"]]})
json.dump(rec, open(path, "w"), indent=1)
print("lineage:", path, "round", os.environ["ROUND"])
PYEOF
fi
