"""GPU: the engine with CUDA graphs (reduce-overhead), the OpenMM CUDA platform, and the battery
on the GPU (run with ``python -m pytest -m gpu`` on a CUDA machine)."""

import numpy as np
import pytest
import torch

from flashcart.simulation import Engine
from flashcart.testing import SimulationBattery, reference_evaluation

from ..simulation.systems import tiny_water_model, water_box, water_cluster
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


def test_openmm_cuda_platform_matches_the_predictor(model):
    openmm = pytest.importorskip("openmm")
    names = [openmm.Platform.getPlatform(i).getName() for i in range(openmm.Platform.getNumPlatforms())]
    if "CUDA" not in names:
        pytest.skip(f"no OpenMM CUDA platform (have {names})")
    for atoms in (water_cluster(), water_box()):
        runner = OpenMMRunner(Engine(model, device="cuda", dtype="float64", skin=0.5), "CUDA")
        e, f, _ = runner(atoms, False)
        e_ref, f_ref, _ = reference_evaluation(model, atoms)
        assert abs(e * EV_PER_KJ_PER_MOL - e_ref) < 1e-6 * max(1.0, abs(e_ref))
        # the CUDA platform sums forces in single (mixed) precision
        assert np.abs(f * EV_PER_KJ_PER_MOL / ANGSTROM_PER_NM - f_ref).max() < 1e-5 * max(1.0, np.abs(f_ref).max())
    assert torch.cuda.is_available()
