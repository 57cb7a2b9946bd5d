"""Structures as tensors, and batches of them as one disconnected graph."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

__all__ = ["Structure", "Batch", "collate"]


@dataclass
class Structure:
    """One labelled structure with its neighbour list.

    positions ``[n, 3]`` Å; numbers ``[n]``; cell ``[3, 3]`` Å (zeros if not periodic);
    pbc ``[3]``; receivers/senders ``[E]`` sorted by receiver; shifts ``[E, 3]`` image
    offsets; energy ``[]`` eV, forces ``[n, 3]`` eV/Å, stress ``[3, 3]`` eV/Å^3 (NaN when
    the frame has none); ``source`` names the file and frame for error messages.
    """

    positions: torch.Tensor
    numbers: torch.Tensor
    cell: torch.Tensor
    pbc: torch.Tensor
    receivers: torch.Tensor
    senders: torch.Tensor
    shifts: torch.Tensor
    energy: torch.Tensor
    forces: torch.Tensor
    stress: torch.Tensor
    source: str = ""

    @property
    def n_atoms(self) -> int:
        return self.positions.shape[0]

    @property
    def n_edges(self) -> int:
        return self.receivers.shape[0]


@dataclass
class Batch:
    """Concatenated structures. ``batch [N]`` and ``edge_batch [E]`` give the graph of each
    atom and edge; ``types [N]`` are model type indices; labels as in :class:`Structure`
    stacked per graph (``energy [G]``, ``forces [N, 3]``, ``stress [G, 3, 3]``)."""

    positions: torch.Tensor
    numbers: torch.Tensor
    types: torch.Tensor
    cell: torch.Tensor
    receivers: torch.Tensor
    senders: torch.Tensor
    shifts: torch.Tensor
    batch: torch.Tensor
    edge_batch: torch.Tensor
    n_atoms: torch.Tensor
    energy: torch.Tensor
    forces: torch.Tensor
    stress: torch.Tensor
    n_graphs: int

    def to(self, device=None, dtype=None) -> "Batch":
        """Move tensors; floating tensors also take ``dtype``."""
        changes = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                changes[f.name] = v.to(device=device, dtype=dtype if v.is_floating_point() and dtype else None, non_blocking=True)
        return replace(self, **changes)

    def pin_memory(self) -> "Batch":
        """The batch in page-locked host memory, so ``to(cuda)`` copies without blocking the host
        (``torch.utils.data.DataLoader(pin_memory=True)`` calls this)."""
        return replace(
            self, **{f.name: getattr(self, f.name).pin_memory() for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}
        )


def collate(structures: list[Structure], z_to_type: torch.Tensor) -> Batch:
    """Concatenate structures into one :class:`Batch` (edges stay grouped by receiver)."""
    n = torch.tensor([s.n_atoms for s in structures])
    offsets = torch.cumsum(n, 0) - n
    numbers = torch.cat([s.numbers for s in structures])
    z_to_type = z_to_type.to(numbers.device)  # structures may have been built on the model's device
    types = z_to_type[numbers]
    if bool((types < 0).any()):
        for s in structures:
            bad = z_to_type[s.numbers] < 0
            if bool(bad.any()):
                from ase.data import chemical_symbols

                syms = sorted({chemical_symbols[int(z)] for z in s.numbers[bad]})
                raise ValueError(f"{s.source}: elements {syms} are not among the model's elements")
    edge_counts = torch.tensor([s.n_edges for s in structures])
    return Batch(
        positions=torch.cat([s.positions for s in structures]),
        numbers=numbers,
        types=types,
        cell=torch.stack([s.cell for s in structures]),
        receivers=torch.cat([s.receivers + o for s, o in zip(structures, offsets.tolist())]),
        senders=torch.cat([s.senders + o for s, o in zip(structures, offsets.tolist())]),
        shifts=torch.cat([s.shifts for s in structures]),
        batch=torch.repeat_interleave(torch.arange(len(structures)), n),
        edge_batch=torch.repeat_interleave(torch.arange(len(structures)), edge_counts),
        n_atoms=n,
        energy=torch.stack([s.energy for s in structures]),
        forces=torch.cat([s.forces for s in structures]),
        stress=torch.stack([s.stress for s in structures]),
        n_graphs=len(structures),
    )
