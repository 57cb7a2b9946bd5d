#!/usr/bin/env bash
# GPU call: every gpu-marked test, one directory at a time (a crash names its directory), full
# logs in OUTDIR, while the energy-offset experiments train on the same GPU (VARIANTS="" skips).
# Usage on the GPU machine, from the repository root: bash benchmarks/gpu_tests.sh OUTDIR
out=${1:-/tmp/out}; mkdir -p "$out"
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 FLASHCART_CACHE_DIR=/tmp/fc
python3 -c "from flashcart.cartesian._backend import torch_ops; torch_ops()"
for v in ${VARIANTS-muon-all adamw-vectors no-ema energy-weight-10}; do
  CUDA_VISIBLE_DEVICES=${OFFSET_GPU:-1} timeout "${T_OFFSET:-520}" python3 benchmarks/energy_offset.py \
    benchmarks/configs/ethanol_reference.yaml --variants "$v" --out /tmp/offset device=gpu > "$out/offset_$v.log" 2>&1 &
done
for d in ${DIRS:-tests/cartesian tests/model tests/data tests/simulation tests/integrations tests/training tests/export top}; do
  paths=$d; [ "$d" = top ] && paths=$(ls tests/test_*.py)
  [ "$d" = top ] || [ -e "$d" ] || continue
  gpus=${TEST_GPUS:-0}; [ "$d" = tests/training ] && gpus=0,1  # the DDP test needs both
  echo "=== $d"
  CUDA_VISIBLE_DEVICES=$gpus timeout "${T_TESTS:-300}" python3 -m pytest -q -m gpu $paths -p no:cacheprovider \
    > "$out/pytest_$(basename $d).log" 2>&1
  echo "rc=$?"; grep -E "passed|failed|error|Fatal|Segmentation|^FAILED|^ERROR" "$out/pytest_$(basename $d).log" | head -12
done
wait
for v in ${VARIANTS-muon-all adamw-vectors no-ema energy-weight-10}; do echo "== $v"; tail -12 "$out/offset_$v.log"; done
