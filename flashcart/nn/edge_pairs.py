"""The edges of a full neighbour list grouped into pairs, so a radial MLP runs once per pair.

A full neighbour list holds every pair of atoms twice: ``i -> j`` with image shift ``S`` and
``j -> i`` with ``-S``. Their vectors are exact negatives of each other in floating point
(``a - b == -(b - a)``), so their distances, radial bases and radial-MLP outputs are equal bit for
bit. Evaluating a distance-only MLP once per pair halves its matrix products; both edges then
read their pair's row.

The grouping is a function of the neighbour list alone (``receivers``, ``senders``, ``shifts``),
plus which edges are live (inside the cutoff now): every edge outside the cutoff has a zero radial
input and a zero MLP output (the MLP has no biases), so all of them share one group. With a
pair-complete list there are at most ``E // 2 + 1`` groups (the pairs, plus one for the dead
edges), a static count, so the grouping works inside ``torch.compile`` and CUDA graphs.

Only the leader of each group (its first edge in key order) feeds the MLP, and gradients reach
the distance of that edge alone. That is exact to every order of differentiation: the two edges
of a pair have the same distance as a function of the positions and the cell, not only the same
value, so ``E(w(d_leader), w(d_leader))`` and ``E(w(d_1), w(d_2))`` are the same function.

The tensor products read the rows through ``pair_of_edge`` and sum each row's gradient over the
two edges ``row_edges`` lists (:class:`~flashcart.cartesian.WeightRows`: no ``[E, W]`` gather; the
kernels add the two edges' weight gradients into their row). The dead edges' row lists none: its value is the MLP of a zero input, which is
zero whatever the MLP's parameters (no biases, activations with ``act(0) = 0``), and its input is
zero wherever the edges are dead (the envelope vanishes with its derivative beyond the cutoff), so
no derivative flows through it; leaving it out is exact.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["EdgePairs", "edge_pairs", "pair_capacity", "pairs_fit"]


class EdgePairs(NamedTuple):
    """``leader [P]``: the edge whose radial input each group's MLP row is computed from;
    ``pair_of_edge [E]``: each edge's group (row of the per-pair weights); ``n_groups``: 0-d
    tensor, the groups found (at most ``P`` for a pair-complete list). Rows from
    ``n_groups`` on are unused. ``row_edges [P, 2]``: the live edges of each group (its leader,
    then its reverse edge), ``-1`` for none (the dead edges' group, unused rows, an edge
    without a reverse)."""

    leader: torch.Tensor
    pair_of_edge: torch.Tensor
    n_groups: torch.Tensor
    row_edges: torch.Tensor


def pair_capacity(n_edges: int) -> int:
    """``P = E // 2 + 1``: the groups of a pair-complete list of ``E`` edges, dead edges included."""
    return n_edges // 2 + 1


def _pair_keys(receivers: torch.Tensor, senders: torch.Tensor, shifts: torch.Tensor, live: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """``[E]`` int64 key, equal for an edge and its reverse; ``-1`` for every dead edge.

    The key orients each edge canonically (lower node first; between an atom and its own image,
    the shift whose first nonzero component is positive) and packs ``(lower, upper, shift)``
    into one integer, each shift component offset by the largest magnitude present.
    """
    r, s = receivers.long(), senders.long()
    t = shifts.long()
    # lexicographic sign of the shift: the first nonzero component's sign
    sign = torch.where(t[:, 0] != 0, t[:, 0].sign(), torch.where(t[:, 1] != 0, t[:, 1].sign(), t[:, 2].sign()))
    flip = (r > s) | ((r == s) & (sign < 0))
    lower, upper = torch.minimum(r, s), torch.maximum(r, s)
    t = torch.where(flip[:, None], -t, t)
    span = t.abs().amax() if t.numel() else torch.zeros((), dtype=torch.long, device=t.device)
    base = 2 * span + 1
    key = lower * n_nodes + upper
    for c in range(3):
        key = key * base + (t[:, c] + span)
    return torch.where(live, key, torch.full_like(key, -1))


def edge_pairs(receivers: torch.Tensor, senders: torch.Tensor, shifts: torch.Tensor, live: torch.Tensor, n_nodes: int) -> EdgePairs:
    """Group the edges of a neighbour list into pairs (see the module docstring).

    Args:
        receivers, senders: ``[E]`` node indices; shifts: ``[E, 3]`` integer image offsets
            (any integer or float dtype holding integers); live: ``[E]`` bool, the edges whose
            radial input is nonzero; n_nodes: the node count (``> max`` index).

    Static shapes throughout (``torch.compile``/CUDA-graph friendly). For a list that is not
    pair-complete ``n_groups`` may exceed ``P``; the indices are clamped so that nothing reads out
    of bounds, but the weights are then wrong: the caller checks with :func:`pairs_fit`.
    Keys are packed into int64: ``n_nodes**2 * (2 * max|shift| + 1)**3`` must stay below ``2**63``.
    """
    n_edges = receivers.shape[0]
    P = pair_capacity(n_edges)
    device = receivers.device
    if n_edges == 0:
        raise ValueError("edge_pairs needs at least one edge")
    key = _pair_keys(receivers, senders, shifts, live, n_nodes)
    sorted_key, order = torch.sort(key)
    start = torch.cat([torch.ones(1, dtype=torch.bool, device=device), sorted_key[1:] != sorted_key[:-1]])
    group = torch.cumsum(start.long(), 0) - 1  # ascending, one id per distinct key
    n_groups = group[-1] + 1
    # each group's first position in key order is its leader
    first = torch.searchsorted(group, torch.arange(P, dtype=group.dtype, device=device)).clamp(max=n_edges - 1)
    leader = order.index_select(0, first)
    pair_of_edge = torch.empty_like(group).scatter_(0, order, group.clamp(max=P - 1))
    # each live group's two edges: its first two positions in key order, the second only if
    # it belongs to the same group
    rows = torch.arange(P, dtype=group.dtype, device=device)
    live_row = (rows < n_groups) & (sorted_key.index_select(0, first) >= 0)
    after = (first + 1).clamp(max=n_edges - 1)
    has_second = live_row & (first + 1 < n_edges) & (group.index_select(0, after) == rows)
    none = torch.full_like(leader, -1)
    row_edges = torch.stack([torch.where(live_row, leader, none), torch.where(has_second, order.index_select(0, after), none)], 1)
    return EdgePairs(leader, pair_of_edge, n_groups, row_edges)


def pairs_fit(pairs: EdgePairs, shifts: torch.Tensor, n_nodes: int) -> bool:
    """Whether ``pairs`` is exact: every group found has a row (``n_groups <= P``), and the packed
    keys cannot have overflowed. Reads two numbers from the device (a synchronisation)."""
    span = int(shifts.abs().amax()) if shifts.numel() else 0
    if n_nodes**2 * (2 * span + 1) ** 3 >= 2**63:
        return False
    return int(pairs.n_groups) <= pairs.leader.shape[0]
