#!/usr/bin/env bash
# Context extension by fine-tuning: from models/rope, train at 4 x its length with the same small budget
# (409,600 bytes, about 3 % of pre-training) with no scaling, linear position interpolation (Chen et al.
# 2023) and YaRN (Peng et al. 2023). One recipe for the three, so the scaling is the only difference.
# OUT_DIR: where the base checkpoint is and the three go (default models/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export OMP_NUM_THREADS=${CPU_THREADS:-1}
OUT_DIR=${OUT_DIR:-models}
BASE=${BASE:-$OUT_DIR/rope}
L=$("$PY" -c "import json; print(json.load(open('$BASE/config.json'))['model']['train_length'])")
RECIPE="tokens=409600 train_length=$((4 * L)) batch_size=4 lr=0.001 warmup_steps=10 log_every=5 checkpoint_every=50 finetune_from=$BASE"
mkdir -p runs
run() {  # name, then position options
    local name=$1; shift
    "$PY" -m posviz.train --method rope --out "$OUT_DIR/$name" --resume --set $RECIPE --option "$@" > "runs/train-$name.log" 2>&1
    echo "fine-tuned $name"
}
run rope-ft4x scaling=none
run rope-linear-ft4x scaling=linear factor=4.0 original_length="$L"
run rope-yarn-ft4x scaling=yarn factor=4.0 original_length="$L"
