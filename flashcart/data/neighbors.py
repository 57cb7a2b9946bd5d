"""Neighbour lists with periodic shifts (O(N) on CPU and CUDA), and the skin check that says
when a list must be rebuilt.

Contract of :func:`neighbor_list` (every backend):

* pairs ``(i, j, S)`` with ``|x_j - x_i + S @ cell| < cutoff`` (Å, strict), exactly the set of
  ``ase.neighborlist.primitive_neighbor_list("ijS", ...)`` on the same numbers (as float64),
  including several images of the same atom when the cell is thinner than the cutoff, any
  mixture of periodic and open directions, and positions outside the cell (they need not be
  wrapped: ``S`` refers to the positions as given);
* ``receivers`` ``i`` and ``senders`` ``j`` are int64 ``[E]``, ``receivers`` non-decreasing
  (edges grouped by receiver; the order within a receiver is backend-defined: deterministic for
  the torch searches);
  ``shifts`` ``S`` ``[E, 3]`` are whole multiples of the lattice vectors (cell rows) in
  ``positions.dtype``, zero along open directions; everything on ``positions.device``;
* ``i == j`` with ``S == 0`` is left out unless ``self_interaction``.

Backends (``backend=``): ``"vesin"`` (the vesin-torch library: C++ cell list on CPU, CUDA
kernels on GPU), ``"cell_list"`` (torch, :mod:`._cell_list`: vectorised binning in fractional
coordinates), ``"all_pairs"`` (torch, O(N^2) in atoms times images, fastest for tiny systems)
and ``"auto"``: vesin when it is installed and loads, else the torch searches (all-pairs when it
evaluates at most ``ALL_PAIRS_MAX_DISTANCES`` distances, else the cell list). On CUDA, "auto"
falls back to the torch searches for good (with a warning) if vesin-torch raises there.
Building a list synchronises with the device (its length is data-dependent); that happens only
when a list is (re)built.

Reuse with a skin (what a simulation engine does between rebuilds): build the list once with
cutoff ``r_max + skin`` at ``reference_positions``; while no atom has moved more than ``skin / 2``
from its reference position (lattice-vector jumps from wrapping excluded), every pair closer
than ``r_max`` is still in the list, because the distance of a pair changes by at most the sum
of the two displacements. :func:`max_displacement_exceeds` evaluates that condition on the
device and returns a 0-d bool tensor without synchronising, so the caller chooses when to read
it (for example in the same transfer as energy and forces). The cell must be the one the list was
built with; a changed cell (or atoms added or removed) needs a rebuild.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from ._cell_list import all_pairs, all_pairs_work, binning_geometry, cell_list_pairs

__all__ = [
    "ALL_PAIRS_MAX_DISTANCES",
    "BACKENDS",
    "displacements",
    "max_displacement_exceeds",
    "neighbor_list",
    "vesin_available",
]

BACKENDS = ("auto", "vesin", "cell_list", "all_pairs")
# "auto" without vesin: all-pairs up to this many distances (atoms^2 x images), else the cell list
# (crossover measured on CPU: ~30 atoms in a periodic 27-image cell, ~300 atoms of a molecule).
ALL_PAIRS_MAX_DISTANCES = 100_000

_vesin_module = None  # vesin_torch once imported; False when it is missing or does not load
_vesin_cuda_failed = False  # "auto" stops trying vesin on CUDA after one failure (warned once)
_vesin_calculators: dict = {}  # (cutoff, device) -> vesin_torch.NeighborList


def vesin_available() -> bool:
    """True when the ``vesin-torch`` package imports and its compiled library loads."""
    global _vesin_module
    if _vesin_module is None:
        try:
            import vesin_torch

            _vesin_module = vesin_torch
        except (ImportError, OSError, RuntimeError):
            _vesin_module = False
    return _vesin_module is not False


def _as_pbc(pbc) -> list[bool]:
    if pbc is None:
        return [False, False, False]
    if isinstance(pbc, torch.Tensor):
        values = pbc.detach().cpu().reshape(-1).tolist()
    else:
        values = np.asarray(pbc).reshape(-1).tolist()
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise ValueError(f"pbc must be 3 booleans (one per lattice vector), got {pbc!r}")
    return [bool(v) for v in values]


def _check(positions: torch.Tensor, cutoff: float, cell: torch.Tensor, periodic: list[bool]) -> None:
    if not isinstance(positions, torch.Tensor) or positions.ndim != 2 or positions.shape[1] != 3:
        raise ValueError(f"positions must be an [n, 3] tensor, got {getattr(positions, 'shape', type(positions))}")
    if not positions.is_floating_point():
        raise ValueError(f"positions must be floating point, got {positions.dtype}")
    if not (isinstance(cutoff, (int, float)) and math.isfinite(cutoff) and cutoff > 0):
        raise ValueError(f"cutoff must be a positive finite number of Å, got {cutoff!r}")
    if cell.shape != (3, 3):
        raise ValueError(f"cell must be [3, 3] (lattice vectors as rows), got {tuple(cell.shape)}")
    if positions.shape[0] and not bool(torch.isfinite(positions).all()):
        raise ValueError("positions contain NaN or infinite values")
    rows = cell.detach().to("cpu", torch.float64)[[k for k in range(3) if periodic[k]]]
    if rows.shape[0]:
        gram = torch.det(rows @ rows.T).item()
        scale = float(torch.prod((rows * rows).sum(1)))
        if not math.isfinite(gram) or gram <= 1e-12 * max(scale, 1e-300):
            raise ValueError(f"periodic structure with a singular cell {cell.detach().cpu().tolist()} (pbc {periodic})")


def _vesin_calculator(cutoff: float, device: torch.device):
    """A vesin ``NeighborList`` per (cutoff, device), kept so its (CUDA) buffers are reused
    between rebuilds instead of allocated and freed each time (at most 4 are kept)."""
    key = (float(cutoff), str(device))
    nl = _vesin_calculators.pop(key, None)
    if nl is None:
        nl = _vesin_module.NeighborList(cutoff=float(cutoff), full_list=True, sorted=True)
    _vesin_calculators[key] = nl  # most recently used last
    while len(_vesin_calculators) > 4:
        _vesin_calculators.pop(next(iter(_vesin_calculators)))
    return nl


def _vesin_pairs(positions, cutoff, cell, periodic, self_interaction):
    pos = positions.detach().to(torch.float64)
    nl = _vesin_calculator(cutoff, pos.device)
    box = cell.detach().to(device=pos.device, dtype=torch.float64)
    i, j, s = nl.compute(pos, box, torch.tensor(periodic, device=pos.device), "ijS")
    s = s.to(torch.int64)
    if self_interaction:
        n = pos.shape[0]
        idx = torch.arange(n, device=pos.device)
        i, j = torch.cat([i, idx]), torch.cat([j, idx])
        s = torch.cat([s, torch.zeros(n, 3, dtype=torch.int64, device=pos.device)])
        order = torch.argsort(i, stable=True)
        i, j, s = i[order], j[order], s[order]
    return i, j, s


def neighbor_list(
    positions: torch.Tensor,
    cutoff: float,
    cell: torch.Tensor | None = None,
    pbc: torch.Tensor | Sequence[bool] | None = None,
    self_interaction: bool = False,
    chunk: int | None = None,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs ``(i, j, shift)`` with ``|x_j - x_i + shift @ cell| < cutoff`` (see the module docstring).

    Args:
        positions: ``[n, 3]`` Å (any float dtype; CPU or CUDA). Need not be wrapped into the cell.
        cutoff: Å.
        cell: ``[3, 3]`` lattice vectors as rows (Å); ``None`` (or zeros) for a molecule. Open
            directions may have zero or arbitrary vectors; periodic ones must be independent.
        pbc: periodicity per lattice vector (3 booleans, tensor/array/tuple); ``None``: none.
        self_interaction: keep ``i == j`` with zero shift.
        chunk: torch backends: candidate pairs held at once (about 100 bytes each; bounds peak
            memory); ``None``: 1M on CPU, 8M on CUDA.
        backend: ``"auto"``, ``"vesin"``, ``"cell_list"`` or ``"all_pairs"``.
    Returns:
        receivers ``i: [E]``, senders ``j: [E]`` (int64, grouped by ``i`` in ascending order),
        shifts ``[E, 3]`` (integer multiples of the lattice vectors, in ``positions.dtype``).
    """
    global _vesin_cuda_failed
    if backend not in BACKENDS:
        raise ValueError(f"neighbour-list backend must be one of {BACKENDS}, got {backend!r}")
    device, dtype = positions.device, positions.dtype
    if chunk is None:
        chunk = 8_000_000 if device.type == "cuda" else 1_000_000
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    periodic = _as_pbc(pbc)
    cell = torch.zeros(3, 3, dtype=torch.float64) if cell is None else torch.as_tensor(cell)
    _check(positions, cutoff, cell, periodic)
    n = positions.shape[0]
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return empty, empty, torch.zeros(0, 3, dtype=dtype, device=device)
    result = None
    if backend == "vesin" or (backend == "auto" and vesin_available() and not (device.type == "cuda" and _vesin_cuda_failed)):
        if not vesin_available():
            raise ImportError("backend='vesin' needs the vesin-torch package (pip install vesin-torch) for this torch version")
        try:
            result = _vesin_pairs(positions, cutoff, cell, periodic, self_interaction)
        except RuntimeError as err:
            if backend == "vesin" or device.type != "cuda":
                raise
            if "maximum capacity" not in str(err):  # a structure denser than vesin's CUDA pair budget: this call only
                _vesin_cuda_failed = True
                warnings.warn(f"vesin-torch failed on {device} ({err}); using the torch cell list from now on", stacklevel=2)
    if result is None:
        geo = binning_geometry(positions, cell.to(device), periodic)
        use_all_pairs = backend == "all_pairs" or (backend == "auto" and all_pairs_work(geo, float(cutoff)) <= ALL_PAIRS_MAX_DISTANCES)
        search = all_pairs if use_all_pairs else cell_list_pairs
        result = search(geo, float(cutoff), self_interaction, max_candidates=chunk)
    i, j, s = result
    return i.to(device), j.to(device), s.to(device=device, dtype=dtype)


