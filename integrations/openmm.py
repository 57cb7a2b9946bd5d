"""OpenMM force provider: a FlashCart model as an ``openmm.PythonForce``.

    from flashcart.integrations.openmm import create_force
    force = create_force("runs/water/best", numbers, periodic=True, device="gpu",
                         compile_mode="reduce-overhead")
    system.addForce(force)

OpenMM calls the force once per step with positions in nm (and the periodic box vectors,
possibly triclinic, when the force is periodic); it gets back the energy in kJ/mol and the
forces ``[N, 3]`` in kJ/mol/nm. Everything else (neighbour-list reuse with a skin, padding,
device and dtype, CUDA graphs) is the :class:`flashcart.simulation.Engine`'s; the unit
conversions are :mod:`flashcart.units`'. Per step the callback costs one host-to-device copy
of the positions (through a pinned buffer), the model call, and one device-to-host copy of
energy and forces together (the step's only synchronisation).

Which OpenMM platform: the model runs on its own ``device`` whatever platform integrates. When
FlashCart's force is the system's only force, OpenMM's Reference platform is the cheapest
(``flashcart-md``'s default): it integrates on the host in about 0.04 ms a step, the round trip
costs about 1 us. OpenMM's CUDA platform creates a CUDA context of its own, which alternates
with PyTorch's on the GPU every step: 0.37 ms between two callbacks on an H200 (768-atom water,
benchmarks/RESULTS.md), worth paying where other forces (an MM environment, PME) need it.

With ``atoms`` (a subset of the system's particles), the force is restricted to them through
``PythonForce.setParticles``: the model sees only those atoms, and the forces on all other
particles are zero.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import openmm
from openmm import unit

from flashcart.model.potential import FlashCartPotential
from flashcart.simulation import Evaluator, make_evaluator
from flashcart.units import ev_per_angstrom_to_kj_per_mol_nm, ev_to_kj_per_mol, nm_to_angstrom

__all__ = ["FlashCartForce", "create_force", "create_force_for_topology", "topology_numbers"]


def _nm(quantity) -> np.ndarray:
    """A NumPy quantity's value in nm (without a copy when it already is in nm)."""
    if getattr(quantity, "unit", None) is unit.nanometer:
        return quantity._value
    return quantity.value_in_unit(unit.nanometer)


