"""The model as exported: a frozen copy with a chosen backend, dtype and device."""

from __future__ import annotations

import torch

from ..model.potential import FlashCartPotential

__all__ = ["frozen_copy", "structure_energy"]


def frozen_copy(model: FlashCartPotential, dtype: torch.dtype, device: torch.device | str, use_triton: bool = False) -> FlashCartPotential:
    """A copy of ``model`` (same weights) in ``dtype`` on ``device``, in eval mode, parameters frozen.

    ``use_triton=False`` builds it with the generated PyTorch backend, so graphs traced from
    it contain only standard torch operations; ``True`` keeps Triton for CUDA tensors.
    """
    options = {**model.options, "use_triton": use_triton}
    avg = float(model.avg_neighbors) if hasattr(model, "avg_neighbors") else 1.0
    copy = FlashCartPotential(list(model.elements), avg_neighbors=avg, **options)
    copy = copy.to(device=device, dtype=dtype)  # before loading: no rounding through the default dtype
    copy.load_state_dict(model.state_dict())
    copy.eval()
    copy.requires_grad_(False)
    # one radial-MLP row per edge: the pair grouping checks its list eagerly, which a traced
    # graph cannot (flashcart.nn.edge_pairs)
    copy.radial_pairs = False
    return copy


def structure_energy(
    model: FlashCartPotential,
    positions: torch.Tensor,
    types: torch.Tensor,
    cell: torch.Tensor,
    shifts: torch.Tensor,
    receivers: torch.Tensor,
    senders: torch.Tensor,
    free: torch.Tensor | None = None,
) -> torch.Tensor:
    """Energy ``[]`` (eV) of one structure: positions ``[N, 3]`` Å, types ``[N]``, cell ``[1, 3, 3]`` Å,
    image shifts ``[E, 3]`` (multiples of the lattice vectors), receivers/senders ``[E]`` grouped by receiver.

    Inert edges (an atom to itself, in an extra graph whose cell moves it beyond the cutoff,
    where envelope and radial weights are exactly zero, as for the Predictor's padding edges)
    contribute nothing. ``free`` (``[E]`` bool): the edge slots that hold no pair (a
    fixed-capacity list's free slots, receiver and sender the same atom) are made inert.
    Without it, one inert edge is put first (atom 0 to itself), so a structure without any
    pair within the cutoff (isolated atoms) has the energy of its isolated atoms instead of an
    empty edge list.
    """
    far = torch.eye(3, dtype=cell.dtype, device=cell.device) * (2.0 * model.r_max + 1.0)
    cells = torch.cat([cell, far[None]])
    if free is not None:
        shifts = torch.where(free[:, None], far[:1] / far[0, 0], shifts)  # (1, 0, 0) in the far cell
        return model.site_energies(positions, types, cells, shifts, receivers, senders, free.long()).sum()
    zero = torch.zeros(1, dtype=receivers.dtype, device=receivers.device)
    # the inert edge's graph index, then zeros: built from the unpadded receivers, not by slicing
    # the padded ones (torch 2.11's inductor fails to lower a slice of a data-dependent size,
    # KeyError 'unbacked_bindings', with the binned search's pair count)
    edge_batch = torch.cat([zero + 1, torch.zeros_like(receivers)])
    receivers = torch.cat([zero, receivers])
    senders = torch.cat([zero, senders])
    shifts = torch.cat([far[:1] / far[0, 0], shifts])  # (1, 0, 0) in the far cell
    # The sum of the site energies, not the model's per-graph index_add: with the graph index a
    # constant zero, inductor (torch 2.11, CUDA, the Triton package) lowered that index_add to an
    # atomic add without its mask, so the lanes past the last atom of the last block each added
    # the first element's offset (-0.5 eV x 7 on a 9-atom molecule). A reduction has no such path.
    return model.site_energies(positions, types, cells, shifts, receivers, senders, edge_batch).sum()
