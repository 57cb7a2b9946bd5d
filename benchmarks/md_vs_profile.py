"""Profiler inference s/run next to ASE and OpenMM MD step times, same model and settings.

For one structure: runs ``flashcart-profile`` (inference phase, one batch of that one
structure), then velocity-Verlet MD through the ASE calculator and through the OpenMM force
(``--engines``) for each engine step mode (``--step-mode``: ``dynamic`` = the Predictor on the
``r_max + skin`` list, ``static`` = the static step compacting the list to ``r_max`` on the
device, ``graph`` = that step captured as one CUDA graph, ``auto`` = the engine's choice), and
prints the per-call times, their ratios, steps/s and where the per-step overhead goes: the
engine's evaluate call against the bare model call on the engine's buffers, neighbour-list
rebuilds, the adapters' own host work per step (ASE's velocity Verlet and OpenMM's PythonForce
with the FlashCart adapter around an evaluator that returns cached results, next to a bare
ASE calculator and a bare zero-force callback), and OpenMM's round trip with a zero-force
callback.

    python benchmarks/md_vs_profile.py --structure ethanol --device cpu --engines ase openmm --step-mode dynamic static
    python benchmarks/md_vs_profile.py --structure water --device gpu --r-max 6 --compile-mode reduce-overhead \\
        --step-mode dynamic graph --openmm-spin \\
        --model n_interactions=2 correlation=3 n_hidden_feats=20 l_max_hidden_feats=2 path_reduced_product=true
"""

from __future__ import annotations

import argparse
import io
import tempfile
import threading
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
from flashcart.simulation import Engine, Evaluation

ROOT = Path(__file__).resolve().parents[1]


def structure(name: str) -> Atoms:
    if name == "ethanol":
        return read(ROOT / "examples" / "ethanol" / "test.extxyz", index=0)
    if name == "diamond":
        return bulk("C", "diamond", a=3.567, cubic=True) * (5, 5, 5)
    if name == "diamond512":
        return bulk("C", "diamond", a=3.567, cubic=True) * (4, 4, 4)
    if name == "diamond216":
        return bulk("C", "diamond", a=3.567, cubic=True) * (3, 3, 3)
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


def make_engine(model, args, step: str) -> Engine:
    engine = Engine(model, device=args.device, compile_mode=args.compile_mode, skin=args.skin, step=step, headroom=args.headroom)
    if getattr(args, "compile_step", None) is not None:
        engine.compile_step = args.compile_step == "on"
    return engine


