"""GPU: the engine with CUDA graphs (reduce-overhead), the OpenMM CUDA platform, and the battery
on the GPU (run with ``python -m pytest -m gpu`` on a CUDA machine)."""

import numpy as np
import pytest
import torch

from flashcart.simulation import Engine
from flashcart.simulation.engine import AUTO_GRAPH_STEP
from flashcart.testing import SimulationBattery, reference_evaluation

from ..simulation.systems import denser_by_one_move, tiny_water_model, water_box, water_cluster
from .runners import ANGSTROM_PER_NM, EV_PER_KJ_PER_MOL, OpenMMRunner, ase_runner

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model():
    return tiny_water_model()


@pytest.mark.parametrize("check", ["reference", "periodicity", "stress_is_strain_derivative", "padded_equals_unpadded"])
def test_battery_on_the_gpu(model, check):
    SimulationBattery(model, water_cluster(), water_box(), dict(device="cuda")).check(check, ase_runner)


def test_reduce_overhead_engine_reuses_detects_stale_lists_and_matches_eager(model):
    atoms = water_box(n_side=3)
    eager = Engine(model, device="cuda", dtype="float32", skin=0.5)
    graphs = Engine(model, device="cuda", dtype="float32", skin=0.5, compile_mode="reduce-overhead")
    rng = np.random.default_rng(0)
    pos = atoms.positions.copy()
    for step in range(8):
        pos = pos + rng.normal(scale=0.005, size=pos.shape)  # small steps: no early rebuild foreseen
        if step == 5:
            pos[0] += 0.4  # more than skin / 2: stale
        a = eager.evaluate(pos, atoms.numbers, atoms.cell.array, atoms.pbc)
        b = graphs.evaluate(pos, atoms.numbers, atoms.cell.array, atoms.pbc)
        assert abs(a.energy - b.energy) < 1e-4 * max(1.0, abs(a.energy))
        assert np.abs(a.forces - b.forces).max() < 1e-4 * max(1.0, np.abs(a.forces).max())
    assert graphs.neighbor_list_builds == 2 and graphs.stale_evaluations == 1 and graphs.early_rebuilds == 0
    moved = atoms.copy()
    moved.positions = pos
    e_ref, f_ref, _ = reference_evaluation(model, moved)
    assert np.abs(b.forces - f_ref).max() < 1e-4 * max(1.0, np.abs(f_ref).max())


@pytest.mark.parametrize("step", ["dynamic", "static", "graph"])
def test_openmm_cuda_platform_matches_the_predictor(model, step):
    openmm = pytest.importorskip("openmm")
    names = [openmm.Platform.getPlatform(i).getName() for i in range(openmm.Platform.getNumPlatforms())]
    if "CUDA" not in names:
        pytest.skip(f"no OpenMM CUDA platform (have {names})")
    for atoms in (water_cluster(), water_box()):
        runner = OpenMMRunner(Engine(model, device="cuda", dtype="float64", skin=0.5, step=step), "CUDA")
        e, f, _ = runner(atoms, False)
        e_ref, f_ref, _ = reference_evaluation(model, atoms)
        assert abs(e * EV_PER_KJ_PER_MOL - e_ref) < 1e-6 * max(1.0, abs(e_ref))
        # the CUDA platform sums forces in single (mixed) precision
        assert np.abs(f * EV_PER_KJ_PER_MOL / ANGSTROM_PER_NM - f_ref).max() < 1e-5 * max(1.0, np.abs(f_ref).max())
    assert torch.cuda.is_available()


def _md_frames(model, atoms, steps: int, skin: float, seed: int = 0):
    """Positions (wrapped into the cell after every step) of a hot velocity-Verlet run driven by
    the eager dynamic engine on the GPU (float64), with its energies and forces."""
    from ase import units as ase_units
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet

    from flashcart.integrations.ase import FlashCartCalculator

    atoms = atoms.copy()
    atoms.calc = FlashCartCalculator(Engine(model, device="cuda", dtype="float64", skin=skin, step="dynamic"))
    MaxwellBoltzmannDistribution(atoms, temperature_K=3000, rng=np.random.default_rng(seed))
    dyn = VelocityVerlet(atoms, timestep=1.0 * ase_units.fs)
    frames = []
    for _ in range(steps):
        dyn.run(1)
        atoms.wrap()
        frames.append((atoms.positions.copy(), atoms.get_potential_energy(), atoms.get_forces().copy()))
    return frames


