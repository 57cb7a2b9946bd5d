"""Equivariant layers of the FlashCart potential: interaction, gate, product, RMS norm.

The tensors of each block are those of the published models (``docs/architecture.md``
lists them; ``tests/model/test_architecture.py`` checks three models tensor for tensor).
Features use the standard layout (rank blocks ``(2l+1, F)``, ranks ascending). Shapes:
nodes ``n``, edges ``E``, channels ``F``. Per layer the order is interaction -> gate ->
product; with a product following, the interaction and the gate carry ranks
``0..l_max_edge_attrs`` and the product truncates its output to ``l_max_hidden_feats``.
"""

from __future__ import annotations

import functools
import math

import torch

from .._env import env_switch
from ..cartesian import EquivariantLinear, TensorProduct, WeightRows, WeightSlopes, WeightTable, linear_sum
from ..cartesian._backend import resolve_backend
from ..cartesian._frozen import frozen_derived, parameters_of
from ..cartesian._layout import layout_width
from ..cartesian._quadratic_invariants import quadratic_invariants
from ..cartesian._weight_table import table_geometry
from .radial import MLP
from .radial_table import table_kernel_enabled, table_slopes_enabled, table_weights, table_weights_and_slopes

__all__ = ["Interaction", "Gate", "ProductBlock", "RMSNorm", "invariant_forms", "rank_channel_index"]

