"""Neighbour lists with periodic shifts (vectorised torch; runs on CPU or GPU).

For each structure, every periodic image within the cutoff is enumerated from the cell's
face distances, so small cells with several images of the same atom work. Pairs are
computed in chunks to bound memory. Edges come out grouped (sorted) by receiver.
"""

from __future__ import annotations

import math

import torch

__all__ = ["neighbor_list"]


def _image_range(cell: torch.Tensor, pbc: torch.Tensor, cutoff: float) -> list[int]:
    """Number of images needed along each lattice vector to cover ``cutoff``."""
    if not bool(pbc.any()):
        return [0, 0, 0]
    volume = torch.abs(torch.det(cell)).item()
    out = []
    for k in range(3):
        if not bool(pbc[k]):
            out.append(0)
            continue
        other = torch.cross(cell[(k + 1) % 3], cell[(k + 2) % 3], dim=0)
        height = volume / max(other.norm().item(), 1e-12)
        out.append(int(math.ceil(cutoff / height)))
    return out


def neighbor_list(
    positions: torch.Tensor,
    cutoff: float,
    cell: torch.Tensor | None = None,
    pbc: torch.Tensor | tuple[bool, bool, bool] | None = None,
    self_interaction: bool = False,
    chunk: int = 4_000_000,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs ``(i, j, shift)`` with ``|x_j - x_i + shift @ cell| < cutoff``.

    Args:
        positions: ``[n, 3]`` Å.
        cutoff: Å.
        cell: ``[3, 3]`` lattice vectors as rows (Å); ``None`` for a molecule.
        pbc: periodicity per lattice vector.
        self_interaction: keep ``i == j`` with zero shift.
    Returns:
        receivers ``i: [E]``, senders ``j: [E]`` (int64, sorted by ``i``), shifts ``[E, 3]``
        (integer multiples of the lattice vectors, in ``positions.dtype``).
    """
    n = positions.shape[0]
    device, dtype = positions.device, positions.dtype
    if cell is None:
        cell = torch.zeros(3, 3, dtype=dtype, device=device)
    if pbc is None:
        pbc = (False, False, False)
    pbc = torch.as_tensor(pbc, dtype=torch.bool)
    if bool(pbc.any()) and abs(torch.det(cell.double()).item()) < 1e-9:
        raise ValueError("periodic structure with a singular cell")
    reps = _image_range(cell.double().cpu(), pbc, cutoff)
    ranges = [torch.arange(-r, r + 1, device=device, dtype=dtype) for r in reps]
    shifts = torch.cartesian_prod(*ranges).reshape(-1, 3)
    offsets = shifts @ cell.to(dtype)  # [S, 3]
    cutoff2 = cutoff * cutoff
    recv, send, sidx = [], [], []
    n_shifts = shifts.shape[0]
    # Chunk over receivers so that one block holds at most `chunk` distances.
    block = max(1, chunk // max(1, n * n_shifts))
    zero_shift = n_shifts // 2  # the (0, 0, 0) shift sits in the middle of the product
    for start in range(0, n, block):
        xi = positions[start : start + block]  # [b, 3]
        d = positions[None, None, :, :] + offsets[None, :, None, :] - xi[:, None, None, :]  # [b, S, n, 3]
        r2 = (d * d).sum(-1)
        mask = r2 < cutoff2
        if not self_interaction:
            idx = torch.arange(start, start + xi.shape[0], device=device)
            mask[torch.arange(xi.shape[0], device=device), zero_shift, idx] = False
        b, s, j = mask.nonzero(as_tuple=True)
        recv.append(b + start)
        send.append(j)
        sidx.append(s)
    receivers = torch.cat(recv)
    senders = torch.cat(send)
    shift_idx = torch.cat(sidx)
    order = torch.argsort(receivers * (n * n_shifts) + senders * n_shifts + shift_idx)
    return receivers[order], senders[order], shifts[shift_idx[order]]
