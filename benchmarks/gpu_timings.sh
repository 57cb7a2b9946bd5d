#!/usr/bin/env bash
# GPU call: profiler s/run of the published architectures on the 1000-atom diamond cell (GPU 0,
# alone), while GPU 1 runs the integration GPU tests and the MD-vs-profiler comparisons.
# Usage on a two-GPU machine, from the repository root: bash benchmarks/gpu_timings.sh OUTDIR
out=${1:-/tmp/out}; mkdir -p "$out"
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 FLASHCART_CACHE_DIR=/tmp/fc
python3 -c "from flashcart.cartesian._backend import torch_ops; torch_ops()"
S="n_interactions=2 correlation=3 n_hidden_feats=20 l_max_hidden_feats=2 path_reduced_product=true"
L="n_interactions=3 correlation=3 n_hidden_feats=64 l_max_hidden_feats=2"
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 150 python3 -m pytest -q -x -m gpu tests/integrations --tb=short > "$out/pytest_integrations.log" 2>&1
  for st in water diamond; do
    timeout 150 python3 benchmarks/md_vs_profile.py --structure $st --device gpu --r-max 6 --steps 200 --repeat 20 \
      --compile-mode reduce-overhead --model $S > "$out/md_${st}_ro.log" 2>&1
  done
  timeout 100 python3 benchmarks/md_vs_profile.py --structure water --device gpu --r-max 6 --steps 100 --repeat 20 \
    --model $S > "$out/md_water_eager.log" 2>&1
) &
for m in S L; do
  eval "opts=\$$m"
  for mode in eager reduce-overhead; do
    extra="profile_phase=both profile_row_limit=1"
    [ $mode = reduce-overhead ] && extra="$extra profile_compile_predict=true profile_compile_mode=reduce-overhead"
    echo "=== $m $mode" | tee -a "$out/profile.log"
    CUDA_VISIBLE_DEVICES=0 timeout 125 bash benchmarks/profile_diamond.sh $opts $extra 2>&1 | grep -E "^\[|parameters|s/run" \
      | tee -a "$out/profile.log"
  done
done
wait
tail -5 "$out/pytest_integrations.log"; for f in "$out"/md_*.log; do echo "== $f"; grep -viE "warn" "$f" | tail -14; done
