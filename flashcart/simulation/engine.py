"""The simulation engine: positions (+ cell, pbc) -> energy, forces, stress through the Predictor.

One engine serves every simulation adapter (ASE calculator, OpenMM force, ``flashcart-md``).
It owns what a simulation needs around the model call:

* device placement and dtype of the model and of the inputs;
* neighbour-list reuse with a skin: the list is built with cutoff ``r_max + skin`` and reused
  while no atom has moved more than ``skin / 2`` from where it was when the list was built.
  The largest displacement is computed on the device and travels to the host in the same
  transfer as the energy and forces, so a step that reuses the list synchronises exactly once
  (when the results are copied back). If it says the list was stale, the result is discarded and
  the step is evaluated again with a fresh list. To avoid paying that extra model call, the
  engine extrapolates the largest displacement of the last two steps and rebuilds one step
  early when the next step would probably exceed ``skin / 2`` (an MD step moves atoms by about
  the same amount each step). Atoms wrapped back into a periodic cell (as OpenMM and
  ``atoms.wrap()`` do) are mapped back next to their reference positions by lattice vectors, so
  wrapping does not force a rebuild;
* padded capacities (through :meth:`Predictor.reserve`, in :meth:`Engine._ensure_capacity`
  only): a new list that does not fit grows them with ``headroom``, so later lists fit without
  recompiling;
* atomic energy offsets (included or not);
* how a step runs (``step``):

  - ``"dynamic"``: the Predictor on the ``r_max + skin`` list (padded when ``pad``), the
    displacement check and the packing as separate eager operations around it;
  - ``"static"``: the static-shape step of :mod:`flashcart.simulation.static_step`: the list
    lives in fixed-capacity buffers, and each step compacts it on the device to the pairs
    within ``r_max`` (so the model sees the edges the profiler sees), with the unwrapping,
    the displacement check and the packing, without a host synchronisation before the one
    that reads the results. Pairs within ``r_max`` beyond the compacted capacity (reported
    with the results) discard the step and rebuild with a larger capacity; capacities are
    ``headroom`` above the sizes at the build;
  - ``"graph"``: the same static step captured as one CUDA graph (host-to-device copy of the
    positions, step, device-to-host copy of the results); per step the host copies the
    positions into pinned memory, replays the graph and synchronises once. A new list is
    copied into the captured buffers; the graph is captured again only when a capacity grows
    (or the system changes). CUDA only; with a compile mode that replays CUDA graphs itself
    (``reduce-overhead``, ``max-autotune``) the model inside is compiled without them;
  - ``"auto"`` (default): when the list is reused (``skin > 0``) and padding is not switched
    off, ``"graph"`` on CUDA with a compile mode that replays CUDA graphs (``reduce-overhead``,
    ``max-autotune``) if :data:`AUTO_GRAPH_STEP` is on, else ``"dynamic"`` there (the
    Predictor's own graphs); ``"static"`` on CUDA otherwise or wherever the model is padded
    anyway (``pad=True`` or compiled); else ``"dynamic"`` (eager on the CPU, where padding a
    small molecule to the capacity multiples would cost more than the compaction saves:
    ethanol padded to 128 atoms is slower). :data:`AUTO_GRAPH_STEP` is on: on the H200
    (2026-12-01, i2c3f20l2r, reduce-overhead, skin 0.5 Å) the graph step took 3.09 and
    4.12 ms an ASE step on water and diamond against the dynamic step's 4.00 and 5.48 ms (the
    model sees only the pairs within ``r_max``). If a capture that the engine chose fails, it warns and continues with
    ``"static"``; an explicit ``step="graph"`` raises.

* device rebuilds (static and graph steps on CUDA, :attr:`Engine.device_rebuild`): a stale
  list is rebuilt on the device by a :class:`~flashcart.simulation.static_list.StaticCellList`
  planned at the last host build, into the same buffers and without a synchronisation (the
  graph step captures it with the step and replays it first). Its pair count and fullest bin
  come back with the step's results; a list that did not fit discards the step and builds on
  the host with grown capacities. On the H200 this took the ASE water step from 3.09 to
  2.58 ms (benchmarks/RESULTS.md, 2026-12-01 evening). Structures periodic along some
  directions only, and those whose dense candidates exceed
  :data:`~flashcart.simulation.static_list.MAX_CANDIDATES`, build on the host.
* the step's own work compiled (:attr:`Engine.compile_step`, on CUDA with a compile mode): the
  static step's work around the model and the device rebuild's cell list run as
  ``torch.compile``'d functions, a few fused kernels inside the captured graphs instead of about a
  hundred small ones. On the H200 this took the ASE water step from 2.72 to 2.49 ms and a device
  rebuild from 0.44 to 0.26 ms (benchmarks/RESULTS.md, 2026-12-01 night).
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..data.batch import Batch, Structure, collate
from ..data.neighbors import neighbor_list
from ..model.checkpoint import load_checkpoint
from ..model.potential import FlashCartPotential, element_types
from ..model.predictor import CUDA_GRAPH_MODES, Predictor
from ..nn.radial_table import MIN_INTERVALS
from ..utils.device import resolve_device
from .evaluator import Evaluation
from .static_list import MAX_CANDIDATES, StaticCellList, plan_cell_list, supports
from .static_step import PACKED_HEADER, CapturedRebuild, CapturedStep, StaticStep, StepCapacities, pairs_within

__all__ = ["Engine", "COMPILE_MODES", "STEP_MODES"]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
STEP_MODES = ("auto", "dynamic", "static", "graph")
# Whether step "auto" captures the graph step on CUDA with a CUDA-graph compile mode: on since the
# graph step (padding edges spread) was measured faster than the dynamic step on the H200
# (benchmarks/RESULTS.md, 2026-12-01: 3.09 against 4.00 ms an ASE step on water, 4.12 against
# 5.48 ms on diamond).
AUTO_GRAPH_STEP = True
# spare atoms per bin of the device rebuilds' cell list (relative to the fullest bin at a host build)
SLOT_HEADROOM = 0.5
# the compile mode of the model inside a captured step: the same without its own CUDA graphs
_WITHOUT_CUDA_GRAPHS = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}


@dataclass
class _Graph:
    """A cached neighbour list and what it was built for."""

    numbers: np.ndarray  # [N] atomic numbers
    pbc: np.ndarray  # [3] bool
    cell: np.ndarray  # [3, 3] float64, Å
    reference: torch.Tensor  # [N, 3] positions the list was built at (device, dtype)
    batch: Batch  # the one-structure batch whose positions are replaced every step
    offset: float  # eV: sum of the atomic energy shifts of these atoms
    cell_t: torch.Tensor | None  # [3, 3] device, for unwrapping (None without periodicity)
    inv_cell_t: torch.Tensor | None  # [3, 3]
    periodic_t: torch.Tensor | None  # [3] 1.0 along periodic directions, else 0.0

    def matches(self, numbers: np.ndarray, cell: np.ndarray, pbc: np.ndarray) -> bool:
        return np.array_equal(numbers, self.numbers) and np.array_equal(pbc, self.pbc) and np.array_equal(cell, self.cell)


@dataclass
class _System:
    """What the static step's list was built for."""

    numbers: np.ndarray  # [N]
    pbc: np.ndarray  # [3] bool
    cell: np.ndarray  # [3, 3] float64, Å
    offset: float  # eV: sum of the atomic energy shifts of these atoms

    def matches(self, numbers: np.ndarray, cell: np.ndarray, pbc: np.ndarray) -> bool:
        return np.array_equal(numbers, self.numbers) and np.array_equal(pbc, self.pbc) and np.array_equal(cell, self.cell)


