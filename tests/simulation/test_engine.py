"""The simulation engine: the shared physics battery, neighbour-list reuse, wrapping, units."""

import numpy as np
import pytest
import torch
from ase import units as ase_units

from flashcart import units
from flashcart.simulation import Engine, Evaluator, make_evaluator
from flashcart.testing import Runner, SimulationBattery, reference_evaluation

from .systems import tiny_water_model, water_box, water_cluster


def engine_runner(model, **options) -> Runner:
    engine = Engine(model, **options)

    def run(atoms, stress):
        r = engine.evaluate(atoms.positions, atoms.numbers, atoms.cell.array if atoms.pbc.any() else None, atoms.pbc, stress=stress)
        return r.energy, r.forces, r.stress

    return Runner("engine", run)


@pytest.fixture(scope="module")
def model():
    return tiny_water_model()


@pytest.fixture(scope="module")
def battery(model):
    return SimulationBattery(model, water_cluster(), water_box())


# compiled == eager runs through the engine in every adapter's battery (tests/integrations)
@pytest.mark.parametrize("check", [c for c in SimulationBattery.CHECKS if c != "compiled_equals_eager"])
def test_engine_passes_the_battery(battery, check):
    battery.check(check, engine_runner)


def test_the_battery_catches_wrong_units_and_wrong_forces(battery):
    def scaled(model, **options):
        r = engine_runner(model, **options)
        return Runner("kJ/mol mislabelled as eV", lambda a, s: (units.ev_to_kj_per_mol(r.run(a, s)[0]), r.run(a, s)[1], None))

    with pytest.raises(AssertionError, match="energy"):
        battery.check("reference", scaled)

    def halved(model, **options):
        r = engine_runner(model, **options)
        return Runner("half forces", lambda a, s: (r.run(a, s)[0], 0.5 * r.run(a, s)[1], None), computes_stress=False)

    with pytest.raises(AssertionError, match="force"):
        battery.check("forces_are_gradients", halved)


def test_units_agree_with_ase():
    # ASE's default constants are CODATA 2014 (FlashCart's are the exact SI 2019 values)
    assert units.KJ_PER_MOL_PER_EV == pytest.approx(ase_units.eV / (ase_units.kJ / ase_units.mol), rel=1e-7)
    assert units.KJ_PER_MOL_NM_PER_EV_ANGSTROM == pytest.approx(964.8533212331, rel=1e-12)
    x = np.array([1.5, -2.0])
    assert np.allclose(units.kj_per_mol_nm_to_ev_per_angstrom(units.ev_per_angstrom_to_kj_per_mol_nm(x)), x)
    assert units.nm_to_angstrom(0.1) == pytest.approx(1.0) and units.angstrom_to_nm(10.0) == pytest.approx(1.0)
    assert units.angstrom_per_fs_to_nm_per_ps(1.0) == pytest.approx(100.0) and units.nm_per_ps_to_angstrom_per_fs(100.0) == pytest.approx(
        1.0
    )


def test_stale_list_is_detected_and_the_step_recomputed(model):
    atoms = water_cluster()
    engine = Engine(model, device="cpu", dtype="float64", skin=0.4)
    engine.evaluate(atoms.positions, atoms.numbers)
    small = atoms.positions + 0.01
    engine.evaluate(small, atoms.numbers)
    assert engine.neighbor_list_builds == 1 and engine.stale_evaluations == 0
    moved = small.copy()
    moved[4] += [0.25, 0.0, 0.0]  # 0.25 Å > skin / 2 from where the list was built, unforeseeably
    r = engine.evaluate(moved, atoms.numbers)
    assert engine.neighbor_list_builds == 2 and engine.stale_evaluations == 1 and engine.early_rebuilds == 0
    fresh = atoms.copy()
    fresh.positions = moved
    e_ref, f_ref, _ = reference_evaluation(model, fresh)
    assert abs(r.energy - e_ref) < 1e-9 and np.abs(r.forces - f_ref).max() < 1e-9


