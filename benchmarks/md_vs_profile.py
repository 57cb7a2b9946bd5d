"""Profiler inference s/run next to ASE and OpenMM MD step times, same model and settings.

For one structure: runs ``flashcart-profile`` (inference phase, one batch of that one
structure), then velocity-Verlet MD through the ASE calculator and through the OpenMM force
(``--engines``), and prints the per-call times, their ratios, steps/s and where the per-step
overhead goes: the engine's evaluate call (positions up, displacement check, model, results
down) against the bare Predictor call, neighbour-list rebuilds, and OpenMM's PythonForce round
trip measured with a callback that returns zero forces.

    python benchmarks/md_vs_profile.py --structure ethanol --device cpu --engines ase openmm
    python benchmarks/md_vs_profile.py --structure water --device gpu --r-max 6 --compile-mode reduce-overhead \\
        --model n_interactions=2 correlation=3 n_hidden_feats=20 l_max_hidden_feats=2 path_reduced_product=true
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
from flashcart.profiling import profile, synchronize, time_per_call
from flashcart.simulation import Engine

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


def _sync(device: str) -> None:
    synchronize("cuda" if device == "gpu" else "cpu")


def _per_call(fn, n: int, device: str, warmup: int = 3) -> float:
    return time_per_call(fn, n, "cuda" if device == "gpu" else "cpu", warmup)


def ase_md(model, atoms: Atoms, args) -> tuple[float, Engine]:
    """s/step of ASE velocity Verlet (after 5 untimed steps) and the engine it ran on."""
    engine = Engine(model, device=args.device, compile_mode=args.compile_mode, skin=args.skin)
    atoms = atoms.copy()
    atoms.calc = FlashCartCalculator(engine)
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
    dyn = VelocityVerlet(atoms, timestep=0.5 * units.fs)
    dyn.run(5)  # warm-up (compilation, first neighbour list)
    _sync(args.device)
    t0 = time.perf_counter()
    dyn.run(args.steps)
    _sync(args.device)
    return (time.perf_counter() - t0) / args.steps, engine


def _openmm_context(atoms: Atoms, force, args):
    import openmm
    from openmm import unit

    system = openmm.System()
    for m in atoms.get_masses():
        system.addParticle(m)
    system.addForce(force)
    periodic = bool(atoms.pbc.all())
    if periodic:
        system.setDefaultPeriodicBoxVectors(*[openmm.Vec3(*row) for row in atoms.cell.array / 10.0])
    integrator = openmm.VerletIntegrator(0.5 * unit.femtosecond)
    platform = openmm.Platform.getPlatformByName(args.openmm_platform or ("CUDA" if args.device == "gpu" else "CPU"))
    props = dict(kv.split("=", 1) for kv in args.openmm_property)
    ctx = openmm.Context(system, integrator, platform, props)
    ctx.setPositions(atoms.positions / 10.0)
    ctx.setVelocitiesToTemperature(300 * unit.kelvin, 1)
    return ctx, integrator


def _openmm_steps(ctx, integrator, steps: int, device: str) -> float:
    integrator.step(5)  # warm-up (compilation, first neighbour list)
    ctx.getState(getEnergy=True)
    _sync(device)
    t0 = time.perf_counter()
    integrator.step(steps)
    ctx.getState(getEnergy=True)  # waits for the last step
    _sync(device)
    return (time.perf_counter() - t0) / steps


def openmm_md(model, atoms: Atoms, args) -> tuple[float, Engine]:
    """s/step of OpenMM's VerletIntegrator with the FlashCart PythonForce (after 5 untimed steps)."""
    from flashcart.integrations.openmm import create_force

    assert atoms.pbc.all() or not atoms.pbc.any()
    engine = Engine(model, device=args.device, compile_mode=args.compile_mode, skin=args.skin)
    ctx, integrator = _openmm_context(atoms, create_force(engine, atoms.numbers, periodic=bool(atoms.pbc.all())), args)
    return _openmm_steps(ctx, integrator, args.steps, args.device), engine


