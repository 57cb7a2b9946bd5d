"""The one interface every way of evaluating a model implements: "evaluate a structure".

Simulation adapters (the ASE calculator, the OpenMM force) only talk to an :class:`Evaluator`,
so a different evaluator (for example an exported model file with its neighbour list inside)
plugs into all of them by implementing :meth:`Evaluator.evaluate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["Evaluation", "Evaluator"]


@dataclass
class Evaluation:
    """Results for one structure, on the host in float64.

    energy: eV. forces: ``[N, 3]`` eV/Å (``-dE/dx``). stress: ``[3, 3]`` eV/Å^3
    (``dE/d(strain) / V``), ``None`` unless requested.
    """

    energy: float
    forces: np.ndarray
    stress: np.ndarray | None = None


@runtime_checkable
class Evaluator(Protocol):
    """Positions (+ cell, pbc) of one structure -> energy, forces and optionally stress."""

    def evaluate(
        self,
        positions: np.ndarray,
        numbers: np.ndarray,
        cell: np.ndarray | None = None,
        pbc: np.ndarray | tuple[bool, bool, bool] | None = None,
        stress: bool = False,
    ) -> Evaluation:
        """Evaluate one structure.

        Args:
            positions: ``[N, 3]`` Å.
            numbers: ``[N]`` atomic numbers.
            cell: ``[3, 3]`` lattice vectors as rows (Å); ``None`` for a molecule.
            pbc: periodicity per lattice vector; ``None``: periodic where ``cell`` is given.
            stress: also compute the stress (needs a cell periodic in all directions).
        """
        ...
