"""Cold start: seconds from process start to the first inference call and the first training
step of a new model shape, with empty FlashCart and Triton caches, then with warm caches.

    python benchmarks/cold_start.py --device gpu --model n_interactions=2 correlation=3 n_hidden_feats=20 path_reduced_product=true
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time
t0 = time.perf_counter()
import torch
from ase.build import bulk
from flashcart.config import load_config
from flashcart.data import collate, structure_from_atoms
from flashcart.model.potential import FlashCartPotential
from flashcart.model.predictor import Predictor
torch.backends.cuda.matmul.allow_tf32 = False
device = sys.argv[1]
cfg = load_config(overrides=sys.argv[2:])
atoms = bulk("C", "diamond", a=3.567, cubic=True) * (5, 5, 5)
model = FlashCartPotential.from_config(cfg, ["C"]).to(device)
batch = collate([structure_from_atoms(atoms, cfg["r_max"], require_labels=False)], model.z_to_type.cpu()).to(device, torch.float32)
predictor = Predictor(model)
out = predictor(batch)
if device == "cuda": torch.cuda.synchronize()
t1 = time.perf_counter()
out = predictor(batch, create_graph=True)
loss = (out["forces"] ** 2).mean() + out["energy"].sum()
loss.backward()
if device == "cuda": torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"{t1 - t0:.2f} {t2 - t0:.2f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", nargs="*", default=[])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as triton_cache:
        env = {**os.environ, "FLASHCART_CACHE_DIR": cache, "TRITON_CACHE_DIR": triton_cache}
        for label in ("empty caches", "warm caches"):
            res = subprocess.run(
                [sys.executable, "-c", CHILD, args.device, "r_max=6.0", *args.model], env=env, capture_output=True, text=True
            )
            if res.returncode:
                print(res.stderr[-3000:])
                raise SystemExit(res.returncode)
            first_inference, first_step = res.stdout.split()[-2:]
            print(f"{label}: first inference {first_inference} s, first training step {first_step} s (from process start)")


if __name__ == "__main__":
    main()
