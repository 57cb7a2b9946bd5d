"""Batching: fixed structure counts or dynamic atom/edge budgets, seeded per-epoch shuffles,
per-rank shards for data-parallel training, optional worker processes for collation."""

from __future__ import annotations

import functools
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


def _split(indices: list[int], parts: int) -> list[list[int]]:
    """``indices`` cut into ``parts`` contiguous pieces whose sizes differ by at most one."""
    q, r = divmod(len(indices), parts)
    out, start = [], 0
    for p in range(parts):
        size = q + (p < r)
        out.append(indices[start : start + size])
        start += size
    return out


class BatchLoader:
    """Iterate :class:`Batch` objects over structures.

    Args:
        structures: the data.
        batch_size: structures per batch, or the target count with ``dynamic`` (per process).
        z_to_type: atomic number -> type index (the model's ``z_to_type``).
        dynamic: fill batches up to atom and edge budgets (:func:`budgets_for`) instead of a
            fixed count; a structure larger than a budget gets a batch of its own.
        shuffle: reshuffle each epoch with ``seed + epoch`` (the same order on every rank).
        drop_last: drop a final incomplete batch (fixed mode; with several ranks, a final
            step with fewer than ``world_size x batch_size`` structures). The number dropped
            is in :attr:`dropped`.
        rank, world_size: this process's shard. With ``equal_steps`` (training) the batches
            of the epoch are dealt out in steps of ``world_size`` consecutive batches, rank
            ``r`` taking the ``r``-th of each, so every rank runs the same number of steps and
            the union of one step's batches is what one process with ``world_size x
            batch_size`` would batch (fixed mode). A last step with fewer batches than ranks
            has its structures split evenly over the ranks; if it has fewer structures than
            ranks they join the previous step's batches. Nothing is dropped unless
            ``drop_last``. Without ``equal_steps`` (evaluation) rank ``r`` takes batches
            ``r, r + world_size, ...``.
        n_workers: worker processes that collate batches (0: in this process).
        pin_memory: give batches in page-locked memory (needs CUDA), so that copying them to
            the GPU does not wait for the GPU's queued work: the next batch is collated and
            sent while the GPU still computes the current step.
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
        rank: int = 0,
        world_size: int = 1,
        equal_steps: bool = True,
        n_workers: int = 0,
        pin_memory: bool = False,
    ):
        if not structures:
            raise ValueError("no structures to batch")
        if pin_memory and not torch.cuda.is_available():
            raise ValueError("pin_memory=True needs CUDA (page-locked memory is for copies to a GPU)")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        if equal_steps and len(structures) < world_size:
            raise ValueError(f"{len(structures)} structures cannot give each of {world_size} processes a batch")
        self.structures, self.batch_size, self.z_to_type = structures, batch_size, z_to_type
        self.dynamic, self.shuffle, self.seed, self.drop_last = dynamic, shuffle, seed, drop_last
        self.rank, self.world_size, self.equal_steps, self.n_workers = rank, world_size, equal_steps, n_workers
        self.pin_memory = pin_memory
        self.max_atoms, self.max_edges = budgets_for(structures, batch_size) if dynamic else (None, None)
        self.epoch, self.dropped = 0, 0
        self._workers = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.structures)))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.structures), generator=g).tolist()

    def _batches(self) -> list[list[int]]:
        """All batches of the epoch, as one process with this ``batch_size`` forms them."""
        order = self._order()
        self.dropped = 0
        if not self.dynamic:
            if self.drop_last:
                step = self.batch_size * (self.world_size if self.equal_steps else 1)
                keep = len(order) // step * step
                self.dropped = len(order) - keep
                order = order[:keep]
            return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
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

    def steps(self) -> list[list[list[int]]]:
        """Structure indices of every step of the epoch, one list per rank (``equal_steps``)."""
        n = self.world_size
        batches = self._batches()
        steps = [batches[i : i + n] for i in range(0, len(batches), n)]
        if steps and len(steps[-1]) < n:
            last = [i for b in steps.pop() for i in b]
            if len(last) >= n:
                steps.append(_split(last, n))
            elif steps:
                for j, i in enumerate(last):
                    steps[-1][j].append(i)
            elif last:
                raise ValueError(f"{len(last)} structures cannot give each of {n} processes a batch")
        return steps

    def index_batches(self) -> list[list[int]]:
        """Structure indices of this rank's batches of the current epoch."""
        if self.world_size == 1:
            return self._batches()
        if self.equal_steps:
            return [step[self.rank] for step in self.steps()]
        return self._batches()[self.rank :: self.world_size]

    def __len__(self) -> int:
        return len(self.index_batches())

    def __iter__(self) -> Iterator[Batch]:
        if self.n_workers == 0:
            for idx in self.index_batches():
                batch = collate([self.structures[i] for i in idx], self.z_to_type)
                yield batch.pin_memory() if self.pin_memory else batch
            return
        if self._workers is None:
            self._workers = torch.utils.data.DataLoader(
                self.structures,
                batch_sampler=_EpochBatches(self),
                collate_fn=functools.partial(_collate, z_to_type=self.z_to_type),
                num_workers=self.n_workers,
                persistent_workers=True,
                pin_memory=self.pin_memory,
            )
        yield from self._workers


class _EpochBatches:
    """The loader's current index batches as a batch sampler (read at each epoch's start)."""

    def __init__(self, loader: BatchLoader):
        self.loader = loader

    def __iter__(self):
        return iter(self.loader.index_batches())

    def __len__(self) -> int:
        return len(self.loader)


def _collate(structures: list[Structure], z_to_type: torch.Tensor) -> Batch:
    return collate(structures, z_to_type)