class TimedEvaluator:
    """An evaluator timing the ``evaluate`` calls of another (seconds summed; the rest of its
    attributes are the wrapped one's)."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def evaluate(self, *args, **kwargs):
        t = time.perf_counter()
        out = self.inner.evaluate(*args, **kwargs)
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return out

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)


class TimedCallback:
    """A PythonForce callback timing itself: seconds inside the callback, and between the end of
    one call and the start of the next (OpenMM's own part of a step)."""

    def __init__(self, callback):
        self.callback = callback
        self.inside = self.between = 0.0
        self.calls = 0
        self._last_exit = None

    def __call__(self, state):
        enter = time.perf_counter()
        if self._last_exit is not None:
            self.between += enter - self._last_exit
        out = self.callback(state)
        self._last_exit = time.perf_counter()
        self.inside += self._last_exit - enter
        self.calls += 1
        return out

    def reset(self) -> None:
        self.inside = self.between = 0.0
        self.calls, self._last_exit = 0, None


def ase_md(model, atoms: Atoms, args, step: str) -> tuple[float, Engine, dict]:
    """s/step of ASE velocity Verlet (after 5 untimed steps), the engine it ran on, and the
    seconds per step spent in the engine's ``evaluate`` during the run."""
    engine = make_engine(model, args, step)
    timed = TimedEvaluator(engine)
    atoms = atoms.copy()
    atoms.calc = FlashCartCalculator(timed)
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
    dyn = VelocityVerlet(atoms, timestep=0.5 * units.fs)
    dyn.run(5)  # warm-up (compilation, first neighbour list)
    _sync(args.device)
    timed.reset()
    t0 = time.perf_counter()
    dyn.run(args.steps)
    _sync(args.device)
    total = time.perf_counter() - t0
    return total / args.steps, engine, {"evaluate in the run": timed.seconds / max(timed.calls, 1)}


def _openmm_platform(args) -> str:
    """The platform of this run: ``args.openmm_platform`` is one name (a run) or a list (all runs)."""
    chosen = args.openmm_platform
    if isinstance(chosen, (list, tuple)):
        chosen = chosen[0] if chosen else None
    return chosen or ("CUDA" if args.device == "gpu" else "CPU")


def _openmm_context(atoms: Atoms, force, args, extra_properties: dict | None = None):
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
    platform = openmm.Platform.getPlatformByName(_openmm_platform(args))
    props = {**dict(kv.split("=", 1) for kv in args.openmm_property), **(extra_properties or {})}
    ctx = openmm.Context(system, integrator, platform, props)
    ctx.setPositions(atoms.positions / 10.0)
    ctx.setVelocitiesToTemperature(300 * unit.kelvin, 1)
    return ctx, integrator


def _openmm_steps(ctx, integrator, steps: int, device: str, before_timing=None) -> float:
    integrator.step(5)  # warm-up (compilation, first neighbour list)
    ctx.getState(getEnergy=True)
    _sync(device)
    if before_timing is not None:
        before_timing()
    t0 = time.perf_counter()
    integrator.step(steps)
    ctx.getState(getEnergy=True)  # waits for the last step
    _sync(device)
    return (time.perf_counter() - t0) / steps


def openmm_md(model, atoms: Atoms, args, step: str, extra_properties: dict | None = None) -> tuple[float, Engine, dict]:
    """s/step of OpenMM's VerletIntegrator with the FlashCart PythonForce (after 5 untimed
    steps), the engine, and where a step went (s per step): the engine's ``evaluate``, the rest
    of the FlashCart callback (positions, box, units), and OpenMM between two callbacks."""
    import openmm

    from flashcart.integrations.openmm import FlashCartForce

    assert atoms.pbc.all() or not atoms.pbc.any()
    engine = make_engine(model, args, step)
    timed = TimedEvaluator(engine)
    periodic = bool(atoms.pbc.all())
    callback = TimedCallback(FlashCartForce(timed, atoms.numbers, periodic))
    force = openmm.PythonForce(callback)  # what create_force builds, with the timing around it
    force.setUsesPeriodicBoundaryConditions(periodic)
    ctx, integrator = _openmm_context(atoms, force, args, extra_properties)

    def reset() -> None:
        timed.reset()
        callback.reset()

    step_s = _openmm_steps(ctx, integrator, args.steps, args.device, before_timing=reset)
    n = max(callback.calls, 1)
    parts = {
        "evaluate in the run": timed.seconds / n,
        "callback beyond evaluate": (callback.inside - timed.seconds) / n,
        "OpenMM between callbacks": callback.between / max(callback.calls - 1, 1),
        "callbacks per step": callback.calls / args.steps,
    }
    return step_s, engine, parts


def openmm_round_trip(atoms: Atoms, args, extra_properties: dict | None = None) -> float:
    """s/step of OpenMM with a PythonForce whose callback returns zero forces without reading
    anything: the cost of the round trip itself."""
    import openmm

    zeros = np.zeros((len(atoms), 3))

    def callback(state):
        return 0.0, zeros

    force = openmm.PythonForce(callback)
    force.setUsesPeriodicBoundaryConditions(bool(atoms.pbc.all()))
    ctx, integrator = _openmm_context(atoms, force, args, extra_properties)
    return _openmm_steps(ctx, integrator, max(args.steps, 200), args.device)


class CachedEvaluator:
    """An evaluator that returns the same results every call: the adapters' own cost."""

    neighbor_list_builds = 0

    def __init__(self, n_atoms: int):
        self.result = Evaluation(energy=0.0, forces=np.zeros((n_atoms, 3)))

    def evaluate(self, positions, numbers, cell=None, pbc=None, stress=False) -> Evaluation:
        return self.result


def adapter_overhead(atoms: Atoms, args) -> dict[str, float]:
    """Host seconds per MD step of the adapters around an evaluator that returns cached
    results (zero forces, atoms drifting at 300 K): ASE velocity Verlet with the FlashCart
    calculator and with a bare ASE calculator, OpenMM (on the CPU platform, so that only host
    work is measured) with the FlashCart callback and with a bare zero-force callback."""
    import openmm
    from ase.calculators.calculator import Calculator, all_changes

    from flashcart.integrations.openmm import FlashCartForce

    n = len(atoms)

    class Bare(Calculator):
        implemented_properties = ["energy", "forces"]

        def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
            super().calculate(atoms, properties, system_changes)
            self.results = {"energy": 0.0, "forces": np.zeros((n, 3))}

    def ase_step(calc) -> float:
        a = atoms.copy()
        MaxwellBoltzmannDistribution(a, temperature_K=300, rng=np.random.default_rng(0))
        a.calc = calc
        dyn = VelocityVerlet(a, timestep=0.5 * units.fs)
        dyn.run(5)
        t0 = time.perf_counter()
        dyn.run(args.steps)
        return (time.perf_counter() - t0) / args.steps

    host = argparse.Namespace(**{**vars(args), "device": "cpu", "openmm_platform": "CPU", "openmm_property": []})

    def openmm_step(callback) -> float:
        force = openmm.PythonForce(callback)
        force.setUsesPeriodicBoundaryConditions(bool(atoms.pbc.all()))
        ctx, integrator = _openmm_context(atoms, force, host)
        return _openmm_steps(ctx, integrator, args.steps, "cpu")

    zeros = np.zeros((n, 3))
    return {
        "ASE velocity Verlet + FlashCart calculator (cached)": ase_step(FlashCartCalculator(CachedEvaluator(n))),
        "ASE velocity Verlet + bare calculator": ase_step(Bare()),
        "OpenMM CPU step + FlashCart callback (cached)": openmm_step(
            FlashCartForce(CachedEvaluator(n), atoms.numbers, bool(atoms.pbc.all()))
        ),
        "OpenMM CPU step + bare zero-force callback": openmm_step(lambda state: (0.0, zeros)),
    }


def breakdown(engine: Engine, atoms: Atoms, args) -> dict[str, float]:
    """Per-call costs inside one step of the engine (s)."""
    from flashcart.data.neighbors import neighbor_list

    cell = atoms.cell.array if atoms.pbc.any() else None
    pos = atoms.positions.copy()
    engine.evaluate(pos, atoms.numbers, cell, atoms.pbc)  # builds (or reuses) the list at pos
    out = {"evaluate (reused list)": _per_call(lambda: engine.evaluate(pos, atoms.numbers, cell, atoms.pbc), args.repeat, args.device)}
    if engine.step == "dynamic":
        batch = engine._graph.batch
        out["model call on the engine's buffers"] = _per_call(lambda: engine.predictor(batch, forces=True), args.repeat, args.device)
    else:
        step = engine._static
        inputs, _ = step.model_inputs(step.unwrapped()[0], False)
        call = engine._static_model_call()
        out["model call on the engine's buffers"] = _per_call(lambda: call(*inputs), args.repeat, args.device)
        out["static step on the device (eager)"] = _per_call(lambda: step(False), args.repeat, args.device)
        if engine.step == "graph":
            captured = engine._captured[False]
            out["captured step (copy in, replay, copy out, sync)"] = _per_call(lambda: captured(pos), args.repeat, args.device)
            rebuild = engine._captured_rebuilds.get(False)
            if rebuild is not None:  # rebuilding at the list's own positions: the same list again
                out["captured step after a device rebuild"] = _per_call(lambda: captured(pos, rebuild=rebuild), args.repeat, args.device)
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
    parser.add_argument(
        "--step-mode", nargs="+", default=["auto"], choices=["auto", "dynamic", "static", "graph"], help="engine step modes to compare"
    )
    parser.add_argument("--openmm-spin", action="store_true", help="also run OpenMM with UseBlockingSync=false (CUDA platform)")
    parser.add_argument(
        "--openmm-platform", nargs="+", default=None, help="OpenMM platforms to run, each in turn (default: CUDA on --device gpu, else CPU)"
    )
    parser.add_argument("--openmm-property", nargs="*", default=[], help="OpenMM platform properties KEY=VALUE")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--skin", type=float, default=0.5)
    parser.add_argument(
        "--headroom", type=float, nargs="+", default=[0.1], help="engine capacity headrooms (static step: spare edge slots), each in turn"
    )
    parser.add_argument(
        "--compile-step",
        nargs="+",
        default=[None],
        choices=["on", "off"],
        help="the engine's compile_step (the static step's own work and device rebuilds compiled), each in turn; default: the engine's",
    )
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
    platforms = args.openmm_platform or [None]
    runs_of = [(mode, headroom, c) for headroom in args.headroom for c in args.compile_step for mode in args.step_mode]
    for mode, headroom, compile_step in runs_of:
        run_args = argparse.Namespace(**{**vars(args), "headroom": headroom, "compile_step": compile_step})
        engine, steps = None, {}
        runs = []
        for name in args.engines:
            for platform in platforms if name == "openmm" else [None]:
                runs.append((name, platform, None))
                if args.openmm_spin and name == "openmm" and (platform or _openmm_platform(args)) == "CUDA":
                    runs.append((name, platform, {"UseBlockingSync": "false"}))
        for name, platform, extra in runs:
            if name == "ase":
                step, engine, parts = ase_md(model, atoms, run_args, mode)
                label = "ASE MD step:"
            else:
                platform_args = argparse.Namespace(**{**vars(run_args), "openmm_platform": platform})
                step, engine, parts = openmm_md(model, atoms, platform_args, mode, extra)
                label = f"OpenMM MD step ({_openmm_platform(platform_args)}" + (", UseBlockingSync=false):" if extra else "):")
            steps[label] = step
            print(
                f"[step={mode} -> {engine.step}, headroom {headroom}, compile_step {engine.compile_step}] {label:<40} "
                f"{step:.6f} s/step = {1 / step:.0f} steps/s, {step / prof:.3f} x profiler "
                f"({args.steps} steps, {engine.neighbor_list_builds} neighbour lists, {engine.early_rebuilds} of them early, "
                f"{engine.stale_evaluations} stale evaluations, {engine.capacity_overflows} capacity overflows, "
                f"{engine.graph_captures} graph captures; the model saw {engine.model_edges} of {engine.n_edges} listed edges)"
            )
            print(
                "    in the run (s per step): "
                + ", ".join(f"{k} {v:.6f}" for k, v in parts.items())
                + f"; device rebuilds {engine.device_rebuilds}"
            )
            if engine.graph_capture_error:
                print(f"  the CUDA-graph capture failed and the step ran eager: {engine.graph_capture_error}")
        if engine is None:
            continue
        print(f"where a step goes (s per call), step={engine.step}:")
        parts = breakdown(engine, atoms, run_args)
        for what, t in parts.items():
            print(f"  {what:<50} {t:.6f}")
        evaluate = parts["evaluate (reused list)"]
        # the graph step replays the model inside its captured step; the bare model call (compiled
        # without CUDA graphs, launched eagerly) is not what it runs
        key = "captured step (copy in, replay, copy out, sync)" if engine.step == "graph" else "model call on the engine's buffers"
        bare, what = parts[key], ("captured step" if engine.step == "graph" else "model call")
        print(f"  {f'engine around the {what} (evaluate - {what})':<50} {evaluate - bare:.6f}")
        print(f"  {f'{what} - profiler s/run':<50} {bare - prof:.6f}")
        for label, step in steps.items():
            print(f"  {label[:-1] + ' - evaluate':<50} {step - evaluate:.6f}")
    if "openmm" in args.engines:
        for platform in platforms:
            platform_args = argparse.Namespace(**{**vars(args), "openmm_platform": platform})
            name = _openmm_platform(platform_args)
            print(f"  {f'OpenMM PythonForce round trip (zero forces, {name})':<50} {openmm_round_trip(atoms, platform_args):.6f}")
            if args.openmm_spin and name == "CUDA":
                spin = openmm_round_trip(atoms, platform_args, {"UseBlockingSync": "false"})
                print(f"  {'  the same with UseBlockingSync=false':<50} {spin:.6f}")
    print(f"Python threads at the end: {[t.name for t in threading.enumerate()]}")
    print("adapters' host work per MD step with an evaluator returning cached results (s):")
    for what, t in adapter_overhead(atoms, args).items():
        print(f"  {what:<50} {t:.6f}")


if __name__ == "__main__":
    main()
