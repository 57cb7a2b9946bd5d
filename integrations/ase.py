"""ASE calculator running a FlashCart model through the inference engine.

    from flashcart.integrations.ase import FlashCartCalculator
    atoms.calc = FlashCartCalculator("runs/ethanol/best", device="cpu")
    atoms.get_forces()   # eV/Å

Energies in eV, forces in eV/Å, stress in eV/Å^3 (ASE's Voigt order xx, yy, zz, yz, xz, xy).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
from ase.stress import full_3x3_to_voigt_6_stress

from flashcart.data import collate, structure_from_atoms
from flashcart.model.checkpoint import load_checkpoint
from flashcart.model.potential import FlashCartPotential
from flashcart.model.predictor import Predictor
from flashcart.utils.device import resolve_device

__all__ = ["FlashCartCalculator"]


class FlashCartCalculator(Calculator):
    """FlashCart potential as an ASE calculator.

    Args:
        model: a checkpoint directory (``best/``, ``log/``), its ``model.pt``, or a model.
        device: ``cpu``, ``gpu`` or ``auto``.
        dtype: ``float32`` or ``float64``.
        skin: extra neighbour-list radius (Å); the list is reused until an atom has moved
            more than ``skin / 2`` (edges beyond the cutoff contribute exactly zero).
        compile_mode: ``None`` (eager) or a ``torch.compile`` mode (``default``,
            ``reduce-overhead``, ...).
        pad: pad to growing capacities (default: on when compiling).
        pad_atom_multiple, pad_edge_multiple: capacity rounding.
        add_atomic_offsets: include the per-element energy shifts in the energy.
    """

    implemented_properties = ["energy", "free_energy", "forces", "stress"]

    def __init__(
        self,
        model: str | Path | FlashCartPotential,
        device: str = "auto",
        dtype: str = "float32",
        skin: float = 0.0,
        compile_mode: str | None = None,
        pad: bool | None = None,
        pad_atom_multiple: int = 128,
        pad_edge_multiple: int = 128,
        add_atomic_offsets: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
        if skin < 0:
            raise ValueError(f"skin must be >= 0, got {skin}")
        self.device = resolve_device(device)
        self.dtype = getattr(torch, dtype)
        if not isinstance(model, FlashCartPotential):
            model = load_checkpoint(model)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.skin, self.add_atomic_offsets = skin, add_atomic_offsets
        self.predictor = Predictor(
            self.model,
            compile=compile_mode is not None,
            compile_mode=compile_mode or "default",
            pad=pad,
            pad_atom_multiple=pad_atom_multiple,
            pad_edge_multiple=pad_edge_multiple,
            pad_graph_multiple=1,
        )
        self._graph = None  # cached neighbour list: species, pbc, cell, reference positions, Batch
        self.neighbor_list_builds = 0

    def _same_topology(self, atoms) -> bool:
        """Same species, periodicity and cell as the cached neighbour list."""
        ref = self._graph
        return (
            ref is not None
            and np.array_equal(atoms.numbers, ref["numbers"])
            and np.array_equal(atoms.pbc, ref["pbc"])
            and np.array_equal(atoms.cell.array, ref["cell"])
        )

    def _batch(self, atoms):
        """The batch for ``atoms``: the cached graph with new positions while nobody moved more
        than ``skin / 2`` (and species, cell and periodicity are unchanged), else a new
        neighbour list (computed on the calculator's device)."""
        positions = torch.as_tensor(atoms.positions, dtype=self.dtype).to(self.device, non_blocking=True)
        if self._same_topology(atoms):
            ref = self._graph
            moved = float((positions - ref["positions"]).norm(dim=1).max()) if len(atoms) else 0.0
            if moved <= 0.5 * self.skin:
                batch = ref["batch"]
                batch.positions = positions
                return batch
        structure = structure_from_atoms(atoms, self.model.r_max + self.skin, where="atoms", require_labels=False, device=self.device)
        batch = collate([structure], self.model.z_to_type).to(self.device, self.dtype)
        self._graph = {
            "numbers": atoms.numbers.copy(),
            "pbc": atoms.pbc.copy(),
            "cell": atoms.cell.array.copy(),
            "positions": positions.clone(),
            "batch": batch,
        }
        self.neighbor_list_builds += 1
        n_edges = batch.receivers.shape[0]
        if self.predictor.pad and n_edges > self.predictor.capacities.edges:
            # grow with 10 % headroom, so that the next neighbour lists fit (no recompilation)
            self.predictor.reserve(len(atoms), int(1.1 * n_edges) + 1, 1)
        return batch

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        atoms = self.atoms
        want_stress = "stress" in properties
        if want_stress and not atoms.pbc.all():
            raise PropertyNotImplementedError("stress needs a structure periodic in all three directions")
        batch = self._batch(atoms)
        out = self.predictor(batch, forces=True, stress=want_stress)
        energy = float(out["energy"][0])
        if not self.add_atomic_offsets:
            energy -= float(self.model.atomic_shifts[batch.types].sum())
        self.results["energy"] = energy
        self.results["free_energy"] = energy
        self.results["forces"] = out["forces"].detach().cpu().double().numpy()
        if want_stress:
            self.results["stress"] = full_3x3_to_voigt_6_stress(out["stress"][0].detach().cpu().double().numpy())
