"""``flashcart-md``: molecular dynamics of a structure with a trained model, through ASE or OpenMM.

The configuration keys, their defaults and meanings are in the packaged ``configs/md.yaml``.
At the end the measured time per MD step is printed next to the profiler's s/run for one force
call on the same structure with the same model, device, dtype and compile mode (timed with
:mod:`flashcart.profiling`'s timer), so the overhead of the simulation loop is visible.
"""

from __future__ import annotations

import difflib
import math
import os
import time
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import yaml
from ase import units as ase_units

from ..config import ConfigError, parse_overrides
from ..config.loader import read_user_yaml
from ..nn.radial_table import MIN_INTERVALS
from ..units import angstrom_per_fs_to_nm_per_ps, angstrom_to_nm, nm_per_ps_to_angstrom_per_fs
from ..utils.io import atomic_write_text
from ..utils.progress import progress_bar
from .engine import COMPILE_MODES, Engine

__all__ = ["MD_SCHEMA", "DEFAULT_OPENMM_PLATFORM", "md_defaults", "load_md_config", "run_md"]

# OpenMM's platform when ``openmm_platform`` is null. FlashCart's force is the system's only
# force here, so OpenMM only integrates: on its Reference platform that costs about 0.04 ms a
# step on the host, and the PythonForce round trip about 1 us, against 0.37 ms between two
# callbacks on its CUDA platform, whose own CUDA context alternates with PyTorch's on the GPU
# (H200, 768-atom water, model on the GPU; 36 us a round trip on its CPU platform here).
DEFAULT_OPENMM_PLATFORM = "Reference"

# kind: "str", "int", "pos_int", "pos_float", "nonneg_float", "bool", or a tuple of allowed
# values; a trailing "?" (or None in the tuple) allows null.
MD_SCHEMA: dict[str, str | tuple] = {
    "model": "str?",
    "structure": "str?",
    "structure_index": "int",
    "output_path": "str",
    "engine": ("ase", "openmm"),
    "ensemble": ("nve", "nvt"),
    "timestep": "pos_float",
    "steps": "pos_int",
    "temperature": "nonneg_float",
    "friction": "nonneg_float",
    "initial_velocities": "bool",
    "seed": "int",
    "trajectory": "str?",
    "trajectory_interval": "pos_int",
    "log_interval": "pos_int",
    "device": ("cpu", "gpu", "auto"),
    "dtype": ("float32", "float64"),
    "compile_mode": (None, *COMPILE_MODES),
    "skin": "nonneg_float",
    "headroom": "nonneg_float",
    "radial_table": "nonneg_int",
    "engine_step": ("auto", "dynamic", "static", "graph"),
    "openmm_platform": "str?",
    "compare_profile": "bool",
    "profile_repeat": "pos_int",
}


def md_defaults() -> dict[str, Any]:
    """Every key with its packaged default (``configs/md.yaml``)."""
    return yaml.safe_load(resources.files("flashcart.configs").joinpath("md.yaml").read_text()) or {}


def _check(key: str, value: Any, where: str) -> Any:
    kind = MD_SCHEMA[key]
    label = f"{where}: key {key!r}"
    if isinstance(kind, tuple):
        if value not in kind:
            shown = ["~" if v is None else v for v in kind]
            raise ConfigError(f"{label} must be one of {shown}, got {value!r}")
        return value
    if value is None:
        if kind.endswith("?"):
            return None
        raise ConfigError(f"{label} must not be null")
    kind = kind.rstrip("?")
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{label} must be true or false, got {value!r}")
        return value
    if kind in ("int", "pos_int", "nonneg_int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{label} must be an integer, got {value!r}")
        if kind == "nonneg_int" and value < 0:
            raise ConfigError(f"{label} must be >= 0, got {value}")
        if kind == "pos_int" and value < 1:
            raise ConfigError(f"{label} must be >= 1, got {value}")
        return value
    if kind in ("pos_float", "nonneg_float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{label} must be a finite number, got {value!r}")
        if kind == "pos_float" and value <= 0 or kind == "nonneg_float" and value < 0:
            raise ConfigError(f"{label} must be {'> 0' if kind == 'pos_float' else '>= 0'}, got {value}")
        return float(value)
    if kind == "str":
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigError(f"{label} must be a string, got {value!r}")
        return str(value)
    raise AssertionError(f"unhandled kind {kind}")


def _merge(cfg: dict[str, Any], updates: dict[str, Any], where: str) -> None:
    for key, value in updates.items():
        if key not in MD_SCHEMA:
            close = difflib.get_close_matches(key, MD_SCHEMA, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint}")
        cfg[key] = _check(key, value, where)