def _reciprocal(cell: torch.Tensor) -> torch.Tensor:
    """``inv(cell)`` from cross products (elementwise ops only: no solver, no synchronisation)."""
    a, b, c = cell[0], cell[1], cell[2]
    bc, ca, ab = torch.linalg.cross(b, c), torch.linalg.cross(c, a), torch.linalg.cross(a, b)
    return torch.stack([bc, ca, ab], dim=1) / (a * bc).sum()


def displacements(
    positions: torch.Tensor,
    reference_positions: torch.Tensor,
    cell: torch.Tensor | None = None,
    pbc: torch.Tensor | Sequence[bool] | None = None,
) -> torch.Tensor:
    """``positions - reference_positions`` ``[n, 3]`` (Å) with whole lattice vectors removed along
    periodic directions (an atom wrapped back into the cell has not moved). Sync-free.

    ``cell [3, 3]`` rows are lattice vectors (Å); ``pbc`` 3 booleans (default: all periodic when a
    cell is given). Valid while true displacements stay below half a cell height.
    """
    d = positions - reference_positions
    if cell is None:
        return d
    cell = cell.to(device=d.device, dtype=d.dtype)
    frac = d @ _reciprocal(cell)
    wraps = torch.round(frac)
    if pbc is not None:
        mask = pbc if isinstance(pbc, torch.Tensor) else torch.tensor(_as_pbc(pbc))
        wraps = wraps * mask.to(device=d.device, dtype=d.dtype)
    return d - wraps @ cell


