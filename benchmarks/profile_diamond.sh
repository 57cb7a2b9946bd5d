#!/usr/bin/env bash
# flashcart-profile on the 1000-atom diamond cell (GPU), printing the operation tables.
# Usage: bash benchmarks/profile_diamond.sh [KEY=VALUE ...]   (needs ase and flashcart importable)
data=$(mktemp --suffix=.extxyz)
python3 - "$data" <<'PY'
import sys, numpy as np
from ase.io import write
from ase.build import bulk
a = bulk("C", "diamond", a=3.567, cubic=True) * (5, 5, 5)
a.info["REF_energy"] = 0.0; a.arrays["REF_forces"] = np.zeros((len(a), 3))
write(sys.argv[1], a, format="extxyz")
PY
cfg=$(mktemp --suffix=.yaml)
echo "train_path: $data" > "$cfg"
python3 -c "import torch; torch.backends.cuda.matmul.allow_tf32=False; from flashcart.cli.main import profile_main; import sys; sys.exit(profile_main(sys.argv[1:]))" \
  "$cfg" device=gpu r_max=6.0 profile_batch_size=1 profile_repeat=20 profile_warmup=3 --no-progress "$@"
