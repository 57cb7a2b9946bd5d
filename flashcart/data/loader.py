"""Batching: fixed structure counts or dynamic atom/edge budgets, seeded per-epoch shuffles."""

from __future__ import annotations

import math
from typing import Iterator

import torch

from .batch import Batch, Structure, collate

__all__ = ["BatchLoader", "budgets_for"]


def budgets_for(structures: list[Structure], target: int) -> tuple[int, int]:
    """Atom and edge budgets of about ``1.1 x target x`` the mean atoms and edges per structure."""
    mean_atoms = sum(s.n_atoms for s in structures) / len(structures)
    mean_edges = sum(s.n_edges for s in structures) / len(structures)
    return max(1, math.ceil(1.1 * target * mean_atoms)), max(1, math.ceil(1.1 * target * mean_edges))


class BatchLoader:
    """Iterate :class:`Batch` objects over structures.

    Args:
        structures: the data.
        batch_size: structures per batch, or the target count with ``dynamic``.
        z_to_type: atomic number -> type index (the model's ``z_to_type``).
        dynamic: fill batches up to atom and edge budgets (:func:`budgets_for`) instead of a
            fixed count; a structure larger than a budget gets a batch of its own.
        shuffle: reshuffle each epoch with ``seed + epoch``.
        drop_last: drop a final batch with fewer than ``batch_size`` structures (fixed mode).
    """

    def __init__(
        self,
        structures: list[Structure],
        batch_size: int,
        z_to_type: torch.Tensor,
        dynamic: bool = False,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
    ):
        if not structures:
            raise ValueError("no structures to batch")
        self.structures, self.batch_size, self.z_to_type = structures, batch_size, z_to_type
        self.dynamic, self.shuffle, self.seed, self.drop_last = dynamic, shuffle, seed, drop_last
        self.max_atoms, self.max_edges = budgets_for(structures, batch_size) if dynamic else (None, None)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.structures)))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.structures), generator=g).tolist()

    def index_batches(self) -> list[list[int]]:
        """Structure indices of each batch of the current epoch."""
        order = self._order()
        if not self.dynamic:
            out = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
            if self.drop_last and out and len(out[-1]) < self.batch_size:
                out.pop()
            return out
        out, cur, atoms, edges = [], [], 0, 0
        for i in order:
            s = self.structures[i]
            if cur and (atoms + s.n_atoms > self.max_atoms or edges + s.n_edges > self.max_edges):
                out.append(cur)
                cur, atoms, edges = [], 0, 0
            cur.append(i)
            atoms += s.n_atoms
            edges += s.n_edges
        if cur:
            out.append(cur)
        return out

    def __len__(self) -> int:
        return len(self.index_batches())

    def __iter__(self) -> Iterator[Batch]:
        for idx in self.index_batches():
            yield collate([self.structures[i] for i in idx], self.z_to_type)