def load_md_config(path: str | Path | None = None, overrides: Sequence[str] | dict[str, Any] = ()) -> dict[str, Any]:
    """The merged, validated MD configuration: packaged ``md.yaml`` < ``path`` < ``overrides``."""
    cfg: dict[str, Any] = {}
    _merge(cfg, md_defaults(), "packaged md.yaml")
    if path is not None:
        _merge(cfg, read_user_yaml(path), str(path))
    _merge(cfg, overrides if isinstance(overrides, dict) else parse_overrides(overrides), "command line")
    for key in ("model", "structure"):
        if cfg[key] is None:
            raise ConfigError(f"flashcart-md needs {key!r} in the configuration (currently null)")
    if cfg["trajectory"] is not None and Path(cfg["trajectory"]).suffix.lower() not in (".extxyz", ".xyz", ".dcd"):
        raise ConfigError(f"key 'trajectory' must end in .extxyz, .xyz or .dcd, got {cfg['trajectory']!r}")
    return cfg


# ------------------------------------------------------------------------------- trajectories


class _Trajectory:
    """Frames written to ``path + '.part'`` and moved onto ``path`` when the run completes."""

    def __init__(self, path: Path, atoms, timestep_fs: float, interval: int):
        self.path, self.part = path, path.with_name(path.name + ".part")
        self.dcd = path.suffix.lower() == ".dcd"
        self.handle = open(self.part, "wb" if self.dcd else "w")
        self.frames = 0
        if self.dcd:
            from openmm import app, unit

            self._writer = app.DCDFile(self.handle, _topology(atoms), timestep_fs * unit.femtosecond, 0, interval)

    def write(self, atoms) -> None:
        if self.dcd:
            from openmm import Vec3, unit

            box = [Vec3(*row) for row in atoms.cell.array] * unit.angstrom if atoms.pbc.all() else None
            self._writer.writeModel(atoms.positions * unit.angstrom, periodicBoxVectors=box)
        else:
            import ase.io

            ase.io.write(self.handle, atoms, format="extxyz")
        self.handle.flush()
        self.frames += 1

    def close(self, complete: bool) -> None:
        self.handle.close()
        if complete:
            os.replace(self.part, self.path)


def _topology(atoms):
    """An OpenMM topology with one residue per atom (for DCD files and OpenMM systems)."""
    from openmm import Vec3, app, unit

    top = app.Topology()
    chain = top.addChain()
    for sym in atoms.get_chemical_symbols():
        top.addAtom(sym, app.Element.getBySymbol(sym), top.addResidue("MOL", chain))
    if atoms.pbc.all():
        top.setPeriodicBoxVectors([Vec3(*row) for row in angstrom_to_nm(atoms.cell.array)] * unit.nanometer)
    return top


# ------------------------------------------------------------------------------- engines


class _AseMD:
    def __init__(self, atoms, engine: Engine, cfg: dict[str, Any]):
        from ase import units
        from ase.md.langevin import Langevin
        from ase.md.verlet import VelocityVerlet

        from ..integrations.ase import FlashCartCalculator

        self.atoms = atoms
        atoms.calc = FlashCartCalculator(engine)
        dt = cfg["timestep"] * units.fs
        if cfg["ensemble"] == "nve":
            self.dyn = VelocityVerlet(atoms, timestep=dt)
        else:
            friction = cfg["friction"] / (1000.0 * units.fs)  # 1/ps in ASE time units
            rng = np.random.default_rng(cfg["seed"])
            self.dyn = Langevin(atoms, timestep=dt, temperature_K=cfg["temperature"], friction=friction, rng=rng)

    def step(self, n: int) -> None:
        self.dyn.run(n)

    def snapshot(self):
        """The current structure (positions, cell, momenta) and (potential eV, kinetic eV)."""
        return self.atoms, self.atoms.get_potential_energy(), self.atoms.get_kinetic_energy()


