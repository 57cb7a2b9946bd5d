"""Neighbour lists inside exported graphs (TorchScript-compatible plain torch code).

Exported files compute their own neighbour list on every call: all pairs ``(i, j, image)``
with ``|x_j - x_i + image| < cutoff`` over a table of periodic images, by a dense distance
test (``[N, S, N]``) and ``nonzero``. Edges come out grouped by receiver, as the model
needs. Positions are first wrapped into the cell along periodic directions (a shift by
lattice vectors: it changes neither the energy nor ``d energy / d positions``), so the
image range that the cell's face distances call for is always enough.

Units are those of the caller (Å inside FlashCart's graphs); shapes as documented.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["reciprocal_rows", "images_needed", "image_table", "wrap_positions", "pair_list"]


def reciprocal_rows(cell: Tensor) -> Tensor:
    """``[3, 3]`` rows ``r_k`` with ``a_i . r_k = delta_ik`` (``inverse(cell).T``) of a cell with rows ``a_i``.

    ``1 / |r_k|`` is the distance between the cell faces spanned by the other two vectors.
    """
    a, b, c = cell[0], cell[1], cell[2]
    bc = torch.linalg.cross(b, c)
    ca = torch.linalg.cross(c, a)
    ab = torch.linalg.cross(a, b)
    volume = (a * bc).sum()
    return torch.stack([bc, ca, ab]) / volume


def images_needed(recip: Tensor, cutoff: float) -> Tensor:
    """``[3]`` images needed on each side along each lattice vector: ``ceil(cutoff / face distance)``."""
    return torch.ceil(cutoff * torch.linalg.vector_norm(recip, dim=1))


def image_table(n0: int, n1: int, n2: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[S, 3]`` integer image offsets ``-n_k..n_k`` (as ``dtype``); ``(0, 0, 0)`` is row ``S // 2``."""
    ranges = [
        torch.arange(-n0, n0 + 1, dtype=dtype, device=device),
        torch.arange(-n1, n1 + 1, dtype=dtype, device=device),
        torch.arange(-n2, n2 + 1, dtype=dtype, device=device),
    ]
    return torch.cartesian_prod(ranges[0], ranges[1], ranges[2]).reshape(-1, 3)


def wrap_positions(positions: Tensor, cell: Tensor, recip: Tensor, periodic: Tensor) -> Tensor:
    """Positions ``[N, 3]`` shifted by whole lattice vectors into the cell along directions where
    ``periodic`` (``[3]``, 1.0 or 0.0) is set; the shift is constant, so gradients pass unchanged."""
    frac = positions @ recip.T
    return positions - (torch.floor(frac.detach()) * periodic) @ cell


def pair_list(positions: Tensor, offsets: Tensor, allowed: Tensor, cutoff: float) -> tuple[Tensor, Tensor, Tensor]:
    """Pairs within ``cutoff``: ``(receivers [E], senders [E], image index [E])``, grouped by receiver.

    Args:
        positions: ``[N, 3]``.
        offsets: ``[S, 3]`` Cartesian image offsets with the zero image at row ``S // 2``.
        allowed: ``[S]`` bool, images that may be used (others are skipped).
        cutoff: pairs with distance ``< cutoff`` are kept; an atom is never its own neighbour
            in the zero image.
    """
    n = positions.shape[0]
    s = offsets.shape[0]
    d = positions[None, None, :, :] + offsets[None, :, None, :] - positions[:, None, None, :]  # [N, S, N, 3]
    r2 = (d * d).sum(-1)
    zero_image = torch.arange(s, device=positions.device) == s // 2
    itself = torch.eye(n, dtype=torch.bool, device=positions.device)[:, None, :] & zero_image[None, :, None]
    mask = (r2 < cutoff * cutoff) & allowed[None, :, None] & ~itself
    idx = mask.nonzero()
    return idx[:, 0], idx[:, 2], idx[:, 1]
