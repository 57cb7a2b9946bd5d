"""Weighted tensor products of ICT features, dense or as a message-passing convolution."""

from __future__ import annotations

import math

import torch

from ._backend import check_backend, check_rank, resolve_backend, torch_ops
from ._components import dim
from ._layout import edge_csr, layout_width, split_ranks
from ._paths import Path, enumerate_paths
from ._weight_rows import WeightRows, gather_weight_rows
from ._weight_slopes import WeightSlopes, apply_weight_slopes
from ._weight_table import WeightTable
from ._weight_table import evaluate as evaluate_weight_table

__all__ = ["TensorProduct", "WeightRows", "WeightSlopes", "WeightTable", "edge_csr", "DENSE_DEVICES"]

# Device types on which the PyTorch backend contracts dense couplings (TensorProduct._rows_dense)
# instead of running the generated straight-line code per path (TensorProduct._rows): an i2c3f20l2r force call has
# 1,024 instead of 9,743 kernel-launching operations, and on ethanol (one CPU thread) took 15.5
# instead of 29.7 ms (benchmarks/RESULTS.md, 2026-12-02). Tests empty it to check one way
# against the other.
DENSE_DEVICES = ("cuda", "cpu")


class TensorProduct(torch.nn.Module):
    """Channel-wise tensor product ``x1 ⊗ x2 -> out`` over all allowed paths.

    Args:
        in1_l_max, in2_l_max, out_l_max: rank limits of the inputs and the output.
        in1_features, in2_features: channels of each input; equal, or one of them 1
            (broadcast): output channel ``f`` uses channel ``f`` (or 0) of each input.
        symmetric: use canonical pairs only (inputs must be identical).
        shared_weights: one weight vector ``[n_paths * F]`` for all rows.
        reduce_paths: sum the weighted outputs of the paths of each output rank.
        backend: ``"torch"``, ``"triton"`` or ``"auto"``.

    Attributes:
        paths: the :class:`Path` list in weight order; ``n_paths``; ``n_paths_per_rank``;
        ``weight_numel`` (``n_paths * F``); ``out_features`` (``F``); ``out_width``.

    ``forward(x1, x2, weights, receivers=None, senders=None, csr=None, weight_rows=None,
    weight_slopes=None)``:

    * dense: ``x1: [n, W1]``, ``x2: [n, W2]``, ``weights: [n, n_paths*F]`` or ``[n_paths*F]``
      -> ``[n, out_width]``;
    * convolution (both index tensors given, ``[E]`` int64, edges grouped by receiver):
      ``x1: [n_nodes, W1]`` gathered at ``senders``, ``x2: [E, W2]``, ``weights: [E, n_paths*F]``
      or shared; messages summed at ``receivers`` -> ``[n_nodes, out_width]``. ``csr`` may
      carry :func:`edge_csr` of the graph, computed once and reused by every layer.
      ``weight_rows`` (:class:`WeightRows`, convolution only, not with shared weights): edge
      ``e`` reads row ``weight_rows.index[e]`` of ``weights [R, n_paths*F]``; each row's gradient
      sums the edges ``weight_rows.edges[r]`` lists (see :mod:`._weight_rows`).
      ``weight_slopes`` (:class:`WeightSlopes`): the weights are constants ``w(t)`` of one
      variable per row and the gradient goes to ``t``; the Triton backward then contracts the
      weights' gradient with the slopes per edge instead of writing it (see
      :mod:`._weight_slopes`).
      ``weights`` may be a :class:`WeightTable` (per-edge or per-row weights): a cubic table of
      one variable per row, whose weights and slopes a convolution's Triton kernels evaluate as
      they read them (see :mod:`._weight_table`); gradients flow to its ``t``.

    Output layout: rank blocks ``(2L+1, n_paths_L, F)``, or ``(2L+1, F)`` with ``reduce_paths``.
    """

    def __init__(
        self,
        in1_l_max: int,
        in2_l_max: int,
        out_l_max: int,
        in1_features: int,
        in2_features: int,
        symmetric: bool = False,
        shared_weights: bool = False,
        reduce_paths: bool = False,
        backend: str = "auto",
    ):
        super().__init__()
        for name, value in (("in1_l_max", in1_l_max), ("in2_l_max", in2_l_max), ("out_l_max", out_l_max)):
            check_rank(value, name)
        if min(in1_features, in2_features) < 1:
            raise ValueError(f"feature counts must be >= 1, got {in1_features} and {in2_features}")
        if in1_features != in2_features and 1 not in (in1_features, in2_features):
            raise ValueError(
                f"in1_features={in1_features} and in2_features={in2_features}: channels pair "
                "elementwise, so they must be equal or one of them must be 1"
            )
        if symmetric and (in1_l_max != in2_l_max or in1_features != in2_features):
            raise ValueError("a symmetric product needs identical inputs (equal l_max and features)")
        self.in1_l_max, self.in2_l_max, self.out_l_max = in1_l_max, in2_l_max, out_l_max
        self.in1_features, self.in2_features = in1_features, in2_features
        self.out_features = max(in1_features, in2_features)
        self.symmetric, self.shared_weights, self.reduce_paths = symmetric, shared_weights, reduce_paths
        self.backend = check_backend(backend)
        self.paths: list[Path] = enumerate_paths(in1_l_max, in2_l_max, out_l_max, symmetric)
        self.n_paths = len(self.paths)
        self.n_paths_per_rank = [sum(p.l_out == l for p in self.paths) for l in range(out_l_max + 1)]
        self.weight_numel = self.n_paths * self.out_features
        self.in1_width = layout_width(in1_l_max, in1_features)
        self.in2_width = layout_width(in2_l_max, in2_features)
        out_paths = [1] * (out_l_max + 1) if reduce_paths else self.n_paths_per_rank
        self.out_width = layout_width(out_l_max, self.out_features, out_paths)
        if backend != "triton":
            torch_ops()  # generate (or load) sources now, not inside a traced forward
            # the dense couplings of the PyTorch backend: a float64 master on the CPU, and a
            # non-persistent buffer that follows the module's device and dtype (see _apply)
            self._coupling_master, path = self._coupling_from_generated()
            self.register_buffer("coupling", self._coupling_master.to(torch.get_default_dtype()), persistent=False)
            self.register_buffer("coupling_path", path, persistent=False)

    def _apply(self, fn, recurse=True):
        """Module conversions (``.to``, ``.float``, ``.double``, ``.cuda``), then the coupling
        buffer taken again from its float64 master: converting through float32 and back would
        round its coefficients."""
        super()._apply(fn, recurse)
        if getattr(self, "coupling", None) is not None:
            self.coupling = self._coupling_master.to(self.coupling.device, self.coupling.dtype)
        return self

    def extra_repr(self) -> str:
        return (
            f"({self.in1_l_max}, {self.in2_l_max}) -> {self.out_l_max}, features "
            f"{self.in1_features}x{self.in2_features}, n_paths={self.n_paths}, "
            f"symmetric={self.symmetric}, shared_weights={self.shared_weights}, "
            f"reduce_paths={self.reduce_paths}, backend={self.backend!r}"
        )

    def _check(self, x1, x2, weight_shape: tuple, receivers, senders, weight_rows=None) -> bool:
        conv = receivers is not None or senders is not None
        if conv and (receivers is None or senders is None):
            raise ValueError("convolution mode needs both receivers and senders")
        if x1.dim() != 2 or x1.shape[1] != self.in1_width:
            raise ValueError(f"x1 must have shape [rows, {self.in1_width}], got {tuple(x1.shape)}")
        if x2.dim() != 2 or x2.shape[1] != self.in2_width:
            raise ValueError(f"x2 must have shape [rows, {self.in2_width}], got {tuple(x2.shape)}")
        rows = senders.shape[0] if conv else x1.shape[0]
        if conv and (receivers.shape != senders.shape or receivers.dim() != 1):
            raise ValueError(f"receivers and senders must be 1-D of equal length, got {tuple(receivers.shape)} and {tuple(senders.shape)}")
        if x2.shape[0] != rows:
            raise ValueError(f"x2 has {x2.shape[0]} rows, expected {rows} ({'edges' if conv else 'rows of x1'})")
        if weight_rows is not None:
            self._check_rows(weight_rows, weight_shape, rows, conv)
            return conv
        expected = (self.weight_numel,) if self.shared_weights else (rows, self.weight_numel)
        if weight_shape != expected:
            raise ValueError(f"weights must have shape {list(expected)}, got {list(weight_shape)}")
        return conv

    def _check_table(self, weight_table) -> tuple:
        """The shape ``[R, W]`` of the weights ``weight_table`` (:class:`WeightTable`) stands for."""
        table, geometry, t = weight_table
        if self.shared_weights:
            raise ValueError("a WeightTable gives per-edge or per-row weights, not shared ones")
        if table.dim() != 3 or table.shape[1] != 4 or table.shape[2] != self.weight_numel or table.shape[0] < 1:
            raise ValueError(f"WeightTable.table must have shape [intervals, 4, {self.weight_numel}], got {list(table.shape)}")
        if geometry.shape != (2,) or geometry.dtype != table.dtype or t.dim() != 1 or t.dtype != table.dtype:
            raise ValueError(
                f"WeightTable.geometry must be [2] and t 1-D, both of the table's dtype {table.dtype}; "
                f"got {geometry.dtype} {list(geometry.shape)} and {t.dtype} {list(t.shape)}"
            )
        if table.requires_grad or geometry.requires_grad:
            raise ValueError("a WeightTable's table and geometry are constants (detached): gradients flow to WeightTable.t")
        return (t.shape[0], self.weight_numel)

    def _check_slopes(self, weights, weight_slopes) -> None:
        slopes, t = weight_slopes
        if self.shared_weights or weights.dim() != 2:
            raise ValueError("weight_slopes needs per-edge or per-row weights [R, W], not shared ones")
        if slopes.shape != weights.shape:
            raise ValueError(f"weight_slopes.slopes must have the weights' shape {list(weights.shape)}, got {list(slopes.shape)}")
        if t.shape != weights.shape[:1]:
            raise ValueError(f"weight_slopes.t must have shape [{weights.shape[0]}] (one per weight row), got {list(t.shape)}")
        if weights.requires_grad or slopes.requires_grad:
            raise ValueError("with weight_slopes the weights and slopes are constants (detached): gradients flow to weight_slopes.t")

    def _check_rows(self, weight_rows, weight_shape: tuple, rows: int, conv: bool) -> None:
        if not conv or self.shared_weights:
            raise ValueError("weight_rows needs convolution mode and per-edge (not shared) weights")
        index, edges = weight_rows
        if len(weight_shape) != 2 or weight_shape[1] != self.weight_numel:
            raise ValueError(f"weights read through weight_rows must have shape [R, {self.weight_numel}], got {list(weight_shape)}")
        if index.shape != (rows,) or index.dtype != torch.int64:
            raise ValueError(f"weight_rows.index must be int64 of shape [{rows}] (one row per edge), got {index.dtype} {list(index.shape)}")
        if edges.shape != (weight_shape[0], 2) or edges.dtype != torch.int64:
            raise ValueError(
                f"weight_rows.edges must be int64 of shape [{weight_shape[0]}, 2] (two edges per row), "
                f"got {edges.dtype} {list(edges.shape)}"
            )

    def forward(
        self,
        x1: torch.Tensor,
        x2: torch.Tensor,
        weights: torch.Tensor | WeightTable,
        receivers: torch.Tensor | None = None,
        senders: torch.Tensor | None = None,
        csr: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        weight_rows: WeightRows | None = None,
        weight_slopes: WeightSlopes | None = None,
    ) -> torch.Tensor:
        """``weight_slopes`` (per-edge or per-row weights only): the weights are constants
        ``w(t)`` of one variable per row, ``WeightSlopes(slopes [R, W], t [R])`` their
        derivatives ``dw/dt`` and variables; gradients flow to ``t`` (to first order), not to
        the weights (:mod:`flashcart.cartesian._weight_slopes`). ``weights`` a
        :class:`WeightTable`: the same with the weights and slopes a cubic table's at ``t``
        (:mod:`flashcart.cartesian._weight_table`)."""
        if isinstance(weights, WeightTable):
            if weight_slopes is not None:
                raise ValueError("a WeightTable carries its own slopes: pass no weight_slopes with it")
            conv = self._check(x1, x2, self._check_table(weights), receivers, senders, weight_rows)
        else:
            conv = self._check(x1, x2, tuple(weights.shape), receivers, senders, weight_rows)
        if weight_slopes is not None:
            self._check_slopes(weights, weight_slopes)
        if resolve_backend(self.backend, x1) == "triton":
            from ._triton.ops import tensor_product

            return tensor_product(self, x1, x2, weights, receivers, senders, csr, weight_rows, weight_slopes)
        if isinstance(weights, WeightTable):
            weights, weight_slopes = evaluate_weight_table(weights)
        if weight_slopes is not None:
            weights = apply_weight_slopes(weights, weight_slopes)
        if weight_rows is not None:
            weights = gather_weight_rows(weights, WeightRows(*weight_rows))
        with torch.profiler.record_function("flashcart::tensor_product[torch]"):
            return self._forward_torch(x1, x2, weights, receivers, senders, conv)

    def _forward_torch(self, x1, x2, weights, receivers, senders, conv: bool) -> torch.Tensor:
        if x1.device.type in DENSE_DEVICES:
            out = self._rows_dense(x1.index_select(0, senders) if conv else x1, x2, weights)
        else:
            a_blocks = split_ranks(x1, self.in1_l_max, self.in1_features)
            if conv:
                a_blocks = [a.index_select(0, senders) for a in a_blocks]
            out = self._rows(a_blocks, x2, weights)
        if conv:
            out = out.new_zeros(x1.shape[0], out.shape[1]).index_add_(0, receivers, out)
        return out

    def _rows(self, a_blocks: list[torch.Tensor], x2: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Row-wise product (rows = nodes, or edges with gathered ``a_blocks``) by the generated
        straight-line code per path: only the nonzero coefficients, but dozens of small
        operations per path. Used on the devices missing from :data:`DENSE_DEVICES` (none by default)."""
        ops = torch_ops()
        b_blocks = split_ranks(x2, self.in2_l_max, self.in2_features)
        f = self.out_features
        rows = b_blocks[0].shape[0]
        w = weights.reshape(-1, self.n_paths, f)
        per_rank: list[list[torch.Tensor]] = [[] for _ in range(self.out_l_max + 1)]
        for idx, p in enumerate(self.paths):
            fn = getattr(ops, f"tp_{p.l1}_{p.l2}_{p.l_out}")
            per_rank[p.l_out].append(fn(a_blocks[p.l1], b_blocks[p.l2]) * w[:, idx, None, :])
        blocks = []
        for l, outs in enumerate(per_rank):
            if not outs:
                if self.reduce_paths:
                    blocks.append(x2.new_zeros(rows, dim(l) * f))
                continue
            if self.reduce_paths:
                block = outs[0]
                for o in outs[1:]:
                    block = block + o
            else:
                block = torch.stack(outs, dim=2)
            blocks.append(block.expand(rows, *block.shape[1:]).reshape(rows, math.prod(block.shape[1:])))  # not -1: rows may be 0
        return torch.cat(blocks, dim=1)

    def _coupling_from_generated(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(C [K, I, J] float64, path [K] int64)`` on the CPU: every path's coupling as one dense
        tensor, and the path of each row.

        ``I`` and ``J`` are the components of all ranks of each input (rank ``l`` from ``l**2``),
        ``K`` the output components of every path, ordered as the output layout: rank, then
        component, then the rank's paths. ``out[k] = sum_ij C[k, i, j] x1[i] x2[j]`` is path
        ``path[k]``'s component before its weight. Read off the generated code (each path's
        function at pairs of unit vectors, in float64: its coefficients exactly), so no symbolic
        work runs here."""
        ops = torch_ops()
        i_all, j_all = (self.in1_l_max + 1) ** 2, (self.in2_l_max + 1) ** 2
        per_path = []  # [2L+1, I, J] of each path
        for p in self.paths:
            n1, n2 = dim(p.l1), dim(p.l2)
            a = torch.eye(n1, dtype=torch.float64).repeat_interleave(n2, 0)[:, :, None]  # pair (i, j) -> e_i
            b = torch.eye(n2, dtype=torch.float64).repeat(n1, 1)[:, :, None]  # pair (i, j) -> e_j
            out = getattr(ops, f"tp_{p.l1}_{p.l2}_{p.l_out}")(a, b)[:, :, 0]  # [n1 * n2, 2L+1]
            full = torch.zeros(dim(p.l_out), i_all, j_all, dtype=torch.float64)
            full[:, p.l1**2 : p.l1**2 + n1, p.l2**2 : p.l2**2 + n2] = out.T.reshape(dim(p.l_out), n1, n2)
            per_path.append(full)
        rows = [(idx, m) for l in range(self.out_l_max + 1) for m in range(dim(l)) for idx, p in enumerate(self.paths) if p.l_out == l]
        c = torch.stack([per_path[idx][m] for idx, m in rows]) if rows else torch.zeros(0, i_all, j_all, dtype=torch.float64)
        path = torch.tensor([idx for idx, _ in rows], dtype=torch.long)
        return c, path

    def _rows_dense(self, x1: torch.Tensor, x2: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """:meth:`_rows` as dense contractions on row-aligned ``x1 [rows, W1]`` (the convolution's
        already gathered at the senders) and ``x2 [rows, W2]``: a matrix product and a batched one
        when one input has a single channel (the convolution's edge attributes), otherwise one
        matrix product of the channels' outer products ``[rows * F, I * J]`` with the couplings."""
        rows = x2.shape[0]
        # a layout row is its rank blocks [2l+1, F] one after the other: [components, F] as a view
        a = x1.reshape(rows, (self.in1_l_max + 1) ** 2, self.in1_features)  # [rows, I, F1]
        b = x2.reshape(rows, (self.in2_l_max + 1) ** 2, self.in2_features)  # [rows, J, F2]
        c, path = self.coupling, self.coupling_path
        if c.dtype != a.dtype or c.device != a.device:  # inputs in another dtype than the module: from the float64 master
            c, path = self._coupling_master.to(a.device, a.dtype), path.to(a.device)
        k, i, j = c.shape
        f = self.out_features
        if b.shape[2] == 1:
            t = (b[:, :, 0] @ c.permute(2, 0, 1).reshape(j, k * i)).reshape(rows, k, i)
            out = torch.bmm(t, a)
        elif a.shape[2] == 1:
            t = (a[:, :, 0] @ c.permute(1, 0, 2).reshape(i, k * j)).reshape(rows, k, j)
            out = torch.bmm(t, b)
        else:
            # both inputs carry channels. Gathering only the nonzero coefficients and adding them
            # with index_add was 2x faster eagerly on the CPU, but the AOTInductor package of it
            # computed wrong forces (6e-2 relative, energy right; 2026-12-02): kept dense.
            # as one matrix product of the channels' outer products [rows * F, I * J] with the
            # couplings [I * J, K]: einsum's bmm over (row, channel) batches of [K, I] x [I] had a
            # backward that the CPU ran as one small copy and matmul per batch (12 % of a CPU
            # training step of i2c3f20l2r, 2026-12-03)
            outer = (a.transpose(1, 2)[:, :, :, None] * b.transpose(1, 2)[:, :, None, :]).reshape(rows * f, i * j)
            out = (outer @ c.reshape(k, i * j).T).reshape(rows, f, k).transpose(1, 2)
        out = out * weights.reshape(-1, self.n_paths, f).index_select(1, path)  # [rows, K, F]
        # the layout is the rows' components in K's order: one view; with reduce_paths the sums
        # over each rank's paths, of one split (not a slice per rank: the backward of each slice
        # wrote a zero-filled [rows, K, F] tensor, a quarter of a CPU training step)
        if not self.reduce_paths:
            return out.reshape(rows, k * f)
        sizes = [dim(l) * n for l, n in enumerate(self.n_paths_per_rank) if n]
        parts = iter(out.split(sizes, dim=1))
        blocks = []
        for l, n_paths in enumerate(self.n_paths_per_rank):
            if n_paths == 0:
                blocks.append(x2.new_zeros(rows, dim(l) * f))
            else:
                blocks.append(next(parts).reshape(rows, dim(l), n_paths, f).sum(2).reshape(rows, dim(l) * f))
        return torch.cat(blocks, dim=1)
