"""The TorchScript export inside openmm-torch's TorchForce, against the Predictor.

Runs where ``openmmtorch`` imports (its wheel needs a CUDA-12 torch; ``.ci/run`` builds a
separate environment with ``torch==2.9.1 openmm==8.6.1 openmmtorch==1.5`` and runs this file
there). Skipped elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms

from flashcart.export import export_torchscript
from flashcart.export.torchscript import EV_TO_KJ_PER_MOL

from .conftest import assert_matches, ethanol, perturbed, predictor_reference

openmm = pytest.importorskip("openmm")
pytest.importorskip("openmmtorch")
from openmmtorch import TorchForce  # noqa: E402


def reduced_triclinic() -> Atoms:
    """A periodic box in OpenMM's reduced form (a along x, b in the xy-plane) with all four elements."""
    cell = np.array([[7.6, 0.0, 0.0], [1.3, 7.2, 0.0], [-0.9, 1.1, 7.4]])
    grid = np.stack(np.meshgrid(*[np.arange(3)] * 3, indexing="ij"), -1).reshape(-1, 3) / 3.0
    atoms = Atoms(["Cu", "C", "O", "H"] * 6 + ["Cu"] * 3, scaled_positions=grid + 0.05, cell=cell, pbc=True)
    atoms.rattle(0.1, seed=4)
    return atoms


def _openmm(path, atoms, platform: str, boxes=None):
    """Energy (eV) and forces (eV/Å) from a Context with the TorchForce, for each box in ``boxes`` (Å)."""
    system = openmm.System()
    for _ in range(len(atoms)):
        system.addParticle(1.0)
    force = TorchForce(str(path))
    periodic = bool(atoms.pbc.any())
    force.setUsesPeriodicBoundaryConditions(periodic)
    system.addForce(force)
    if periodic:
        system.setDefaultPeriodicBoxVectors(*[openmm.Vec3(*row) * 0.1 for row in atoms.cell.array])
    context = openmm.Context(system, openmm.VerletIntegrator(0.001), openmm.Platform.getPlatformByName(platform))
    out = []
    for frame in boxes or [atoms]:
        if periodic:
            context.setPeriodicBoxVectors(*[openmm.Vec3(*row) * 0.1 for row in frame.cell.array])
        context.setPositions(frame.positions * 0.1)
        state = context.getState(getEnergy=True, getForces=True)
        energy = state.getPotentialEnergy().value_in_unit(openmm.unit.kilojoule_per_mole) / EV_TO_KJ_PER_MOL
        forces = np.asarray(state.getForces(asNumpy=True).value_in_unit(openmm.unit.kilojoule_per_mole / openmm.unit.nanometer))
        out.append((energy, forces / (10.0 * EV_TO_KJ_PER_MOL)))
    return out


@pytest.mark.parametrize("platform, dtype, tol", [("Reference", torch.float64, 1e-10), ("CPU", torch.float32, 1e-5)])
def test_torchforce_molecule(model, tmp_path, platform, dtype, tol):
    atoms = ethanol()
    path = export_torchscript(model, atoms, tmp_path / "ethanol.pt", dtype)
    frames = [perturbed(atoms, seed) for seed in range(2)]
    for k, (energy, forces) in enumerate(_openmm(path, atoms, platform, frames)):
        # forces pass through OpenMM's platform precision (single on CPU)
        assert_matches(energy, forces, *predictor_reference(model, frames[k], dtype), tol, f"{platform} molecule frame {k}")


@pytest.mark.parametrize(
    "platform, dtype, tol, neighbours",
    [
        ("Reference", torch.float64, 1e-10, "all-pairs"),
        ("CPU", torch.float32, 1e-5, "all-pairs"),
        ("Reference", torch.float64, 1e-10, "cells"),
    ],
)
def test_torchforce_periodic_box_changes(model, tmp_path, platform, dtype, tol, neighbours):
    """Periodic: moved atoms and changed boxes (as a barostat does) in one Context; both
    neighbour searches (the binned one is the default from 256 atoms)."""
    atoms = reduced_triclinic()
    path = export_torchscript(model, atoms, tmp_path / "box.pt", dtype, neighbours=neighbours)
    frames = [perturbed(atoms, 1)]
    for scale in (1.04, 0.93):
        f = perturbed(atoms, 2)
        f.set_cell(f.cell.array * scale, scale_atoms=True)
        frames.append(f)
    for k, (energy, forces) in enumerate(_openmm(path, atoms, platform, frames)):
        assert_matches(energy, forces, *predictor_reference(model, frames[k], dtype), tol, f"{platform} periodic frame {k}")
