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
        **kwargs,
    ):
        super().__init__(**kwargs)
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
        )

    @property
    def neighbor_list_builds(self) -> int:
        """Neighbour lists the engine has built so far."""
        return self.engine.neighbor_list_builds

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
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
