"""Product weights read from a cubic table of one variable per weight row.

A tabulated radial MLP (:mod:`flashcart.nn.radial_table`) is a piecewise cubic ``w(t)`` of the
edge length ``t``: on ``K`` equal intervals of ``[0, r_max]``, per interval the coefficients
``c0..c3`` of ``c0 + c1 s + c2 s^2 + c3 s^3`` in the position ``s`` in the interval, a table
``[K, 4, W]``; zero from ``r_max`` on. Given as a :class:`WeightTable`, a convolution's Triton
kernels evaluate the cubic per edge as they read the weights (``W_TABLE``): the weights ``[R, W]``
and their slopes are never written, and the table (a few MB) stays in the GPU's cache. The
backward contracts each edge's weight gradient with the cubic's derivative in the kernels, as
with :class:`~flashcart.cartesian.WeightSlopes`, and returns ``t``'s gradient.

:func:`evaluate` is the same as ATen operations: the other paths (the PyTorch backend, dense
products, wide channel blocks) take its weights and slopes. First derivatives only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._weight_slopes import WeightSlopes

__all__ = ["WeightTable", "table_geometry", "locate", "evaluate"]


class WeightTable(NamedTuple):
    """``table [K, 4, W]``: per interval the cubic's coefficients (constants); ``geometry [2]``:
    the cutoff ``r_max`` and the intervals per unit of ``t``, ``K / r_max``, in the table's dtype
    (:func:`table_geometry`); ``t [R]``: each weight row's variable, through which the gradient
    flows."""

    table: torch.Tensor
    geometry: torch.Tensor
    t: torch.Tensor


def table_geometry(intervals: int, r_max: float, dtype: torch.dtype, device=None) -> torch.Tensor:
    """``[2]``: ``(r_max, intervals / r_max)`` in ``dtype``, for :class:`WeightTable`."""
    return torch.tensor([r_max, intervals / r_max], dtype=dtype, device=device)


def locate(table: torch.Tensor, geometry, t: torch.Tensor):
    """Each ``t``'s place in ``table``: ``(s [n, 1], (c0, c1, c2, c3) [n, W] each, inside [n, 1])``,
    ``s`` differentiable in ``t`` (``t K / r_max - k``), ``inside`` where ``t < r_max``. From
    ``r_max`` on (padding edges) the last interval's end is evaluated, to be masked: no cubic of
    a far ``t``, whose powers could overflow into the masked gradient. ``geometry``:
    :func:`table_geometry`'s tensor, or the same two numbers as Python floats."""
    r_max, scale = geometry[0], geometry[1]
    x = t.clamp(max=r_max) * scale
    k = x.detach().floor().clamp(0, table.shape[0] - 1)
    return (x - k)[:, None], table.index_select(0, k.long()).unbind(1), (t < r_max)[:, None]


def evaluate(weight_table: WeightTable) -> tuple[torch.Tensor, WeightSlopes]:
    """``(w [R, W], WeightSlopes(dw/dt [R, W], t))``: the table's weights and slopes at ``t`` as
    constants, zero from ``r_max`` on (the kernels' ``W_TABLE`` as ATen operations). The geometry
    may also be :func:`locate`'s Python floats."""
    table, geometry, t = weight_table
    with torch.no_grad():
        s, (c0, c1, c2, c3), inside = locate(table, geometry, t)
        zero = torch.zeros((), dtype=table.dtype, device=table.device)
        w = torch.where(inside, c0 + s * (c1 + s * (c2 + s * c3)), zero)
        slope = torch.where(inside, (c1 + s * (2 * c2 + 3 * s * c3)) * geometry[1], zero)
    return w, WeightSlopes(slope, t)
