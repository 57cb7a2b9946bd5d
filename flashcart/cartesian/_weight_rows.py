"""Weights shared by several edges: edge ``e`` reads row ``index[e]`` of ``w [R, W]``.

A tensor product may read its per-edge weights through an index (``WeightRows``), so that a
weight row computed once serves several edges: the two edges of a pair of reverse edges share
one radial-MLP row (:mod:`flashcart.nn.edge_pairs`). The Triton kernels read the row through the
index in place (no ``[E, W]`` gather); the PyTorch backend gathers it.

The gradient of row ``r`` is the sum of the per-edge gradients of the edges listed in
``edges[r]`` (at most two; ``-1`` for none). A row lists every edge reading it, or none (a row
whose gradient the caller knows to be unused: a constant row, listed as ``[-1, -1]``). The Triton
kernels add each listed edge's gradient into its row (two additions into zero: the same result in
either order), or with ``FLASHCART_WEIGHT_ROW_SUM=pass`` a separate pass sums the two known rows
of the per-edge gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["WeightRows", "gather_weight_rows", "listed_edges", "weight_rows_sum"]


class WeightRows(NamedTuple):
    """``index [E]`` int64: the weight row of each edge; ``edges [R, 2]`` int64: the edges whose
    gradients each row sums (``-1``: none)."""

    index: torch.Tensor
    edges: torch.Tensor


def weight_rows_sum(g: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """``[R, W]``: row ``r`` is ``g[edges[r, 0]] + g[edges[r, 1]]`` (``-1`` entries add nothing),
    for per-edge gradients ``g [E, W]``. Differentiable (plain tensor operations)."""
    picked = g.index_select(0, edges.clamp(min=0).reshape(-1)).view(edges.shape[0], 2, g.shape[1])
    return torch.where((edges >= 0).unsqueeze(-1), picked, 0).sum(1)


def listed_edges(edges: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``[E]`` bool: whether edge ``e`` is among the edges its row ``index[e]`` lists."""
    e = torch.arange(index.shape[0], device=index.device, dtype=index.dtype)
    return (edges.index_select(0, index) == e[:, None]).any(1)


def gather_weight_rows(w: torch.Tensor, rows: WeightRows) -> torch.Tensor:
    """``[E, W]``: each edge's weight row (the PyTorch backend's reading of ``rows``). Rows that
    list no edge pass no gradient, as in the Triton kernels; a listed row's gradient is the sum
    over every edge reading it (the kernels' sum over the listed ones: the same whenever a row
    lists all its readers or none, as :mod:`flashcart.nn.edge_pairs` does). The mask is applied
    to the ``R`` rows, not to the ``E`` gathered ones: on the CPU an edge mask made the
    second-order training step 1.24x slower than one row per edge (RESULTS.md). Plain tensor
    operations (a custom ``autograd.Function`` here gave wrong second derivatives under
    ``torch.compile``)."""
    listed = (rows.edges >= 0).any(1, keepdim=True)
    return torch.where(listed, w, w.detach()).index_select(0, rows.index)
