"""The ASE calculator's own per-step work: exact change detection and the reused snapshot."""

import numpy as np
import pytest

from flashcart.integrations.ase import FlashCartCalculator
from flashcart.simulation import Engine
from flashcart.testing import reference_evaluation

from ..simulation.systems import tiny_water_model, water_box


@pytest.fixture(scope="module")
def model():
    return tiny_water_model()


def test_every_change_the_model_sees_is_detected_and_nothing_else(model):
    atoms = water_box()
    calc = FlashCartCalculator(Engine(model, device="cpu", dtype="float64", skin=0.5))
    atoms.calc = calc
    atoms.get_forces()
    assert calc.check_state(atoms) == []
    atoms.set_initial_charges(np.ones(len(atoms)))  # not a model input
    assert calc.check_state(atoms) == []
    atoms.positions[3, 1] = np.nextafter(atoms.positions[3, 1], np.inf)  # below ASE's isclose tolerance
    assert calc.check_state(atoms) == ["positions"]
    for change, edit in [
        ("numbers", lambda a: a.numbers.__setitem__(0, 1)),
        ("cell", lambda a: a.set_cell(a.cell.array * 1.01, scale_atoms=False)),
        ("pbc", lambda a: a.set_pbc([True, True, False])),
    ]:
        changed = atoms.copy()
        edit(changed)
        assert change in calc.check_state(changed)
    # forces follow every step of in-place moves (the snapshot is a copy, not a view)
    rng = np.random.default_rng(0)
    for _ in range(3):
        atoms.positions += rng.normal(scale=0.01, size=atoms.positions.shape)
        f = atoms.get_forces()
        assert np.abs(f - reference_evaluation(model, atoms)[1]).max() < 1e-10
        assert np.array_equal(calc.atoms.positions, atoms.positions) and calc.atoms.positions is not atoms.positions


def test_snapshot_follows_a_changed_system(model):
    atoms = water_box()
    calc = FlashCartCalculator(Engine(model, device="cpu", dtype="float64", skin=0.5))
    atoms.calc = calc
    atoms.get_potential_energy()
    first = calc.atoms
    smaller = atoms[:-3]  # one molecule fewer
    smaller.calc = calc
    e = smaller.get_potential_energy()
    assert len(calc.atoms) == len(smaller) and calc.atoms is not first
    assert e == pytest.approx(reference_evaluation(model, smaller)[0], abs=1e-10)
    smaller.set_momenta(np.ones((len(smaller), 3)))
    smaller.positions[0] += 0.01
    smaller.get_potential_energy()
    assert np.array_equal(calc.atoms.get_momenta(), smaller.get_momenta())  # arrays follow in place


def test_engine_options_reach_the_engine_and_clash_with_a_given_evaluator(model):
    calc = FlashCartCalculator(model, device="cpu", dtype="float64", skin=0.3, headroom=0.02, step="static")
    engine = calc.engine
    assert (engine.skin, engine.headroom, engine.step) == (0.3, 0.02, "static")
    with pytest.raises(ValueError, match=r"options \['headroom'\] configure a new engine"):
        FlashCartCalculator(Engine(model, device="cpu"), headroom=0.3)