@pytest.mark.parametrize("compile_mode", [None, "reduce-overhead"])
def test_graph_step_equals_the_eager_engine_along_md_with_rebuilds(model, compile_mode):
    """The captured static step (float32) against the eager engine, step after step of an MD run
    with list rebuilds and wrapped atoms; one capture for the whole run (the lists fit)."""
    atoms = water_box(n_side=3)
    frames = _md_frames(model, atoms, steps=40, skin=0.3)
    chosen = Engine(model, device="cuda", dtype="float32", skin=0.3, compile_mode=compile_mode, headroom=0.5)
    assert chosen.step == (("graph" if AUTO_GRAPH_STEP else "dynamic") if compile_mode else "static")
    pos, energy, _ = frames[0]
    assert abs(chosen.evaluate(pos, atoms.numbers, atoms.cell.array, atoms.pbc).energy - energy) < 1e-5 * max(1.0, abs(energy))
    assert chosen.graph_capture_error is None  # step "auto" did not fall back to the eager step
    graph = Engine(model, device="cuda", dtype="float32", skin=0.3, compile_mode=compile_mode, headroom=0.5, step="graph")
    for pos, energy, forces in frames:
        r = graph.evaluate(pos, atoms.numbers, atoms.cell.array, atoms.pbc)
        scale = max(1.0, np.abs(forces).max())
        assert abs(r.energy - energy) < 1e-5 * max(1.0, abs(energy))
        assert np.abs(r.forces - forces).max() < 1e-5 * scale
    assert graph.neighbor_list_builds >= 3 and graph.capacity_overflows == 0
    # the new lists were built on the device into the captured buffers: one capture of the step,
    # one of the device rebuild, whatever the number of rebuilds
    assert graph.device_rebuilds == graph.neighbor_list_builds - 1 and graph.graph_captures == 2


def test_graph_is_captured_again_only_when_a_capacity_grows(model):
    atoms = water_box(n_side=3, tilt=False)
    # no headroom, unit rounding: the edge capacity is exactly the pairs within r_max at the build
    engine = Engine(model, device="cuda", dtype="float64", skin=1.0, headroom=0.0, pad_edge_multiple=1, step="graph")
    first = engine.evaluate(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
    e_ref, f_ref, _ = reference_evaluation(model, atoms)
    assert abs(first.energy - e_ref) < 1e-9 and np.abs(first.forces - f_ref).max() < 1e-9
    rng = np.random.default_rng(1)
    for _ in range(3):  # tiny moves: the list is reused, the graph replayed
        moved = atoms.positions + rng.normal(scale=1e-7, size=atoms.positions.shape)  # no pair crosses r_max
        engine.evaluate(moved, atoms.numbers, atoms.cell.array, atoms.pbc)
    assert engine.graph_captures == 2 and engine.neighbor_list_builds == 1  # the step and its device rebuild
    # one atom 0.3 Å (< skin / 2) towards more neighbours: more pairs within r_max than edge slots
    count, denser = denser_by_one_move(atoms, model.r_max, 0.3)
    assert count > engine._static.capacities.edges
    r = engine.evaluate(denser.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
    e_ref, f_ref, _ = reference_evaluation(model, denser)
    assert abs(r.energy - e_ref) < 1e-9 and np.abs(r.forces - f_ref).max() < 1e-9
    assert engine.capacity_overflows == 1 and engine.model_edges == count
    assert engine.graph_captures == 4 and engine.neighbor_list_builds == 2  # both again, for the grown buffers


@pytest.mark.parametrize("step", ["static", "graph"])
@pytest.mark.parametrize("check", ["reference", "periodicity", "stress_is_strain_derivative"])
def test_battery_through_the_static_and_captured_steps(model, step, check):
    SimulationBattery(model, water_cluster(), water_box(), dict(device="cuda", step=step)).check(check, ase_runner)
