"""A neighbour list with static shapes: rebuilt on the device, inside a CUDA graph, without a
host synchronisation.

:func:`flashcart.data.neighbors.neighbor_list` returns as many pairs as there are (its length
is data-dependent, so a build synchronises and cannot be captured); on the H200 a vesin build
of the 768-atom water box at 6.5 Å costs about 2 ms, and a simulation step that rebuilds its
list every eight steps or so pays that on every rebuild. :class:`StaticCellList` finds the same
pairs into buffers of fixed size, so a rebuild is a handful of kernels that a CUDA graph can
replay, and it reports what did not fit instead of reallocating:

1. the atoms are binned in fractional coordinates (periodic structures: of the cell, the
   positions wrapped into it; open structures: of a box around the atoms at construction, the
   atoms that leave it binned into its outermost bins, which is still exact);
2. every bin holds at most ``slots`` atoms (a table ``[bins, slots]``; the atoms beyond are
   dropped, and the fullest bin's count is reported);
3. every atom's candidates are the table rows of the ``K`` bins within reach: a dense
   ``[N, K, slots]`` block (searched in blocks of receivers that bound the memory), exact
   distances in the step's dtype, element-wise (no matrix product whose precision a TF32
   setting could change);
4. the pairs within the cutoff are compacted, in (receiver, bin offset, slot) order (so
   grouped by receiver, ascending), into ``capacity`` slots (the count is reported; the pairs
   beyond are dropped).

Pairs are ``(i, j, S)`` with ``|x_j - x_i + S @ cell| < cutoff`` for the positions as given
(they need not be wrapped), the contract of :func:`~flashcart.data.neighbors.neighbor_list`:
the same set as ASE's ``primitive_neighbor_list`` (tested on the hard cases: triclinic cells,
cells thinner than the cutoff with many images of each atom, open boundaries). Structures
periodic along some directions only are not supported (:func:`supports`); nor are those whose
dense candidates would exceed :data:`MAX_CANDIDATES`.

The results are valid only when the reported counts fit: ``pairs <= capacity`` and
``fullest bin <= slots``; the caller checks both (in the same transfer as the step's results)
and otherwise builds on the host with larger capacities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ._compiled import CompiledOrEager

__all__ = ["ListPlan", "StaticCellList", "plan_cell_list", "supports"]

_FAR = 1.0e6  # Å: where an empty table slot's atom is, far beyond any cutoff
_SPREAD = 1024  # rejected candidates are scattered over this many spare slots (not one address)
MAX_CANDIDATES = 64_000_000  # dense candidates in all, atoms x bins in reach x slots (beyond: host builds)
BLOCK_CANDIDATES = 4_000_000  # candidates held at once (receivers are searched in blocks)


def supports(pbc) -> bool:
    """Periodic in all three directions, or in none."""
    pbc = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
    return bool(pbc.all() or not pbc.any())


@dataclass(frozen=True)
class ListPlan:
    """Host-side sizes of a :class:`StaticCellList`.

    periodic: all three directions (else none). bins, reach: per direction, bins and the bin
    offsets searched either side. slots: atoms per bin. origin, inverse: fractional
    coordinates are ``(x - origin) @ inverse`` (periodic: origin 0 and the inverse cell; open:
    a box around the atoms). cell: lattice vectors as rows (Å; zeros when open).
    """

    periodic: bool
    bins: tuple[int, int, int]
    reach: tuple[int, int, int]
    slots: int
    origin: tuple[float, float, float]
    inverse: tuple[tuple[float, ...], ...]
    cell: tuple[tuple[float, ...], ...]

    @property
    def offsets(self) -> int:
        return math.prod(2 * r + 1 for r in self.reach)

    def candidates(self, n_atoms: int) -> int:
        return n_atoms * self.offsets * self.slots


def _occupancy(frac: np.ndarray, bins: tuple[int, int, int]) -> int:
    coord = np.clip(np.floor(frac * np.array(bins)).astype(np.int64), 0, np.array(bins) - 1)
    ids = (coord[:, 0] * bins[1] + coord[:, 1]) * bins[2] + coord[:, 2]
    return int(np.bincount(ids, minlength=math.prod(bins)).max()) if len(ids) else 0


def plan_cell_list(positions: np.ndarray, cell: np.ndarray, pbc, cutoff: float, headroom: float = 0.5) -> ListPlan:
    """Bins and slots for ``positions`` ``[N, 3]`` (Å): the bin layout (bins at least the cutoff
    or half of it thick) with the fewest dense candidates, slots the fullest bin's atoms times
    ``1 + headroom`` plus two."""
    pbc = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
    if not supports(pbc):
        raise ValueError(f"the static cell list needs pbc all True or all False, got {pbc.tolist()}")
    if cutoff <= 0:
        raise ValueError(f"cutoff must be positive, got {cutoff}")
    positions = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
    periodic = bool(pbc.all())
    if periodic:
        cell = np.asarray(cell, dtype=np.float64).reshape(3, 3)
        inverse = np.linalg.inv(cell)
        heights = 1.0 / np.linalg.norm(inverse, axis=0)  # face distances of the cell
        origin = np.zeros(3)
        frac = positions @ inverse
        frac = frac - np.floor(frac)
    else:
        cell = np.zeros((3, 3))
        lo, hi = positions.min(0) - cutoff, positions.max(0) + cutoff  # a margin: atoms move
        heights = hi - lo
        inverse = np.diag(1.0 / heights)
        origin = lo
        frac = (positions - origin) @ inverse
    best = None
    for per_cutoff in (1, 2):
        bins = tuple(max(1, int(h * per_cutoff / cutoff)) for h in heights)
        if not periodic:  # a box much larger than the atoms' volume needs no more bins than atoms
            while math.prod(bins) > 4 * len(positions) + 64:
                k = int(np.argmax(bins))
                bins = tuple(b // 2 if q == k else b for q, b in enumerate(bins))
        # bins an atom's partners can be away: ceil(cutoff / bin thickness), with a margin for
        # rounding in the binning (float32 positions: ~1e-6 of a bin)
        reach = tuple(int(math.ceil(cutoff * b / h + 1e-4)) for b, h in zip(bins, heights))
        if not periodic:
            reach = tuple(min(r, b - 1) for r, b in zip(reach, bins))
        slots = int(math.ceil(_occupancy(frac, bins) * (1.0 + headroom))) + 2
        plan = ListPlan(
            periodic=periodic,
            bins=bins,  # type: ignore[arg-type]
            reach=reach,  # type: ignore[arg-type]
            slots=slots,
            origin=tuple(float(x) for x in origin),  # type: ignore[arg-type]
            inverse=tuple(tuple(float(x) for x in row) for row in inverse),
            cell=tuple(tuple(float(x) for x in row) for row in cell),
        )
        if best is None or plan.candidates(len(positions)) < best.candidates(len(positions)):
            best = plan
    return best  # type: ignore[return-value]


def _rows_times(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``x [..., 3] @ m [3, 3]`` element-wise (no matmul: exact in the dtype whatever TF32 says)."""
    return x[..., 0:1] * m[0] + x[..., 1:2] * m[1] + x[..., 2:3] * m[2]


