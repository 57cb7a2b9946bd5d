"""How an AOTInductor package's cost grows with the number of atoms (issue 12).

With ``--neighbours all-pairs`` the package builds its neighbour list from all pairs and every
periodic image it enumerates (``flashcart.export.neighbors.pair_list``), so its time grows as
``N^2 x images``; ``cells`` (the CPU default) bins the atoms
(``flashcart.export.neighbors.binned_pair_list``). For each search this exports one small
model once (the export tests' ``SMALL`` options, float32, a periodic water box, one image per
side) and runs the package on water boxes of growing size, each in a fresh process: seconds
per call (median of ``--repeat``) and the process's peak memory (CPU: its maximum resident set; CUDA: the caching allocator's peak).

    python benchmarks/pt2_scaling.py --device cpu --sides 2 3 4 5 --neighbours cells all-pairs
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUN = """
import json, resource, statistics, sys, time, torch
path, device, side, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
from tests.simulation.systems import water_box
atoms = water_box(n_side=side)
runner = torch._inductor.aoti_load_package(path)
dtype = torch.float32
args = (torch.tensor(atoms.positions, dtype=dtype, device=device), torch.tensor(atoms.numbers, device=device),
        torch.tensor(atoms.cell.array, dtype=dtype, device=device), torch.tensor(atoms.pbc, device=device))
runner(*args)
times = []
for _ in range(repeat):
    t0 = time.perf_counter()
    energy, forces = runner(*args)
    if device == "cuda":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"atoms": len(atoms), "cell": float(atoms.cell.array[0, 0]), "s_per_call": statistics.median(times), "peak_MiB": peak}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--sides", type=int, nargs="+", default=[2, 3, 4, 5], help="water_box n_side values")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--neighbours", nargs="+", default=["cells", "all-pairs"], choices=["cells", "all-pairs"])
    args = parser.parse_args()
    from flashcart.export import export_aoti
    from flashcart.model.potential import FlashCartPotential
    from tests.export.conftest import ELEMENTS, SMALL
    from tests.simulation.systems import water_box

    torch.manual_seed(0)
    model = FlashCartPotential(ELEMENTS, avg_neighbors=5.0, use_triton=False, **SMALL)
    for neighbours in args.neighbours:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "water.pt2"
            t0 = time.perf_counter()
            export_aoti(
                model, water_box(n_side=max(2, min(args.sides))), path, torch.float32, args.device, max_images=1, neighbours=neighbours
            )
            seconds = time.perf_counter() - t0
            print(f"\nneighbours {neighbours}: export and check {seconds:.0f} s, r_max {model.r_max} A, max_images 1", flush=True)
            print("| atoms | cell (A) | s/call | peak MiB |\n| ---: | ---: | ---: | ---: |", flush=True)
            for side in args.sides:
                cmd = [sys.executable, "-c", RUN, str(path), args.device, str(side), str(args.repeat), str(ROOT)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(f"| n_side {side} | failed: {proc.stderr.strip().splitlines()[-1][:200]} | | |", flush=True)
                    continue
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                print(f"| {row['atoms']} | {row['cell']:.2f} | {row['s_per_call']:.4f} | {row['peak_MiB']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
