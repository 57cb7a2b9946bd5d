"""Product weights given as a function of one variable per weight row, with their slopes.

A tabulated radial MLP (:mod:`flashcart.nn.radial_table`) gives each pair of reverse edges its
weights ``w(t) [W]`` as a function of the pair's length ``t``. The products then need only
``t``'s gradient, ``sum_k dE/dw_k * dw_k/dt``, not the weights' gradient ``[R, W]``. Passing the
values ``w`` and slopes ``dw/dt`` as constants with ``t`` lets the Triton backward contract the
two per edge inside its kernels (``W_SLOPE``) instead of writing the weights' gradient, zeroing
it first and reading it back.

:func:`apply_weight_slopes` is the same thing as an expression for autograd: the values, plus the
slopes times ``t - t.detach()`` (zero, but with derivative ``ws`` in ``t``). Every other path (the
PyTorch backend, dense products, wide channel blocks) uses it. Both give exact first
derivatives; the slopes' own derivative is not given, so they carry no second derivative in
``t``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["WeightSlopes", "apply_weight_slopes"]


class WeightSlopes(NamedTuple):
    """``slopes [R, W]``: ``dw/dt`` of each weight row (a constant, laid out as the weights);
    ``t [R]``: each row's variable, through which the gradient flows."""

    slopes: torch.Tensor
    t: torch.Tensor


def apply_weight_slopes(weights: torch.Tensor, weight_slopes: WeightSlopes | tuple) -> torch.Tensor:
    """``[R, W]``: ``weights`` (constants) with first derivative ``slopes`` in ``t``: equal in
    value, differentiable in ``t`` to first order."""
    slopes, t = weight_slopes
    return weights + (t - t.detach()).unsqueeze(-1) * slopes
