"""The one inference path: padded, optionally ``torch.compile``d energy/force/stress evaluation.

Everything that evaluates a model goes through :class:`Predictor` (training and testing
with ``predict_compile``, the profiler, the ASE calculator, later the OpenMM providers and
exported files), so the time the profiler reports is the time a simulation pays per call.

Padding: batches are padded to capacities for atoms, edges and graphs that only grow and
are rounded up to ``pad_*_multiple``. Padding atoms live in an extra graph, spaced twice
the cutoff apart on a line, and padding edges join neighbouring padding atoms, so every
padding edge is longer than the cutoff: its envelope and radial weights are exactly zero
and it contributes nothing. Results are sliced back to the real atoms and graphs. Batches
that fit the capacities reuse the compiled graph; a larger batch grows the capacities and
compiles once more.

Global state is touched only inside the calls that need it: ``torch._dynamo.config.trace_autograd_ops``
(the force derivative inside the compiled graph) is patched around compiled calls only, and
parameters are frozen (``requires_grad=False``) for the duration of a call without
``create_graph`` only when some of them still require grad (see :meth:`Predictor.frozen`).
"""

from __future__ import annotations

import contextlib
import math
import operator
import types
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import torch

from .._env import env_switch
from ..data.batch import Batch
from ..nn import edge_layout as _edge_layout
from . import static_buffers as _static_buffers

__all__ = ["Predictor", "energy_forces_stress", "Capacities", "frozen_parameters", "CUDA_GRAPH_MODES"]

# The padded batch's neighbour-list tensors that a call reads (static_buffers).
_LIST_INPUTS = ("types", "cell", "shifts", "receivers", "senders", "batch", "edge_batch")

