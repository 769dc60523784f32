#!/usr/bin/env bash
# Train every shipped checkpoint with the one shared recipe (posviz.train.TrainConfig defaults).
# JOBS processes at a time, each with CPU_THREADS threads (small models use 1 thread best on a CPU).
# OUT_DIR: where the checkpoints go (default models/); RECIPE: KEY=VALUE overrides of the recipe, for trials.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
JOBS=${JOBS:-2}
export OMP_NUM_THREADS=${CPU_THREADS:-1}
# Every registered method by default, so a new file in posviz/positions/ is trained without editing this.
METHODS=${METHODS:-$("$PY" -c 'from posviz.positions import method_names; print(" ".join(method_names()))')}
OUT_DIR=${OUT_DIR:-models}
SET=${RECIPE:+--set $RECIPE}
mkdir -p runs
printf '%s\n' $METHODS | xargs -P "$JOBS" -I{} sh -c "$PY -m posviz.train --method {} --out $OUT_DIR/{} --resume $SET > runs/train-{}.log 2>&1 && echo 'trained {}'"
