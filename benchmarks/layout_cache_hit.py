"""Per-call cost of ``Predictor._layout``'s cache hit: the "same list tensors at the same versions"
check that every Predictor call makes (the simulation engine's steps included). CPU, one thread,
TINY_MODEL in float64 on a rattled 4-atom copper cell; the median of rounds of calls, in µs.

    python benchmarks/layout_cache_hit.py [--rounds 21] [--calls 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from ase.build import bulk

from flashcart.data import collate, structure_from_atoms
from flashcart.model.potential import FlashCartPotential
from flashcart.model.predictor import Predictor
from flashcart.testing import TINY_MODEL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = FlashCartPotential(["H", "C", "O", "Cu"], avg_neighbors=5.0, use_triton=False, **TINY_MODEL).double()
    atoms = bulk("Cu", "fcc", a=3.6) * (1, 1, 2)
    atoms.rattle(0.05, seed=1)
    batch = collate([structure_from_atoms(atoms, model.r_max, where="copper", require_labels=False)], model.z_to_type)
    batch = batch.to(dtype=torch.float64)
    predictor = Predictor(model)
    predictor(batch)
    n_edges = batch.receivers.shape[0]
    predictor._layout(batch, n_edges)
    rounds = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.calls):
            predictor._layout(batch, n_edges)
        rounds.append((time.perf_counter() - t0) / args.calls * 1e6)
    print(f"[time] _layout cache hit: median {statistics.median(rounds):.2f} us/call (min {min(rounds):.2f}, {torch.__version__})")


if __name__ == "__main__":
    main()
