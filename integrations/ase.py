"""ASE calculator running a FlashCart model through the simulation engine.

    from flashcart.integrations.ase import FlashCartCalculator
    atoms.calc = FlashCartCalculator("runs/ethanol/best", device="cpu")
    atoms.get_forces()   # eV/Å

Energies in eV, forces in eV/Å, stress in eV/Å^3 (ASE's Voigt order xx, yy, zz, yz, xz, xy).
Neighbour-list reuse, padding, device placement and dtype live in
:class:`flashcart.simulation.Engine`; this class only translates ASE's ``Atoms``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
from ase.stress import full_3x3_to_voigt_6_stress

from flashcart.model.potential import FlashCartPotential
from flashcart.simulation import Evaluator, make_evaluator

__all__ = ["FlashCartCalculator"]


class FlashCartCalculator(Calculator):
    """FlashCart potential as an ASE calculator.

    Args:
        model: a checkpoint directory (``best/``, ``log/``), its ``model.pt``, a ``.pt2`` package from
            ``flashcart-export``, a model, or an
            :class:`~flashcart.simulation.Evaluator` (e.g. an :class:`~flashcart.simulation.Engine`
            built with its own options; the options below must then keep their defaults).
        device: ``cpu``, ``gpu`` or ``auto``.
        dtype: ``float32`` or ``float64``.
        skin: extra neighbour-list radius (Å); the list is reused until an atom has moved
            more than ``skin / 2`` (edges beyond the cutoff contribute exactly zero).
        compile_mode: ``None`` (eager) or a ``torch.compile`` mode (``default``,
            ``reduce-overhead``, ...).
        pad: pad to growing capacities (default: on when compiling).
        pad_atom_multiple, pad_edge_multiple: capacity rounding.
        add_atomic_offsets: include the per-element energy shifts in the energy.
        headroom: spare buffer capacity (fraction), as for :class:`~flashcart.simulation.Engine`.
        step: how the engine runs a step: ``auto``, ``dynamic``, ``static`` or ``graph`` (see
            :class:`~flashcart.simulation.Engine`).
        radial_table: ``0``, or the radial MLPs tabulated on this many intervals (inference
            stand-ins, as for :class:`~flashcart.simulation.Engine`).
    """

    implemented_properties = ["energy", "free_energy", "forces", "stress"]

    def __init__(
        self,
        model: str | Path | FlashCartPotential | Evaluator,
        device: str = "auto",
        dtype: str = "float32",
        skin: float = 0.0,
        compile_mode: str | None = None,
        pad: bool | None = None,
        pad_atom_multiple: int = 128,
        pad_edge_multiple: int = 128,
        add_atomic_offsets: bool = True,
        step: str = "auto",
        headroom: float = 0.1,
        radial_table: int = 0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._last_atoms = None  # reused by _snapshot
        self.engine = make_evaluator(
            model,
            device=device,
            dtype=dtype,
            skin=skin,
            compile_mode=compile_mode,
            pad=pad,
            pad_atom_multiple=pad_atom_multiple,
            pad_edge_multiple=pad_edge_multiple,
            add_atomic_offsets=add_atomic_offsets,
            step=step,
            headroom=headroom,
            radial_table=radial_table,
        )

    def check_state(self, atoms, tol: float = 1e-15) -> list[str]:
        """What changed since the last calculation among what the model depends on (positions,
        atomic numbers, cell, pbc), by exact comparison.

        ASE's default compares every per-atom array with ``numpy.isclose`` (``tol``), which cost
        about 0.3 ms per MD step for 768 atoms (three comparisons per velocity-Verlet step), more
        than the rest of the calculator; an exact comparison can only see a change where ASE's
        would not (a recalculation, never a stale result). Magnetic moments and charges are not
        compared: the model does not use them."""
        old = self.atoms
        if old is None:
            return list(all_changes)
        changes = []
        if not np.array_equal(old.arrays["positions"], atoms.arrays["positions"]):
            changes.append("positions")
        if not np.array_equal(old.arrays["numbers"], atoms.arrays["numbers"]):
            changes.append("numbers")
        if not np.array_equal(old.cell.array, atoms.cell.array):
            changes.append("cell")
        if not np.array_equal(old.pbc, atoms.pbc):
            changes.append("pbc")
        return changes

    @property
    def neighbor_list_builds(self) -> int:
        """Neighbour lists the engine has built so far."""
        return self.engine.neighbor_list_builds

    def _snapshot(self, atoms):
        """``self.atoms`` after a calculation: a copy of ``atoms``' arrays, cell and pbc, written
        into the previous copy when the number of atoms is unchanged (``Atoms.copy()``, which
        the base class makes every step, costs more than the rest of a cached step; ``info``
        and constraints are those of the first copy)."""
        snap = self._last_atoms
        if snap is None or len(snap) != len(atoms):
            snap = self._last_atoms = atoms.copy()
            return snap
        for name in [k for k in snap.arrays if k not in atoms.arrays]:
            del snap.arrays[name]
        for name, value in atoms.arrays.items():
            old = snap.arrays.get(name)
            if old is not None and old.shape == value.shape and old.dtype == value.dtype:
                old[...] = value
            else:
                snap.arrays[name] = value.copy()
        snap.cell.array[...] = atoms.cell.array
        snap.pbc[...] = atoms.pbc
        return snap

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        if atoms is not None:  # what the base class does, without a new Atoms per step
            self.atoms = self._snapshot(atoms)
        atoms = self.atoms
        want_stress = "stress" in properties
        if want_stress and not atoms.pbc.all():
            raise PropertyNotImplementedError("stress needs a structure periodic in all three directions")
        result = self.engine.evaluate(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc, stress=want_stress)
        self.results["energy"] = result.energy
        self.results["free_energy"] = result.energy
        self.results["forces"] = result.forces
        if want_stress:
            self.results["stress"] = full_3x3_to_voigt_6_stress(result.stress)
