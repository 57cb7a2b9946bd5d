"""Feature layout: rank blocks ``(2l+1, paths_l, F)`` concatenated by increasing rank."""

from __future__ import annotations

import torch

from ._components import dim

__all__ = ["split_ranks", "layout_width", "edge_csr"]


def layout_width(l_max: int, n_features: int, n_paths: list[int] | None = None) -> int:
    """Width of a feature row: ``sum_l (2l+1) * paths_l * F``."""
    paths = [1] * (l_max + 1) if n_paths is None else n_paths
    return sum(dim(l) * p for l, p in enumerate(paths)) * n_features


def split_ranks(x: torch.Tensor, l_max: int, n_features: int, n_paths: list[int] | None = None) -> list[torch.Tensor]:
    """Views ``[rows, 2l+1, paths_l * F]`` of each rank block of ``x: [rows, width]``."""
    paths = [1] * (l_max + 1) if n_paths is None else n_paths
    out, start = [], 0
    for l, p in enumerate(paths):
        size = dim(l) * p * n_features
        out.append(x[:, start : start + size].reshape(x.shape[0], dim(l), p * n_features))
        start += size
    return out


def edge_csr(receivers: torch.Tensor, senders: torch.Tensor, n_nodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rowptr, perm, srowptr)``: receiver CSR, edges sorted by sender, and sender CSR.

    Edges must be sorted by receiver (ascending). Shapes ``[n_nodes + 1]``, ``[E]``, ``[n_nodes + 1]``.
    Static shapes only (``torch.compile``-friendly).

    Row pointers are binary searches of the sorted indices, not counts: an integer
    ``index_add`` has no atomic kernel in inductor, which falls back to ATen's sort-based
    ``index_put_`` (two radix sorts and an ``indexing_backward_kernel`` per call on the H200).
    """
    nodes = torch.arange(n_nodes + 1, dtype=receivers.dtype, device=receivers.device)
    rowptr = torch.searchsorted(receivers, nodes)
    sorted_senders, perm = torch.sort(senders, stable=True)
    srowptr = torch.searchsorted(sorted_senders, nodes)
    return rowptr, perm, srowptr