def _count(host: np.ndarray, k: int) -> int:
    """Entry ``k`` of a packed static-step result's header, a count stored in the step's dtype."""
    return int(round(float(host[k])))


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if dtype in ("float32", torch.float32):
        return torch.float32
    if dtype in ("float64", torch.float64):
        return torch.float64
    raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")


class Engine:
    """A FlashCart model as an :class:`~flashcart.simulation.Evaluator` for simulations.

    Args:
        model: a checkpoint directory (``best/``, ``log/``), its ``model.pt``, or a
            :class:`~flashcart.model.FlashCartPotential` (copied, so the caller's model is
            left as it is).
        device: ``cpu``, ``gpu``, ``auto`` or ``cuda[:N]``.
        dtype: ``float32`` or ``float64`` (model and inputs).
        skin: extra neighbour-list radius (Å); the list is reused until an atom has moved more
            than ``skin / 2`` (edges beyond the cutoff contribute exactly zero). ``0``: a new
            list for every call.
        compile_mode: ``None`` (eager) or a ``torch.compile`` mode (``default``,
            ``reduce-overhead``, ...).
        pad: pad to growing capacities (default: on when compiling).
        pad_atom_multiple, pad_edge_multiple: capacity rounding.
        add_atomic_offsets: include the per-element energy shifts in the energy.
        headroom: relative spare capacity reserved when a new neighbour list does not fit
            (and, for the static step, above the pairs within ``r_max`` at a build: padding
            edges fill those slots; on the H200 a graph step on water took 2.31 ms at 0.1 and
            2.35 ms at 0.03, so they cost little; a smaller one makes an overflow, which
            rebuilds with new buffers and, compiled, recompiles, likelier).
        compile_backend: ``torch.compile`` backend (``inductor``; tests use ``aot_eager``).
        step: ``auto``, ``dynamic``, ``static`` or ``graph`` (see the module docs).
        radial_table: ``0`` (the radial MLPs), or their tables on this many intervals (at least
            16; 4096 is as accurate as float32 MLPs): inference-only stand-ins for the MLPs,
            built from this engine's copy of the model
            (:meth:`~flashcart.model.FlashCartPotential.set_radial_tables`).
    """

    def __init__(
        self,
        model: str | Path | FlashCartPotential,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "float32",
        skin: float = 0.0,
        compile_mode: str | None = None,
        pad: bool | None = None,
        pad_atom_multiple: int = 128,
        pad_edge_multiple: int = 128,
        add_atomic_offsets: bool = True,
        headroom: float = 0.1,
        compile_backend: str | Callable = "inductor",
        step: str = "auto",
        radial_table: int = 0,
    ):
        self._options = dict(
            device=str(device),
            dtype=dtype,
            skin=skin,
            compile_mode=compile_mode,
            pad=pad,
            pad_atom_multiple=pad_atom_multiple,
            pad_edge_multiple=pad_edge_multiple,
            add_atomic_offsets=add_atomic_offsets,
            headroom=headroom,
            compile_backend=compile_backend,
            step=step,
            radial_table=radial_table,
        )
        self.dtype = _as_dtype(dtype)
        if not skin >= 0:
            raise ValueError(f"skin must be >= 0 (Å), got {skin}")
        if not headroom >= 0:
            raise ValueError(f"headroom must be >= 0, got {headroom}")
        if compile_mode is not None and compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be None or one of {list(COMPILE_MODES)}, got {compile_mode!r}")
        for name, value in (("pad_atom_multiple", pad_atom_multiple), ("pad_edge_multiple", pad_edge_multiple)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if step not in STEP_MODES:
            raise ValueError(f"step must be one of {list(STEP_MODES)}, got {step!r}")
        if isinstance(radial_table, bool) or not isinstance(radial_table, int) or not (radial_table == 0 or radial_table >= MIN_INTERVALS):
            raise ValueError(f"radial_table must be 0 (the radial MLPs) or at least {MIN_INTERVALS} intervals, got {radial_table!r}")
        self.device = resolve_device(device)
        # a graph the engine chose itself falls back to the eager static step if capturing fails
        self._graph_fallback = step == "auto"
        if step == "auto":
            step = "dynamic"
            if skin > 0 and pad is not False:
                if self.device.type == "cuda" and compile_mode in CUDA_GRAPH_MODES:
                    step = "graph" if AUTO_GRAPH_STEP else "dynamic"
                elif self.device.type == "cuda" or pad or compile_mode is not None:
                    step = "static"
        if step in ("static", "graph") and pad is False:
            raise ValueError(f"step={step!r} pads to static capacities: it cannot run with pad=False")
        if step == "graph" and self.device.type != "cuda":
            raise ValueError(f"step='graph' captures a CUDA graph and needs a CUDA device, got device={device!r} ({self.device})")
        self.step = step
        if isinstance(model, FlashCartPotential):
            model = copy.deepcopy(model)
        else:
            model = load_checkpoint(model)
        self._atomic_shifts = model.atomic_shifts.detach().to(torch.float64).cpu()  # eV, before any cast
        self._z_to_type = model.z_to_type.detach().cpu()
        self.elements = list(model.elements)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        # this engine's own tables (or none), built from its copy in its device and dtype
        try:
            self.model.set_radial_tables(radial_table or None)
        except ValueError as err:
            raise ValueError(f"radial_table={radial_table}: {err}") from None
        self.r_max = float(self.model.r_max)
        self.skin, self.add_atomic_offsets, self.headroom = float(skin), add_atomic_offsets, float(headroom)
        self.compile_mode = compile_mode
        self.predictor = Predictor(
            self.model,
            compile=compile_mode is not None,
            compile_mode=compile_mode or "default",
            pad=pad,
            pad_atom_multiple=pad_atom_multiple,
            pad_edge_multiple=pad_edge_multiple,
            pad_graph_multiple=1,
            compile_backend=compile_backend,
        )
        self._multiples = (pad_atom_multiple, pad_edge_multiple)
        self._graph: _Graph | None = None
        self._static: StaticStep | None = None  # step="static"/"graph": buffers and the list
        self._system: _System | None = None
        self._captured: dict[bool, CapturedStep] = {}  # step="graph", by stress
        self._captured_rebuilds: dict[bool, CapturedRebuild] = {}  # device rebuilds of those steps
        self._cell_list: StaticCellList | None = None  # the static step's device rebuilds (None: host builds only)
        # static and graph steps: rebuild stale lists on the device (a static cell list, captured
        # with the graph step) where the structure allows it; host builds still size the buffers
        self.device_rebuild = self.device.type == "cuda"
        # static and graph steps on CUDA with a compile mode: the step's own work around the model
        # (compaction, device rebuilds) compiled into a few fused kernels instead of about a
        # hundred small ones
        self.compile_step = self.device.type == "cuda" and compile_mode is not None
        self._static_predictor: Predictor | None = None
        self._pinned_in: torch.Tensor | None = None  # host staging buffers (CUDA only)
        self._pinned_out: torch.Tensor | None = None
        self.neighbor_list_builds = 0  # lists built (first call, stale lists, changed systems)
        self.device_rebuilds = 0  # of those, rebuilt on the device (static and graph steps)
        self.stale_evaluations = 0  # calls evaluated with a reused list that turned out stale
        self.early_rebuilds = 0  # lists rebuilt because the next step was predicted to be stale
        self.capacity_overflows = 0  # static steps discarded: more pairs within r_max than edge slots
        self.graph_captures = 0  # CUDA graphs captured (step="graph")
        self.graph_capture_error: str | None = None  # why step "auto" fell back from "graph" to "static"
        self.model_edges = 0  # edges the model saw in the last call (within r_max for the static step)
        self._moved = (0.0, 0.0)  # largest displacement (Å) from the list's reference, last two calls

    # ------------------------------------------------------------------ public

    def evaluate(
        self,
        positions: np.ndarray | torch.Tensor,
        numbers: np.ndarray,
        cell: np.ndarray | None = None,
        pbc: np.ndarray | tuple[bool, bool, bool] | None = None,
        stress: bool = False,
    ) -> Evaluation:
        """Energy (eV), forces ``[N, 3]`` (eV/Å) and optionally stress ``[3, 3]`` (eV/Å^3).

        Args:
            positions: ``[N, 3]`` Å (NumPy, or a tensor on any device).
            numbers: ``[N]`` atomic numbers.
            cell: ``[3, 3]`` lattice vectors as rows (Å); ``None`` for a molecule.
            pbc: periodicity per lattice vector; ``None``: periodic in all directions when a
                cell is given, else in none.
            stress: also compute the stress (needs periodicity in all three directions).
        """
        numbers = np.asarray(numbers)
        n = numbers.shape[0]
        if n == 0:
            raise ValueError("cannot evaluate a structure without atoms")
        if tuple(positions.shape) != (n, 3):
            raise ValueError(f"positions have shape {tuple(positions.shape)}, expected ({n}, 3) for {n} atoms")
        cell_np = np.zeros((3, 3)) if cell is None else np.asarray(cell, dtype=np.float64).reshape(3, 3)
        pbc_np = np.full(3, cell is not None) if pbc is None else np.broadcast_to(np.asarray(pbc, dtype=bool), (3,)).copy()
        if stress and not pbc_np.all():
            raise ValueError("stress needs a structure periodic in all three directions")
        if self.step != "dynamic":
            return self._evaluate_static(positions, numbers, cell_np, pbc_np, stress)
        pos = self._upload(positions)
        graph = self._graph
        if self.skin > 0 and graph is not None and graph.matches(numbers, cell_np, pbc_np):
            previous, last = self._moved
            if last + 1.5 * max(last - previous, 0.0) <= 0.5 * self.skin:
                pos_reused, moved2 = self._reuse(graph, pos)
                result = self._run(graph, pos_reused, stress, moved2)
                if result is not None:
                    return result
                self.stale_evaluations += 1
            else:
                self.early_rebuilds += 1
        graph = self._build(pos, numbers, cell_np, pbc_np)
        return self._run(graph, pos, stress, None)

    __call__ = evaluate

    def __reduce__(self):
        """Pickled as the model and the options (OpenMM's XmlSerializer pickles PythonForce
        callbacks); compiled functions, neighbour lists and buffers are rebuilt on first use."""
        return (_rebuild_engine, (copy.deepcopy(self.model).cpu(), self._atomic_shifts, self._options))

    @property
    def n_edges(self) -> int:
        """Edges (within ``r_max + skin``) of the cached neighbour list; 0 before the first call."""
        if self.step != "dynamic":
            return 0 if self._static is None else self._static.n_pairs
        return 0 if self._graph is None else int(self._graph.batch.receivers.shape[0])

    def check_numbers(self, numbers) -> torch.Tensor:
        """Model type indices ``[N]`` of atomic numbers ``[N]``; elements the model does not know
        are an error naming them."""
        return element_types(self._z_to_type, torch.as_tensor(np.asarray(numbers), dtype=torch.long), self.elements)

    # ------------------------------------------------------------------ internals

    def _upload(self, positions) -> torch.Tensor:
        """Positions on the engine's device and dtype; from NumPy through a pinned buffer on CUDA."""
        if isinstance(positions, torch.Tensor):
            return positions.detach().to(device=self.device, dtype=self.dtype)
        positions = np.asarray(positions, dtype=np.float64)
        if self.device.type != "cuda":
            return torch.tensor(positions, dtype=self.dtype)  # a copy: callers move their arrays in place
        if self._pinned_in is None or self._pinned_in.shape != positions.shape:
            self._pinned_in = torch.empty(positions.shape, dtype=self.dtype, pin_memory=True)
        self._pinned_in.numpy()[...] = positions  # cast to the engine's dtype on the host
        return self._pinned_in.to(self.device, non_blocking=True)

    def _reuse(self, graph: _Graph, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions mapped next to the list's reference by lattice vectors, and the largest
        squared displacement from it (Å^2, a 0-d tensor on the device; nothing is synchronised).

        The unwrapping uses the inverse cell computed once per list (the cell is fixed while a
        list is reused), which takes fewer kernel launches per step than
        :func:`~flashcart.data.neighbors.displacements`, which recomputes it."""
        if graph.cell_t is not None:
            wraps = torch.round((pos - graph.reference) @ graph.inv_cell_t) * graph.periodic_t  # whole lattice vectors
            pos = pos - wraps @ graph.cell_t  # exact for atoms that were not wrapped (wraps == 0)
        d = pos - graph.reference
        return pos, (d * d).sum(dim=1).amax()

    def _build(self, pos: torch.Tensor, numbers: np.ndarray, cell: np.ndarray, pbc: np.ndarray) -> _Graph:
        """A new neighbour list at ``pos`` (on the engine's device), cached for later calls."""
        numbers_t = torch.as_tensor(numbers, dtype=torch.long)
        types = self.check_numbers(numbers)
        if pbc.any() and abs(float(np.linalg.det(cell))) < 1e-9:
            raise ValueError(f"periodic structure with a singular cell {cell.tolist()}")
        dev = self.device
        cell_t = torch.tensor(cell, dtype=self.dtype, device=dev)
        pbc_t = torch.tensor(pbc)
        receivers, senders, shifts = neighbor_list(pos, self.r_max + self.skin, cell_t, pbc_t)
        n = pos.shape[0]
        nan = torch.tensor(float("nan"), dtype=self.dtype)
        structure = Structure(
            positions=pos,
            numbers=numbers_t.to(dev),
            cell=cell_t,
            pbc=pbc_t,
            receivers=receivers,
            senders=senders,
            shifts=shifts,
            energy=nan.to(dev),
            forces=nan.expand(n, 3).to(dev),
            stress=nan.expand(3, 3).to(dev),
        )
        batch = collate([structure], self._z_to_type.to(dev)).to(dev, self.dtype)
        self._ensure_capacity(n, receivers.shape[0])
        periodic = bool(pbc.any())
        graph = _Graph(
            numbers=numbers.copy(),
            pbc=pbc.copy(),
            cell=cell.copy(),
            reference=pos.clone(),
            batch=batch,
            offset=float(self._atomic_shifts[types].sum()),
            cell_t=cell_t if periodic else None,
            inv_cell_t=torch.linalg.inv(torch.tensor(cell, dtype=torch.float64)).to(dev, self.dtype) if periodic else None,
            periodic_t=torch.tensor(pbc, dtype=self.dtype, device=dev) if periodic else None,
        )
        self._graph = graph
        self.neighbor_list_builds += 1
        return graph

    def _ensure_capacity(self, n_atoms: int, n_edges: int) -> None:
        """The one place capacities grow: a list that does not fit reserves ``headroom`` more."""
        p = self.predictor
        if not p.pad:
            return
        cap = p.capacities
        if n_edges > cap.edges or n_atoms + 2 > cap.atoms:
            h = 1.0 + self.headroom
            p.reserve(max(n_atoms, int(h * n_atoms)), max(n_edges, int(h * n_edges) + 1), 1)

    def _run(self, graph: _Graph, pos: torch.Tensor, stress: bool, moved2: torch.Tensor | None) -> Evaluation | None:
        """One model call; ``None`` when the largest squared displacement ``moved2`` (Å^2, from
        the list's reference) turns out above ``(skin / 2)^2`` (the result is then discarded).
        ``moved2=None``: the list was just built at ``pos``."""
        batch = graph.batch
        batch.positions = pos
        out = self.predictor(batch, forces=True, stress=stress)
        n = pos.shape[0]
        self.model_edges = int(batch.receivers.shape[0])
        parts = [out["energy"].reshape(1), (moved2 if moved2 is not None else out["energy"].new_zeros(())).to(pos.dtype).reshape(1)]
        parts.append(out["forces"].reshape(-1))
        if stress:
            parts.append(out["stress"].reshape(-1))
        host = self._download(torch.cat(parts))
        moved = math.sqrt(max(float(host[1]), 0.0))
        if moved > 0.5 * self.skin:
            return None
        self._moved = (self._moved[1], moved) if moved2 is not None else (0.0, 0.0)
        energy = float(host[0])
        if not self.add_atomic_offsets:
            energy -= graph.offset
        forces = host[2 : 2 + 3 * n].astype(np.float64).reshape(n, 3)
        s = host[2 + 3 * n :].astype(np.float64).reshape(3, 3) if stress else None
        return Evaluation(energy=energy, forces=forces, stress=s)

    # ------------------------------------------------------------------ static step

    def _evaluate_static(self, positions, numbers: np.ndarray, cell: np.ndarray, pbc: np.ndarray, stress: bool) -> Evaluation:
        """:meth:`evaluate` through the static step (``step`` ``static`` or ``graph``)."""
        if self.skin > 0 and self._system is not None and self._system.matches(numbers, cell, pbc):
            previous, last = self._moved
            stale = True  # the list must be rebuilt (not the capacities grown)
            if last + 1.5 * max(last - previous, 0.0) <= 0.5 * self.skin:
                host = self._run_static(positions, stress)
                moved = math.sqrt(max(float(host[1]), 0.0))
                if moved > 0.5 * self.skin:
                    self.stale_evaluations += 1
                elif _count(host, 2) > self._static.capacities.edges:
                    self.capacity_overflows += 1
                    stale = False
                else:
                    self._moved = (self._moved[1], moved)
                    return self._static_result(host, stress)
            else:
                self.early_rebuilds += 1
            if stale and self._cell_list is not None:  # a new list on the device, the step on it, one synchronisation
                host = self._run_static(positions, stress, rebuild=True)  # None: its capture failed (warned)
                if host is not None and self._device_list_fits(host):
                    self.neighbor_list_builds += 1
                    self.device_rebuilds += 1
                    self._moved = (0.0, 0.0)
                    return self._static_result(host, stress)
                if host is not None:
                    self.capacity_overflows += 1  # the host build below grows the capacities
        self._build_static(positions, numbers, cell, pbc)
        host = self._run_static(positions, stress)
        if _count(host, 2) > self._static.capacities.edges:
            # the build counted the pairs within r_max eagerly, the step (compiled, with fused
            # multiply-adds) can count a pair at the cutoff differently: size from the step's count
            self.capacity_overflows += 1
            self._build_static(positions, numbers, cell, pbc, min_edges=_count(host, 2))
            host = self._run_static(positions, stress)
            if _count(host, 2) > self._static.capacities.edges:
                raise RuntimeError(f"{int(host[2])} pairs within r_max right after a build with {self._static.capacities.edges} edge slots")
        self._moved = (0.0, 0.0)
        return self._static_result(host, stress)

    def _device_list_fits(self, host: np.ndarray) -> bool:
        """Whether a device rebuild's list (pairs listed, fullest bin) and the step's pairs within
        ``r_max`` fitted their capacities (else that step's results are wrong)."""
        step, cell_list = self._static, self._cell_list
        within, listed, fullest = _count(host, 2), _count(host, 3), _count(host, 4)
        if listed > step.capacities.pairs or fullest > cell_list.m or within > step.capacities.edges:
            return False
        step.n_pairs = listed
        return True

    def _static_model_call(self) -> Callable:
        """The padded model function of the static step: the engine's Predictor, or for a
        captured step with a compile mode that replays CUDA graphs, the same compiled without."""
        if self._static_predictor is None:
            p = self.predictor
            if p.compile and self.device.type == "cuda" and self.compile_mode in _WITHOUT_CUDA_GRAPHS:
                ma, me = self._multiples
                p = Predictor(
                    self.model,
                    compile=True,
                    compile_mode=_WITHOUT_CUDA_GRAPHS[self.compile_mode],
                    pad=True,
                    pad_atom_multiple=ma,
                    pad_edge_multiple=me,
                    pad_graph_multiple=1,
                    compile_backend=p.compile_backend,
                )
            self._static_predictor = p
        return self._static_predictor.call_static

    def _build_static(self, positions, numbers: np.ndarray, cell: np.ndarray, pbc: np.ndarray, min_edges: int = 0) -> None:
        """A new ``r_max + skin`` list at ``positions`` into the static buffers (new buffers, and
        a new CUDA graph, only when a capacity grows or the number of atoms or pbc change); the
        edge capacity fits at least ``min_edges`` pairs within ``r_max``."""
        types = self.check_numbers(numbers)
        if pbc.any() and abs(float(np.linalg.det(cell))) < 1e-9:
            raise ValueError(f"periodic structure with a singular cell {cell.tolist()}")
        pos = self._upload(positions)
        dev, n = self.device, pos.shape[0]
        cell_t = torch.tensor(cell, dtype=self.dtype, device=dev)
        receivers, senders, shifts = neighbor_list(pos, self.r_max + self.skin, cell_t, torch.tensor(pbc))
        shifts = shifts.to(self.dtype)
        within = int(pairs_within(pos, cell_t, receivers, senders, shifts, self.r_max).sum())  # a build synchronises anyway
        within = max(within, int(min_edges))
        step = self._static
        fits = step is not None and step.matches(n, pbc)
        current = step.capacities if fits else StepCapacities(0, 0, 0)
        capacities = current.grown(n, receivers.shape[0], within, self.headroom, *self._multiples)
        if not fits or capacities != current:
            step = self._static = StaticStep(
                self._static_model_call(), n, pbc, self.r_max, capacities, self.dtype, dev, compiled=self.compile_step
            )
            self._captured = {}
        periodic = bool(pbc.any())
        inv = torch.linalg.inv(torch.tensor(cell, dtype=torch.float64)).to(dev, self.dtype) if periodic else torch.zeros_like(cell_t)
        step.load(pos, types.to(dev), cell_t, inv, receivers, senders, shifts)
        self._cell_list = self._make_cell_list(pos, cell, pbc, step)
        self._captured_rebuilds = {}
        self._system = _System(numbers=numbers.copy(), pbc=pbc.copy(), cell=cell.copy(), offset=float(self._atomic_shifts[types].sum()))
        self.neighbor_list_builds += 1

    def _make_cell_list(self, pos: torch.Tensor, cell: np.ndarray, pbc: np.ndarray, step: StaticStep) -> StaticCellList | None:
        """The device rebuilder of ``step``'s ``r_max + skin`` list, planned at ``pos`` (bins, and
        slots with :data:`SLOT_HEADROOM`, not the engine's ``headroom``: a full bin only costs a
        host build, and fewer slots would not make the model cheaper); ``None`` where device rebuilds are off, or the structure is
        periodic along some directions only, or its dense candidate block would be too large."""
        if not self.device_rebuild or self.skin <= 0 or not supports(pbc):
            return None
        cutoff = self.r_max + self.skin
        plan = plan_cell_list(pos.detach().cpu().double().numpy(), cell, pbc, cutoff, SLOT_HEADROOM)
        if plan.candidates(step.n) > MAX_CANDIDATES:
            return None
        return StaticCellList(plan, step.n, cutoff, step.capacities.pairs, self.dtype, self.device, compiled=self.compile_step)

    def _run_static(self, positions, stress: bool, rebuild: bool = False) -> np.ndarray | None:
        """The packed results of one static step at ``positions`` (host, a view valid until the
        next call); with ``rebuild``, after a device rebuild of the list at ``positions``
        (``None`` when capturing that rebuild failed: device rebuilds are then switched off).
        The graph step captures its device rebuild together with the step."""
        step = self._static
        if self.step == "graph":
            captured = self._captured.get(stress)
            if captured is None:
                try:
                    captured = CapturedStep(step, stress)
                except Exception as e:
                    if not self._graph_fallback:
                        raise
                    self.graph_capture_error = f"{type(e).__name__}: {e}"
                    warnings.warn(
                        f"capturing the simulation step as a CUDA graph failed ({self.graph_capture_error}); "
                        "continuing with step='static' (the same step, eager)",
                        stacklevel=4,
                    )
                    self.step = "static"
                    return self._run_static(positions, stress)
                self._captured[stress] = captured
                self.graph_captures += 1
            if self._cell_list is not None and stress not in self._captured_rebuilds:
                # captured with the step (or after a host build planned a new cell list), not at
                # the first rebuild: a capture (and the first launch of its kernels) costs tens of
                # ms, which belong with the warm-up, not inside a simulation's steps. Its warm-up
                # rebuilds the list at these positions, where the current list is valid too.
                captured.host_in.numpy()[...] = positions if not isinstance(positions, torch.Tensor) else positions.detach().cpu()
                try:
                    self._captured_rebuilds[stress] = CapturedRebuild(captured, self._cell_list)
                    self.graph_captures += 1
                except Exception as e:  # the lists are then built on the host, as without device rebuilds
                    warnings.warn(
                        f"capturing the device rebuild of the neighbour list failed ({type(e).__name__}: {e}); "
                        "lists are built on the host from now on",
                        stacklevel=4,
                    )
                    self.device_rebuild, self._cell_list = False, None
                    if rebuild:
                        return None
            again = self._captured_rebuilds.get(stress) if rebuild else None
            return captured(positions, rebuild=again)
        step.positions.copy_(self._upload(positions))
        if rebuild:
            step.rebuild(self._cell_list)
        return self._download(step(stress))

    def _static_result(self, host: np.ndarray, stress: bool) -> Evaluation:
        n = self._static.n
        self.model_edges = _count(host, 2)
        energy = float(host[0])
        if not self.add_atomic_offsets:
            energy -= self._system.offset
        k = PACKED_HEADER
        forces = host[k : k + 3 * n].astype(np.float64).reshape(n, 3)
        s = host[k + 3 * n :].astype(np.float64).reshape(3, 3) if stress else None
        return Evaluation(energy=energy, forces=forces, stress=s)

    def _download(self, packed: torch.Tensor) -> np.ndarray:
        """One device-to-host copy (and the step's only synchronisation)."""
        if packed.device.type != "cuda":
            return packed.numpy()
        k = packed.shape[0]
        if self._pinned_out is None or self._pinned_out.shape[0] < k or self._pinned_out.dtype != packed.dtype:
            self._pinned_out = torch.empty(k, dtype=packed.dtype, pin_memory=True)
        buf = self._pinned_out[:k]
        buf.copy_(packed, non_blocking=True)
        torch.cuda.current_stream(packed.device).synchronize()
        return buf.numpy()  # a view: the caller copies out of it before the next call


def _rebuild_engine(model: FlashCartPotential, atomic_shifts: torch.Tensor, options: dict) -> Engine:
    engine = Engine(model, **options)
    engine._atomic_shifts = atomic_shifts  # float64, as read before the model was cast
    return engine
