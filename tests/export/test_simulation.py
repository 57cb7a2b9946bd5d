"""A simulation from the exported file alone: the ASE calculator, the OpenMM force and flashcart-md take a .pt2."""

from __future__ import annotations

import numpy as np
import pytest
from ase.io import write

from flashcart.integrations.ase import FlashCartCalculator

from .conftest import assert_matches, crystal, ethanol, perturbed, predictor_reference


def test_ase_calculator_takes_a_package(small_model, package64):
    atoms = perturbed(crystal(), 5)
    atoms.calc = FlashCartCalculator(str(package64))
    forces = atoms.get_forces()
    assert_matches(atoms.get_potential_energy(), forces, *predictor_reference(small_model, atoms), 1e-10, "ASE calculator with a .pt2")
    with pytest.raises(ValueError, match="configure a new engine"):
        FlashCartCalculator(str(package64), compile_mode="default")


def test_openmm_force_takes_a_package(small_model, package64):
    openmm = pytest.importorskip("openmm")
    from flashcart.integrations.openmm import create_force
    from flashcart.units import KJ_PER_MOL_NM_PER_EV_ANGSTROM, KJ_PER_MOL_PER_EV

    atoms = perturbed(ethanol(), 6)
    system = openmm.System()
    for _ in range(len(atoms)):
        system.addParticle(1.0)
    system.addForce(create_force(str(package64), atoms.numbers, periodic=False))
    context = openmm.Context(system, openmm.VerletIntegrator(0.001), openmm.Platform.getPlatformByName("Reference"))
    context.setPositions(atoms.positions * 0.1)
    state = context.getState(getEnergy=True, getForces=True)
    energy = state.getPotentialEnergy().value_in_unit(openmm.unit.kilojoule_per_mole) / KJ_PER_MOL_PER_EV
    forces = np.asarray(state.getForces(asNumpy=True).value_in_unit(openmm.unit.kilojoule_per_mole / openmm.unit.nanometer))
    assert_matches(
        energy, forces / KJ_PER_MOL_NM_PER_EV_ANGSTROM, *predictor_reference(small_model, atoms), 1e-10, "OpenMM force with a .pt2"
    )
    with pytest.raises(ValueError, match=r"elements \['Na'\]"):
        create_force(str(package64), [11, 1], periodic=False)


@pytest.mark.parametrize("package", ["package64", "package64_fixed"])
def test_flashcart_md_runs_from_the_package(package, tmp_path, request):
    from flashcart.simulation.md import load_md_config, run_md

    package64 = request.getfixturevalue(package)
    write(tmp_path / "ethanol.xyz", ethanol())
    cfg = load_md_config(
        overrides=[
            f"model={package64}",
            f"structure={tmp_path / 'ethanol.xyz'}",
            f"output_path={tmp_path / 'md'}",
            "steps=6",
            "log_interval=2",
            "device=cpu",
            "dtype=float64",
        ]
    )
    lines = []
    results = run_md(cfg, progress=False, out=lines.append)
    assert results["step"] > 0 and "profile" not in results
    log = (tmp_path / "md" / "md.log").read_text().splitlines()
    assert len(log) == 1 + 4  # header and steps 0, 2, 4, 6
    energies = [float(line.split()[4]) for line in log[1:]]
    assert np.ptp(energies) < 1e-2  # NVE: the total energy is conserved (tiny steps of a smooth model)
    assert any("exported model" in line for line in lines)
    if package == "package64_fixed":  # the capacity is reported (on a CPU there is no CUDA graph)
        assert any("fixed capacity: 64 edge slots per atom" in line and "CUDA graph" not in line for line in lines)
    bad = load_md_config(
        overrides=[
            f"model={package64}",
            f"structure={tmp_path / 'ethanol.xyz'}",
            f"output_path={tmp_path / 'bad'}",
            "dtype=float32",
            "device=cpu",
        ]
    )
    with pytest.raises(Exception, match="float64"):
        run_md(bad, progress=False, out=lines.append)
