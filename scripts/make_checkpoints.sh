#!/usr/bin/env bash
# Regenerate the whole shipped set: train every method with the one recipe, evaluate each (bpb vs length,
# copy probe, RoPE scalings) into its metrics.json, then redraw the README chart.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$(dirname "$0")/train_all.sh"
"$PY" -m posviz.evaluate_all
"$PY" -m posviz.report --out docs/bpb_vs_length.svg