_ACTIVATIONS = {"sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu, "tanh": torch.tanh}
# FLASHCART_TABLE_SLOPES and FLASHCART_TABLE_KERNEL, read at import (tests and benchmarks flip the attributes)
_TABLE_SLOPES = table_slopes_enabled()
_TABLE_KERNEL = table_kernel_enabled()


def norm_forms_mode() -> bool:
    """``FLASHCART_NORM_FORMS``: ``1`` evaluates the RMS norm's invariants in compiled calls on the
    Triton path as quadratic forms in ATen operations (:func:`~flashcart.cartesian._quadratic_invariants.quadratic_invariants`),
    which inductor fuses with the norm's mean, root and scaling, instead of a symmetric
    tensor-product launch each way; ``0`` (default, until timed on a GPU) keeps the product.
    Anything else is an error naming the variable."""
    return env_switch("FLASHCART_NORM_FORMS", default=False)


# read at import (tests and benchmarks flip the attribute)
_NORM_FORMS = norm_forms_mode()


def _fused_rowwise(x: torch.Tensor, backend: str):
    """The fused row-wise kernels (:mod:`flashcart.cartesian._triton.rowwise`) when a block on
    ``x`` takes them (eager calls on the Triton path), else ``None``. Imported here, not at the
    top: the PyTorch backend runs without Triton installed."""
    if resolve_backend(backend, x) != "triton":
        return None
    from ..cartesian._triton import rowwise

    return rowwise if rowwise.use_fused(x) else None


@functools.lru_cache(maxsize=None)
def _invariant_forms(l_max: int) -> torch.Tensor:
    tp = TensorProduct(l_max, l_max, 0, 1, 1, symmetric=True, shared_weights=True, backend="torch").double()
    ones = torch.ones(tp.weight_numel, dtype=torch.float64)
    origin = torch.zeros((l_max + 1) ** 2, dtype=torch.float64)
    forms = []
    for l in range(l_max + 1):
        hessian = torch.autograd.functional.hessian(lambda v, l=l: tp(v[None], v[None], ones)[0, l], origin)
        forms.append((hessian[l * l : (l + 1) ** 2, l * l : (l + 1) ** 2] / 2).reshape(-1))
    return torch.cat(forms)


def invariant_forms(l_max: int) -> torch.Tensor:
    """The RMS norm's invariants as quadratic forms: ``[sum_l (2l+1)^2]`` float64, the row-major
    ``G_l`` of ranks ``0..l_max`` one after the other, with ``x_lf^T G_l x_lf`` the symmetric
    ``(l, l) -> 0`` product of a rank-``l`` channel with itself (the path-resolved rank-0 output of
    ``TensorProduct(l_max, l_max, 0, symmetric=True)`` with unit weights).

    Read off that product (one channel, the PyTorch backend) as half its Hessian; computed once
    per ``l_max`` and process, returned as a copy.
    """
    return _invariant_forms(l_max).clone()


def _leading(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x[:, :width]``, or ``x`` itself when it has that width (no view, no backward node)."""
    return x if x.shape[1] == width else x[:, :width]


def rank_channel_index(l_max: int, n_feats: int) -> torch.Tensor:
    """``[layout_width(l_max, F)]`` int64: column -> ``l * F + f`` (its rank and channel).

    Gathering a ``[(l_max+1) * F]`` vector with it broadcasts a per-(rank, channel) value over
    the ``2l+1`` components of each rank.
    """
    return torch.cat([l * n_feats + torch.arange(n_feats).repeat(2 * l + 1) for l in range(l_max + 1)])


class RMSNorm(torch.nn.Module):
    """Divide features by ``sqrt(mean_l mean_f I_lf + eps)`` with ``I_lf`` the (l,l)->0 invariants.

    The invariants are the path-resolved rank-0 output of a symmetric product of the
    features with themselves: per rank a quadratic form ``x_lf^T G_l x_lf`` (``forms``, see
    :func:`invariant_forms`), which eager calls on the Triton path evaluate inside one row-wise
    kernel with the scale and gains (:mod:`flashcart.cartesian._triton.rowwise`); other calls
    run the product and the ATen expression; compiled ones on the Triton path with
    ``FLASHCART_NORM_FORMS=1`` the quadratic forms in ATen operations (:func:`norm_forms_mode`).
    Optional learnable gains, one per rank and channel
    (``gains[l]: [F]``). ``forward(x: [n, W]) -> [n, W]``.
    """

    def __init__(self, l_max: int, n_feats: int, gains: bool = True, eps: float = 1e-6, backend: str = "auto"):
        super().__init__()
        self.l_max, self.F, self.eps = l_max, n_feats, eps
        self.invariants = TensorProduct(l_max, l_max, 0, n_feats, n_feats, symmetric=True, shared_weights=True, backend=backend)
        self.register_buffer("ones", torch.ones(self.invariants.weight_numel), persistent=False)
        self.gains = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(n_feats)) for _ in range(l_max + 1)]) if gains else None
        self.register_buffer("gain_index", rank_channel_index(l_max, n_feats), persistent=False)
        # the invariants' quadratic forms (float64 master; the buffer follows the module, see _apply)
        self._forms_master = invariant_forms(l_max)
        self.register_buffer("forms", self._forms_master.to(torch.get_default_dtype()), persistent=False)

    def _apply(self, fn, recurse=True):
        """Module conversions, then the forms taken again from their float64 master (converting
        through float32 and back would round them)."""
        super()._apply(fn, recurse)
        self.forms = self._forms_master.to(self.forms.device, self.forms.dtype)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = _fused_rowwise(x, self.invariants.backend)
        if fused is not None:  # eager Triton path: invariants, scale and gains in one kernel each way
            gains = self._gains("gains", lambda g: torch.cat(g)) if self.gains is not None else None
            return fused.rms_norm(x, self.forms, gains, self.eps, self.l_max, self.F)
        if _NORM_FORMS and torch.compiler.is_compiling() and resolve_backend(self.invariants.backend, x) == "triton":
            inv = quadratic_invariants(x, self.forms, self.l_max, self.F)  # [n, (l_max+1) * F]
        else:
            inv = self.invariants(x, x, self.ones.to(x.dtype))
        scale = torch.rsqrt(inv.mean(dim=1, keepdim=True).abs() + self.eps)
        y = x * scale
        if self.gains is not None:
            y = y * self._gains("column_gains", lambda g: torch.cat(g).index_select(0, self.gain_index))
        return y

    def _gains(self, slot: str, build) -> torch.Tensor:
        """``build(gains)``: the gains ``[(l_max+1) F]``, or ``[W]`` broadcast over each rank's
        components; built once while the gains are frozen
        (:func:`~flashcart.cartesian._frozen.frozen_derived`)."""
        gains = parameters_of(self.gains)
        return frozen_derived(self, slot, [*gains, self.gain_index], lambda: build(gains))


class Interaction(torch.nn.Module):
    """Message passing: linear -> convolution product with edge attributes -> linear + residual.

    Node ranks ``0..l_in`` times edge ranks ``0..l_edge`` -> ranks ``0..l_out`` (every
    natural-parity path), one radial weight per path and channel from a bias-free MLP,
    summed at receivers and divided by ``sqrt(avg_neighbors)``; a per-rank
    ``(paths_l F) -> F`` linear mixes paths and channels; a per-rank ``F x F`` residual of
    the input is added to the matching output ranks; optional RMS norm with per-(rank,
    channel) gains.

    ``forward(x [n, W_in], attrs [E, (l_edge+1)^2], radial [E, n_radial], receivers, senders,
    csr, node_embed [n, F_e] | None, pairs: EdgePairs | None, lengths [E] | None) -> [n,
    layout_width(l_out, F)]``. With ``pairs`` (:mod:`flashcart.nn.edge_pairs`; element-agnostic
    blocks only) the radial MLP runs once per pair of reverse edges and both edges read their
    pair's weights. With a :attr:`radial_table` (inference, element-agnostic blocks;
    :mod:`flashcart.nn.radial_table`) the weights are the table's at the edge ``lengths`` (Å)
    instead of the MLP's.
    """

    def __init__(
        self,
        l_in: int,
        l_out: int,
        l_edge: int,
        F: int,
        n_radial: int,
        hidden_radial: list[int],
        avg_neighbors: float,
        element_features: int | None,
        layer_norm: bool,
        backend: str = "auto",
    ):
        super().__init__()
        self.linear_in = EquivariantLinear(l_in, l_in, F, F, backend=backend)
        self.tp = TensorProduct(l_in, l_edge, l_out, F, 1, backend=backend)
        self.element_features = element_features
        n_in = n_radial + (2 * element_features if element_features else 0)
        self.radial = MLP(n_in, hidden_radial, self.tp.weight_numel, bias=False)
        self.linear_out = EquivariantLinear(l_out, l_out, F, F, in_paths=self.tp.n_paths_per_rank, backend=backend)
        self.skip = EquivariantLinear(l_in, l_out, F, F, backend=backend)
        self.register_buffer("inv_sqrt_avg_neighbors", torch.tensor(1.0 / math.sqrt(avg_neighbors)))
        self.norm = RMSNorm(l_out, F, backend=backend) if layer_norm else None
        # the radial MLP tabulated over [0, radial_table_r_max] Å (FlashCartPotential.set_radial_tables):
        # a buffer (it moves and casts with the model), not saved in state dicts
        self.register_buffer("radial_table", None, persistent=False)
        self.radial_table_r_max = 0.0
        # the table's cutoff and intervals per Å in its dtype (WeightTable.geometry)
        self.register_buffer("radial_table_geometry", None, persistent=False)

    def set_radial_table(self, table: torch.Tensor | None, r_max: float) -> None:
        """Tabulate this interaction's radial MLP (:func:`~flashcart.nn.radial_table.cubic_table`'s
        ``[K, 4, W]``, already in the MLP's dtype and device) over ``[0, r_max]`` Å, or drop it (``None``)."""
        self.radial_table = table
        self.radial_table_r_max = r_max if table is not None else 0.0
        self.radial_table_geometry = None if table is None else table_geometry(table.shape[0], r_max, table.dtype, table.device)

    def forward(self, x, attrs, radial, receivers, senders, csr, node_embed=None, pairs=None, lengths=None):
        weights, rows, slopes = self.edge_weights(radial, receivers, senders, node_embed, pairs, lengths)
        msg = self.tp(self.linear_in(x), attrs, weights, receivers, senders, csr, rows, slopes)
        # the neighbour normalisation folded into linear_out's weights (no pass over the nodes);
        # with FLASHCART_LINEAR_PAIRS both maps in one launch
        out = linear_sum(self.linear_out, msg, self.skip, x, self.inv_sqrt_avg_neighbors)
        return self.norm(out) if self.norm is not None else out

    def edge_weights(
        self, radial, receivers, senders, node_embed=None, pairs=None, lengths=None
    ) -> tuple[torch.Tensor, WeightRows | None, WeightSlopes | None]:
        """``(weights, rows, slopes)``: the radial MLP's path weights ``[E, weight_numel]``, ``None``
        and ``None``; or, with ``pairs`` (element-agnostic blocks), one row per pair ``[P,
        weight_numel]`` and the :class:`WeightRows` through which the product reads each pair's row
        for both its edges. With a :attr:`radial_table` the same from the table at ``lengths``
        ``[E]`` (Å); the weights are then constants and ``slopes`` their derivatives in the
        lengths (:class:`WeightSlopes`), unless ``FLASHCART_TABLE_SLOPES=0``; by default the table
        itself, per edge (:class:`WeightTable`: the products' kernels evaluate it), with ``rows``
        and ``slopes`` ``None`` (``FLASHCART_TABLE_KERNEL``)."""
        if self.radial_table is not None:
            if lengths is None:
                raise ValueError("this interaction's radial MLP is tabulated: its forward needs the edge lengths")
            if torch.is_grad_enabled() and any(p.requires_grad for p in self.radial.parameters()):
                raise RuntimeError(
                    "a tabulated radial MLP (FlashCartPotential.set_radial_tables) is for inference, but its parameters "
                    "require grad here (training?): they would get no gradient. Freeze them, or drop the tables"
                )
            if _TABLE_SLOPES and _TABLE_KERNEL and resolve_backend(self.tp.backend, lengths) == "triton":
                # per edge: the kernels read one length per edge, no pairs
                return WeightTable(self.radial_table, self.radial_table_geometry, lengths), None, None
            if pairs is not None:
                lengths, rows = lengths.index_select(0, pairs.leader), WeightRows(pairs.pair_of_edge, pairs.row_edges)
            else:
                rows = None
            if _TABLE_SLOPES:
                weights, slopes = table_weights_and_slopes(self.radial_table, self.radial_table_r_max, lengths)
                return weights, rows, WeightSlopes(slopes, lengths)
            return table_weights(self.radial_table, self.radial_table_r_max, lengths), rows, None
        if self.element_features:
            # radial input stays proportional to the envelope: element terms multiply it
            env = radial[:, :1]
            return self.radial(torch.cat([radial, node_embed[senders] * env, node_embed[receivers] * env], dim=1)), None, None
        if pairs is not None:
            return self.radial(radial.index_select(0, pairs.leader)), WeightRows(pairs.pair_of_edge, pairs.row_edges), None
        return self.radial(radial), None, None


class Gate(torch.nn.Module):
    """Gated nonlinearity with a zero-initialised output projection (identity at init).

    ``y = x + P(act(G x_0 + b) * V x)``: ``V`` a per-rank ``F x F`` value linear, ``G`` a
    ``F -> (l_max+1) F`` linear (with the model's only bias) on the scalar channels, whose
    gates (invariant under proper and improper rotations) multiply every component of
    their rank and channel, ``P`` a per-rank ``F x F`` output linear initialised to zero.
    ``forward(x: [n, W]) -> [n, W]``.
    """

    def __init__(self, l_max: int, F: int, activation: str = "sigmoid", bias: bool = True, backend: str = "auto"):
        super().__init__()
        self.l_max, self.F = l_max, F
        self.activation, self.act = activation, _ACTIVATIONS[activation]
        self.value = EquivariantLinear(l_max, l_max, F, F, backend=backend)
        self.gates = torch.nn.Linear(F, (l_max + 1) * F, bias=bias)
        self.proj = EquivariantLinear(l_max, l_max, F, F, backend=backend)
        for w in self.proj.weights:
            torch.nn.init.zeros_(w)
        self.register_buffer("gate_index", rank_channel_index(l_max, F), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.gates(x[:, : self.F])  # [n, (l_max+1) F]
        fused = _fused_rowwise(x, self.value.backend)
        if fused is not None:  # eager Triton path: one kernel each way
            return x + self.proj(fused.gated(self.value(x), z, self.activation, self.l_max, self.F))
        return x + self.proj(self.value(x) * self.act(z).index_select(1, self.gate_index))


class ProductBlock(torch.nn.Module):
    """Raise the body order with repeated products of the aggregated features ``A``.

    ``A`` carries ranks ``0..l_in``; the output ranks ``0..l_out`` (``0`` in the last layer).
    Step 0 maps ``A`` to ``P_0`` (ranks ``0..l_in``); step ``k = 1..correlation-1`` is
    ``P_k = mix_k(TP(P_{k-1}, A))``, into ranks ``0..l_in`` except the last step, which
    goes straight to ``0..l_out``. Every ``P_k`` (truncated to ``0..l_out``) is added to the
    result, plus a per-rank linear skip of ``A``; optional RMS norm with per-(rank, channel)
    gains.

    * Full (``path_reduced=False``): step 0 is a per-rank ``F x F`` linear, ``mix_k`` a
      per-rank ``(paths_l F) -> F`` linear of the path-resolved product.
    * Path-reduced: step 0 multiplies ``A`` by one weight per (rank, channel); the products
      carry one weight per (path, channel), their paths of each rank are summed and scaled
      by ``n_paths_l^-1/2``; one final per-rank ``F x F`` linear mixes the summed steps.

    ``element_agnostic=False`` gives the products' per-(path, channel) weights one row per
    element (full variant: such weights are added, the agnostic full product has none).
    ``forward(a: [n, layout_width(l_in, F)], types: [n]) -> [n, layout_width(l_out, F)]``.
    """

    def __init__(
        self,
        l_in: int,
        l_out: int,
        F: int,
        correlation: int,
        path_reduced: bool,
        n_elements: int,
        element_agnostic: bool,
        layer_norm: bool,
        backend: str = "auto",
    ):
        super().__init__()
        self.path_reduced, self.element_agnostic = path_reduced, element_agnostic
        self.out_width = layout_width(l_out, F)
        self.skip = EquivariantLinear(l_in, l_out, F, F, backend=backend)
        self.norm = RMSNorm(l_out, F, backend=backend) if layer_norm else None
        self.steps = torch.nn.ModuleList()  # the products of steps 1..correlation-1
        self.mix = torch.nn.ModuleList()  # full: step 0 linear, then one per product
        self.path_weights = torch.nn.ParameterList()  # per-(path, channel) weights of the products
        n_steps = correlation - 1
        if path_reduced:
            self.final = EquivariantLinear(l_out, l_out, F, F, backend=backend)
            self.first_weights = torch.nn.Parameter(torch.ones((l_in + 1) * F))
            self.register_buffer("first_index", rank_channel_index(l_in, F), persistent=False)
        elif n_steps:
            self.mix.append(EquivariantLinear(l_in, l_in, F, F, backend=backend))
        weighted = path_reduced or not element_agnostic
        for k in range(n_steps):
            l_k = l_out if k == n_steps - 1 else l_in
            tp = TensorProduct(l_in, l_in, l_k, F, F, shared_weights=element_agnostic, reduce_paths=path_reduced, backend=backend)
            self.steps.append(tp)
            if weighted:
                shape = (tp.weight_numel,) if element_agnostic else (n_elements, tp.weight_numel)
                self.path_weights.append(torch.nn.Parameter(torch.randn(shape)))
            else:
                self.register_buffer(f"unit_weights_{k}", torch.ones(tp.weight_numel), persistent=False)
            if path_reduced:
                # n_paths_l^-1/2 per weight (paths in weight order, F weights each): the summed paths
                # of each output rank scaled through the weights, not by a pass over the rows
                scales = torch.tensor([tp.n_paths_per_rank[p.l_out] ** -0.5 for p in tp.paths]).repeat_interleave(F)
                self.register_buffer(f"weight_scale_{k}", scales, persistent=False)
            else:
                self.mix.append(EquivariantLinear(l_k, l_k, F, F, in_paths=tp.n_paths_per_rank, backend=backend))

    def _weights(self, k: int, types: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Step ``k``'s product weights ``[weight_numel]`` (element-agnostic) or ``[n, weight_numel]``,
        path-reduced ones times their rank's ``n_paths^-1/2``."""
        if not self.path_weights:
            return getattr(self, f"unit_weights_{k}").to(dtype)
        w = self.path_weights[k]
        if self.path_reduced:
            scale = getattr(self, f"weight_scale_{k}")
            w = frozen_derived(self, f"weights_{k}", [w, scale], lambda: w * scale.to(w.dtype))
        w = w.to(dtype)
        return w if self.element_agnostic else w.index_select(0, types)

    def _first_weights(self) -> torch.Tensor:
        """Path-reduced step 0's ``[W]`` weights, one per (rank, channel) broadcast over components."""
        w, index = self.first_weights, self.first_index
        return frozen_derived(self, "first_weights", [w, index], lambda: w.index_select(0, index))

    def forward(self, a: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        ow = self.out_width
        if not self.steps:
            out = self.skip(a)
            return self.norm(out) if self.norm is not None else out
        if self.path_reduced:
            p = a * self._first_weights()
        else:
            p = self.mix[0](a)
        # summed at full width while the steps' widths agree, truncated to ranks 0..l_out once (the
        # same sums: every slice costs a zero-filled gradient and a copy in the backward pass)
        total = p
        for k, tp in enumerate(self.steps):
            p = tp(p, a, self._weights(k, types, a.dtype))
            if not self.path_reduced:
                p = self.mix[k + 1](p)
            if p.shape[1] != total.shape[1]:
                total, p = _leading(total, ow), _leading(p, ow)
            total = total + p
        total = _leading(total, ow)
        out = linear_sum(self.final, total, self.skip, a) if self.path_reduced else self.skip(a) + total
        return self.norm(out) if self.norm is not None else out
