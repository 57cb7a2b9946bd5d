#!/usr/bin/env bash
# Everything measured on the GPU machine in one call (see benchmarks/RESULTS.md).
# Usage there: bash benchmarks/gpu_suite.sh OUTDIR
out=${1:-/tmp/out}; mkdir -p "$out"
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl  # ase + this package (pip wheel --no-deps . -w .whl)
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 FLASHCART_CACHE_DIR=/tmp/fc
S="n_interactions=2 correlation=3 n_hidden_feats=20 l_max_hidden_feats=2 path_reduced_product=true"
L="n_interactions=3 correlation=3 n_hidden_feats=64 l_max_hidden_feats=2"
run() { echo "=== $*"; timeout "${T:-300}" "$@" 2>&1 | grep -v "^\s*$" | tail -${N:-8}; }
N=12 T=400 run python3 -m pytest -q -x -m gpu tests
T=200 N=80 run bash benchmarks/profile_diamond.sh $S profile_phase=inference profile_row_limit=25
for m in S L; do
  eval "opts=\$$m"
  T=300 run python3 benchmarks/cold_start.py --device cuda --model $opts
  for mode in "" reduce-overhead; do
    T=300 run python3 benchmarks/md_vs_profile.py --structure diamond --device gpu --r-max 6 --steps 50 ${mode:+--compile-mode $mode} --model $opts
  done
  for cell in diamond diamond512; do
    echo "=== training $m $cell"
    python3 - "$cell" $opts <<'PY' 2>&1 | grep -E "^\[|^  " | grep -v profile
import sys, tempfile, numpy as np, torch
from ase.io import write
sys.argv = sys.argv
from benchmarks.md_vs_profile import structure
from flashcart.config import load_config
from flashcart.profiling import profile
torch.backends.cuda.matmul.allow_tf32 = False
a = structure(sys.argv[1]); a.info["REF_energy"] = 0.0; a.arrays["REF_forces"] = np.zeros((len(a), 3))
p = tempfile.mktemp(suffix=".extxyz"); write(p, a, format="extxyz")
cfg = load_config(overrides=[f"train_path={p}", "device=gpu", "r_max=6.0", "profile_phase=training", "profile_batch_size=1",
                             "profile_repeat=20", "profile_warmup=3", "profile_row_limit=1", *sys.argv[2:]])
profile(cfg, progress=False)
PY
  done
done
T=300 run python3 benchmarks/md_vs_profile.py --structure water --device gpu --r-max 6 --steps 50 --model $S
T=300 run python3 benchmarks/md_vs_profile.py --structure water --device gpu --r-max 6 --steps 50 --compile-mode reduce-overhead --model $S