class StaticCellList:
    """The pairs within ``cutoff`` of ``N`` atoms into ``capacity`` slots (see the module docs).

    Args:
        plan: from :func:`plan_cell_list`.
        n_atoms: ``N``.
        cutoff: Å.
        capacity: pair slots.
        dtype, device: of the positions.
        block_candidates: candidates held at once (receivers are searched in blocks of
            ``block_candidates // (K * slots)`` atoms, at least one, so memory stays bounded
            for large structures; a block is about 40 bytes a candidate).
        compiled: run the search as one compiled (``torch.compile``) function (a few fused kernels
            instead of about sixty small ones; the engine asks for it on CUDA with a compile mode).
    """

    def __init__(
        self,
        plan: ListPlan,
        n_atoms: int,
        cutoff: float,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
        block_candidates: int = BLOCK_CANDIDATES,
        compiled: bool = False,
    ):
        if n_atoms < 1:
            raise ValueError("a neighbour list needs at least one atom")
        if capacity < 1:
            raise ValueError(f"pair capacity must be positive, got {capacity}")
        self.plan, self.n, self.cutoff, self.capacity = plan, int(n_atoms), float(cutoff), int(capacity)
        self.dtype, self.device = dtype, device
        f = dict(dtype=dtype, device=device)
        i = dict(dtype=torch.long, device=device)
        b0, b1, b2 = plan.bins
        self.n_bins = b0 * b1 * b2
        self.bins_t = torch.tensor(plan.bins, **i)
        self.strides = torch.tensor([b1 * b2, b2, 1], **i)
        self.origin = torch.tensor(plan.origin, **f)
        self.inverse = torch.tensor(plan.inverse, **f)
        self.cell = torch.tensor(plan.cell, **f)
        r0, r1, r2 = plan.reach
        grid = torch.meshgrid(*(torch.arange(-r, r + 1, **i) for r in plan.reach), indexing="ij")
        self.offsets = torch.stack([g.reshape(-1) for g in grid], dim=1)  # [K, 3]
        k, m = self.offsets.shape[0], plan.slots
        self.k, self.m = k, m
        self.center_offset = (r0 * (2 * r1 + 1) + r1) * (2 * r2 + 1) + r2
        self.block = max(1, min(self.n, int(block_candidates) // (k * m)))  # receivers per block
        per_block = self.block * k * m
        self.flat = torch.arange(per_block, **i)  # a block's candidate index
        self.flat_offset = torch.div(self.flat, m, rounding_mode="floor") % k  # its bin offset
        self.flat_atom = torch.div(self.flat, k * m, rounding_mode="floor")  # its receiver within the block
        self.spare = self.capacity + self.flat % _SPREAD  # where rejected candidates go
        self.is_center = (self.flat_offset == self.center_offset).view(self.block, k, m)
        self.atoms = torch.arange(n_atoms, **i)
        self.pair_slots = torch.arange(self.capacity, **i)
        self.far = torch.full((1, 3), _FAR, **f)
        self.compiled = bool(compiled)
        self._search = CompiledOrEager(self._find, "the device rebuild's cell list") if compiled else self._find

    @property
    def candidates(self) -> int:
        return self.n * self.k * self.m

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pairs at ``positions`` ``[N, 3]`` (Å): ``receivers, senders [capacity]`` (int64),
        ``shifts [capacity, 3]`` (lattice vectors, positions' dtype), ``valid [capacity]``
        (bool; the slots past the count are ``(0, 0, 0)`` and invalid) and ``status [2]``
        (int64: pairs found, atoms in the fullest bin). Static shapes, no synchronisation."""
        return self._search(positions)

    def _find(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`__call__`, eager (compiled when ``compiled``)."""
        plan, n, k, m = self.plan, self.n, self.k, self.m
        frac = _rows_times(positions - self.origin, self.inverse)  # [N, 3]
        if plan.periodic:
            image = torch.floor(frac)
            frac = frac - image
            wrapped = positions - _rows_times(image, self.cell)
            image = image.long()
        else:
            image, wrapped = None, positions
        coord = torch.minimum(torch.floor(frac * self.bins_t).long().clamp_min(0), self.bins_t - 1)  # [N, 3]
        bin_of = (coord * self.strides).sum(1)  # [N]
        sorted_bins, order = torch.sort(bin_of, stable=True)
        counts = torch.zeros(self.n_bins, dtype=torch.long, device=self.device).scatter_add_(0, bin_of, torch.ones_like(bin_of))
        starts = torch.cumsum(counts, 0) - counts
        rank = self.atoms - starts.index_select(0, sorted_bins)
        slot = torch.where(rank < m, sorted_bins * m + rank, self.n_bins * m)
        table = torch.full((self.n_bins * m + 1,), n, dtype=torch.long, device=self.device).scatter_(0, slot, order)
        table = table[: self.n_bins * m].view(self.n_bins, m)
        padded = torch.cat([wrapped, self.far.to(wrapped.dtype)])  # [N + 1, 3]: row N is no atom
        # per block of receivers: candidates, distances, and the kept ones scattered to their
        # ranks (receiver, bin offset, slot order), after the pairs of the blocks before
        spare = self.capacity + _SPREAD
        receivers = torch.zeros(spare, dtype=torch.long, device=self.device)
        senders = torch.zeros(spare, dtype=torch.long, device=self.device)
        offset_of = torch.zeros(spare, dtype=torch.long, device=self.device)
        found = torch.zeros((), dtype=torch.long, device=self.device)
        for first in range(0, n, self.block):
            b = min(self.block, n - first)
            c = b * k * m
            target = coord[first : first + b, None, :] + self.offsets[None]  # [b, K, 3]
            if plan.periodic:
                wrap = torch.div(target, self.bins_t, rounding_mode="floor")
                target = target - wrap * self.bins_t
            else:
                wrap = None
                inside = ((target >= 0) & (target < self.bins_t)).all(-1)  # [b, K]: open ends
                target = torch.minimum(target.clamp_min(0), self.bins_t - 1)
            cand = table.index_select(0, ((target * self.strides).sum(-1)).reshape(-1)).view(b, k, m)
            if wrap is None:
                cand = torch.where(inside[:, :, None], cand, n)
            v = padded.index_select(0, cand.reshape(-1)).view(b, k, m, 3) - wrapped[first : first + b, None, None, :]
            if wrap is not None:
                v = v + _rows_times(wrap.to(positions.dtype), self.cell)[:, :, None, :]
            d2 = v[..., 0] * v[..., 0] + v[..., 1] * v[..., 1] + v[..., 2] * v[..., 2]
            own = cand == self.atoms[first : first + b, None, None]
            keep = (d2 < self.cutoff * self.cutoff) & (cand < n) & ~(own & self.is_center[:b])
            keep = keep.reshape(-1)
            ranks = torch.cumsum(keep.to(torch.int32), 0, dtype=torch.int32).long() + found
            dest = torch.where(keep & (ranks <= self.capacity), ranks - 1, self.spare[:c])
            receivers.scatter_(0, dest, self.flat_atom[:c] + first)
            senders.scatter_(0, dest, cand.reshape(-1))
            offset_of.scatter_(0, dest, self.flat_offset[:c])
            found = ranks[-1]
        valid = self.pair_slots < found
        receivers = torch.where(valid, receivers[: self.capacity], 0)
        senders = torch.where(valid, senders[: self.capacity], 0)
        if plan.periodic:
            cell_offset = torch.where(valid, offset_of[: self.capacity], self.center_offset)
            target = coord.index_select(0, receivers) + self.offsets.index_select(0, cell_offset)
            wrap = torch.div(target, self.bins_t, rounding_mode="floor")
            shifts = wrap + image.index_select(0, receivers) - image.index_select(0, senders)
            shifts = torch.where(valid[:, None], shifts, 0).to(positions.dtype)
        else:
            shifts = torch.zeros(self.capacity, 3, dtype=positions.dtype, device=self.device)
        status = torch.stack([found, counts.max()])
        return receivers, senders, shifts, valid, status
