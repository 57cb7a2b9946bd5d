"""Profiler inference s/run next to ASE velocity-Verlet step time, same model and settings.

For one structure: runs ``flashcart-profile`` (inference phase, one batch of that one
structure) and then MD with :class:`FlashCartCalculator` for ``--steps`` steps, and prints
both per-call times and their ratio.

    python benchmarks/md_vs_profile.py --structure ethanol --device cpu
    python benchmarks/md_vs_profile.py --structure diamond --device gpu --compile-mode reduce-overhead \\
        --model n_interactions=2 correlation=3 n_hidden_feats=20 path_reduced_product=true
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import torch
from ase import Atoms, units
from ase.build import bulk
from ase.io import read, write
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
from ase.md.verlet import VelocityVerlet

from flashcart.config import load_config
from flashcart.data import read_structures
from flashcart.integrations.ase import FlashCartCalculator
from flashcart.model.potential import FlashCartPotential
from flashcart.model.prefit import prefit
from flashcart.profiling import profile

ROOT = Path(__file__).resolve().parents[1]


def structure(name: str) -> Atoms:
    if name == "ethanol":
        return read(ROOT / "examples" / "ethanol" / "test.extxyz", index=0)
    if name == "diamond":
        return bulk("C", "diamond", a=3.567, cubic=True) * (5, 5, 5)
    if name == "diamond512":
        return bulk("C", "diamond", a=3.567, cubic=True) * (4, 4, 4)
    if name == "water":  # 256 H2O in a 19.706 Å cube (about 1 g/cm^3), random orientations on a grid
        rng = np.random.default_rng(0)
        box, n_side = 19.706, 7
        sites = np.stack(np.meshgrid(*[np.arange(n_side)] * 3, indexing="ij"), -1).reshape(-1, 3)[:256]
        mol = np.array([[0.0, 0.0, 0.0], [0.9572, 0.0, 0.0], [-0.2400, 0.9266, 0.0]])
        pos = []
        for s in sites:
            q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
            pos.append((s + 0.5) * box / n_side + mol @ q.T)
        return Atoms("OHH" * 256, positions=np.concatenate(pos), cell=[box] * 3, pbc=True)
    raise ValueError(f"unknown structure {name!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--structure", default="ethanol", choices=["ethanol", "water", "diamond", "diamond512"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode (default: eager)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--r-max", type=float, default=5.0)
    parser.add_argument("--model", nargs="*", default=[], help="KEY=VALUE model options")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    atoms = structure(args.structure)
    atoms.info["REF_energy"] = 0.0
    atoms.arrays["REF_forces"] = np.zeros((len(atoms), 3))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "one.extxyz"
        write(path, atoms, format="extxyz")
        overrides = [
            f"train_path={path}",
            f"device={args.device}",
            f"r_max={args.r_max}",
            "profile_phase=inference",
            "profile_batch_size=1",
            f"profile_repeat={args.repeat}",
            "profile_warmup=3",
            f"profile_compile_predict={args.compile_mode is not None}",
            "profile_row_limit=1",
            *args.model,
        ]
        if args.compile_mode:
            overrides.append(f"profile_compile_mode={args.compile_mode}")
        cfg = load_config(overrides=overrides)
        buf = io.StringIO()
        with redirect_stdout(buf):
            result = profile(cfg, progress=False)
        header = [line for line in buf.getvalue().splitlines() if line.startswith(("[model]", "[inference]", "[timer]"))]
        structures = read_structures(path, cfg["r_max"], "REF_energy", "REF_forces", "REF_stress", progress=False)
    elements = sorted(set(atoms.get_chemical_symbols()))
    model = FlashCartPotential.from_config(cfg, elements)
    prefit(model, structures)
    calc = FlashCartCalculator(model, device=args.device, compile_mode=args.compile_mode, skin=0.5)
    atoms.calc = calc
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
    dyn = VelocityVerlet(atoms, timestep=0.5 * units.fs)
    dyn.run(5)  # warm-up (compilation, first neighbour list)
    if args.device == "gpu":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    dyn.run(args.steps)
    if args.device == "gpu":
        torch.cuda.synchronize()
    md = (time.perf_counter() - t0) / args.steps
    for line in header:
        print(line)
    print(f"structure={args.structure} atoms={len(atoms)} device={args.device} compile={args.compile_mode or 'eager'}")
    print(f"profiler inference: {result['inference']:.6f} s/run")
    print(f"ASE MD step:        {md:.6f} s/step ({args.steps} steps, {calc.neighbor_list_builds} neighbour lists)")
    print(f"overhead ratio:     {md / result['inference']:.3f}")


if __name__ == "__main__":
    main()
