#!/usr/bin/env bash
# Cold start and the reduce-overhead (CUDA graph) measurements on the GPU machine.
out=${1:-/tmp/out}; mkdir -p "$out"
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 FLASHCART_CACHE_DIR=/tmp/fc
S="n_interactions=2 correlation=3 n_hidden_feats=20 l_max_hidden_feats=2 path_reduced_product=true"
L="n_interactions=3 correlation=3 n_hidden_feats=64 l_max_hidden_feats=2"
run() { echo "=== $*"; timeout "${T:-300}" "$@" 2>&1 | grep -v "^\s*$" | grep -v "Data Pointer" | tail -${N:-8}; }
T=100 N=6 run python3 benchmarks/md_vs_profile.py --structure diamond --device gpu --r-max 6 --steps 50 --compile-mode reduce-overhead --model $S
T=100 N=6 run python3 benchmarks/md_vs_profile.py --structure water --device gpu --r-max 6 --steps 50 --compile-mode reduce-overhead --model $S
T=100 N=6 run python3 benchmarks/md_vs_profile.py --structure diamond --device gpu --r-max 6 --steps 50 --compile-mode reduce-overhead --model $L