def max_displacement_exceeds(
    positions: torch.Tensor,
    reference_positions: torch.Tensor,
    skin: float,
    cell: torch.Tensor | None = None,
    pbc: torch.Tensor | Sequence[bool] | None = None,
) -> torch.Tensor:
    """0-d bool tensor on ``positions.device``: has some atom moved more than ``skin / 2`` (Å) from
    ``reference_positions`` (where the list with cutoff ``r_max + skin`` was built)?

    ``False`` means the list still holds every pair closer than ``r_max``. Nothing is synchronised
    (no ``.item()``, no solver): read the flag when convenient. For a fully sync-free call on CUDA,
    pass ``cell`` and ``pbc`` as device tensors (a Python/NumPy ``pbc`` is uploaded each call).
    """
    if not (isinstance(skin, (int, float)) and math.isfinite(skin) and skin >= 0):
        raise ValueError(f"skin must be a finite number of Å >= 0, got {skin!r}")
    if positions.shape != reference_positions.shape:
        raise ValueError(f"positions {tuple(positions.shape)} and reference positions {tuple(reference_positions.shape)} differ in shape")
    d = displacements(positions, reference_positions, cell, pbc)
    if d.shape[0] == 0:
        return torch.zeros((), dtype=torch.bool, device=d.device)
    return (d * d).sum(-1).amax() > (0.5 * skin) ** 2
