#!/usr/bin/env bash
# Eager and reduce-overhead (CUDA graph) measurements on the GPU machine (RESULTS.md).
# Usage there: bash benchmarks/gpu_compiled.sh OUTDIR   (wheels in .whl/, see gpu_suite.sh)
out=${1:-/tmp/out}; mkdir -p "$out"
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 FLASHCART_CACHE_DIR=/tmp/fc
S="n_interactions=2 correlation=3 n_hidden_feats=20 l_max_hidden_feats=2 path_reduced_product=true"
L="n_interactions=3 correlation=3 n_hidden_feats=64 l_max_hidden_feats=2"
RO="profile_compile_predict=true profile_compile_mode=reduce-overhead"
run() { echo "=== $*"; timeout "${T:-300}" "$@" 2>&1 | grep -v "^\s*$" | grep -v "Data Pointer" | tee -a "$out/full.log" | tail -${N:-8}; }
[ -n "$TESTS" ] && N=15 T=400 run python3 -m pytest -q -x -m gpu $TESTS
T=150 N=3 run bash benchmarks/profile_diamond.sh $S profile_phase=inference profile_row_limit=40
for m in ${PROFILE_MODELS-S L}; do
  eval "opts=\$$m"
  for ph in inference training; do
    T=200 N=3 run bash benchmarks/profile_diamond.sh $opts profile_phase=$ph profile_row_limit=1 $RO
  done
done
for m in S L; do
  eval "opts=\$$m"
  for mode in "" reduce-overhead; do
    T=200 N=4 run python3 benchmarks/md_vs_profile.py --structure diamond --device gpu --r-max 6 --steps 100 ${mode:+--compile-mode $mode} --model $opts
  done
done
for mode in "" reduce-overhead; do
  T=200 N=4 run python3 benchmarks/md_vs_profile.py --structure water --device gpu --r-max 6 --steps 100 ${mode:+--compile-mode $mode} --model $S
done
