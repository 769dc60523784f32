#!/usr/bin/env bash
# DroPE (Gelberg et al. 2025, arXiv 2512.12167; code SakanaAI/DroPE): models/rope with its rotation removed (trained
# on as nope, every weight carried over) and recalibrated at its own training length. The recipe follows the
# reference's recalibration config (cfgs/run_cfg/smollm_360m_drope.yaml over cfgs/trainer_cfg/base_trainer.yaml):
# learning rate 3e-4 held constant after a warm-up of 10 % of the steps, no weight decay, gradients clipped at 1.0;
# its budget (120,000 steps of 512 x 2,048 tokens, 126 B tokens after SmolLM-360M's 600 B, 21 %) scaled to rope's
# 16 M bytes: 20 %, 3,200,000 bytes (781 steps). A 100-step trial (2.6 %) stayed at 3.18 bits per byte at 1x.
# OUT_DIR: where the base checkpoint is and the recalibrated one goes (default models/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export OMP_NUM_THREADS=${CPU_THREADS:-1}
OUT_DIR=${OUT_DIR:-models}
BASE=${BASE:-$OUT_DIR/rope}
RECIPE="tokens=3200000 lr=0.0003 min_lr_ratio=1.0 warmup_steps=78 weight_decay=0.0 grad_clip=1.0 log_every=10 checkpoint_every=50 finetune_from=$BASE"
mkdir -p runs
"$PY" -m posviz.train --method nope --out "$OUT_DIR/rope-drope" --resume --set $RECIPE > runs/train-rope-drope.log 2>&1
echo "recalibrated rope-drope"
