"""Neighbour lists inside exported graphs (TorchScript-compatible plain torch code).

Exported files compute their own neighbour list on every call: all pairs ``(i, j, image)``
with ``|x_j - x_i + image| < cutoff`` over a table of periodic images, by a dense distance
test (``[N, S, N]``) and ``nonzero``. Edges come out grouped by receiver, as the model
needs. Positions are first wrapped into the cell along periodic directions (a shift by
lattice vectors: it changes neither the energy nor ``d energy / d positions``), so the
image range that the cell's face distances call for is always enough.

:func:`binned_pair_list` finds the same pairs in time linear in the atom count: atoms are
sorted into bins at least one cutoff wide, and each atom tests only the atoms of the
neighbouring bins (``.pt2`` packages; the dense test's time grows as N² x images).

:func:`fixed_pair_list` finds them, by either search, into ``N * edges_per_atom`` slots
(:func:`fixed_slots`) with bins of a fixed capacity. It has no data-dependent size, so it never
synchronises with the host (fixed-capacity ``.pt2`` packages). What does not fit is reported
by a flag.

Units are those of the caller (Å inside FlashCart's graphs); shapes as documented.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "reciprocal_rows",
    "images_needed",
    "image_table",
    "wrap_positions",
    "pair_list",
    "binned_pair_list",
    "fullest_bin",
    "fixed_slots",
    "fixed_pair_list",
    "SEARCHES",
    "check_search",
]

# The exported files' neighbour searches: binned_pair_list and pair_list.
SEARCHES = ("cells", "all-pairs")


def check_search(neighbours: str) -> str:
    """``neighbours`` if it names one of :data:`SEARCHES`, else a ``ValueError`` naming it."""
    if neighbours not in SEARCHES:
        raise ValueError(f"neighbours must be {' or '.join(SEARCHES)}, got {neighbours!r}")
    return neighbours


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
    idx = _pair_mask(positions, offsets, allowed, cutoff).nonzero()
    return idx[:, 0], idx[:, 2], idx[:, 1]


def _pair_mask(positions: Tensor, offsets: Tensor, allowed: Tensor, cutoff: float) -> Tensor:
    """``[N, S, N]`` bool: receiver ``i``, image ``s``, sender ``j`` within ``cutoff`` (arguments
    of :func:`pair_list`)."""
    n = positions.shape[0]
    s = offsets.shape[0]
    d = positions[None, None, :, :] + offsets[None, :, None, :] - positions[:, None, None, :]  # [N, S, N, 3]
    r2 = (d * d).sum(-1)
    zero_image = torch.arange(s, device=positions.device) == s // 2
    itself = torch.eye(n, dtype=torch.bool, device=positions.device)[:, None, :] & zero_image[None, :, None]
    return (r2 < cutoff * cutoff) & allowed[None, :, None] & ~itself


def _bin_candidates(
    positions: Tensor,
    cell: Tensor,
    recip: Tensor,
    periodic: Tensor,
    max_images: tuple[int, int, int],
    cutoff: float,
    width: int | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The binned search's candidates (see :func:`binned_pair_list`): ``(j [N, O, W] candidate
    atoms, image [N, O, 3] their lattice images, mask [N, O, W] those within the cutoff, fullest
    [] the most atoms any tested bin holds, limit [3] max_images as a tensor)``.

    ``width=None``: ``W`` is ``fullest`` (a data-dependent size: a synchronisation on a GPU);
    an int: ``W`` is that capacity (static shapes; bins holding more atoms than ``W`` lose the
    rest, which ``fullest > W`` reports)."""
    n = positions.shape[0]
    dev, dtype = positions.device, positions.dtype
    frac = positions @ recip.T  # [N, 3]
    face = 1.0 / torch.linalg.vector_norm(recip, dim=1)  # [3] distance between opposite faces
    lo = torch.where(periodic, torch.zeros_like(face), frac.min(dim=0).values)
    span = torch.where(periodic, torch.ones_like(face), (frac.max(dim=0).values - lo).clamp_min(1e-12))
    # bins a little wider than the cutoff, so rounding in the fractional coordinates (float32)
    # cannot put a pair within the cutoff two bins apart; at most 2**20 per axis (a huge, sparse
    # non-periodic extent gets wider bins, never an int64 overflow of the bin id)
    nb = torch.floor(span * face / (cutoff * (1.0 + 1e-4))).clamp(1, 1048576).to(torch.int64)  # [3]
    b = torch.floor((frac - lo) / span * nb.to(dtype)).to(torch.int64)
    b = torch.minimum(b.clamp_min(0), nb - 1)  # [N, 3]; rounding at the faces stays inside
    ids = (b[:, 0] * nb[1] + b[:, 1]) * nb[2] + b[:, 2]
    sorted_ids, order = torch.sort(ids)
    offsets = image_table(max(1, max_images[0]), max(1, max_images[1]), max(1, max_images[2]), torch.int64, dev)  # [O, 3]
    target = b[:, None, :] + offsets[None, :, :]  # [N, O, 3] bins, before wrapping
    image = torch.where(periodic, torch.div(target, nb, rounding_mode="floor"), torch.zeros_like(target))
    inside = target - image * nb  # [N, O, 3] bins in the cell
    limit = torch.tensor([max_images[0], max_images[1], max_images[2]], dtype=torch.int64, device=dev)
    ok = torch.where(periodic, image.abs() <= limit, (target >= 0) & (target < nb)).all(dim=-1)  # [N, O]
    tid = (inside[..., 0] * nb[1] + inside[..., 1]) * nb[2] + inside[..., 2]
    tid = torch.where(ok, tid, torch.zeros_like(tid)).reshape(-1)
    start = torch.searchsorted(sorted_ids, tid).reshape(n, -1)
    count = torch.where(ok, torch.searchsorted(sorted_ids, tid, right=True).reshape(n, -1) - start, torch.zeros_like(start))
    fullest = count.max()
    if width is None:
        width = fullest.item()  # the most atoms any (atom, bin) pair tests (data-dependent under tracing)
        if not torch.jit.is_scripting():
            torch._check(width >= 0)
    slot = torch.arange(width, device=dev)
    j = order.index_select(0, (start[:, :, None] + slot).clamp(max=n - 1).reshape(-1)).reshape(n, -1, width)  # [N, O, W]
    shift = image.to(dtype) @ cell  # [N, O, 3]
    d = positions.index_select(0, j.reshape(-1)).reshape(n, -1, width, 3) + shift[:, :, None, :] - positions[:, None, None, :]
    r2 = (d * d).sum(-1)
    itself = (j == torch.arange(n, device=dev)[:, None, None]) & (image == 0).all(dim=-1)[:, :, None]
    mask = (slot < count[:, :, None]) & (r2 < cutoff * cutoff) & ~itself
    return j, image, mask, fullest, limit


