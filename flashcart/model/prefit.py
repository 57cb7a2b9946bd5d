"""Data-dependent initialisation: per-element energy shifts, energy scale, ``avg_neighbors``."""

from __future__ import annotations

import torch

from ..data.batch import Structure
from .potential import FlashCartPotential

__all__ = ["prefit", "solve_shift_correction"]


def prefit(
    model: FlashCartPotential,
    structures: list[Structure],
    atomic_shifts: dict[str, float] | None = None,
    fit_atomic_shifts: bool = True,
    ridge: float = 1e-6,
) -> dict[str, object]:
    """Set ``model``'s shifts, scale and neighbour normalisation from training structures.

    * shifts: ridge-regularised least squares of energies on element counts; with
      ``atomic_shifts`` given, the fit corrects those (or they are used verbatim when
      ``fit_atomic_shifts`` is false);
    * scale: RMS of the reference force components (1 if there are none);
    * ``avg_neighbors``: mean edges per atom within ``r_max``.

    Returns the fitted values (for the log).
    """
    n_el = len(model.elements)
    counts = torch.zeros(len(structures), n_el, dtype=torch.float64)
    energies = torch.tensor([float(s.energy) for s in structures], dtype=torch.float64)
    for k, s in enumerate(structures):
        types = model.types_from_numbers(s.numbers)
        counts[k] = torch.bincount(types, minlength=n_el).double()
    base = torch.zeros(n_el, dtype=torch.float64)
    if atomic_shifts:
        missing = [e for e in model.elements if e not in atomic_shifts]
        if missing:
            raise ValueError(f"atomic_shifts has no value for {missing}")
        base = torch.tensor([atomic_shifts[e] for e in model.elements], dtype=torch.float64)
    shifts = base
    finite = torch.isfinite(energies)
    if fit_atomic_shifts and bool(finite.any()):
        A, y = counts[finite], energies[finite] - counts[finite] @ base
        shifts = base + solve_shift_correction(A.T @ A, A.T @ y, float(A.abs().max()), ridge)
    forces = torch.cat([s.forces.reshape(-1) for s in structures])
    forces = forces[torch.isfinite(forces)]
    energy_scale = float(torch.sqrt((forces**2).mean())) if forces.numel() and float((forces**2).mean()) > 0 else 1.0
    n_atoms = sum(s.n_atoms for s in structures)
    avg_neighbors = max(sum(s.n_edges for s in structures) / max(n_atoms, 1), 1.0)
    with torch.no_grad():
        model.atomic_shifts.copy_(shifts)
        model.scale.fill_(energy_scale)
        model.set_avg_neighbors(avg_neighbors)
    return {"atomic_shifts": dict(zip(model.elements, shifts.tolist())), "scale": energy_scale, "avg_neighbors": avg_neighbors}


def solve_shift_correction(ata: torch.Tensor, aty: torch.Tensor, max_count: float, ridge: float = 1e-6) -> torch.Tensor:
    """Per-element energy shifts ``[n_el]`` (eV) minimising ``|A s - y|^2 + ridge max_count^2 |s|^2``.

    ``ata = A^T A`` ``[n_el, n_el]`` and ``aty = A^T y`` ``[n_el]`` in float64, with ``A`` the element
    counts of each structure and ``y`` the energies (or residuals) to explain; passing the normal
    equations lets callers sum them over batches and processes. With a single composition the
    ridge term picks the smallest shifts that reproduce the mean energy.
    """
    scale = max(max_count, 1.0)
    lhs = ata + ridge * scale**2 * torch.eye(ata.shape[0], dtype=ata.dtype, device=ata.device)
    return torch.linalg.solve(lhs, aty)
