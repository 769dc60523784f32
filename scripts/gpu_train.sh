#!/usr/bin/env bash
# Train and evaluate checkpoints on a GPU machine in one call (issue #35: a task with a GPU lent trains
# there), with the shared recipe in fp32, on the very bytes the CPU-trained checkpoints saw:
#   METHODS="fox cope stick_breaking" bash scripts/gpu_train.sh
# The training corpus is the standard library of the Python that trained the shipped set (3.11.7), carried
# as .devsite/stdlib.tar.xz (made by `python -m posviz.training.data --pack-stdlib .devsite/stdlib.tar.xz`) and named by $POSVIZ_STDLIB, so
# that a machine with another Python trains on the same files (its corpus description and file-list hash
# say so). The checkpoints come back as $OUT/checkpoints.tar (models/<method>/ for each method).
set -u -o pipefail
OUT=${OUT:-/tmp/gpu-train}
METHODS=${METHODS:?name the methods to train, e.g. METHODS="fox cope"}
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/stdlib && tar -C /tmp/stdlib -xJf .devsite/stdlib.tar.xz
export POSVIZ_STDLIB=/tmp/stdlib POSVIZ_STDLIB_VERSION=$(cat /tmp/stdlib/POSVIZ_VERSION)
python3 -c "from posviz.training.data import load_corpus; print(load_corpus().description)"

start=$SECONDS
pids=()
for m in $METHODS; do  # all at once: each is a small model, far from filling the GPU (68-72 s each on an H100)
    timeout "${TRAIN_TIMEOUT:-330}" python3 -m posviz.train --method "$m" --set precision=fp32 > "/tmp/train-$m.log" 2>&1 &
    pids+=($!)
done
wait "${pids[@]}"  # these alone: a bare `wait` also waits for the log's tee, for ever
for m in $METHODS; do tail -c 300 "/tmp/train-$m.log"; echo; done
echo "training: $((SECONDS - start)) s"
start=$SECONDS
timeout "${EVAL_TIMEOUT:-200}" python3 -m posviz.evaluate_all --only $METHODS --device cuda 2>&1 | tail -20
echo "evaluation: $((SECONDS - start)) s"
# the checkpoints, and the training states a run stopped by its timeout leaves (resume with --resume)
tar -cf "$OUT/checkpoints.tar" $(for m in $METHODS; do [ -d "models/$m" ] && echo "models/$m"; done) $(ls -d runs 2>/dev/null)
ls -la "$OUT"