class _OpenMMMD:
    def __init__(self, atoms, engine: Engine, cfg: dict[str, Any]):
        try:
            import openmm
            from openmm import unit
        except ImportError:
            raise ConfigError("engine: openmm needs OpenMM (pip install openmm)") from None
        from ..integrations.openmm import create_force

        if atoms.pbc.any() and not atoms.pbc.all():
            raise ConfigError(f"engine: openmm needs a structure periodic in all three directions or in none, got pbc={atoms.pbc.tolist()}")
        periodic = bool(atoms.pbc.all())
        if periodic:  # OpenMM's box convention: a along x, b in the xy plane (rotate to it)
            rcell, rotation = atoms.cell.standard_form()  # rcell = cell @ rotation.T
            velocities = atoms.get_velocities() @ rotation.T
            atoms = atoms.copy()
            atoms.set_cell(rcell, scale_atoms=True)
            atoms.set_velocities(velocities)
        self.atoms, self.unit = atoms, unit
        system = openmm.System()
        for m in atoms.get_masses():
            system.addParticle(m)
        system.addForce(create_force(engine, atoms.numbers, periodic=periodic))
        if periodic:
            try:
                system.setDefaultPeriodicBoxVectors(*[openmm.Vec3(*row) for row in angstrom_to_nm(atoms.cell.array)])
            except Exception as err:  # OpenMM needs a reduced triclinic box
                raise ConfigError(f"key 'structure': OpenMM cannot use the cell {atoms.cell.array.tolist()} ({err})") from None
        dt = cfg["timestep"] * unit.femtosecond
        if cfg["ensemble"] == "nve":
            self.integrator = openmm.VerletIntegrator(dt)
        else:
            self.integrator = openmm.LangevinMiddleIntegrator(cfg["temperature"] * unit.kelvin, cfg["friction"] / unit.picosecond, dt)
            self.integrator.setRandomNumberSeed(cfg["seed"] + 1)  # OpenMM's seed 0 means "random"
        name = cfg["openmm_platform"] or DEFAULT_OPENMM_PLATFORM
        try:
            platform = openmm.Platform.getPlatformByName(name)
        except Exception:
            names = [openmm.Platform.getPlatform(i).getName() for i in range(openmm.Platform.getNumPlatforms())]
            raise ConfigError(f"key 'openmm_platform': platform {name!r} is not available (available: {names})") from None
        self.context = openmm.Context(system, self.integrator, platform)
        self.context.setPositions(angstrom_to_nm(atoms.positions))
        self.context.setVelocities(angstrom_per_fs_to_nm_per_ps(atoms.get_velocities() * ase_units.fs))

    def step(self, n: int) -> None:
        self.integrator.step(n)

    def snapshot(self):
        from ..units import kj_per_mol_to_ev

        u = self.unit
        state = self.context.getState(getPositions=True, getVelocities=True, getEnergy=True)
        self.atoms.positions = state.getPositions(asNumpy=True).value_in_unit(u.angstrom)
        if self.atoms.pbc.all():
            self.atoms.set_cell(state.getPeriodicBoxVectors(asNumpy=True).value_in_unit(u.angstrom))
        velocities = state.getVelocities(asNumpy=True).value_in_unit(u.nanometer / u.picosecond)
        self.atoms.set_velocities(nm_per_ps_to_angstrom_per_fs(velocities) / ase_units.fs)
        potential = kj_per_mol_to_ev(state.getPotentialEnergy().value_in_unit(u.kilojoule_per_mole))
        kinetic = kj_per_mol_to_ev(state.getKineticEnergy().value_in_unit(u.kilojoule_per_mole))
        return self.atoms, potential, kinetic


# ------------------------------------------------------------------------------- the run


def _profiler_seconds_per_call(engine: Engine, atoms, cfg: dict[str, Any]) -> float:
    """s/run of one force call as ``flashcart-profile`` measures it: an unpadded Predictor with the
    same model, device, dtype and compile mode, on this structure's ``r_max`` neighbour list."""
    from ..data import collate, structure_from_atoms
    from ..model.predictor import Predictor
    from ..profiling import time_per_call

    model = engine.model
    predictor = Predictor(model, compile=cfg["compile_mode"] is not None, compile_mode=cfg["compile_mode"] or "default", pad=False)
    structure = structure_from_atoms(atoms, model.r_max, require_labels=False, device=engine.device)
    batch = collate([structure], model.z_to_type).to(engine.device, engine.dtype)
    return time_per_call(lambda: predictor(batch, forces=True), cfg["profile_repeat"], engine.device)


