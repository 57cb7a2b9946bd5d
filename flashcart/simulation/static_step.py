"""The static-shape simulation step: every tensor it touches has a fixed shape and address.

A step that reuses a neighbour list (built with cutoff ``r_max + skin``) does, on the device,
without any host synchronisation:

1. unwrap the positions next to the list's reference positions by whole lattice vectors;
2. the largest squared displacement from the reference (Å^2), which says whether the list is
   still valid (no atom moved more than ``skin / 2``);
3. **compaction**: the pairs of the list closer than ``r_max`` (mask, cumulative sum, scatter)
   into a buffer of ``capacities.edges`` model edges, the free slots filled with padding edges
   that contribute exactly zero (as :meth:`Predictor._pad <flashcart.model.Predictor.padded>`
   makes them: between padding atoms spaced ``2 r_max`` apart), spread evenly over the
   padding atoms of which there are enough that none has more edges than a real atom on
   average (the receiver- and sender-grouped kernels run a row's edges in one program, so
   thousands of padding edges on one padding atom make one program the whole kernel's time:
   on the H200 the captured diamond step took 23 ms against the profiler's 3.1 ms when all
   the free slots fell on one to three padding atoms). The model therefore sees the
   edges the profiler sees (within ``r_max``), not the ``((r_max + skin) / r_max)^3`` times
   more of the list. The number of pairs within ``r_max`` is reported with the results: more
   than the capacity is an overflow, and the caller must rebuild with a larger capacity (the
   results of that step are wrong and must be discarded);
4. the padded model call with ``autograd`` forces (and stress);
5. one packed result ``[energy, moved^2, pairs within r_max, pairs listed, fullest bin,
   forces (3N), stress (9)]``.

A new list comes either from the host (:meth:`StaticStep.load`: any neighbour-list backend,
copied into the buffers) or from the device (:meth:`StaticStep.rebuild`: a
:class:`~flashcart.simulation.static_list.StaticCellList` at the current positions, written
into the same buffers without a synchronisation; its pair count and fullest bin come back in
the packed result of the step that follows, and the caller discards that step when they did
not fit).

:class:`StaticStep` owns the buffers and runs the step eagerly (any device);
:class:`CapturedStep` captures the same step, between a pinned host input and a pinned host
output, as one CUDA graph: per call the host copies the positions into pinned memory, replays
the graph and synchronises once. :class:`CapturedRebuild` captures a device rebuild the same
way, replayed before the step when the list must be rebuilt (two replays, one synchronisation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ._compiled import CompiledOrEager

__all__ = [
    "StepCapacities",
    "StaticStep",
    "CapturedStep",
    "CapturedRebuild",
    "pairs_within",
    "padding_atoms",
    "prepare_step",
    "unwrap",
    "compact",
    "PACKED_HEADER",
]

PACKED_HEADER = 5  # energy, moved^2, pairs within r_max, pairs listed, fullest bin; then forces (3N) and stress (9)


def _round_up(n: int, multiple: int) -> int:
    return max(multiple, int(math.ceil(n / multiple)) * multiple)


@dataclass(frozen=True)
class StepCapacities:
    """Static sizes of a :class:`StaticStep`.

    atoms: padded atoms (real atoms + at least two padding atoms; see :func:`padding_atoms`).
    pairs: slots for the ``r_max + skin`` neighbour list. edges: slots for the compacted list
    the model sees.
    """

    atoms: int
    pairs: int
    edges: int

    def fits(self, n_atoms: int, n_pairs: int, n_edges: int) -> bool:
        return n_atoms + 2 <= self.atoms and n_pairs <= self.pairs and n_edges <= self.edges

    def grown(self, n_atoms: int, n_pairs: int, n_edges: int, headroom: float, atom_multiple: int, edge_multiple: int) -> "StepCapacities":
        """Capacities that fit these sizes: kept where they already fit, else the size times
        ``1 + headroom`` rounded up to the multiples (never shrinks). The atoms get no headroom
        (a step's number of atoms is fixed: another number of atoms is another step), only the
        :func:`padding_atoms` that the edge capacity asks for."""
        h = 1.0 + headroom

        def grow(current: int, need: int, multiple: int) -> int:
            need = max(need, 1)  # at least one slot: a structure without pairs still gets padding edges
            return current if need <= current else _round_up(max(need, int(math.ceil(h * need))), multiple)

        edges = grow(self.edges, n_edges, edge_multiple)
        atoms = n_atoms + padding_atoms(n_atoms, n_edges, edges)
        return StepCapacities(
            atoms=self.atoms if atoms <= self.atoms else _round_up(atoms, atom_multiple),
            pairs=grow(self.pairs, n_pairs, edge_multiple),
            edges=edges,
        )


def padding_atoms(n_atoms: int, n_edges: int, edge_capacity: int) -> int:
    """Padding atoms for ``edge_capacity`` model edges of which ``n_edges`` are real: at least
    two, and enough that the free slots, spread evenly, give none of them more edges than a
    real atom has on average."""
    degree = max(1.0, n_edges / max(n_atoms, 1))
    return max(2, math.ceil((edge_capacity - n_edges) / degree))


def pairs_within(positions, cell, receivers, senders, shifts, r_max: float) -> torch.Tensor:
    """Mask ``[P]``: pairs ``(i, j, S)`` with ``|x_j - x_i + S @ cell| < r_max`` (Å).

    Written as elementwise operations in a fixed order (no matrix product or reduction whose
    kernel could depend on ``P``), so the count at a list's build and the step's count at the
    same positions agree exactly."""
    image = shifts[:, 0:1] * cell[0] + shifts[:, 1:2] * cell[1] + shifts[:, 2:3] * cell[2]
    v = positions.index_select(0, senders) - positions.index_select(0, receivers) + image
    return v[:, 0] * v[:, 0] + v[:, 1] * v[:, 1] + v[:, 2] * v[:, 2] < r_max * r_max


def unwrap(positions, reference, cell, inv_cell, periodic_mask, periodic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``positions [N, 3]`` mapped next to ``reference`` by whole lattice vectors (rows of
    ``cell``; ``periodic_mask [3]`` selects the periodic ones), and the largest squared
    displacement from ``reference`` (Å^2, 0-d)."""
    pos = positions
    if periodic:
        wraps = torch.round((pos - reference) @ inv_cell) * periodic_mask
        pos = pos - wraps @ cell
    d = pos - reference
    return pos, (d * d).sum(dim=1).amax()


def compact(pos, cell, pair_receivers, pair_senders, pair_shifts, pair_valid, slots, r_max: float, n: int, n_padding: int) -> tuple:
    """The valid pairs of a list closer than ``r_max`` at ``pos``, in list order, then padding
    edges spread over the ``n_padding`` padding atoms ``n, n + 1, ...``: ``receivers, senders
    [E]``, ``shifts [E, 3]``, ``edge_batch [E]`` and the number of such pairs (0-d), where
    ``E + 1`` is the length of ``slots`` (``arange``; the extra slot takes the pairs beyond
    ``E``)."""
    c, pa = slots.shape[0] - 1, n_padding
    within = pairs_within(pos, cell, pair_receivers, pair_senders, pair_shifts, r_max) & pair_valid
    rank = torch.cumsum(within, 0) - 1
    count = within.sum()
    target = torch.where(within & (rank < c), rank, c)  # slot c: discarded
    # the padding slots count..c-1 spread evenly (and in order: receivers stay sorted) over
    # the padding atoms, this step's count deciding where they start
    free = slots - count
    pad_receivers = n + torch.clamp(free.clamp_min(0) * pa // (c - count).clamp_min(1), max=pa - 1)
    pad_senders = n + (pad_receivers - n + 1) % pa
    receivers = pad_receivers.scatter(0, target, pair_receivers)[:c]
    senders = pad_senders.scatter(0, target, pair_senders)[:c]
    shifts = torch.zeros(c + 1, 3, dtype=pos.dtype, device=pos.device).scatter(0, target[:, None].expand(-1, 3), pair_shifts)[:c]
    edge_batch = (free[:c] >= 0).long()  # padding edges in the padding graph
    return receivers, senders, shifts, edge_batch, count


def prepare_step(
    positions,
    reference,
    cell,
    inv_cell,
    periodic_mask,
    pair_receivers,
    pair_senders,
    pair_shifts,
    pair_valid,
    slots,
    padded_positions,
    *,
    periodic: bool,
    r_max: float,
    n: int,
    n_padding: int,
) -> tuple:
    """A static step's work before the model: :func:`unwrap`, :func:`compact`, and the padded
    positions (``padded_positions`` with its first ``n`` rows replaced by the unwrapped ones, a
    new tensor). Returns ``padded [A, 3], moved2, receivers, senders, shifts, edge_batch, count``."""
    pos, moved2 = unwrap(positions, reference, cell, inv_cell, periodic_mask, periodic)
    receivers, senders, shifts, edge_batch, count = compact(
        pos, cell, pair_receivers, pair_senders, pair_shifts, pair_valid, slots, r_max, n, n_padding
    )
    padded = torch.cat([pos, padded_positions[n:]])
    return padded, moved2, receivers, senders, shifts, edge_batch, count


class StaticStep:
    """Static buffers for one structure and the step that runs on them (see the module docs).

    Args:
        model_call: ``(positions, strain, types, cell, shifts, receivers, senders, batch,
            edge_batch, n_graphs) -> (energy [G], forces [A, 3], stress [G, 3, 3] | None)``
            on padded tensors (:meth:`flashcart.model.Predictor.call_static`).
        n_atoms: real atoms ``N``.
        pbc: ``[3]`` periodicity (the unwrapping uses the periodic lattice vectors only).
        r_max: model cutoff (Å).
        capacities: static sizes.
        dtype, device: of the positions and the model.
        compiled: run the step's own work around the model (unwrapping, displacement, compaction,
            padded positions; about forty small operations) as one compiled (``torch.compile``) function,
            a few fused kernels instead of one per operation (the engine asks for it on CUDA with
            a compile mode). The model call is the caller's either way.
    """

    def __init__(
        self,
        model_call: Callable,
        n_atoms: int,
        pbc: np.ndarray,
        r_max: float,
        capacities: StepCapacities,
        dtype: torch.dtype,
        device: torch.device,
        compiled: bool = False,
    ):
        if not capacities.fits(n_atoms, 0, 0):
            raise ValueError(f"atom capacity {capacities.atoms} is too small for {n_atoms} atoms and two padding atoms")
        self.model_call, self.n, self.r_max, self.capacities = model_call, n_atoms, float(r_max), capacities
        self.pbc = np.asarray(pbc, dtype=bool).copy()
        self.periodic = bool(self.pbc.any())
        self.dtype, self.device = dtype, device
        n, a, p, c = n_atoms, capacities.atoms, capacities.pairs, capacities.edges
        f = dict(dtype=dtype, device=device)
        i = dict(dtype=torch.long, device=device)
        self.positions = torch.zeros(n, 3, **f)  # the input slot (Å), written before every step
        self.reference = torch.zeros(n, 3, **f)  # where the list was built
        self.cell = torch.zeros(3, 3, **f)
        self.inv_cell = torch.zeros(3, 3, **f)
        self.periodic_mask = torch.tensor(self.pbc, **f)
        self.pair_receivers = torch.zeros(p, **i)
        self.pair_senders = torch.zeros(p, **i)
        self.pair_shifts = torch.zeros(p, 3, **f)
        self.pair_valid = torch.zeros(p, dtype=torch.bool, device=device)
        # pairs listed, atoms in the fullest bin (0 for a host list); in the step's dtype, as packed
        # (cast once a rebuild, not once a step)
        self.list_status = torch.zeros(2, **f)
        self.n_pairs = 0
        # padding: atoms n..a-1 on a line 2 r_max apart (graph 1), edges between neighbouring ones
        self.n_padding = pa = a - n
        self.padded_positions = torch.zeros(a, 3, **f)
        self.padded_positions[n:, 0] = torch.arange(pa, **f) * (2.0 * self.r_max)
        self.types = torch.zeros(a, **i)
        self.batch = torch.cat([torch.zeros(n, **i), torch.ones(pa, **i)])
        self.model_cell = torch.zeros(2, 3, 3, **f)
        self.slots = torch.arange(c + 1, **i)  # one extra slot takes the pairs that are not copied
        self.compiled = bool(compiled)
        # torch.compile keeps its compiled code with prepare_step's code object: every step of the
        # same shapes reuses it
        self._prepare = CompiledOrEager(prepare_step, "the static step's work around the model") if compiled else prepare_step

    def matches(self, n_atoms: int, pbc: np.ndarray) -> bool:
        return n_atoms == self.n and np.array_equal(np.asarray(pbc, dtype=bool), self.pbc)

    def load(self, positions, types, cell, inv_cell, receivers, senders, shifts) -> None:
        """A new neighbour list (built at ``positions`` ``[N, 3]``, the new reference) into the
        static buffers (eager copies; nothing is reallocated). The caller checks that it fits."""
        p = receivers.shape[0]
        if p > self.capacities.pairs:
            raise ValueError(f"{p} pairs do not fit the capacity of {self.capacities.pairs}")
        with torch.no_grad():
            self.reference.copy_(positions)
            self.positions.copy_(positions)
            self.cell.copy_(cell)
            self.inv_cell.copy_(inv_cell)
            self.model_cell[0].copy_(cell)
            self.types[: self.n].copy_(types)
            self.pair_receivers[:p].copy_(receivers)
            self.pair_receivers[p:].zero_()
            self.pair_senders[:p].copy_(senders)
            self.pair_senders[p:].zero_()
            self.pair_shifts[:p].copy_(shifts)
            self.pair_shifts[p:].zero_()
            self.pair_valid[:p].fill_(True)
            self.pair_valid[p:].fill_(False)
            self.list_status[0] = p
            self.list_status[1] = 0
        self.n_pairs = p

    def rebuild(self, cell_list) -> None:
        """A new list at the current :attr:`positions` (the new reference), built on the device
        by ``cell_list`` (a :class:`~flashcart.simulation.static_list.StaticCellList` with
        ``capacities.pairs`` slots, for this step's cell) into the static buffers: no
        reallocation, no synchronisation. Its pair count and fullest bin are in the packed
        result of the next step (the caller checks that they fit)."""
        if cell_list.capacity != self.capacities.pairs or cell_list.n != self.n:
            raise ValueError(
                f"the cell list has {cell_list.capacity} pair slots for {cell_list.n} atoms, the step {self.capacities.pairs} for {self.n}"
            )
        with torch.no_grad():
            receivers, senders, shifts, valid, status = cell_list(self.positions)
            self.pair_receivers.copy_(receivers)
            self.pair_senders.copy_(senders)
            self.pair_shifts.copy_(shifts)
            self.pair_valid.copy_(valid)
            self.list_status.copy_(status)
            self.reference.copy_(self.positions)

    def packed_size(self, stress: bool) -> int:
        return PACKED_HEADER + 3 * self.n + (9 if stress else 0)

    def unwrapped(self) -> tuple[torch.Tensor, torch.Tensor]:
        """:attr:`positions` mapped next to the reference by whole lattice vectors (exact for
        atoms that were not wrapped), and the largest squared displacement from the reference
        (Å^2, 0-d)."""
        return unwrap(self.positions, self.reference, self.cell, self.inv_cell, self.periodic_mask, self.periodic)

    def compact(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The list's pairs closer than ``r_max`` at ``pos`` (unwrapped), in list order (so still
        grouped by receiver), then padding edges: ``receivers, senders [E]``, ``shifts [E, 3]``,
        ``edge_batch [E]`` (``E = capacities.edges``) and the number of such pairs (0-d; more than
        ``E`` means the ones beyond were dropped)."""
        return compact(
            pos,
            self.cell,
            self.pair_receivers,
            self.pair_senders,
            self.pair_shifts,
            self.pair_valid,
            self.slots,
            self.r_max,
            self.n,
            self.n_padding,
        )

    def model_inputs(self, pos: torch.Tensor, stress: bool) -> tuple:
        """The arguments of ``model_call`` for unwrapped positions ``pos``, and the pair count."""
        receivers, senders, shifts, edge_batch, count = self.compact(pos)
        padded = torch.cat([pos, self.padded_positions[self.n :]])
        return self._model_args(padded, receivers, senders, shifts, edge_batch, stress), count

    def _model_args(self, padded, receivers, senders, shifts, edge_batch, stress: bool) -> tuple:
        """``model_call``'s arguments: the padded positions (a leaf that requires grad), the strain
        (with ``stress``), and the step's buffers."""
        x = padded.detach().requires_grad_(True)
        strain = torch.zeros(2, 3, 3, dtype=self.dtype, device=self.device, requires_grad=True) if stress else None
        return (x, strain, self.types, self.model_cell, shifts, receivers, senders, self.batch, edge_batch, 2)

    def __call__(self, stress: bool) -> torch.Tensor:
        """One step on the current contents of :attr:`positions`: the packed results
        ``[energy, moved^2, pairs within r_max, pairs listed, fullest bin, forces (3N),
        stress (9, if asked)]`` (device).
        Static shapes, no host synchronisation, no tensors from host data."""
        padded, moved2, receivers, senders, shifts, edge_batch, count = self._prepare(
            self.positions,
            self.reference,
            self.cell,
            self.inv_cell,
            self.periodic_mask,
            self.pair_receivers,
            self.pair_senders,
            self.pair_shifts,
            self.pair_valid,
            self.slots,
            self.padded_positions,
            periodic=self.periodic,
            r_max=self.r_max,
            n=self.n,
            n_padding=self.n_padding,
        )
        energy, forces, s = self.model_call(*self._model_args(padded, receivers, senders, shifts, edge_batch, stress))
        parts = [energy[:1].detach(), moved2.reshape(1), count.to(self.dtype).reshape(1), self.list_status]
        parts.append(forces[: self.n].detach().reshape(-1))
        if stress:
            parts.append(s[0].detach().reshape(-1))
        return torch.cat(parts)


def _capture(body: Callable[[], None], device: torch.device, warmup: int) -> torch.cuda.CUDAGraph:
    """``body`` run ``warmup`` times eagerly on a side stream (compiling and autotuning whatever
    its first calls compile), then captured on that stream as a CUDA graph."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            body()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: another library in the process (OpenMM's CUDA platform) may use the
    # device from its own threads; only this thread's work must be capture-safe
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        body()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph


class CapturedStep:
    """A :class:`StaticStep` captured as one CUDA graph, from a pinned host input ``[N, 3]``
    to a pinned host output (the packed results).

    The graph holds: host-to-device copy of the positions, the step, device-to-host copy of
    the results. It is captured after ``warmup`` eager runs on a side stream (which compile
    and autotune whatever the first calls compile; the capture uses that same stream), and
    stays valid while the step's buffers are not reallocated (new lists are copied into them).
    """

    def __init__(self, step: StaticStep, stress: bool, warmup: int = 3):
        if step.device.type != "cuda":
            raise ValueError(f"a CUDA graph needs a CUDA device, the step is on {step.device}")
        self.step, self.stress = step, stress
        self.host_in = torch.empty(step.n, 3, dtype=step.dtype, pin_memory=True)
        self.host_out = torch.empty(step.packed_size(stress), dtype=step.dtype, pin_memory=True)
        self.host_in.copy_(step.positions)  # warm-up on the current (valid) positions
        self.graph = _capture(self._body, step.device, warmup)

    def _body(self) -> None:
        self.step.positions.copy_(self.host_in, non_blocking=True)
        self.host_out.copy_(self.step(self.stress), non_blocking=True)

    def __call__(self, positions, rebuild: "CapturedRebuild | None" = None) -> np.ndarray:
        """The packed results for ``positions`` ``[N, 3]`` Å (NumPy or tensor), as a view of the
        pinned output (valid until the next call); with ``rebuild``, a new list at these
        positions first (both graphs replayed, one synchronisation)."""
        if isinstance(positions, torch.Tensor):
            self.host_in.copy_(positions.detach())
        else:
            self.host_in.numpy()[...] = positions  # cast to the step's dtype on the host
        if rebuild is not None:
            rebuild.replay()
        self.graph.replay()
        torch.cuda.current_stream(self.step.device).synchronize()
        return self.host_out.numpy()


class CapturedRebuild:
    """A device rebuild of a :class:`CapturedStep`'s list (:meth:`StaticStep.rebuild`)
    captured as a CUDA graph that reads the captured step's pinned input: replayed before the
    step's graph, it costs a few kernels instead of a host-side build (about 2 ms on the H200
    for the 768-atom water box with vesin, which synchronises).

    Args:
        captured: the step whose input and buffers it uses.
        cell_list: a :class:`~flashcart.simulation.static_list.StaticCellList` for that step.
    """

    def __init__(self, captured: CapturedStep, cell_list, warmup: int = 2):
        self.captured, self.cell_list = captured, cell_list
        self.graph = _capture(self._body, captured.step.device, warmup)  # the warm-up rebuilds at the input's positions: a valid list

    def _body(self) -> None:
        step = self.captured.step
        step.positions.copy_(self.captured.host_in, non_blocking=True)
        step.rebuild(self.cell_list)

    def replay(self) -> None:
        self.graph.replay()