class FlashCartForce:
    """The ``PythonForce`` callback: an OpenMM ``State`` -> (energy kJ/mol, forces kJ/mol/nm).

    Args:
        evaluator: an :class:`~flashcart.simulation.Evaluator` (e.g. an ``Engine``).
        numbers: ``[N]`` atomic numbers of the atoms the force acts on, in order.
        periodic: read the box vectors from the state (periodic in all three directions).
    """

    def __init__(self, evaluator: Evaluator, numbers: Sequence[int], periodic: bool):
        self.evaluator = evaluator
        self.numbers = np.asarray(numbers, dtype=np.int64)
        self.periodic = bool(periodic)
        self.pbc = np.full(3, self.periodic)
        self._positions_nm = np.empty((len(self.numbers), 3))  # filled by OpenMM every step

    def __getstate__(self):  # pickled by XmlSerializer: the buffer is rebuilt
        return {k: v for k, v in self.__dict__.items() if k != "_positions_nm"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._positions_nm = np.empty((len(self.numbers), 3))

    def positions_nm(self, state: openmm.State) -> np.ndarray:
        """The state's positions ``[N, 3]`` in nm, copied by OpenMM into a buffer reused every
        step (a view: valid until the next call).

        ``State.getPositions(asNumpy=True)`` does the same copy and then wraps the array in a
        ``Quantity`` after an attribute lookup through ``dir()``, which costs more than the copy;
        where the OpenMM build does not have the method it calls, the public one is used."""
        copy, count = getattr(state, "_getVectorAsNumpy", None), getattr(state, "_getNumParticles", None)
        if copy is None or count is None:
            return self._checked(_nm(state.getPositions(asNumpy=True)))
        n = count()
        if n != len(self.numbers):  # OpenMM's copy does not check the buffer's size
            self._checked(np.empty((n, 3)))
        copy(openmm.State.Positions, self._positions_nm)
        return self._positions_nm

    def _checked(self, positions: np.ndarray) -> np.ndarray:
        if positions.shape != (len(self.numbers), 3):
            raise ValueError(
                f"OpenMM passed {positions.shape[0]} particles to the FlashCart force, which was built for "
                f"{len(self.numbers)} atomic numbers (give one number per particle, or per atom of `atoms`)"
            )
        return positions

    def __call__(self, state: openmm.State) -> tuple[float, np.ndarray]:
        positions = nm_to_angstrom(self.positions_nm(state))  # a new array: the evaluator may keep it
        cell = nm_to_angstrom(_nm(state.getPeriodicBoxVectors(asNumpy=True))) if self.periodic else None
        result = self.evaluator.evaluate(positions, self.numbers, cell, self.pbc)
        return ev_to_kj_per_mol(result.energy), ev_per_angstrom_to_kj_per_mol_nm(result.forces)


def create_force(
    model: str | Path | FlashCartPotential | Evaluator,
    numbers: Sequence[int],
    atoms: Iterable[int] | None = None,
    periodic: bool = False,
    device: str = "auto",
    dtype: str = "float32",
    skin: float = 0.5,
    compile_mode: str | None = None,
    pad: bool | None = None,
    pad_atom_multiple: int = 128,
    pad_edge_multiple: int = 128,
    add_atomic_offsets: bool = True,
    step: str = "auto",
    headroom: float = 0.1,
    radial_table: int = 0,
) -> openmm.PythonForce:
    """A ``PythonForce`` evaluating a FlashCart model.

    Args:
        model: a checkpoint directory (``best/``, ``log/``), its ``model.pt``, a ``.pt2`` package from
            ``flashcart-export``, a model, or an
            :class:`~flashcart.simulation.Evaluator` (the engine options below must then keep
            their defaults).
        numbers: atomic numbers of the atoms the force acts on: of every particle of the
            system, or of ``atoms`` only (same order) when ``atoms`` is given.
        atoms: indices of the particles the model acts on (``setParticles``); ``None``: all.
        periodic: use the system's periodic box (``setUsesPeriodicBoundaryConditions``).
        device, dtype, skin (Å), compile_mode, pad, pad_atom_multiple, pad_edge_multiple,
        add_atomic_offsets, step, headroom, radial_table: as for :class:`~flashcart.simulation.Engine`
        (skin defaults to 0.5 Å here: every OpenMM step moves the atoms).
    """
    numbers = np.asarray(numbers, dtype=np.int64)
    subset = None if atoms is None else [int(i) for i in atoms]
    if subset is not None and len(subset) != len(numbers):
        raise ValueError(
            f"{len(subset)} atoms were selected but {len(numbers)} atomic numbers given: give the numbers of the selected atoms"
        )
    if subset is not None and len(set(subset)) != len(subset):
        raise ValueError("atoms: particle indices must be unique")
    evaluator = make_evaluator(
        model,
        defaults=_CREATE_FORCE_DEFAULTS,
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
    check = getattr(evaluator, "check_numbers", None)
    if check is not None:
        check(numbers)  # unknown elements are an error now, not at the first step
    force = openmm.PythonForce(FlashCartForce(evaluator, numbers, periodic))
    force.setUsesPeriodicBoundaryConditions(bool(periodic))
    if subset is not None:
        force.setParticles(subset)
    return force


_CREATE_FORCE_DEFAULTS = {
    k: v.default for k, v in inspect.signature(create_force).parameters.items() if v.default is not inspect.Parameter.empty
}


def topology_numbers(topology: "openmm.app.Topology", atoms: Iterable[int] | None = None) -> np.ndarray:
    """Atomic numbers of ``topology``'s atoms (or of ``atoms``, in that order); an atom without
    an element is an error naming it."""
    all_atoms = list(topology.atoms())
    chosen = all_atoms if atoms is None else [all_atoms[int(i)] for i in atoms]
    missing = [f"{a.name} (index {a.index}, residue {a.residue.name})" for a in chosen if a.element is None]
    if missing:
        raise ValueError(f"atoms without an element cannot be modelled: {', '.join(missing[:10])}")
    return np.array([a.element.atomic_number for a in chosen], dtype=np.int64)


def create_force_for_topology(
    model: str | Path | FlashCartPotential | Evaluator,
    topology: "openmm.app.Topology",
    atoms: Iterable[int] | None = None,
    periodic: bool | None = None,
    **options,
) -> openmm.PythonForce:
    """:func:`create_force` with the atomic numbers of ``topology`` (of ``atoms`` when given);
    ``periodic=None`` means periodic when the topology has box vectors."""
    atoms = None if atoms is None else [int(i) for i in atoms]
    if periodic is None:
        periodic = topology.getPeriodicBoxVectors() is not None
    return create_force(model, topology_numbers(topology, atoms), atoms=atoms, periodic=periodic, **options)