def openmm_round_trip(atoms: Atoms, args) -> float:
    """s/step of OpenMM with a PythonForce whose callback only reads the positions (and box)
    and returns zero forces: the cost of the round trip itself."""
    import openmm

    from flashcart.integrations.openmm import _nm

    zeros = np.zeros((len(atoms), 3))
    periodic = bool(atoms.pbc.all())

    def callback(state):
        _nm(state.getPositions(asNumpy=True))
        if periodic:
            _nm(state.getPeriodicBoxVectors(asNumpy=True))
        return 0.0, zeros

    force = openmm.PythonForce(callback)
    force.setUsesPeriodicBoundaryConditions(periodic)
    ctx, integrator = _openmm_context(atoms, force, args)
    return _openmm_steps(ctx, integrator, max(args.steps, 200), args.device)


def breakdown(engine: Engine, atoms: Atoms, args) -> dict[str, float]:
    """Per-call costs inside one step of the engine (s)."""
    from flashcart.data.neighbors import neighbor_list

    cell = atoms.cell.array if atoms.pbc.any() else None
    pos = atoms.positions.copy()
    engine.evaluate(pos, atoms.numbers, cell, atoms.pbc)  # builds (or reuses) the list at pos
    out = {"evaluate (reused list)": _per_call(lambda: engine.evaluate(pos, atoms.numbers, cell, atoms.pbc), args.repeat, args.device)}
    batch = engine._graph.batch
    out["predictor call on the engine's batch"] = _per_call(lambda: engine.predictor(batch, forces=True), args.repeat, args.device)
    dev_pos = torch.as_tensor(pos, dtype=engine.dtype, device=engine.device)
    cell_t = torch.as_tensor(atoms.cell.array, dtype=engine.dtype, device=engine.device)
    pbc_t = torch.as_tensor(atoms.pbc)
    out["neighbour list build"] = _per_call(lambda: neighbor_list(dev_pos, engine.r_max + engine.skin, cell_t, pbc_t), 5, args.device, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--structure", default="ethanol", choices=["ethanol", "water", "diamond", "diamond512"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode (default: eager)")
    parser.add_argument("--engines", nargs="+", default=["ase", "openmm"], choices=["ase", "openmm"])
    parser.add_argument("--openmm-platform", default=None, help="default: CUDA on --device gpu, else CPU")
    parser.add_argument("--openmm-property", nargs="*", default=[], help="OpenMM platform properties KEY=VALUE")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--skin", type=float, default=0.5)
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
    prof = result["inference"]
    for line in header:
        print(line)
    print(f"structure={args.structure} atoms={len(atoms)} device={args.device} compile={args.compile_mode or 'eager'} skin={args.skin}")
    print(f"profiler inference: {prof:.6f} s/run")
    engine, steps = None, {}
    for name in args.engines:
        step, engine = (ase_md if name == "ase" else openmm_md)(model, atoms, args)
        steps[name] = step
        label = "ASE MD step:   " if name == "ase" else "OpenMM MD step:"
        print(
            f"{label} {step:.6f} s/step = {1 / step:.0f} steps/s, {step / prof:.3f} x profiler "
            f"({args.steps} steps, {engine.neighbor_list_builds} neighbour lists, {engine.early_rebuilds} of them early, "
            f"{engine.stale_evaluations} stale evaluations)"
        )
    if engine is not None:
        print("where a step goes (s per call):")
        parts = breakdown(engine, atoms, args)
        for what, t in parts.items():
            print(f"  {what:<45} {t:.6f}")
        evaluate, bare = parts["evaluate (reused list)"], parts["predictor call on the engine's batch"]
        print(f"  {'engine around the model (evaluate - predictor)':<45} {evaluate - bare:.6f}")
        print(f"  {'padded predictor call - profiler s/run':<45} {bare - prof:.6f}")
        if "openmm" in steps:
            print(f"  {'OpenMM PythonForce round trip (zero forces)':<45} {openmm_round_trip(atoms, args):.6f}")
            print(f"  {'OpenMM step - evaluate':<45} {steps['openmm'] - evaluate:.6f}")
        if "ase" in steps:
            print(f"  {'ASE step - evaluate':<45} {steps['ase'] - evaluate:.6f}")


if __name__ == "__main__":
    main()
