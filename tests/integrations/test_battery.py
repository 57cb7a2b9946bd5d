"""Every way of running a model passes the same physics battery (flashcart.testing.SimulationBattery)."""

import pytest

from flashcart.testing import SimulationBattery

from ..simulation.systems import tiny_water_model, water_box, water_cluster
from .runners import ase_runner, openmm_runner

RUNNERS = {
    "ase": ase_runner,
    # the engine with its radial MLPs tabulated (4096 intervals, float64: within 1e-8 of the MLPs)
    "ase-radial-tables": lambda model, **options: ase_runner(model, radial_table=4096, **options),
}
try:
    import openmm  # noqa: F401

    RUNNERS.update({"openmm-Reference": openmm_runner("Reference"), "openmm-CPU": openmm_runner("CPU")})
except ImportError:  # the test extra installs OpenMM; without it only the ASE calculator is checked
    pass


@pytest.fixture(scope="module")
def battery():
    return SimulationBattery(tiny_water_model(), water_cluster(), water_box())


CASES = [
    (runner, check)
    for runner in sorted(RUNNERS)
    for check in SimulationBattery.CHECKS
    # compilation does not depend on the OpenMM platform: compiled == eager once per integration
    if not (runner == "openmm-CPU" and check == "compiled_equals_eager")
]


@pytest.mark.parametrize("runner, check", CASES)
def test_integration_passes_the_battery(battery, runner, check):
    battery.check(check, RUNNERS[runner])
