#!/usr/bin/env bash
# The GPU check (issue #36) in one call on a GPU machine that has a CUDA build of PyTorch but no network:
#   1. `make gpu-check`: the tests marked cuda (tests/test_gpu.py);
#   2. every lab's default view and the Extrapolation lab at 1x, 4x, 16x, timed on the GPU;
#   3. the same on that machine's CPU (CUDA_VISIBLE_DEVICES=), for the ratios and for what the pages show.
#   4. the pages again on the CPU with the GPU's caps: the very work of step 2, whose numbers must agree.
# Everything lands in $OUT (default /tmp/gpu-check): log, gpu-check.log, {cuda,cpu,cpu-gpu-caps}.{json,md}.
#
# The machine's python3 holds PyTorch for its GPU, so make's "venv" is that environment (VENV=its prefix,
# its stamps touched: nothing is installed from the network). The packages posviz needs beyond it are
# unpacked from .devsite/site.tar.xz (streamlit, altair, transformers at the versions requirements.txt
# allows), made on a machine with the registries by:
#   pip install --no-deps --target DIR --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 ...
set -u -o pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
if [ -f .devsite/site.tar.xz ]; then
    mkdir -p /tmp/site && tar -C /tmp/site -xJf .devsite/site.tar.xz && export PYTHONPATH=/tmp/site
fi
python3 - <<'EOF'
import sys, torch, transformers, streamlit
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| transformers", transformers.__version__, "| streamlit", streamlit.__version__,
      "| GPU", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
EOF

VENV=$(python3 -c 'import sys; print(sys.prefix)')
touch "$VENV/.installed-test" "$VENV/.installed-app"
# STAGES picks what runs (a rerun after a fix need not repeat what passed): check cuda cpu same
STAGES=${STAGES:-check cuda cpu same}
stage() { case " $STAGES " in *" $1 "*) return 0;; *) return 1;; esac; }

if stage check; then
    start=$SECONDS
    if command -v make >/dev/null; then
        timeout 240 make gpu-check VENV="$VENV" 2>&1 | tee "$OUT/gpu-check.log"
    else  # the same command as the Makefile's target
        timeout 240 python3 -m pytest -m cuda tests/test_gpu.py 2>&1 | tee "$OUT/gpu-check.log"
    fi
    echo "gpu-check: $((SECONDS - start)) s"
fi
if stage cuda; then  # every lab timed on the GPU, and what each page shows
    start=$SECONDS
    timeout 120 python3 -m posviz_tools.bench_device --out "$OUT" --tag cuda 2>&1 | tail -60
    echo "bench on the GPU: exit $?, $((SECONDS - start)) s"
fi
if stage cpu; then  # the same on this machine's CPU, with its own caps: the speed ratios
    start=$SECONDS
    CUDA_VISIBLE_DEVICES= timeout 120 python3 -m posviz_tools.bench_device --out "$OUT" --tag cpu 2>&1 | tail -8
    echo "bench on the CPU: exit $?, $((SECONDS - start)) s"
fi
if stage same; then  # the pages on the CPU with the GPU's caps: the very work of the GPU run, the same numbers
    start=$SECONDS
    CUDA_VISIBLE_DEVICES= timeout 150 python3 -m posviz_tools.bench_device --out "$OUT" --tag cpu-gpu-caps \
        --gpu-caps --skip-extrapolation 2>&1 | tail -14
    echo "pages on the CPU with the GPU's caps: exit $?, $((SECONDS - start)) s"
fi
