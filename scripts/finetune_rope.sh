#!/usr/bin/env bash
# Context extension by fine-tuning: from models/rope, train at 4 x its length with the same small budget
# (409,600 bytes, about 3 % of pre-training) with no scaling, linear position interpolation (Chen et al.
# 2023) and YaRN (Peng et al. 2023). One recipe for the three, so the scaling is the only difference.
# Then DroPE from the same base (below). OUT_DIR: where the base checkpoint is and the four go (default models/).
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

# DroPE (Gelberg et al. 2025, arXiv 2512.12167; code SakanaAI/DroPE): the same base with its rotation removed (trained on
# as nope, every weight carried over), recalibrated at its own training length with the reference's recalibration
# config (cfgs/run_cfg/smollm_360m_drope.yaml over cfgs/trainer_cfg/base_trainer.yaml): learning rate 3e-4 held after
# a warm-up of 10 % of the steps, no weight decay, gradients clipped at 1.0; its budget (120,000 steps of 512 x 2,048
# tokens, 126 B tokens after SmolLM-360M's 600 B, 21 %) scaled to rope's 16 M bytes: 20 %, 3,200,000 bytes (781 steps).
DROPE="tokens=3200000 lr=0.0003 min_lr_ratio=1.0 warmup_steps=78 weight_decay=0.0 grad_clip=1.0 log_every=10 checkpoint_every=50 finetune_from=$BASE"
"$PY" -m posviz.train --method nope --out "$OUT_DIR/rope-drope" --resume --set $DROPE > runs/train-rope-drope.log 2>&1
echo "recalibrated rope-drope"
