"""Radial MLPs tabulated for inference: path weights as piecewise cubics of the edge length.

An element-agnostic interaction's path weights depend on the edge length ``d`` alone:
``w(d) = MLP(basis(d) * env(d))``, ``R -> R^W``. With frozen parameters that function can be
tabulated once. :func:`cubic_table` samples it in float64 at ``K + 1`` knots ``k h``
(``h = r_max / K``): values and derivatives (forward-mode AD), the cubic Hermite interpolant
between them. Per interval it stores the cubic's four coefficients in ``s = d / h - k``
(``[K, 4, W]``). Stored this way, each coefficient's rounding error stays relative to its own
size. Rounded knot values would instead put their ulps, divided by ``h``, into the derivative.

:func:`table_weights` evaluates the table at a call's lengths as ATen operations: a gather of
each length's interval row, Horner's rule, zero from ``r_max`` on. In a compiled call that is
one fused gather kernel, instead of three products and the activations between them. Autograd
differentiates the cubic, so forces are the exact derivative of the tabulated energy: the
interpolant is C1 and energy is conserved. Eager calls with tables compute the edge features
with ATen operations: the fused edge kernels (:mod:`flashcart.nn.edge_kernels`) do not return
the lengths the tables read.

Accuracy, measured by ``benchmarks/radial_table.py`` (i2c3f20l2r's two interactions, maximum
error over 200,000 random lengths, relative to the largest ``|w|`` and ``|w'|``):
- ``K = 4096``, float32 table evaluated in float32: values 4.0-6.1e-7, derivatives 0.7-1.2e-6,
  also with the weights x3. That is under the float32 MLP's own error, 1.1-1.7e-6 and
  1.2-2.1e-6.
- ``K = 4096``, float64: 2e-12 and 1.4e-9.

:func:`table_weights_and_slopes` gives the same weights and their derivatives in ``d`` as
constants. Interactions pass both to the products (:class:`~flashcart.cartesian.WeightSlopes`),
whose Triton backward contracts each edge's weight gradient with the slopes in its kernels and
returns each pair's length gradient: the weights' gradient ``[P, W]`` is never written. The
first derivatives are the same; ``FLASHCART_TABLE_SLOPES=0`` (:func:`table_slopes_enabled`)
differentiates :func:`table_weights` with autograd instead, which also gives second derivatives.

Inference only. The MLPs get no gradient through a table, and a table is stale once they change
(:meth:`FlashCartPotential.set_radial_tables <flashcart.model.FlashCartPotential.set_radial_tables>`
rebuilds them).
"""

from __future__ import annotations

from typing import Callable

import torch

from .._env import env_switch
from ..cartesian._weight_table import WeightTable, evaluate, locate
from .fusion_barrier import realized

__all__ = ["cubic_table", "table_weights", "table_weights_and_slopes", "table_slopes_enabled", "table_kernel_enabled", "MIN_INTERVALS"]

MIN_INTERVALS = 16


def table_slopes_enabled() -> bool:
    """``FLASHCART_TABLE_SLOPES`` (``1``, the default, or ``0``): whether interactions pass the
    products their tabulated weights with the slopes ``dw/dd`` (:func:`table_weights_and_slopes`,
    the products' backward contracts the two per edge), or as a function autograd differentiates
    (:func:`table_weights`: the weights' gradient ``[P, W]`` written, then read back). Anything
    else is an error naming the variable."""
    return env_switch("FLASHCART_TABLE_SLOPES")


def table_kernel_enabled() -> bool:
    """``FLASHCART_TABLE_KERNEL`` (``1``, the default, or ``0``): with the slopes on
    (:func:`table_slopes_enabled`), whether interactions pass the products their table itself
    (:class:`~flashcart.cartesian.WeightTable`: a convolution's Triton kernels evaluate the cubic
    per edge, no weights ``[E, W]`` written), or the weights and slopes evaluated with ATen
    operations (:func:`table_weights_and_slopes`). Anything else is an error naming the variable."""
    return env_switch("FLASHCART_TABLE_KERNEL")


def cubic_table(fn: Callable[[torch.Tensor], torch.Tensor], r_max: float, intervals: int) -> torch.Tensor:
    """``[intervals, 4, W]`` float64: the cubic Hermite interpolant of ``fn`` (``[n] Å -> [n, W]``,
    evaluated here in float64 on the CPU) on ``intervals`` equal intervals of ``[0, r_max]``;
    per interval the coefficients ``c0..c3`` of ``c0 + c1 s + c2 s^2 + c3 s^3``, ``s`` in ``[0, 1]``."""
    if intervals < MIN_INTERVALS:
        raise ValueError(f"a radial table needs at least {MIN_INTERVALS} intervals, got {intervals}")
    h = r_max / intervals
    knots = torch.arange(intervals + 1, dtype=torch.float64) * h
    with torch.no_grad(), torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(knots, torch.ones_like(knots))
        out = torch.autograd.forward_ad.unpack_dual(fn(dual))
    y, m = out.primal, out.tangent * h  # slopes per unit of s
    y0, y1, m0, m1 = y[:-1], y[1:], m[:-1], m[1:]
    return torch.stack([y0, m0, 3 * (y1 - y0) - 2 * m0 - m1, 2 * (y0 - y1) + m0 + m1], dim=1)


def _geometry(table: torch.Tensor, r_max: float) -> tuple[float, float]:
    """The table's cutoff and intervals per Å (:func:`flashcart.cartesian._weight_table.locate`)."""
    return r_max, table.shape[0] / r_max


def table_weights(table: torch.Tensor, r_max: float, d: torch.Tensor) -> torch.Tensor:
    """``[n, W]``: the tabulated function at lengths ``d`` ``[n]`` (Å), zero from ``r_max`` on,
    differentiable in ``d``. ``table``: :func:`cubic_table`'s, in ``d``'s dtype."""
    # compiled calls: the lengths stored once, not recomputed for each of the W weights
    s, (c0, c1, c2, c3), inside = locate(table, _geometry(table, r_max), realized(d))
    w = c0 + s * (c1 + s * (c2 + s * c3))
    return torch.where(inside, w, torch.zeros((), dtype=w.dtype, device=w.device))


def table_weights_and_slopes(table: torch.Tensor, r_max: float, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w, dw/dd)``, each ``[n, W]``: :func:`table_weights` and its derivative in ``d`` (per Å),
    both constants (no autograd graph), zero from ``r_max`` on. For the products'
    ``weight_slopes`` (:class:`~flashcart.cartesian.WeightSlopes` with ``t = d``): the same first
    derivatives as differentiating :func:`table_weights`."""
    w, (slopes, _) = evaluate(WeightTable(table, _geometry(table, r_max), realized(d)))
    return w, slopes