def _image_index(img: Tensor, limit: Tensor) -> Tensor:
    """Row of ``image_table(*limit)`` of each lattice image ``img [E, 3]``."""
    side = 2 * limit + 1
    shifted = img + limit
    return (shifted[:, 0] * side[1] + shifted[:, 1]) * side[2] + shifted[:, 2]


def binned_pair_list(
    positions: Tensor, cell: Tensor, recip: Tensor, periodic: Tensor, max_images: tuple[int, int, int], cutoff: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The pairs of :func:`pair_list` (over ``image_table(*max_images)``) found through bins.

    Args:
        positions: ``[N, 3]``, wrapped into the cell along periodic directions
            (:func:`wrap_positions`).
        cell: ``[3, 3]`` lattice vectors (rows); only its periodic rows are used.
        recip: ``[3, 3]`` :func:`reciprocal_rows` of the cell (of any non-singular cell whose
            periodic rows are the lattice vectors: along non-periodic directions it only
            orients the bins).
        periodic: ``[3]`` bool.
        max_images: images on each side along each lattice vector that the pairs may use
            (the caller checks that the structure needs no more).
        cutoff: pairs with distance ``< cutoff``; an atom is never its own neighbour in the zero image.

    Returns ``(receivers [E], senders [E], image index [E])`` into ``image_table(*max_images)``,
    grouped by receiver.

    Along each lattice direction the atoms' fractional range (the unit interval if periodic)
    is cut into ``max(1, floor(length / cutoff))`` bins, so a bin is at least a cutoff wide
    between its faces, except the single bin of a periodic cell thinner than the cutoff, whose
    images the offsets ``-max_images..max_images`` reach. A neighbour within the cutoff is then
    in a bin at most one step (or, in that thin cell, one image) away. Each atom tests every
    atom of the bins at offsets ``-R..R`` (``R = max(1, max_images)`` per direction), up to the
    most populated bin's count (a data-dependent size); offsets past a periodic cell's ends
    wrap into images, past a non-periodic range's ends they are skipped.
    """
    j, image, mask, _, limit = _bin_candidates(positions, cell, recip, periodic, max_images, cutoff, None)
    idx = mask.nonzero()
    receivers, o = idx[:, 0], idx[:, 1]
    senders = j[receivers, o, idx[:, 2]]
    return receivers, senders, _image_index(image[receivers, o], limit)


def fullest_bin(positions: Tensor, cell: Tensor, recip: Tensor, periodic: Tensor, max_images: tuple[int, int, int], cutoff: float) -> int:
    """The most atoms any bin that :func:`binned_pair_list` tests holds (host integer)."""
    return int(_bin_candidates(positions, cell, recip, periodic, max_images, cutoff, 1)[3])


def fixed_slots(mask: Tensor, edges_per_atom: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The true entries of ``mask [N, C]`` (candidate ``c`` of receiver ``i``) in ``N * edges_per_atom``
    edge slots, without a data-dependent size.

    Returns ``(receivers [S], candidate [S], real [S], count [])``: slot ``s`` belongs to
    receiver ``receivers[s]`` (ascending: grouped by receiver) and, where ``real``, holds that
    receiver's candidate ``candidate[s]`` (row order); ``count`` is the number of true entries.
    The ``S - count`` free slots are spread evenly over the receivers, after each one's real
    slots (the receiver-grouped kernels run a receiver's edges in one program, so free slots
    piled on one receiver would make one program the whole kernel's time). With ``count > S``
    the slots hold only part of the entries; the caller reports it.
    """
    n, c = mask.shape[0], mask.shape[1]
    dev = mask.device
    capacity = n * edges_per_atom
    counts = mask.sum(dim=1)  # [N] int64
    total = counts.sum()
    free = (capacity - total).clamp_min(0)
    bounds = (torch.arange(n + 1, device=dev) * free) // n
    rows = counts + (bounds[1:] - bounds[:-1])  # [N] slots per receiver
    row_end = torch.cumsum(rows, 0)
    slots = torch.arange(capacity, device=dev)
    receivers = torch.searchsorted(row_end, slots, right=True).clamp(max=n - 1)
    k = slots - (row_end - rows).index_select(0, receivers)  # slot within its receiver's row
    real = k < counts.index_select(0, receivers)
    rank = (torch.cumsum(counts, 0) - counts).index_select(0, receivers) + k  # among all true entries
    cumulative = torch.cumsum(mask.reshape(-1), 0)  # [N * C]
    flat = torch.searchsorted(cumulative, rank + 1)  # the entry that makes the count rank + 1
    candidate = torch.where(real, flat - receivers * c, torch.zeros_like(flat)).clamp(0, c - 1)
    return receivers, candidate, real, total


def fixed_pair_list(
    positions: Tensor,
    cell: Tensor,
    recip: Tensor,
    periodic: Tensor,
    max_images: tuple[int, int, int],
    cutoff: float,
    edges_per_atom: int,
    atoms_per_bin: int | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The pairs of :func:`binned_pair_list` (``atoms_per_bin`` an int: bins of that capacity)
    or :func:`pair_list` (``None``: all pairs) in :func:`fixed_slots`: static shapes, no
    synchronisation (a package that a CUDA graph can capture).

    Returns ``(receivers [S], senders [S], image index [S], real [S], overflow [])`` with
    ``S = N * edges_per_atom``: the slots that are not ``real`` are free (receiver and sender the
    same atom, image index of the zero image); ``overflow`` (bool) is set when the pairs need
    more slots or a bin holds more atoms than ``atoms_per_bin``, and then the pairs are incomplete.
    """
    n = positions.shape[0]
    table = image_table(*max_images, dtype=positions.dtype, device=positions.device)
    zero_image = table.shape[0] // 2
    if atoms_per_bin is None:
        allowed = ((table == 0) | periodic[None, :]).all(dim=1)
        mask = _pair_mask(positions, table @ cell, allowed, cutoff)
        receivers, candidate, real, count = fixed_slots(mask.reshape(n, -1), edges_per_atom)
        senders, image = candidate % n, torch.div(candidate, n, rounding_mode="floor")
        crowded = torch.zeros((), dtype=torch.bool, device=positions.device)
    else:
        j, img, mask, fullest, limit = _bin_candidates(positions, cell, recip, periodic, max_images, cutoff, atoms_per_bin)
        o_count = img.shape[1]
        receivers, candidate, real, count = fixed_slots(mask.reshape(n, -1), edges_per_atom)
        senders = j.reshape(-1).index_select(0, receivers * (o_count * atoms_per_bin) + candidate)
        o = torch.div(candidate, atoms_per_bin, rounding_mode="floor")
        image = _image_index(img.reshape(-1, 3).index_select(0, receivers * o_count + o), limit)
        crowded = fullest > atoms_per_bin
    senders = torch.where(real, senders, receivers)
    image = torch.where(real, image, torch.full_like(image, zero_image))
    return receivers, senders, image, real, (count > n * edges_per_atom) | crowded
