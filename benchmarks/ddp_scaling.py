"""Data-parallel scaling: training epoch time on 1 and N devices, and the scaling efficiency.

Generates rattled and strained diamond frames (64 atoms each) labelled with ASE's EMT
calculator (energies, forces, stress), then runs ``flashcart-train`` once per device count
with the same per-device batch (``train_batch_size`` is per device, so N devices run 1/N of
the steps), and reads each epoch's time from ``metrics.csv``. Epoch 1 (Triton compilation,
autotuning) is left out: the time is the median of the later epochs. Speed-up is
``t(1) / t(N)``; efficiency is speed-up / N.

On the two-GPU machine (target: speed-up >= 1.8 on 2 GPUs):

    python benchmarks/ddp_scaling.py --device gpu --devices 1 2

A quick check on the CPU (two gloo processes, tiny model):

    python benchmarks/ddp_scaling.py --device cpu --devices 1 2 --frames 64 --epochs 2 n_hidden_feats=8 l_max_edge_attrs=2
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = "import sys; from flashcart.cli.main import train_main; sys.exit(train_main(sys.argv[1:]))"


def _label(atoms):
    from ase.calculators.emt import EMT

    atoms.calc = EMT()
    energy, forces, stress = atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress(voigt=False)
    atoms.calc = None
    atoms.info["REF_energy"] = energy
    atoms.info["REF_stress"] = stress.reshape(-1)
    atoms.arrays["REF_forces"] = forces
    return atoms


def make_frames(path: Path, n_frames: int, seed: int) -> None:
    """``n_frames`` diamond cells (2x2x2 conventional, 64 atoms): 2 % random strain, 0.08 Å
    rattle; EMT energy (eV), forces (eV/Å) and stress (eV/Å^3) as REF_* labels (labelled
    in parallel over the CPU cores)."""
    import multiprocessing as mp
    import os

    import numpy as np
    from ase.build import bulk
    from ase.io import write

    rng = np.random.default_rng(seed)
    base = bulk("C", "diamond", a=3.567, cubic=True) * (2, 2, 2)
    frames = []
    for _ in range(n_frames):
        atoms = base.copy()
        strain = np.eye(3) + 0.02 * rng.uniform(-1, 1, (3, 3))
        atoms.set_cell(atoms.cell.array @ strain, scale_atoms=True)
        atoms.positions += rng.normal(0.0, 0.08, atoms.positions.shape)
        frames.append(atoms)
    with mp.get_context("fork").Pool(min(os.cpu_count() or 1, 16)) as pool:
        frames = pool.map(_label, frames, chunksize=16)
    write(path, frames, format="extxyz")


def epoch_times(run_dir: Path) -> list[float]:
    with (run_dir / "metrics.csv").open() as fh:
        return [float(r["time"]) for r in csv.DictReader(fh)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2], help="device counts to compare (the first is the baseline)")
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="train_batch_size per device")
    parser.add_argument("--workdir", type=Path, default=None, help="keep data and runs here (default: a temporary directory)")
    parser.add_argument(
        "--threads",
        type=int,
        default=4,
        help="OMP_NUM_THREADS of every run (the 1-device baseline too; under DDP the trainer caps a GPU process at 4 "
        "threads, and on 2026-11-30 an uncapped baseline ran each step 20%% slower than a DDP rank); 0: unset",
    )
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE options for flashcart-train (model size etc.)")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory() if args.workdir is None else None
    work = Path(tmp.name) if tmp else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    data = work / "diamond_emt.extxyz"
    if not data.exists():
        t0 = time.perf_counter()
        make_frames(data, args.frames, seed=0)
        print(f"[data] {args.frames} diamond frames (64 atoms, EMT labels) in {time.perf_counter() - t0:.1f} s: {data}")
    common = [
        f"train_path={data}",
        f"device={args.device}",
        f"train_batch_size={args.batch}",
        "dynamic_batching=false",
        f"max_epochs={args.epochs}",
        "warmup_epochs=0",
        "decay_epochs=0",
        f"save_every={args.epochs}",
        "r_max=5.0",
        *args.overrides,
    ]
    results = {}
    for n in args.devices:
        out = work / f"run_{n}"
        strategy = ["strategy=ddp", f"devices={n}"] if n > 1 else []
        cmd = [sys.executable, "-c", TRAIN, str(data.with_suffix(".yaml")), f"output_path={out}", *common, *strategy, "--no-progress"]
        data.with_suffix(".yaml").write_text("{}\n")
        t0 = time.perf_counter()
        env = {**os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if res.returncode:
            print(res.stdout[-2000:], res.stderr[-4000:])
            raise SystemExit(f"flashcart-train with {n} device(s) failed")
        times = epoch_times(out)
        steady = times[1:] or times
        results[n] = statistics.median(steady)
        print(f"[run] {n} device(s): epoch times {', '.join(f'{t:.2f}' for t in times)} s (wall {time.perf_counter() - t0:.0f} s)")
    base_n = args.devices[0]
    print(f"\n| devices | steps/epoch per device | epoch time (s) | speed-up vs {base_n} | efficiency |")
    print("| --- | --- | --- | --- | --- |")
    for n, t in results.items():
        speedup = results[base_n] / t * base_n
        steps = -(-args.frames // (args.batch * n))
        print(f"| {n} | {steps} | {t:.2f} | {speedup / base_n:.2f}x | {speedup / n:.0%} |")
    print(f"\n({args.frames} frames x 64 atoms, train_batch_size={args.batch} per device, {' '.join(args.overrides) or 'default model'})")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
