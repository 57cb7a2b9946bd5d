"""ASE calculator: forces and stress are derivatives, neighbour-list reuse, changing systems, NVE."""

import numpy as np
import pytest
import torch
from ase import Atoms, units
from ase.build import bulk, molecule
from ase.calculators.calculator import PropertyNotImplementedError
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
from ase.md.verlet import VelocityVerlet

from flashcart.integrations.ase import FlashCartCalculator
from flashcart.model.checkpoint import CheckpointError, save_checkpoint
from flashcart.model.potential import FlashCartPotential
from flashcart.testing import TINY_MODEL


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = FlashCartPotential(["H", "C", "O", "Cu"], avg_neighbors=6.0, use_triton=False, **TINY_MODEL)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def calc(model, **kw):
    return FlashCartCalculator(model, device="cpu", dtype="float64", **kw)


def test_forces_are_minus_energy_gradient(model):
    atoms = molecule("CH3CH2OH")
    atoms.calc = calc(model)
    forces = atoms.get_forces()
    h = 1e-5
    for i, k in [(0, 0), (3, 1), (8, 2)]:
        disp = atoms.copy()
        disp.calc = atoms.calc
        disp.positions[i, k] += h
        ep = disp.get_potential_energy()
        disp.positions[i, k] -= 2 * h
        em = disp.get_potential_energy()
        assert abs(-(ep - em) / (2 * h) - forces[i, k]) < 1e-6


def test_stress_is_finite_strain_derivative(model):
    atoms = bulk("Cu", "fcc", a=3.6) * (2, 1, 1)
    atoms.rattle(0.05, seed=0)
    atoms.calc = calc(model)
    stress = atoms.get_stress(voigt=False)
    h = 1e-5
    for a, b in [(0, 0), (1, 2)]:
        e = []
        for sign in (1, -1):
            strained = atoms.copy()
            eps = np.eye(3)
            eps[a, b] += sign * h / 2
            eps[b, a] += sign * h / 2
            strained.set_cell(atoms.cell.array @ eps, scale_atoms=True)
            strained.calc = atoms.calc
            e.append(strained.get_potential_energy())
        assert abs((e[0] - e[1]) / (2 * h) / atoms.get_volume() - stress[a, b]) < 1e-6
    assert atoms.get_potential_energy() == atoms.get_potential_energy(apply_constraint=False)


def test_skin_reuses_neighbour_list_with_identical_forces(model):
    atoms = molecule("CH3CH2OH")
    reuse, rebuild = calc(model, skin=1.0), calc(model)
    rng = np.random.default_rng(0)
    for _ in range(4):
        atoms.positions += rng.normal(scale=0.05, size=atoms.positions.shape)
        atoms.calc = reuse
        f_reuse = atoms.get_forces()
        atoms.calc = rebuild
        f_rebuild = atoms.get_forces()
        assert np.allclose(f_reuse, f_rebuild, atol=1e-12)
    assert reuse.neighbor_list_builds == 1 and rebuild.neighbor_list_builds == 4


def test_changes_of_count_species_cell_and_periodicity(model):
    c = calc(model, skin=0.5)
    systems = [molecule("CH4"), molecule("CH3CH2OH"), molecule("H2O"), bulk("Cu", "fcc", a=3.6)]
    slab = bulk("Cu", "fcc", a=3.6) * (2, 2, 1)
    slab.pbc = (True, True, False)
    systems.append(slab)
    for atoms in systems:
        atoms.calc = c
        e, f = atoms.get_potential_energy(), atoms.get_forces()
        fresh = atoms.copy()
        fresh.calc = calc(model)
        assert abs(fresh.get_potential_energy() - e) < 1e-10
        assert np.allclose(fresh.get_forces(), f, atol=1e-10)
    with pytest.raises(PropertyNotImplementedError):
        slab.get_stress()