# torch.compile modes that replay CUDA graphs (they need CUDA tensors).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def energy_forces_stress(
    model: torch.nn.Module,
    positions: torch.Tensor,
    strain: torch.Tensor | None,
    types: torch.Tensor,
    cell: torch.Tensor,
    shifts: torch.Tensor,
    receivers: torch.Tensor,
    senders: torch.Tensor,
    batch: torch.Tensor,
    edge_batch: torch.Tensor,
    n_graphs: int,
    forces: bool,
    create_graph: bool,
    layout: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Energies ``[G]`` eV, forces ``[N, 3]`` eV/Å (``-dE/dx``), stress ``[G, 3, 3]`` eV/Å^3.

    ``positions`` (and ``strain`` ``[G, 3, 3]`` of zeros, when stress is wanted) must be
    leaves that require grad when derivatives are requested (``requires_grad_`` cannot be
    called inside ``torch.compile``). Stress is ``dE/d(strain) / V`` for a symmetric strain
    applied to positions and cell. ``layout``: the list's
    :class:`~flashcart.nn.edge_layout.EdgeLayout` (``model.edge_layout``), passed on to the model
    when given.
    """
    pos, c = positions, cell
    if strain is not None:
        sym = 0.5 * (strain + strain.transpose(1, 2))
        pos = positions + torch.einsum("ni,nij->nj", positions, sym[batch])
        c = cell + torch.bmm(cell, sym)
    if layout is None:
        energy = model(pos, types, c, shifts, receivers, senders, batch, edge_batch, n_graphs)
    else:
        energy = model(pos, types, c, shifts, receivers, senders, batch, edge_batch, n_graphs, layout=layout)
    if not forces and strain is None:
        return energy, None, None
    wrt = [positions] + ([strain] if strain is not None else [])
    grads = torch.autograd.grad(energy.sum(), wrt, create_graph=create_graph)
    if not create_graph:
        energy = energy.detach()  # its graph was consumed by autograd.grad
    f = -grads[0] if forces else None
    s = None
    if strain is not None:
        s = grads[1] / torch.abs(torch.linalg.det(cell)).clamp_min(1e-12)[:, None, None]
    return energy, f, s


@contextlib.contextmanager
def frozen_parameters(parameters: Iterable[torch.nn.Parameter]) -> Iterator[None]:
    """Inside the block, the given parameters that required grad do not; restored on exit.

    Force-only predictions use it so that no kernel computes weight gradients nobody asked
    for (as in a simulation, whose parameters are fixed).
    """
    thawed = [p for p in parameters if p.requires_grad]
    for p in thawed:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in thawed:
            p.requires_grad_(True)


def inline_triton_ops() -> bool:
    """Whether ``torch.compile`` lowers FlashCart's Triton ops to their kernels (default; ``FLASHCART_INLINE_TRITON_OPS=0``
    keeps each op one opaque call that launches its own kernels).

    Inlined, inductor launches the kernels itself (no Python launcher per kernel). On the H200
    (torch 2.11, 2026-12-01) compiled force calls of i2c3f20l2r on the 1000-atom diamond took
    3.5 ms inlined in the default mode and 3.10 ms (inlined) / 3.11 ms (opaque) with
    reduce-overhead. (The inlined launches had hit an illegal memory access there until the
    linear maps' kernel stopped reading its launch table through a jit helper, which inductor
    took for a write of the table.) AOTInductor packages exported with the Triton kernels
    (``export_aoti(triton=True)``) always inline them: they must run without Python.
    """
    return env_switch("FLASHCART_INLINE_TRITON_OPS")


def combo_kernels() -> bool:
    """Whether compiled calls on CUDA let inductor fuse independent kernels into one launch
    (``FLASHCART_COMBO_KERNELS=1``, the default: inductor's ``combo_kernels`` option, its
    horizontal fusion; ``0`` leaves inductor's own default).

    The reduce-overhead force call of i2c3f20l2r on the 1000-atom diamond is GPU-bound (on the
    H100, 2026-12-07: 1.515 ms of GPU time in a 1.533 ms call; 152 launches, 1.444 ms of kernels,
    so about 0.07 ms between launches), and about 100 of its launches are inductor's small
    elementwise and reduction kernels of a few microseconds each: combining independent ones
    saves their launches and the gaps between them: 0.014-0.019 ms of 1.25 ms of GPU time on an
    H100 (benchmarks/RESULTS.md, 2026-12-07 evening), and compiled calls and training steps
    equal eager ones with it on the GPU (tests/model/test_gpu_model.py, 2026-12-07 late night).
    Read when a Predictor compiles; any value other than 0 or 1 raises an error naming the
    variable."""
    return env_switch("FLASHCART_COMBO_KERNELS", default=True)


class _CompileSettings:
    """Settings for a compiled call (its first call compiles): dynamo traces ``autograd.grad``,
    and the Triton ops stay opaque unless :func:`inline_triton_ops`. Set and restored by plain
    attribute writes: this runs on every compiled call (every MD step), where two
    ``config.patch`` contexts cost about 90 µs on a slow CPU."""

    def __enter__(self) -> None:
        import torch._dynamo.config as dynamo_config
        import torch._functorch.config as functorch_config

        self._saved = (dynamo_config.trace_autograd_ops, functorch_config.decompose_custom_triton_ops)
        dynamo_config.trace_autograd_ops = True
        functorch_config.decompose_custom_triton_ops = inline_triton_ops()

    def __exit__(self, *exc) -> None:
        import torch._dynamo.config as dynamo_config
        import torch._functorch.config as functorch_config

        dynamo_config.trace_autograd_ops, functorch_config.decompose_custom_triton_ops = self._saved


def _compile_context(compiled: bool) -> contextlib.AbstractContextManager:
    """:class:`_CompileSettings` for a compiled call, else nothing."""
    return _CompileSettings() if compiled else contextlib.nullcontext()


@dataclass
class Capacities:
    atoms: int = 0
    edges: int = 0
    graphs: int = 0


def _own_code(fn: Callable) -> Callable:
    """``fn`` with a copy of its code object (same globals, defaults and closure)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class _TensorsSeen(NamedTuple):
    """Tensors as a call saw them (:meth:`of`): :meth:`same` as another record of the very same
    tensor objects at the same versions (unchanged in place since), which is when per-list work
    can be reused."""

    tensors: tuple[torch.Tensor, ...]
    versions: tuple[int, ...]

    @staticmethod
    def of(tensors: tuple[torch.Tensor, ...]) -> "_TensorsSeen":
        return _TensorsSeen(tensors, tuple(t._version for t in tensors))

    def same(self, other: "_TensorsSeen") -> bool:
        return self.versions == other.versions and all(map(operator.is_, self.tensors, other.tensors))


class _LayoutCache(NamedTuple):
    """The edge layout of the last list: the list's tensors as seen, the settings it was made for, the layout."""

    seen: _TensorsSeen
    key: tuple
    layout: Any


class _KeptCache(NamedTuple):
    """An unpadded Predictor's copies of the caller's last list at fixed addresses (static lists)."""

    seen: _TensorsSeen
    copies: dict[str, torch.Tensor]


def _round_up(n: int, multiple: int) -> int:
    return max(multiple, int(math.ceil(n / multiple)) * multiple)


class Predictor:
    """Evaluate a model on :class:`~flashcart.data.Batch` objects.

    Args:
        model: a :class:`~flashcart.model.FlashCartPotential`.
        compile: wrap the evaluation in ``torch.compile``.
        compile_mode: ``default``, ``reduce-overhead``, ``max-autotune`` or ``max-autotune-no-cudagraphs``.
            On CPU tensors the inductor backend gets the mode's options without CUDA graphs
            (plus a CPU vectoriser work-around); a mode in :data:`CUDA_GRAPH_MODES` then warns
            once that it runs without CUDA graphs.
        compile_fullgraph, compile_dynamic: passed to ``torch.compile``.
        pad: pad to growing capacities (default: same as ``compile``).
        pad_atom_multiple, pad_edge_multiple, pad_graph_multiple: capacity rounding.
        compile_backend: ``torch.compile`` backend (tests count compilations with their own).

    Calls without ``create_graph`` freeze the model's parameters for the call (no weight
    gradients are computed); a caller making many such calls can enter :meth:`frozen` once
    instead, so that no call toggles ``requires_grad``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        compile: bool = False,
        compile_mode: str = "default",
        compile_fullgraph: bool = True,
        compile_dynamic: bool = False,
        pad: bool | None = None,
        pad_atom_multiple: int = 128,
        pad_edge_multiple: int = 128,
        pad_graph_multiple: int = 8,
        compile_backend: str | Callable = "inductor",
    ):
        self.model = model
        self.compile, self.compile_mode = compile, compile_mode
        self.compile_fullgraph, self.compile_dynamic = compile_fullgraph, compile_dynamic
        self.compile_backend = compile_backend
        self.pad = compile if pad is None else pad
        self.multiples = (pad_atom_multiple, pad_edge_multiple, pad_graph_multiple)
        self.capacities = Capacities()
        self._compiled: dict[tuple, Callable] = {}
        self._pad_cache: tuple | None = None  # (graph tensors, capacities, padded batch)
        self._layout_cache: _LayoutCache | None = None
        self._kept_cache: _KeptCache | None = None
        self._parameters = list(model.parameters())
        self._warned_cpu_mode = False

    @classmethod
    def from_config(
        cls,
        model: torch.nn.Module,
        cfg: dict[str, Any],
        compile: bool | None = None,
        compile_mode: str | None = None,
        compile_fullgraph: bool | None = None,
    ) -> "Predictor":
        """Options from the ``predict_*`` keys (``compile`` etc. override them, e.g. for the profiler)."""
        return cls(
            model,
            compile=cfg["predict_compile"] if compile is None else compile,
            compile_mode=compile_mode or cfg["predict_compile_mode"],
            compile_fullgraph=cfg["predict_compile_fullgraph"] if compile_fullgraph is None else compile_fullgraph,
            compile_dynamic=cfg["predict_compile_dynamic"],
            pad=cfg["predict_compile"] if compile is None else compile,
            pad_atom_multiple=cfg["predict_pad_atom_multiple"],
            pad_edge_multiple=cfg["predict_pad_edge_multiple"],
            pad_graph_multiple=cfg["predict_pad_graph_multiple"],
        )

    # ------------------------------------------------------------------ padding

    def _grow(self, n_atoms: int, n_edges: int, n_graphs: int) -> None:
        ma, me, mg = self.multiples
        cap = self.capacities
        # one spare graph for the padding atoms; two padding atoms so padding edges have length
        if n_atoms + 2 > cap.atoms:
            cap.atoms = _round_up(n_atoms + 2, ma)
        if n_edges > cap.edges:
            cap.edges = _round_up(n_edges, me)
        if n_graphs + 1 > cap.graphs:
            cap.graphs = _round_up(n_graphs + 1, mg)

    def reserve(self, n_atoms: int, n_edges: int, n_graphs: int) -> None:
        """Grow the capacities to fit at least this many atoms, edges and graphs (never shrinks)."""
        self._grow(n_atoms, n_edges, n_graphs)

    def padded(self, b: Batch) -> Batch:
        """``b`` padded to the current capacities (grown first if it does not fit).

        A batch whose graph tensors (the very same objects) were padded last time only gets
        its positions re-padded: a simulation that reuses its neighbour list pays one
        concatenation per call.
        """
        n, e, g = b.positions.shape[0], b.receivers.shape[0], b.n_graphs
        self._grow(n, e, g)
        cap = self.capacities
        graph = (b.receivers, b.senders, b.shifts, b.types, b.cell, b.batch, b.edge_batch)
        hit = self._pad_cache
        if hit is not None and hit[1] == (cap.atoms, cap.edges, cap.graphs) and all(x is y for x, y in zip(hit[0], graph)):
            p = hit[2]
            return replace(
                p,
                positions=torch.cat([b.positions, p.positions[n:].to(b.positions.dtype)]),
                energy=b.energy,
                forces=b.forces,
                stress=b.stress,
            )
        out = self._pad(b, n, e, g)
        if self._static_list(out):  # the list's tensors at the previous list's addresses
            previous = hit[2] if hit is not None else None
            out = replace(out, **{k: _static_buffers.keep_addresses(getattr(previous, k, None), getattr(out, k)) for k in _LIST_INPUTS})
        self._pad_cache = (graph, (cap.atoms, cap.edges, cap.graphs), out)
        return out

    def _static_list(self, b: Batch) -> bool:
        """Whether lists keep their tensors at fixed addresses (:mod:`.static_buffers`,
        ``FLASHCART_STATIC_LIST``): compiled CUDA-graph calls on CUDA tensors."""
        return _static_buffers.STATIC_LIST and self.compile and self.compile_mode in CUDA_GRAPH_MODES and b.positions.is_cuda

    def _kept_list(self, b: Batch) -> Batch:
        """Unpadded static lists: ``b`` with its list's tensors (``_LIST_INPUTS``) replaced by this
        Predictor's copies at fixed addresses (:func:`.static_buffers.keep_addresses` with
        ``owned=False``). While the caller passes the very same unchanged list tensors, the copies
        are reused as they are; a new list is written into them (same shapes) or copied anew."""
        listed = _TensorsSeen.of(tuple(getattr(b, k) for k in _LIST_INPUTS))
        hit = self._kept_cache
        if hit is not None and hit.seen.same(listed):
            return replace(b, **hit.copies)
        previous = hit.copies if hit is not None else {}
        kept = {k: _static_buffers.keep_addresses(previous.get(k), t, owned=False) for k, t in zip(_LIST_INPUTS, listed.tensors)}
        self._kept_cache = _KeptCache(listed, kept)
        return replace(b, **kept)

    def _layout(self, b: Batch, n_real_edges: int) -> Any:
        """The :class:`~flashcart.nn.edge_layout.EdgeLayout` of ``b``'s neighbour list (the model's
        ``edge_layout``), computed once per list: reused while the receivers, senders and shifts are
        the very same unchanged tensors (a simulation between list rebuilds, the profiler). ``None``
        for models without ``edge_layout`` and with ``FLASHCART_EDGE_LAYOUT=0`` (each call then
        computes it). A compiled call's list that is not pair-complete is a ``ValueError`` here."""
        make = getattr(self.model, "edge_layout", None)
        if make is None or not _edge_layout.EDGE_LAYOUT:
            return None
        listed = _TensorsSeen.of((b.receivers, b.senders, b.shifts))
        key = (n_real_edges, b.positions.shape[0], self.compile, self.model.radial_pairs_used(b.receivers.is_cuda, compiled=self.compile))
        hit = self._layout_cache
        if hit is not None and hit.key == key and hit.seen.same(listed):
            return hit.layout
        layout = make(*listed.tensors, n_real_edges, b.positions.shape[0], compiled=self.compile, where="the batch's neighbour list")
        if self._static_list(b):
            layout = _static_buffers.keep_addresses(hit.layout if hit is not None else None, layout)
        self._layout_cache = _LayoutCache(listed, key, layout)
        return layout

    def _pad(self, b: Batch, n: int, e: int, g: int) -> Batch:
        cap = self.capacities
        pa, pe, pg = cap.atoms - n, cap.edges - e, cap.graphs - g
        dev, dt = b.positions.device, b.positions.dtype
        pad_graph = cap.graphs - 1
        spacing = 2.0 * float(self.model.r_max)
        pad_pos = torch.zeros(pa, 3, dtype=dt, device=dev)
        pad_pos[:, 0] = torch.arange(pa, dtype=dt, device=dev) * spacing
        k = torch.arange(pe, device=dev)
        pad_recv = n + (k * pa) // max(pe, 1)
        pad_send = n + ((pad_recv - n + 1) % pa)
        long = dict(dtype=torch.long, device=dev)
        return Batch(
            positions=torch.cat([b.positions, pad_pos]),
            numbers=torch.cat([b.numbers, torch.zeros(pa, **long)]),
            types=torch.cat([b.types, torch.zeros(pa, **long)]),
            cell=torch.cat([b.cell, torch.zeros(pg, 3, 3, dtype=dt, device=dev)]),
            receivers=torch.cat([b.receivers, pad_recv]),
            senders=torch.cat([b.senders, pad_send]),
            shifts=torch.cat([b.shifts, torch.zeros(pe, 3, dtype=b.shifts.dtype, device=dev)]),
            batch=torch.cat([b.batch, torch.full((pa,), pad_graph, **long)]),
            edge_batch=torch.cat([b.edge_batch, torch.full((pe,), pad_graph, **long)]),
            n_atoms=torch.cat([b.n_atoms, torch.zeros(pg, dtype=b.n_atoms.dtype, device=b.n_atoms.device)]),
            energy=b.energy,
            forces=b.forces,
            stress=b.stress,
            n_graphs=cap.graphs,
        )

    # ------------------------------------------------------------------ evaluation

    def frozen(self) -> contextlib.AbstractContextManager:
        """Context manager: the model's parameters do not require grad inside (restored on exit).

        Calls with ``create_graph=True`` (training) need parameter gradients: do not make them
        inside this block.
        """
        return frozen_parameters(self._parameters)

    def _compile_options(self, device_type: str) -> dict[str, Any]:
        """``mode``/``options`` for ``torch.compile`` on tensors of ``device_type``."""
        mode = None if self.compile_mode == "default" else self.compile_mode
        from torch._inductor import list_mode_options

        if self.compile_backend == "inductor" and device_type == "cuda" and combo_kernels():
            # options replace the mode (torch.compile takes one or the other): the mode's own options, plus
            return {"options": {**list_mode_options(self.compile_mode), "combo_kernels": True}}
        if self.compile_backend != "inductor" or device_type == "cuda":
            return {"mode": mode}

        options = {k: v for k, v in list_mode_options(self.compile_mode).items() if k != "triton.cudagraphs"}
        options["cpp.simdlen"] = 1  # works around an inductor CPU vectoriser assertion
        if self.compile_mode in CUDA_GRAPH_MODES and not self._warned_cpu_mode:
            self._warned_cpu_mode = True
            warnings.warn(
                f"compile_mode={self.compile_mode!r} replays CUDA graphs, which need CUDA tensors: "
                f"on {device_type} it compiles with the rest of the mode's options and without CUDA graphs",
                stacklevel=3,
            )
        return {"options": options}

    def _compiled_or_plain(self, run: Callable, device_type: str) -> Callable:
        """``run`` wrapped in ``torch.compile`` with this Predictor's settings, or itself uncompiled.

        Compiled, ``run`` gets a code object of its own (:func:`_own_code`): dynamo keeps its
        compiled graphs per code object, and every ``run`` of every Predictor is otherwise the same
        one. Its recompile limit (8 graphs) then counted every Predictor's graphs in the process,
        and the ninth model compiled in one process (with ``fullgraph``) failed outright.
        """
        if not self.compile:
            return run
        return torch.compile(
            _own_code(run),
            fullgraph=self.compile_fullgraph,
            dynamic=self.compile_dynamic,
            backend=self.compile_backend,
            **self._compile_options(device_type),
        )

    def _prepared(self, batch: Batch) -> tuple[Batch, Any]:
        """``(batch padded (with pad), with its list at fixed addresses (unpadded, static lists:
        :meth:`_kept_list`) or itself, its list's EdgeLayout or None)`` (:meth:`_layout`)."""
        n_edges = batch.receivers.shape[0]
        if self.pad:
            b = self.padded(batch)
        else:
            b = self._kept_list(batch) if self._static_list(batch) else batch
        return b, self._layout(b, n_edges)

    def _function(self, forces: bool, stress: bool, create_graph: bool, device_type: str) -> Callable:
        key = (forces, stress, create_graph, device_type)
        if key not in self._compiled:
            model = self.model

            def run(positions, strain, types, cell, shifts, receivers, senders, batch, edge_batch, n_graphs, layout=None):
                return energy_forces_stress(
                    model, positions, strain, types, cell, shifts, receivers, senders, batch, edge_batch, n_graphs, forces, create_graph,
                    layout,
                )  # fmt: skip

            self._compiled[key] = self._compiled_or_plain(run, device_type)
        return self._compiled[key]

    def call_static(
        self,
        positions: torch.Tensor,
        strain: torch.Tensor | None,
        types: torch.Tensor,
        cell: torch.Tensor,
        shifts: torch.Tensor,
        receivers: torch.Tensor,
        senders: torch.Tensor,
        batch: torch.Tensor,
        edge_batch: torch.Tensor,
        n_graphs: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Energies ``[G]``, forces ``[N, 3]`` and stress (``[G, 3, 3]`` when ``strain`` is given)
        of tensors that are already padded, through the same (compiled) function as ``__call__``
        but without padding, slicing, copies or CUDA-graph bookkeeping: for callers that own
        static buffers and capture the call into a CUDA graph themselves (the simulation
        engine's static step; see :func:`energy_forces_stress` for the arguments, which must be
        leaves requiring grad). The parameters must not require grad; no ``create_graph``.
        Do not use it with a compile mode in :data:`CUDA_GRAPH_MODES` on CUDA tensors (those
        graphs cannot be captured inside another graph)."""
        fn = self._function(True, strain is not None, False, positions.device.type)
        with _compile_context(self.compile), torch.enable_grad():
            return fn(positions, strain, types, cell, shifts, receivers, senders, batch, edge_batch, n_graphs)

    def _grads_function(self, loss_fn: Callable, parameters: tuple, forces: bool, stress: bool, device_type: str) -> Callable:
        key = ("grads", loss_fn, parameters, forces, stress, device_type)
        if key not in self._compiled:
            model, params = self.model, list(parameters)

            def run(
                positions, strain, types, cell, shifts, receivers, senders, batch, edge_batch, n_graphs, targets, atoms, graphs, layout
            ):
                energy, f, s = energy_forces_stress(
                    model, positions, strain, types, cell, shifts, receivers, senders, batch, edge_batch, n_graphs, forces, True, layout
                )
                pred = {"energy": energy}
                if forces:
                    pred["forces"] = f
                if stress:
                    pred["stress"] = s
                loss = loss_fn(pred, targets, atoms, graphs)
                return loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)

            self._compiled[key] = self._compiled_or_plain(run, device_type)
        return self._compiled[key]

    def loss_and_grads(
        self, batch: Batch, loss_fn: Callable, parameters: Iterable[torch.nn.Parameter], forces: bool = True, stress: bool = False
    ) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]:
        """A training step's loss and its gradients with respect to ``parameters``, in one (compiled)
        function: ``(loss [], grads)``, a gradient per parameter (``None`` where the loss does not
        depend on it), detached.

        The same as ``loss_fn`` on ``self(batch, forces, stress, create_graph=True)`` followed by
        ``loss.backward(inputs=parameters)``, except that nothing computes the loss's derivative with
        respect to the positions: a compiled prediction's backward returns a gradient for every
        input requiring grad, positions included (a Hessian-vector product through every block,
        computed and dropped). On the H200 (i2c3f20l2r, 1000-atom diamond) the step took 11.5 ms this
        way against 22.6 ms with compile mode ``default``, and 7.77 ms against 8.58 ms with
        ``reduce-overhead``, whose CUDA graphs remove most of the difference (RESULTS.md).

        ``loss_fn(pred, targets, atom_mask, graph_mask)`` sees padded tensors (static shapes, so
        batches of other sizes reuse the compiled graph): predictions ``energy [G']``,
        ``forces [N', 3]``, ``stress [G', 3, 3]``; labels ``energy``, ``forces``, ``stress`` and
        ``n_atoms`` padded alike (padding labels: 0, NaN stress, one atom); bool masks of the real
        atoms ``[N']`` and graphs ``[G']`` (see :func:`flashcart.training.losses.masked_loss_value`).
        The compiled function is cached per ``loss_fn`` object: pass the same one every step.
        """
        params = tuple(parameters)
        n, g = batch.positions.shape[0], batch.n_graphs
        b, layout = self._prepared(batch)
        n_pad, g_pad = b.positions.shape[0] - n, b.n_graphs - g
        ref = batch.positions
        targets = {
            "energy": torch.cat([batch.energy.to(ref.dtype), ref.new_zeros(g_pad)]),
            "n_atoms": torch.cat([batch.n_atoms, batch.n_atoms.new_ones(g_pad)]),
        }
        if forces:
            targets["forces"] = torch.cat([batch.forces.to(ref.dtype), ref.new_zeros(n_pad, 3)])
        if stress:
            targets["stress"] = torch.cat([batch.stress.to(ref.dtype), ref.new_full((g_pad, 3, 3), float("nan"))])
        atom_mask = torch.arange(b.positions.shape[0], device=ref.device) < n
        graph_mask = torch.arange(b.n_graphs, device=ref.device) < g
        positions = b.positions.detach().requires_grad_(forces or stress)
        strain = None
        if stress:
            strain = torch.zeros(b.n_graphs, 3, 3, dtype=positions.dtype, device=positions.device, requires_grad=True)
        fn = self._grads_function(loss_fn, params, forces, stress, positions.device.type)
        cudagraphs = self.compile and self.compile_mode in CUDA_GRAPH_MODES and positions.is_cuda
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        with _compile_context(self.compile), torch.enable_grad():
            loss, grads = fn(
                positions, strain, b.types, b.cell, b.shifts, b.receivers, b.senders, b.batch, b.edge_batch, b.n_graphs,
                targets, atom_mask, graph_mask, layout,
            )  # fmt: skip
        if cudagraphs:  # static buffers, overwritten by the next replay
            return loss.clone(), tuple(None if t is None else t.clone() for t in grads)
        return loss, tuple(grads)

    def __call__(self, batch: Batch, forces: bool = True, stress: bool = False, create_graph: bool = False) -> dict[str, torch.Tensor]:
        """``{"energy": [G], "forces": [N, 3], "stress": [G, 3, 3]}`` for the real atoms and graphs."""
        n, g = batch.positions.shape[0], batch.n_graphs
        b, layout = self._prepared(batch)
        need_grad = forces or stress
        positions = b.positions.detach().requires_grad_(need_grad)
        strain = None
        if stress:
            strain = torch.zeros(b.n_graphs, 3, 3, dtype=positions.dtype, device=positions.device, requires_grad=True)
        fn = self._function(forces, stress, create_graph, positions.device.type)
        cudagraphs = self.compile and self.compile_mode in CUDA_GRAPH_MODES and positions.is_cuda
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()  # outputs of the previous call may be reused
        # Without create_graph nothing differentiates the parameters: unless the caller froze them
        # already (Predictor.frozen), freeze them for this call.
        freeze = not create_graph and any(p.requires_grad for p in self._parameters)
        with (
            frozen_parameters(self._parameters) if freeze else contextlib.nullcontext(),
            _compile_context(self.compile),
            torch.enable_grad() if need_grad or create_graph else torch.no_grad(),
        ):
            energy, f, s = fn(
                positions, strain, b.types, b.cell, b.shifts, b.receivers, b.senders, b.batch, b.edge_batch, b.n_graphs, layout
            )
        out = {"energy": energy[:g]}
        if forces:
            out["forces"] = f[:n]
        if stress:
            out["stress"] = s[:g]
        if not create_graph:
            out = {k: v.detach() for k, v in out.items()}
        if cudagraphs:  # CUDA-graph outputs live in static buffers overwritten by the next replay
            out = {k: v.clone() for k, v in out.items()}
        return out
