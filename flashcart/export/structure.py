"""The ``--structure`` of an export: one frame read with ASE, checked against the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["read_structure", "check_elements"]


def check_elements(atoms, elements: list[str], where: str) -> None:
    """Raise ``ValueError`` naming ``where`` and every element of ``atoms`` not in ``elements``."""
    unknown = sorted(set(atoms.get_chemical_symbols()) - set(elements))
    if unknown:
        raise ValueError(f"{where}: elements {unknown} are not among the model's elements {list(elements)}")


def read_structure(path: str | Path, elements: list[str]):
    """The first frame of ``path`` (any format ASE reads) as ``ase.Atoms``, with every element known to the model."""
    import ase.io

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"structure file {path} does not exist")
    try:
        atoms = ase.io.read(path, index=0)
    except Exception as err:  # ASE raises many types for malformed files
        raise ValueError(f"{path}: cannot be read as a structure ({type(err).__name__}: {err})") from None
    if len(atoms) == 0:
        raise ValueError(f"{path}: the structure has no atoms")
    if not np.isfinite(atoms.positions).all():
        raise ValueError(f"{path}: positions contain non-finite values")
    check_elements(atoms, elements, str(path))
    if atoms.pbc.any() and abs(float(np.linalg.det(atoms.cell.array))) < 1e-9:
        raise ValueError(f"{path}: periodic structure with a singular cell")
    return atoms