def test_steady_motion_rebuilds_one_step_early_instead_of_evaluating_twice(model):
    atoms = water_cluster()
    engine = Engine(model, device="cpu", dtype="float64", skin=0.4)
    for step in range(8):  # every atom moves 0.03 Å per step: 0.18 Å after 6 steps, 0.21 after 7
        pos = atoms.positions + [0.03 * step, 0.0, 0.0]
        r = engine.evaluate(pos, atoms.numbers)
        fresh = atoms.copy()
        fresh.positions = pos
        assert np.abs(r.forces - reference_evaluation(model, fresh)[1]).max() < 1e-9
    # after 0.15 and 0.18 Å the next step (0.21 > skin / 2) is foreseen: rebuilt before step 7
    assert engine.early_rebuilds == 1 and engine.stale_evaluations == 0 and engine.neighbor_list_builds == 2


def test_wrapped_atoms_reuse_the_list(model):
    atoms = water_box()
    engine = Engine(model, device="cpu", dtype="float64", skin=0.5)
    first = engine.evaluate(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
    wrapped = atoms.copy()
    wrapped.positions[:5] += 0.02
    wrapped.positions[3] += wrapped.cell.array[0]  # as a simulation wrapping atoms into the cell would
    wrapped.positions[7] -= wrapped.cell.array[2] + wrapped.cell.array[1]
    r = engine.evaluate(wrapped.positions, wrapped.numbers, wrapped.cell.array, wrapped.pbc)
    assert engine.neighbor_list_builds == 1
    e_ref, f_ref, _ = reference_evaluation(model, wrapped)
    assert abs(r.energy - e_ref) < 1e-9 and np.abs(r.forces - f_ref).max() < 1e-9
    assert abs(r.energy - first.energy) > 1e-12  # the small moves did change the energy


def test_offsets_unknown_elements_and_bad_options(model):
    atoms = water_cluster()
    with_offsets = Engine(model, device="cpu", dtype="float64").evaluate(atoms.positions, atoms.numbers)
    without = Engine(model, device="cpu", dtype="float64", add_atomic_offsets=False).evaluate(atoms.positions, atoms.numbers)
    assert with_offsets.energy - without.energy == pytest.approx(3 * (2 * -13.6 - 432.1), abs=1e-9)
    engine = Engine(model, device="cpu")
    with pytest.raises(ValueError, match=r"elements \['Na'\] are not among the model's elements \['H', 'O'\]"):
        engine.evaluate(np.zeros((2, 3)) + [[0, 0, 0], [2, 0, 0]], [1, 11])
    with pytest.raises(ValueError, match="stress needs"):
        engine.evaluate(atoms.positions, atoms.numbers, stress=True)
    with pytest.raises(ValueError, match="dtype must be"):
        Engine(model, dtype="half")
    with pytest.raises(ValueError, match="skin must be"):
        Engine(model, skin=-1)
    with pytest.raises(ValueError, match="compile_mode must be"):
        Engine(model, compile_mode="fast")
    with pytest.raises(ValueError, match="radial_table must be 0"):
        Engine(model, radial_table=8)
    tabulated = Engine(model, device="cpu", dtype="float64", radial_table=4096)
    assert tabulated.model.interactions[0].radial_table is not None and model.interactions[0].radial_table is None
    r = tabulated.evaluate(atoms.positions, atoms.numbers)
    assert r.energy == pytest.approx(with_offsets.energy, rel=1e-9) and np.abs(r.forces - with_offsets.forces).max() < 1e-7
    assert isinstance(engine, Evaluator) and make_evaluator(engine) is engine
    with pytest.raises(ValueError, match=r"options \['skin'\] configure a new engine"):
        make_evaluator(engine, skin=1.0, device="auto")


def test_the_callers_model_is_not_modified(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    Engine(model, device="cpu", dtype="float32").evaluate(water_cluster().positions, water_cluster().numbers)
    assert next(model.parameters()).dtype == torch.float64
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_engine_pickles_as_model_and_options(model):
    import pickle

    atoms = water_box()
    engine = Engine(model, device="cpu", dtype="float64", skin=0.3, add_atomic_offsets=False)
    a = engine.evaluate(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
    copy = pickle.loads(pickle.dumps(engine))
    assert copy.skin == 0.3 and copy.add_atomic_offsets is False and copy.neighbor_list_builds == 0
    b = copy.evaluate(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
    assert a.energy == pytest.approx(b.energy, abs=1e-12) and np.array_equal(a.forces, b.forces)
