"""Read labelled extxyz files (through ASE) into :class:`Structure` objects.

Errors name the file and the frame: missing label keys, non-finite values, force arrays
of the wrong shape, empty files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..utils.progress import progress_bar
from .batch import Structure
from .neighbors import neighbor_list

__all__ = ["read_structures", "structure_from_atoms", "DataError"]


class DataError(ValueError):
    """A problem with input data; the message names the file and frame."""


def _stress_matrix(value, where: str) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if arr.shape == (3, 3):
        return arr
    if arr.shape == (6,):  # Voigt: xx yy zz yz xz xy
        xx, yy, zz, yz, xz, xy = arr
        return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    if arr.shape == (9,):
        return arr.reshape(3, 3)
    raise DataError(f"{where}: stress must have 3x3, 6 (Voigt) or 9 values, got shape {arr.shape}")


def structure_from_atoms(
    atoms,
    r_max: float,
    energy_key: str | None = None,
    forces_key: str | None = None,
    stress_key: str | None = None,
    where: str = "",
    require_labels: bool = True,
    device: torch.device | str | None = None,
) -> Structure:
    """One :class:`Structure` with its neighbour list; labels read if keys are given.

    ``device``: where the neighbour list is computed and the tensors live (default CPU).
    """
    n = len(atoms)
    if n == 0:
        raise DataError(f"{where}: structure has no atoms")
    positions = np.asarray(atoms.get_positions(), dtype=float)
    if not np.isfinite(positions).all():
        raise DataError(f"{where}: positions contain non-finite values")
    energy, forces, stress = float("nan"), np.full((n, 3), np.nan), np.full((3, 3), np.nan)
    if energy_key is not None:
        if energy_key in atoms.info:
            energy = float(atoms.info[energy_key])
            if not np.isfinite(energy):
                raise DataError(f"{where}: energy {energy_key!r} is not finite ({energy})")
        elif require_labels:
            raise DataError(f"{where}: missing energy label atoms.info[{energy_key!r}] (set energy_key)")
    if forces_key is not None:
        if forces_key in atoms.arrays:
            forces = np.asarray(atoms.arrays[forces_key], dtype=float)
            if forces.shape != (n, 3):
                raise DataError(f"{where}: forces {forces_key!r} have shape {forces.shape}, expected ({n}, 3)")
            if not np.isfinite(forces).all():
                raise DataError(f"{where}: forces {forces_key!r} contain non-finite values")
        elif require_labels:
            raise DataError(f"{where}: missing force label atoms.arrays[{forces_key!r}] (set forces_key)")
    if stress_key is not None and stress_key in atoms.info:
        stress = _stress_matrix(atoms.info[stress_key], where)
        if not np.isfinite(stress).all():
            raise DataError(f"{where}: stress {stress_key!r} contains non-finite values")
    pbc = torch.tensor(np.asarray(atoms.pbc, dtype=bool))
    cell_np = np.asarray(atoms.cell.array, dtype=float)
    if pbc.any() and abs(float(np.linalg.det(cell_np))) < 1e-9:
        raise DataError(f"{where}: periodic structure with a singular cell")
    cell = torch.tensor(cell_np, device=device)
    pos_t = torch.tensor(positions, device=device)
    receivers, senders, shifts = neighbor_list(pos_t, r_max, cell, pbc)
    return Structure(
        positions=pos_t,
        numbers=torch.tensor(atoms.numbers, dtype=torch.long, device=device),
        cell=cell,
        pbc=pbc.to(device),
        receivers=receivers,
        senders=senders,
        shifts=shifts,
        energy=torch.tensor(energy, device=device),
        forces=torch.tensor(forces, device=device),
        stress=torch.tensor(stress, device=device),
        source=where,
    )


def read_structures(
    path: str | Path, r_max: float, energy_key: str, forces_key: str, stress_key: str, progress: bool = True
) -> list[Structure]:
    """All frames of an extxyz file as labelled structures with neighbour lists."""
    import ase.io

    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    try:
        frames = ase.io.read(path, index=":")
    except Exception as err:  # ASE raises many types for malformed files
        raise DataError(f"{path}: cannot read as extended XYZ ({type(err).__name__}: {err})") from None
    if not frames:
        raise DataError(f"{path}: file holds no structures")
    out = []
    for k, atoms in enumerate(progress_bar(frames, desc=f"neighbour lists {path.name}", disable=not progress)):
        out.append(structure_from_atoms(atoms, r_max, energy_key, forces_key, stress_key, where=f"{path}, frame {k}"))
    return out