def test_padding_and_offsets_options(model):
    atoms = molecule("CH3CH2OH")
    atoms.calc = calc(model)
    e, f = atoms.get_potential_energy(), atoms.get_forces()
    padded = calc(model, pad=True, pad_atom_multiple=32, pad_edge_multiple=64)
    atoms.calc = padded
    assert abs(atoms.get_potential_energy() - e) < 1e-10 and np.allclose(atoms.get_forces(), f, atol=1e-10)
    atoms.calc = calc(model, add_atomic_offsets=False)
    shifts = model.atomic_shifts[model.types_from_numbers(torch.tensor(atoms.numbers))].sum()
    assert abs(atoms.get_potential_energy() - (e - float(shifts))) < 1e-9


def test_padded_rebuilds_grow_capacities_with_headroom_only_when_a_list_does_not_fit(model):
    atoms = molecule("CH3CH2OH")
    # the Predictor's growing capacities (the dynamic step; the static step's are tested in
    # tests/simulation)
    c = calc(model, pad=True, skin=0.1, pad_atom_multiple=8, pad_edge_multiple=8, step="dynamic")
    capacities = c.engine.predictor.capacities
    atoms.calc = c
    atoms.get_forces()
    first_edges, first_cap = c.engine.n_edges, capacities.edges
    assert first_cap >= 1.1 * first_edges  # headroom on the first build
    # small moves beyond skin/2: new lists with about as many edges fit, nothing grows
    rng = np.random.default_rng(1)
    for _ in range(3):
        atoms.positions += rng.normal(scale=0.03, size=atoms.positions.shape)
        atoms.positions[0] += 0.2  # one atom moves more than skin/2: a new list
        atoms.get_forces()
        assert c.engine.n_edges <= first_cap and capacities.edges == first_cap
    assert c.neighbor_list_builds == 4
    # the same calculator on a compressed copper crystal: more edges than the capacity, which
    # must grow, with headroom
    atoms = bulk("Cu", "fcc", a=3.0, cubic=True)
    atoms.rattle(0.05, seed=0)
    atoms.calc = c
    f = atoms.get_forces()
    grown_edges = c.engine.n_edges
    assert grown_edges > first_cap, "the crystal must not fit (test set-up)"
    assert capacities.edges >= 1.1 * grown_edges
    fresh = atoms.copy()
    fresh.calc = calc(model)
    assert np.allclose(fresh.get_forces(), f, atol=1e-10)


def test_nve_energy_is_conserved(model):
    atoms = molecule("CH3CH2OH")
    atoms.calc = calc(model, skin=0.5)  # through neighbour-list reuse and rebuilds
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(1))
    dyn = VelocityVerlet(atoms, timestep=0.25 * units.fs)
    energies = []
    dyn.attach(lambda: energies.append(atoms.get_total_energy()), interval=1)
    dyn.run(100)
    drift = max(energies) - min(energies)
    assert atoms.calc.neighbor_list_builds > 1  # the list was rebuilt during the run
    # measured: 2.4e-6 eV peak-to-peak over 100 steps of 0.25 fs (5 neighbour lists); the bound
    # leaves a factor 40
    assert drift < 1e-4, drift


def test_bad_checkpoints_are_clear(tmp_path, model):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        FlashCartCalculator(tmp_path / "nothing", device="cpu")
    save_checkpoint(model, tmp_path / "ok")
    (tmp_path / "ok" / "model.pt").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="cannot be read"):
        FlashCartCalculator(tmp_path / "ok", device="cpu")
    with pytest.raises(ValueError, match="dtype must be"):
        FlashCartCalculator(model, device="cpu", dtype="half")


def test_unknown_element_is_named(model):
    atoms = Atoms("NaCl", positions=[[0, 0, 0], [2.5, 0, 0]])
    atoms.calc = calc(model)
    with pytest.raises(ValueError, match="not among the model's elements"):
        atoms.get_potential_energy()
