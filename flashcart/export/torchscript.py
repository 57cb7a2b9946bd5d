"""TorchScript export with openmm-torch's ``TorchForce`` contract.

The saved module computes ``forward(positions [N, 3] nm, box [3, 3] nm or None) -> energy []
kJ/mol`` for the atoms (and their order) of the structure it was exported for. Forces are
``-d energy / d positions``, taken by ``TorchForce`` (or by the caller) through autograd.

* The model part is traced (``torch.jit.trace``) from a copy built with the generated
  PyTorch backend: standard torch operations only, so loading needs nothing but torch
  (``torch.jit.load`` in Python, ``torch::jit::load`` in C++). Tracing records no Python
  control flow that depends on the data; sizes (atoms, edges) stay symbolic, which
  ``tests/export`` checks by evaluating other structures than the traced one.
* The neighbour list and the unit conversions are scripted (``torch.jit.script``) around it.
  From :data:`BINNED_FROM_ATOMS` atoms (or with ``neighbours="cells"``) the list is found
  through bins a cutoff wide, below by the dense all-pairs test.
  Periodic exports wrap positions into the box given on each call and enumerate every image
  within the cutoff from that box, so a box that changes between calls (NPT, a Monte Carlo
  barostat) is handled exactly; the box may be smaller than twice the cutoff.
* A periodic export needs ``TorchForce.setUsesPeriodicBoundaryConditions(True)`` (the box is
  then passed); a non-periodic one refuses a box rather than ignore it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from ..model.potential import FlashCartPotential
from ..units import ANGSTROM_PER_NM, KJ_PER_MOL_PER_EV
from ..utils.io import atomic_write
from .model import frozen_copy, structure_energy
from .neighbors import binned_pair_list, check_search, image_table, images_needed, pair_list, reciprocal_rows, wrap_positions

__all__ = ["export_torchscript", "TorchForceModule", "EV_TO_KJ_PER_MOL", "NM_TO_ANGSTROM", "BINNED_FROM_ATOMS", "default_neighbours"]

# From this many atoms a file finds neighbours through bins (binned_pair_list). The `.pt2`
# packages of benchmarks/pt2_scaling.py (this machine's CPU, 2026-12-01) broke even near 200
# atoms: 0.7 against 0.3 ms at 24 atoms, 10 against 22 ms at 648.
BINNED_FROM_ATOMS = 256

EV_TO_KJ_PER_MOL = KJ_PER_MOL_PER_EV
NM_TO_ANGSTROM = ANGSTROM_PER_NM


class _Energy(torch.nn.Module):
    """The traced part: energy [] (eV) from Å positions and a neighbour list (see :func:`structure_energy`)."""

    def __init__(self, model: FlashCartPotential):
        super().__init__()
        self.model = model

    def forward(self, positions, types, cell, shifts, receivers, senders):
        return structure_energy(self.model, positions, types, cell, shifts, receivers, senders)


class TorchForceModule(torch.nn.Module):
    """``forward(positions [N, 3] nm, box [3, 3] nm | None) -> energy [] kJ/mol`` (scripted).

    ``energy`` has the dtype of ``positions``; the model runs in the dtype it was exported in.
    """

    def __init__(
        self,
        energy: torch.nn.Module,
        types: Tensor,
        numbers: Tensor,
        elements: list[str],
        cutoff: float,
        periodic: bool,
        dtype: torch.dtype,
        binned: bool = False,
    ):
        super().__init__()
        self.binned = binned  # binned_pair_list instead of the dense pair_list
        self.energy = energy
        self.register_buffer("types", types)
        self.register_buffer("atomic_numbers", numbers)  # the exported structure's atoms, in order
        self.elements = elements
        self.cutoff = cutoff
        self.periodic = periodic
        self.n_atoms = int(types.shape[0])
        self.dtype = dtype
        self.dtype_name = str(dtype).replace("torch.", "")
        self.kj_per_mol_per_ev = EV_TO_KJ_PER_MOL
        self.angstrom_per_nm = NM_TO_ANGSTROM

    def forward(self, positions: Tensor, box: Optional[Tensor] = None) -> Tensor:
        if positions.dim() != 2 or positions.shape[0] != self.n_atoms or positions.shape[1] != 3:
            raise RuntimeError(
                "flashcart export: positions must have shape [" + str(self.n_atoms) + ", 3] (nm), got " + str(positions.shape)
            )
        pos = positions.to(self.dtype) * self.angstrom_per_nm
        if self.periodic:
            if box is None:
                raise RuntimeError(
                    "flashcart export: this model was exported for a periodic structure and needs the box "
                    "(TorchForce.setUsesPeriodicBoundaryConditions(True))"
                )
            cell = box.to(self.dtype) * self.angstrom_per_nm
            recip = reciprocal_rows(cell)
            if not bool(torch.isfinite(recip).all()):
                raise RuntimeError("flashcart export: singular periodic box " + str(box))
            pos = wrap_positions(pos, cell, recip, torch.ones(3, dtype=self.dtype, device=pos.device))
            n = images_needed(recip, self.cutoff)
            images = (int(n[0]), int(n[1]), int(n[2]))
        else:
            if box is not None:
                raise RuntimeError(
                    "flashcart export: this model was exported for a non-periodic structure; it takes no box "
                    "(TorchForce.setUsesPeriodicBoundaryConditions(False)), re-export with a periodic --structure"
                )
            cell = torch.zeros(3, 3, dtype=self.dtype, device=pos.device)
            recip = torch.eye(3, dtype=self.dtype, device=pos.device)  # orients the bins only
            images = (0, 0, 0)
        table = image_table(images[0], images[1], images[2], self.dtype, pos.device)
        if self.binned:
            periodic = torch.full((3,), self.periodic, dtype=torch.bool, device=pos.device)
            receivers, senders, image = binned_pair_list(pos, cell, recip, periodic, images, self.cutoff)
        else:
            allowed = torch.ones(table.shape[0], dtype=torch.bool, device=pos.device)
            receivers, senders, image = pair_list(pos, table @ cell, allowed, self.cutoff)
        shifts = table.index_select(0, image)
        energy = self.energy(pos, self.types, cell[None], shifts, receivers, senders)
        return (energy * self.kj_per_mol_per_ev).to(positions.dtype)


def _example_inputs(model: FlashCartPotential, atoms, dtype: torch.dtype, device: torch.device):
    """Inputs of the traced part for ``atoms`` (its own neighbour list), used only to trace."""
    from ..data import structure_from_atoms

    s = structure_from_atoms(atoms, model.r_max, where="export structure", require_labels=False)
    types = model.types_from_numbers(s.numbers.to(model.z_to_type.device)).to(device)
    return (
        s.positions.to(device, dtype),
        types,
        s.cell.to(device, dtype)[None],
        s.shifts.to(device, dtype),
        s.receivers.to(device),
        s.senders.to(device),
    )


def default_neighbours(n_atoms: int) -> str:
    """The file's neighbour search when none is named: ``cells`` from :data:`BINNED_FROM_ATOMS`
    atoms, ``all-pairs`` below (fewer operations where the dense test is cheap)."""
    return "cells" if n_atoms >= BINNED_FROM_ATOMS else "all-pairs"


def build_torchscript(
    model: FlashCartPotential, atoms, dtype: torch.dtype = torch.float32, device: str = "cpu", neighbours: str | None = None
) -> torch.jit.ScriptModule:
    """The scripted :class:`TorchForceModule` for the atoms of ``atoms`` (an ``ase.Atoms``).

    ``atoms.pbc`` must be all True (a periodic box) or all False: OpenMM boxes are periodic
    in every direction. ``neighbours``: ``cells`` (:func:`~flashcart.export.neighbors.binned_pair_list`),
    ``all-pairs`` (:func:`~flashcart.export.neighbors.pair_list`) or ``None``
    (:func:`default_neighbours`).
    """
    neighbours = default_neighbours(len(atoms)) if neighbours is None else check_search(neighbours)
    pbc = [bool(p) for p in atoms.pbc]
    if any(pbc) and not all(pbc):
        raise ValueError(f"TorchScript export: the structure is periodic along {pbc}; OpenMM boxes are periodic in all three directions")
    device = torch.device(device)
    frozen = frozen_copy(model, dtype, device, use_triton=False)
    example = _example_inputs(frozen, atoms, dtype, device)
    with warnings.catch_warnings():
        # the layers' shape checks become constants of the trace: expected, they only validate;
        # tests/export evaluates other sizes than the traced ones
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(_Energy(frozen), example, check_trace=False)
    numbers = torch.tensor(atoms.numbers, dtype=torch.long, device=device)
    module = TorchForceModule(
        traced, example[1], numbers, list(frozen.elements), float(frozen.r_max), all(pbc), dtype, binned=neighbours == "cells"
    )
    return torch.jit.script(module)


def export_torchscript(
    model: FlashCartPotential,
    atoms,
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    neighbours: str | None = None,
) -> Path:
    """Write :func:`build_torchscript`'s module to ``path`` (atomically); returns the path."""
    scripted = build_torchscript(model, atoms, dtype, device, neighbours)
    path = Path(path)
    atomic_write(path, lambda h: torch.jit.save(scripted, h), binary=True)
    return path
