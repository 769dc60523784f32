#!/usr/bin/env bash
# Regenerate the whole shipped set: train every method with the one recipe, evaluate each (bpb vs length,
# far-context probes, RoPE scalings) into its metrics.json, then redraw the charts and rewrite the tables
# of docs/results.md. Fine-tunes the rope checkpoint at 4x its length three ways for the
# context-extension lab, and recalibrates it without its rotation (DroPE). Rerun to resume a stopped set.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -m posviz_tools.train_all  # every registered method, two at a time, one progress line a minute with the time left
"$(dirname "$0")/finetune_rope.sh"  # rope-ft4x, rope-linear-ft4x, rope-yarn-ft4x and rope-drope (DroPE) from models/rope
"$PY" -m posviz.evaluate_all
"$PY" -m posviz_tools.report --out docs/bpb_vs_length.svg --results docs/results.md
