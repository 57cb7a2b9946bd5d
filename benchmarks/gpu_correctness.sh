#!/usr/bin/env bash
# GPU call 1: kernel and model correctness on CUDA (pytest -m gpu) while the energy-offset
# experiments (benchmarks/energy_offset.py, one variant per process) train on the same GPU.
# Usage on the GPU machine, from the repository root: bash benchmarks/gpu_correctness.sh OUTDIR
out=${1:-/tmp/out}; mkdir -p "$out"
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 FLASHCART_CACHE_DIR=/tmp/fc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# warm the generated sources once, so the parallel runs below do not all generate them
python3 -c "from flashcart.cartesian._backend import torch_ops; torch_ops()"
for v in ${VARIANTS:-muon-all adamw-vectors no-ema energy-weight-10}; do
  timeout "${T_OFFSET:-540}" python3 benchmarks/energy_offset.py benchmarks/configs/ethanol_reference.yaml --variants "$v" \
    --out "/tmp/offset" device=gpu > "$out/offset_$v.log" 2>&1 &
done
timeout "${T_TESTS:-420}" python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -25 | tee "$out/pytest_gpu.log"
wait
for v in ${VARIANTS:-muon-all adamw-vectors no-ema energy-weight-10}; do echo "== $v"; tail -12 "$out/offset_$v.log"; done
