"""Stored <-> full conversions and rotations of ICTs (numerical, exact rational matrices)."""

from __future__ import annotations

import itertools
from functools import lru_cache

import torch

from ._components import component_in_stored, dim, stored_components

__all__ = ["to_full", "from_full", "rotate", "rotation_matrix_stored"]


@lru_cache(maxsize=None)
def _to_full_matrix(l: int) -> tuple[tuple[float, ...], ...]:
    """Rows: full indices (row-major over ``3^l``), columns: stored components."""
    rows = []
    for index in itertools.product(range(3), repeat=l):
        a, b, c = index.count(0), index.count(1), index.count(2)
        row = [0.0] * dim(l)
        for j, coef in component_in_stored(a, b, c):
            row[j] = float(coef)
        rows.append(tuple(row))
    return tuple(rows)


@lru_cache(maxsize=None)
def _from_full_indices(l: int) -> tuple[int, ...]:
    """Flat full index of the representative entry ``x^a y^b z^c`` of each stored component."""
    out = []
    for a, b, c in stored_components(l):
        flat = 0
        for i in [0] * a + [1] * b + [2] * c:
            flat = flat * 3 + i
        out.append(flat)
    return tuple(out)


def to_full(x: torch.Tensor, l: int) -> torch.Tensor:
    """Full symmetric traceless tensor from stored components.

    Args:
        x: ``[..., 2l+1]`` stored components.
        l: tensor rank.
    Returns:
        ``[..., 3, ..., 3]`` (``l`` trailing axes of size 3).
    """
    if x.shape[-1] != dim(l):
        raise ValueError(f"to_full: last axis must have {dim(l)} components for rank {l}, got {x.shape[-1]}")
    m = torch.tensor(_to_full_matrix(l), dtype=x.dtype, device=x.device)
    return (x @ m.T).reshape(*x.shape[:-1], *([3] * l))


def from_full(t: torch.Tensor, l: int) -> torch.Tensor:
    """Stored components of a full symmetric traceless tensor ``[..., 3, ..., 3] -> [..., 2l+1]``."""
    if l > 0 and tuple(t.shape[-l:]) != (3,) * l:
        raise ValueError(f"from_full: expected {l} trailing axes of size 3, got shape {tuple(t.shape)}")
    flat = t.reshape(*t.shape[: t.dim() - l], 3**l)
    idx = torch.tensor(_from_full_indices(l), device=t.device)
    return flat.index_select(-1, idx)


def rotation_matrix_stored(R: torch.Tensor, l: int) -> torch.Tensor:
    """The ``[2l+1, 2l+1]`` matrix acting on stored components as ``R`` acts on every index."""
    full = torch.eye(1, dtype=R.dtype, device=R.device)
    for _ in range(l):
        full = torch.kron(full, R)
    m = torch.tensor(_to_full_matrix(l), dtype=R.dtype, device=R.device)
    idx = torch.tensor(_from_full_indices(l), device=R.device)
    return (full @ m)[idx]


def rotate(x: torch.Tensor, R: torch.Tensor, l_max: int, n_paths: list[int] | None = None) -> torch.Tensor:
    """Rotate features in the standard layout by ``R`` (proper or improper).

    Args:
        x: ``[n, width]`` with rank blocks ``(2l+1, n_paths[l], F)`` for ``l = 0..l_max``.
        R: ``[3, 3]`` orthogonal matrix; vectors transform as ``v' = R v``.
        l_max: highest rank in ``x``.
        n_paths: paths per rank (default one per rank).
    Returns:
        ``[n, width]`` rotated features.
    """
    paths = [1] * (l_max + 1) if n_paths is None else list(n_paths)
    if len(paths) != l_max + 1:
        raise ValueError(f"rotate: n_paths needs {l_max + 1} entries, got {len(paths)}")
    per_channel = sum(dim(l) * p for l, p in enumerate(paths))
    if x.shape[-1] % per_channel:
        raise ValueError(f"rotate: width {x.shape[-1]} is not a multiple of {per_channel}")
    n_feat = x.shape[-1] // per_channel
    blocks, start = [], 0
    for l, p in enumerate(paths):
        size = dim(l) * p * n_feat
        block = x[..., start : start + size].reshape(*x.shape[:-1], dim(l), p * n_feat)
        d = rotation_matrix_stored(R.to(x), l)
        blocks.append(torch.einsum("ij,...jf->...if", d, block).reshape(*x.shape[:-1], size))
        start += size
    return torch.cat(blocks, dim=-1)
