"""Tiny models and structures shared by the simulation and integration tests."""

from __future__ import annotations

import numpy as np
import torch
from ase import Atoms

from flashcart.model.potential import FlashCartPotential
from flashcart.testing import TINY_MODEL

WATER = np.array([[0.0, 0.0, 0.0], [0.9572, 0.0, 0.0], [-0.2400, 0.9266, 0.0]])  # O, H, H (Å)


def tiny_water_model(dtype: torch.dtype = torch.float64) -> FlashCartPotential:
    """An untrained H/O model with random weights (a random "pre-fit": scale, shifts and
    neighbour normalisation set to arbitrary non-trivial values)."""
    torch.manual_seed(0)
    m = FlashCartPotential(["H", "O"], avg_neighbors=8.0, use_triton=False, **TINY_MODEL)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
        m.atomic_shifts.copy_(torch.tensor([-13.6, -432.1], dtype=m.atomic_shifts.dtype))
    return m.to(dtype).eval()


def _waters(centres: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    out = []
    for c in centres:
        q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        out.append(c + WATER @ q.T)
    return np.concatenate(out)


def water_cluster() -> Atoms:
    """Three water molecules, not periodic."""
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0, 0.0], [2.8, 0.3, 0.1], [1.2, 2.5, -0.4]])
    return Atoms("OHH" * 3, positions=_waters(centres, rng))


def water_box(n_side: int = 2, spacing: float = 3.1, tilt: bool = True) -> Atoms:
    """``n_side^3`` water molecules on a (triclinic, in OpenMM's reduced form) periodic lattice."""
    rng = np.random.default_rng(2)
    L = n_side * spacing
    cell = np.array([[L, 0.0, 0.0], [0.15 * L, L, 0.0], [-0.1 * L, 0.12 * L, L]]) if tilt else np.eye(3) * L
    grid = np.stack(np.meshgrid(*[np.arange(n_side)] * 3, indexing="ij"), -1).reshape(-1, 3)
    centres = (grid + 0.5) / n_side @ cell + rng.normal(scale=0.1, size=(len(grid), 3))
    return Atoms("OHH" * len(grid), positions=_waters(centres, rng), cell=cell, pbc=True)


def pairs_within(atoms: Atoms, cutoff: float) -> int:
    """Directed pairs closer than ``cutoff`` (Å), by ASE's neighbour list."""
    from ase.neighborlist import primitive_neighbor_list

    return len(primitive_neighbor_list("i", atoms.pbc, atoms.cell.array, atoms.positions, cutoff))


def denser_by_one_move(atoms: Atoms, cutoff: float, distance: float) -> tuple[int, Atoms]:
    """The move of one atom by ``distance`` (Å) along a Cartesian axis that brings the most pairs
    within ``cutoff``: ``(pairs within cutoff afterwards, moved copy)``."""
    best = None
    for i in range(len(atoms)):
        for direction in np.vstack([np.eye(3), -np.eye(3)]):
            trial = atoms.copy()
            trial.positions[i] += distance * direction
            count = pairs_within(trial, cutoff)
            if best is None or count > best[0]:
                best = (count, trial)
    return best
