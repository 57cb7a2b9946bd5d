"""Exported files pass the shared physics battery (flashcart.testing.SimulationBattery).

Checks that apply to a file: reference values, forces as energy gradients, periodicity. The
engine variants (padding, torch.compile) and stress do not exist in an exported file.
"""

from __future__ import annotations

import pytest
import torch

from flashcart.export import build_torchscript, load_exported
from flashcart.testing import Runner, SimulationBattery
from flashcart.units import ANGSTROM_PER_NM, KJ_PER_MOL_PER_EV

from .conftest import crystal, ethanol

CHECKS = ("reference", "forces_are_gradients", "periodicity")


def torchscript_factory(model, dtype="float64", **engine_options):
    """A Runner in TorchForce's units (nm, kJ/mol): one file per structure's atoms, exported on first use."""
    assert dtype == "float64"
    modules = {}

    def run(atoms, stress):
        key = (tuple(atoms.numbers), bool(atoms.pbc.any()))
        if key not in modules:
            modules[key] = build_torchscript(model, atoms, torch.float64)
        x = torch.tensor(atoms.positions / ANGSTROM_PER_NM, requires_grad=True)
        box = torch.tensor(atoms.cell.array / ANGSTROM_PER_NM) if atoms.pbc.any() else None
        with torch.jit.optimized_execution(False):  # no profiling re-optimisation between calls
            energy = modules[key](x, box)
        (grad,) = torch.autograd.grad(energy, x)
        return float(energy), (-grad).numpy(), None

    return Runner("torchscript", run, energy_unit=1 / KJ_PER_MOL_PER_EV, length_unit=ANGSTROM_PER_NM, computes_stress=False)


@pytest.fixture(scope="module")
def battery(model):
    return SimulationBattery(model, ethanol(), crystal())


@pytest.mark.parametrize("check", CHECKS)
def test_torchscript_passes_the_battery(battery, check):
    battery.check(check, torchscript_factory)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("package", ["package64", "package64_fixed"])
def test_aoti_package_passes_the_battery(small_model, package, check, request):
    """Both kinds of package: sized by the structure, and fixed-capacity (static sizes)."""
    pot = load_exported(request.getfixturevalue(package))

    def run(atoms, stress):
        result = pot.evaluate(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
        return result.energy, result.forces, None

    def factory(model, dtype="float64", **engine_options):
        assert model is small_model and dtype == "float64"
        return Runner("aoti", run, computes_stress=False)

    SimulationBattery(small_model, ethanol(), crystal()).check(check, factory)