def run_md(cfg: dict[str, Any], progress: bool = True, out: Callable[[str], None] = print) -> dict[str, float]:
    """Run the MD a configuration from :func:`load_md_config` describes; returns the timings
    (``step``: s per MD step, ``profile``: the profiler's s/run when ``compare_profile``)."""
    import ase.io
    from ase import units
    from ase.md import velocitydistribution

    path = Path(cfg["structure"])
    if not path.is_file():
        raise ConfigError(f"key 'structure': file {path} does not exist")
    try:
        atoms = ase.io.read(path, index=cfg["structure_index"])
    except Exception as err:  # ASE raises many types for unreadable files
        raise ConfigError(f"key 'structure': cannot read {path} frame {cfg['structure_index']} ({type(err).__name__}: {err})") from None
    out_dir = Path(cfg["output_path"])
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "md_config.yaml", yaml.safe_dump(cfg, sort_keys=False))
    if str(cfg["model"]).endswith(".pt2"):  # an exported package: its own device, dtype and neighbour list
        from ..export.loader import md_evaluator

        engine = md_evaluator(cfg, out)
    else:
        if 0 < cfg["radial_table"] < MIN_INTERVALS:
            raise ConfigError(
                f"key 'radial_table' must be 0 (the radial MLPs) or at least {MIN_INTERVALS} intervals, got {cfg['radial_table']}"
            )
        try:
            engine = Engine(
                cfg["model"],
                device=cfg["device"],
                dtype=cfg["dtype"],
                skin=cfg["skin"],
                compile_mode=cfg["compile_mode"],
                step=cfg["engine_step"],
                headroom=cfg["headroom"],
                radial_table=cfg["radial_table"],
            )
        except ValueError as err:
            if not str(err).startswith("radial_table="):
                raise
            raise ConfigError(f"key 'radial_table': {err}") from None
    engine.check_numbers(atoms.numbers)
    if cfg["initial_velocities"]:
        rng = np.random.default_rng(cfg["seed"])
        thermalize = getattr(velocitydistribution, "thermalize_momenta", None)  # ASE >= 3.29
        if thermalize is not None:
            thermalize(atoms, cfg["temperature"], rng=rng)
        else:
            velocitydistribution.MaxwellBoltzmannDistribution(atoms, temperature_K=cfg["temperature"], rng=rng)
        velocitydistribution.Stationary(atoms)
    md = (_AseMD if cfg["engine"] == "ase" else _OpenMMMD)(atoms, engine, cfg)
    n_atoms = len(atoms)
    out(
        f"[md] engine={cfg['engine']} ensemble={cfg['ensemble']} atoms={n_atoms} steps={cfg['steps']} timestep={cfg['timestep']} fs "
        f"device={engine.device} dtype={cfg['dtype']} compile={cfg['compile_mode'] or 'eager'} skin={cfg['skin']} Å "
        f"engine_step={getattr(engine, 'step', 'exported')}"
    )
    trajectory = None
    if cfg["trajectory"] is not None:
        trajectory = _Trajectory(out_dir / cfg["trajectory"], md.atoms, cfg["timestep"], cfg["trajectory_interval"])
    log = open(out_dir / "md.log", "w", buffering=1)
    log.write(f"{'step':>10} {'time_ps':>10} {'epot_eV':>16} {'ekin_eV':>12} {'etot_eV':>16} {'T_K':>9}\n")

    def record(step: int) -> None:
        snap, potential, kinetic = md.snapshot()
        if step % cfg["log_interval"] == 0 or step == cfg["steps"]:
            temperature = 2.0 * kinetic / (3.0 * n_atoms * units.kB)
            t_ps = step * cfg["timestep"] / 1000.0
            log.write(f"{step:>10d} {t_ps:>10.4f} {potential:>16.6f} {kinetic:>12.6f} {potential + kinetic:>16.6f} {temperature:>9.2f}\n")
        if trajectory is not None and step % cfg["trajectory_interval"] == 0:
            trajectory.write(snap)

    steps, events = cfg["steps"], (cfg["log_interval"], cfg["trajectory_interval"])
    warmup = min(10, steps // 2)  # untimed: compilation and the first neighbour lists
    done, complete, t0 = 0, False, None
    try:
        record(0)
        with progress_bar(None, total=steps, desc="md", unit="step", disable=not progress) as bar:
            while done < steps:
                if t0 is None and done >= warmup:
                    if engine.device.type == "cuda":
                        torch.cuda.synchronize(engine.device)
                    t0, timed_from = time.perf_counter(), done
                nxt = min([steps] + [(done // k + 1) * k for k in events])
                if t0 is None:
                    nxt = min(nxt, warmup)
                md.step(nxt - done)
                done = nxt
                if any(done % k == 0 for k in events) or done == steps:
                    record(done)
                bar.update(nxt - bar.n)
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)
        step_time = (time.perf_counter() - t0) / max(1, steps - timed_from)
        complete = True
    finally:
        log.close()
        if trajectory is not None:
            trajectory.close(complete)
    results = {"step": step_time}
    out(
        f"[md] step time: {step_time:.6f} s/step ({1.0 / step_time:.1f} steps/s over {steps - timed_from} steps, "
        f"logging and trajectory included; {engine.neighbor_list_builds} neighbour lists)"
    )
    if trajectory is not None:
        out(f"[md] wrote {trajectory.frames} frames to {trajectory.path} and the log to {out_dir / 'md.log'}")
    if cfg["compare_profile"] and isinstance(engine, Engine):
        results["profile"] = _profiler_seconds_per_call(engine, atoms, cfg)
        out(
            f"[md] profiler force call on the same structure and settings: {results['profile']:.6f} s/run; "
            f"MD step / profiler = {step_time / results['profile']:.2f}"
        )
    return results
