"""Triton-backed ``torch.library`` custom ops with autograd to any order.

Every operation here is bilinear in its two tensor operands (product: ``x1, x2`` with the
weights as a third linear factor; linear map: ``x, W``), so each derivative is again one
of the same ops with substituted operands. The autograd formulas below call the ops
themselves, so backward, double backward and beyond are all Triton launches, and
``torch.compile(fullgraph=True)`` sees opaque ops with fake implementations.

Ops (namespace ``flashcart``):

* ``tp_fwd(x1, x2, w, *graph, key)``; ``tp_bwd(go, x1, x2, w, *graph, key, need_x1, need_x2,
  need_w)`` with ``graph = (receivers, senders, rowptr, perm, srowptr, widx, wrows)``; the tensor product's double backward is
  ``tp_dbwd`` (``double_backward.py``: fused kernels, used when the double backward is not
  itself differentiated) or a composition of ``tp_fwd``/``tp_bwd`` (differentiable again).
* ``tp_fwd_tabulated(x1, x2, t, w, ws, geometry, *graph, key)``: weights that are a function of one
  variable ``t`` per row, given as values and slopes, or (``geometry`` given) as a cubic table the
  kernels evaluate; first derivatives (to ``t``) only.
* ``expansion_fwd(u, l_max)``, ``expansion_vjp(u, g, l_max)``, ``expansion_second(u, g, v, l_max)``.
* ``lin_fwd(x, w, table, key)``, ``lin_bwd_x(gy, w, table, key)``, ``lin_bwd_w(gy, x, table, key)``
  (``table``: the layer's launch table, see ``flashcart.cartesian._linear_spec``);
  ``lin_pair(r1, w1, r2, w2, t1, t2, k1, k2, mode)``: two maps' forwards or input gradients in
  one launch.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import NamedTuple, Optional

import torch
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import guard_or_false

from .._frozen import frozen_derived, parameters_of
from .._layout import edge_csr
from .._linear_spec import BWD_W, BWD_X, COLUMN, FWD, N_COLS, launch_rows, linear_spec, n_tiles
from .._weight_rows import listed_edges
from .._weight_slopes import apply_weight_slopes
from .._weight_table import WeightTable
from .._weight_table import evaluate as evaluate_weight_table
from . import common as _common
from .common import DT as _DT
from .common import block_f as _block_f
from .common import cdiv as _cdiv
from .common import kernel_op
from .common import next_pow2 as _next_pow2
from .common import reduce_channels as _reduce_channels
from .common import sum_splits as _sum_splits
from .common import switch_mode as _switch_mode
from .common import tp_shapes as _tp_shapes
from .common import walk_splits as _walk_splits
from .double_backward import env_mode, fused_outputs
from .double_backward import tp_dbwd as _tp_dbwd_op
from .linear_kernel import LinearTiles, default_tiles, grouped_matmul, kernel_unit_axes, kernel_unit_axes_of_rows, linear_tiles
from .signatures import EXPANSION_FWD, EXPANSION_SECOND, EXPANSION_VJP, TP_BWD_CSR, TP_BWD_EDGE, TP_BWD_X1_CSR, TP_FWD, launch_kernel
from .source import expansion_module, product_key, product_module
from .weight_rows import _backward as _rows_sum_backward
from .weight_rows import _setup as _rows_sum_setup
from .weight_rows import rows_in_kernel as _rows_in_kernel
from .weight_rows import weight_grad_shape as _weight_grad_shape
from .weight_rows import weight_rows_sum

__all__ = ["tensor_product", "direction_expansion", "equivariant_linear", "edge_csr", "FUSED_DOUBLE_BACKWARD"]


# The tensor product's double backward: the fused kernels (double_backward.tp_dbwd, default)
# or the composition of tp_fwd/tp_bwd launches (FLASHCART_FUSED_DOUBLE_BACKWARD=0). Read at
# import; benchmarks flip the module attribute to compare the two in one process.
FUSED_DOUBLE_BACKWARD = env_mode()[0]


def _csr_backward_mode() -> bool:
    """``FLASHCART_FUSED_CSR_BACKWARD``: ``1`` (default) runs the convolution backward that needs
    input 1's gradient and another as one pass per sender (``tp_bwd_csr``); ``0`` as two
    kernels (``tp_bwd_edge`` per edge, then ``tp_bwd_x1_csr`` per sender)."""
    return _switch_mode("FLASHCART_FUSED_CSR_BACKWARD")


# Read at import; benchmarks flip the module attribute to compare the two in one process.
FUSED_CSR_BACKWARD = _csr_backward_mode()


def _sender_walk_mode() -> bool:
    """``FLASHCART_SENDER_WALK_BACKWARD``: ``1`` runs a convolution backward that does not need
    input 1's gradient (a first convolution, whose node features carry no position dependence)
    as the sender walk too (``tp_bwd_csr``, split like the other walks; input 1's gradient is
    computed into scratch and dropped); ``0`` (default, until timed on a GPU) as one program
    per edge (``tp_bwd_edge``: 158,000 one-warp programs on the 1000-atom diamond)."""
    return _switch_mode("FLASHCART_SENDER_WALK_BACKWARD", default=False)


# Read at import; benchmarks and tests flip the module attribute.
SENDER_WALK_BACKWARD = _sender_walk_mode()


def _pipeline_mode() -> bool:
    """``FLASHCART_TP_PIPELINE``: ``1`` (default) runs the convolution forward's receiver walk
    software pipelined (each step loads the next edge's operands before it computes the current
    edge's messages; on the H200 21-27 % faster, RESULTS.md 2026-12-03); ``0`` loads each edge's
    operands in its own step (fewer registers)."""
    return _switch_mode("FLASHCART_TP_PIPELINE")


# Read at import; benchmarks and tests flip the module attribute.
TP_PIPELINE = _pipeline_mode()

# ---------------------------------------------------------------------------------------
# tensor product
# ---------------------------------------------------------------------------------------


# Graph tensors in convolution mode: receivers, senders, rowptr, perm, srowptr (see edge_csr);
# all None in dense mode. Then widx, wrows (both None, or both given): edge e reads weight row
# widx[e] of w [R, n_paths * F], and the weights' gradient of row r sums the per-edge gradients of
# the edges wrows[r] lists (flashcart.cartesian._weight_rows). The kernels read rows through widx.
# With weight_rows.IN_KERNEL (FLASHCART_WEIGHT_ROW_SUM=atomic, default) tp_bwd and tp_dbwd return
# the weights' gradient per row, shaped like w (the kernels add each listed edge's gradient into
# its row), and tp_dbwd reads the cotangent ggw per row; otherwise both are per edge
# ([E, n_paths * F]) and the autograd formulas sum the gradients into rows (weight_rows_sum).


@kernel_op("flashcart::tp_fwd")
def tp_fwd(
    x1: Tensor,
    x2: Tensor,
    w: Tensor,
    receivers: Optional[Tensor],
    senders: Optional[Tensor],
    rowptr: Optional[Tensor],
    perm: Optional[Tensor],
    srowptr: Optional[Tensor],
    widx: Optional[Tensor],
    wrows: Optional[Tensor],
    key: str,
) -> Tensor:
    return _tp_fwd_impl(x1, x2, w, rowptr, senders, widx, key)


class _Table(NamedTuple):
    """``W_TABLE``'s operands: ``w`` is then a cubic table ``[K, 4, W]`` of ``t [R]``, one variable
    per weight row (:mod:`flashcart.cartesian._weight_table`), ``geometry [2]`` its cutoff and scale."""

    t: Tensor
    geometry: Tensor


def _table_args(table: Optional[_Table], w: Tensor, unused: Tensor) -> dict:
    """The kernels' ``W_TABLE`` arguments (``t_ptr``, ``geom_ptr``, ``tab_n``, ``W_TABLE``)."""
    if table is None:
        return dict(t_ptr=unused, geom_ptr=unused, tab_n=0, W_TABLE=False)
    return dict(t_ptr=table.t, geom_ptr=table.geometry, tab_n=w.shape[0], W_TABLE=True)


def _w_row(w: Tensor, table: Optional[_Table]) -> int:
    """Elements per weight row: ``W`` of ``[R, W]`` (or of a table ``[K, 4, W]``), 0 for shared ``[W]``."""
    return w.shape[-1] if table is not None or w.dim() == 2 else 0


def _tp_fwd_impl(
    x1: Tensor,
    x2: Tensor,
    w: Tensor,
    rowptr: Optional[Tensor],
    senders: Optional[Tensor],
    widx: Optional[Tensor],
    key: str,
    table: Optional[_Table] = None,
) -> Tensor:
    """The product's forward launch (``tp_fwd``, shared by :func:`tp_fwd` and :func:`tp_fwd_tabulated`;
    ``table`` given: ``w`` is a cubic table, ``W_TABLE``)."""
    spec, f1, f2, F = _tp_shapes(key, x1, x2)
    conv = rowptr is not None
    rows = x1.shape[0] if conv else x2.shape[0]
    splits = _walk_splits(conv, spec.n_paths, channels=F)
    out = torch.empty(splits * rows, spec.n_out_blocks * F, dtype=x2.dtype, device=x2.device)
    if guard_or_false(rows == 0) or F == 0:
        return _sum_splits(out, splits)  # nothing to compute: out has no elements
    x1, x2, w = x1.contiguous(), x2.contiguous(), w.contiguous()
    block, warps = _block_f(F)
    unused = out  # any tensor: pointer arguments the kernel does not read (CONV off)
    TP_FWD.launch(
        product_module(key),
        (splits * rows, _cdiv(F, block)),
        num_warps=warps,
        x1_ptr=x1,
        x2_ptr=x2,
        w_ptr=w,
        widx_ptr=widx if widx is not None else unused,
        **_table_args(table, w, unused),
        out_ptr=out,
        rowptr_ptr=rowptr if conv else unused,
        send_ptr=senders if conv else unused,
        x1_row=x1.shape[1],
        x2_row=x2.shape[1],
        w_row=_w_row(w, table),
        out_row=out.shape[1],
        F1S=int(f1 != 1),
        F2S=int(f2 != 1),
        F1C=f1,
        F2C=f2,
        F=F,
        CONV=conv,
        W_INDEX=widx is not None,
        PIPELINE=TP_PIPELINE and conv,  # a dense row is one step: nothing to overlap
        SPLITS=splits,
        BLOCK_F=block,
        DT=_DT[out.dtype],
    )
    return _sum_splits(out, splits)


@tp_fwd.register_fake
def _(x1, x2, w, receivers, senders, rowptr, perm, srowptr, widx, wrows, key):
    spec, _, _, F = _tp_shapes(key, x1, x2)
    rows = x1.shape[0] if rowptr is not None else x2.shape[0]
    return x2.new_empty(rows, spec.n_out_blocks * F)


@kernel_op("flashcart::tp_bwd")
def tp_bwd(
    go: Tensor,
    x1: Tensor,
    x2: Tensor,
    w: Tensor,
    receivers: Optional[Tensor],
    senders: Optional[Tensor],
    rowptr: Optional[Tensor],
    perm: Optional[Tensor],
    srowptr: Optional[Tensor],
    widx: Optional[Tensor],
    wrows: Optional[Tensor],
    key: str,
    need_x1: bool,
    need_x2: bool,
    need_w: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    return _tp_bwd_impl(go, x1, x2, w, None, receivers, senders, perm, srowptr, widx, wrows, key, need_x1, need_x2, need_w)


def _tp_bwd_impl(go, x1, x2, w, ws, receivers, senders, perm, srowptr, widx, wrows, key, need_x1, need_x2, need_w, table=None):
    """The product's backward launches (shared by :func:`tp_bwd` and :func:`tp_bwd_tabulated`).
    ``ws`` given (``W_SLOPE``): ``w = w(t)`` with ``dw/dt = ws``, and the third result is the
    gradient of ``t`` instead of ``w``'s: ``[R]`` per weight row with ``widx`` (summed in the
    kernels, or here over each row's listed edges), else ``[rows]``. ``table``
    given: ``w`` is a cubic table of ``table.t`` (``W_TABLE``), whose slopes the kernels evaluate
    (``ws`` unused), and the third result is ``t``'s gradient likewise."""
    spec, f1, f2, F = _tp_shapes(key, x1, x2)
    conv = receivers is not None
    slope = (ws is not None or table is not None) and need_w
    rows = x2.shape[0]
    go, x1, x2, w = go.contiguous(), x1.contiguous(), x2.contiguous(), w.contiguous()
    shared = w.dim() == 1
    n_wrows = table.t.shape[0] if table is not None else w.shape[0]  # weight rows (R)
    dev, dt = x2.device, x2.dtype
    splits = _walk_splits(conv, spec.n_paths, channels=F)  # the sender walks (input 1's gradient) write partial sums per split
    # convolution with input 1's gradient and another: one pass per sender (tp_bwd_csr); without
    # input 1's gradient too with SENDER_WALK_BACKWARD (input 1's gradient into scratch)
    walk = (need_x1 and FUSED_CSR_BACKWARD) or (not need_x1 and SENDER_WALK_BACKWARD)
    fused = conv and walk and (need_x2 or need_w) and not shared and F > 0
    mod = product_module(key)
    g1 = torch.empty(splits * x1.shape[0], spec.in1_comps * F, dtype=dt, device=dev) if need_x1 or fused else x1.new_empty(0)
    # A broadcast input 2 (one channel, the edge attributes) gets its channel sum in-kernel:
    # one program then covers every channel.
    reduce_g2 = need_x2 and f2 == 1 and F > 1 and F <= 256
    g2 = torch.empty(rows, spec.in2_comps * (1 if reduce_g2 else F), dtype=dt, device=dev) if need_x2 else x2.new_empty(0)
    in_rows = _rows_in_kernel(widx)
    if not need_w:
        gw = w.new_empty(0)
    elif slope:  # one scalar per weight row (summed by atomics) or per edge
        ws = ws.contiguous() if ws is not None else None
        gw = torch.zeros(n_wrows, dtype=dt, device=dev) if in_rows else torch.empty(rows, dtype=dt, device=dev)
    elif in_rows:  # each listed edge's gradient is added into its row
        gw = torch.zeros(w.shape[0], spec.n_paths * F, dtype=dt, device=dev)
    else:
        gw = torch.empty(rows, spec.n_paths * F, dtype=dt, device=dev)
    block, warps = _block_f(F)
    w_row = _w_row(w, table)
    if fused:
        _bwd_csr(
            mod,
            go,
            x1,
            x2,
            w,
            table,
            slope,
            ws if slope else None,
            widx,
            wrows if in_rows else None,
            g1,
            g2,
            gw,
            receivers,
            perm,
            srowptr,
            f1,
            f2,
            F,
            need_x2,
            need_w,
            reduce_g2,
            splits,
        )
    elif not guard_or_false(rows == 0) and F and (need_x2 or need_w or (need_x1 and not conv)):
        unused = go  # any tensor: pointer arguments the kernel does not read (their NEED_*/CONV flag is off)
        eblock = _next_pow2(F) if reduce_g2 or slope else block  # one program for every channel
        TP_BWD_EDGE.launch(
            mod,
            (rows, _cdiv(F, eblock)),
            num_warps=max(1, eblock // 32),
            go_ptr=go,
            x1_ptr=x1,
            x2_ptr=x2,
            w_ptr=w,
            ws_ptr=ws if slope and ws is not None else unused,
            widx_ptr=widx if widx is not None else unused,
            wrows_ptr=wrows if in_rows else unused,
            **_table_args(table, w, unused),
            g1_ptr=g1 if need_x1 and not conv else unused,
            g2_ptr=g2 if need_x2 else unused,
            gw_ptr=gw if need_w else unused,
            recv_ptr=receivers if conv else unused,
            send_ptr=senders if conv else unused,
            go_row=go.shape[1],
            x1_row=x1.shape[1],
            x2_row=x2.shape[1],
            w_row=w_row,
            g1_row=g1.shape[-1] if need_x1 else 0,
            g2_row=g2.shape[-1] if need_x2 else 0,
            gw_row=0 if slope or not need_w else gw.shape[-1],
            F1S=int(f1 != 1),
            F2S=int(f2 != 1),
            F1C=f1,
            F2C=f2,
            F=F,
            CONV=conv,
            W_INDEX=widx is not None,
            W_ROWS=in_rows,
            W_SLOPE=slope,
            NEED_G1=need_x1 and not conv,
            NEED_G2=need_x2,
            NEED_GW=need_w,
            REDUCE_G2=reduce_g2,
            BLOCK_F=eblock,
            DT=_DT[dt],
        )
    if need_x1 and conv and not fused and not guard_or_false(x1.shape[0] == 0) and F:
        TP_BWD_X1_CSR.launch(
            mod,
            (splits * x1.shape[0], _cdiv(F, block)),
            num_warps=warps,
            go_ptr=go,
            x2_ptr=x2,
            w_ptr=w,
            widx_ptr=widx if widx is not None else go,
            **_table_args(table, w, go),
            g1_ptr=g1,
            srowptr_ptr=srowptr,
            perm_ptr=perm,
            recv_ptr=receivers,
            go_row=go.shape[1],
            x2_row=x2.shape[1],
            w_row=w_row,
            g1_row=g1.shape[1],
            F2S=int(f2 != 1),
            F2C=f2,
            F=F,
            W_INDEX=widx is not None,
            PREFETCH=_common.index_prefetch("tp_bwd_x1_csr", block),
            SPLITS=splits,
            BLOCK_F=block,
            DT=_DT[dt],
        )
    elif need_x1 and conv and not fused:
        g1.zero_()
    if need_x1:
        g1 = _reduce_channels(_sum_splits(g1, splits), spec.in1_comps, f1)
    elif fused:
        g1 = x1.new_empty(0)  # the sender walk's scratch
    if need_x2 and not reduce_g2:
        g2 = _reduce_channels(g2, spec.in2_comps, f2)
    if slope and widx is not None and not in_rows:  # per edge: each row sums the edges it lists
        gw = torch.zeros(n_wrows, dtype=dt, device=dev).index_add_(0, widx, torch.where(listed_edges(wrows, widx), gw, 0))
    if need_w and shared:
        gw = gw.sum(0)
    return g1, g2, gw


def _bwd_csr(
    mod, go, x1, x2, w, table, slope, ws, widx, wrows, g1, g2, gw, receivers, perm, srowptr, f1, f2, F, need_x2, need_w, reduce_g2, splits
) -> None:
    """Launch ``tp_bwd_csr``: ``splits`` programs per sender (and channel block; a single block
    covering every channel when input 2's gradient is summed over channels in-kernel, or with
    ``slope``), input 1's gradient as partial sums in ``g1 [splits * nodes, ...]``; ``wrows``
    given: the weight gradient is summed into rows (``W_ROWS``); ``slope``: the gradient of the
    weights' variable instead (``W_SLOPE``), with slopes ``ws`` or those of ``table``."""
    if guard_or_false(x1.shape[0] == 0):
        return
    block = _next_pow2(F) if reduce_g2 or slope else _block_f(F)[0]
    unused = go  # pointer arguments the kernel does not read (their NEED_* flag is off)
    TP_BWD_CSR.launch(
        mod,
        (splits * x1.shape[0], _cdiv(F, block)),
        num_warps=max(1, block // 32),
        go_ptr=go,
        x1_ptr=x1,
        x2_ptr=x2,
        w_ptr=w,
        ws_ptr=ws if ws is not None else unused,
        widx_ptr=widx if widx is not None else unused,
        wrows_ptr=wrows if wrows is not None else unused,
        **_table_args(table, w, unused),
        g1_ptr=g1,
        g2_ptr=g2 if need_x2 else unused,
        gw_ptr=gw if need_w else unused,
        srowptr_ptr=srowptr,
        perm_ptr=perm,
        recv_ptr=receivers,
        go_row=go.shape[1],
        x1_row=x1.shape[1],
        x2_row=x2.shape[1],
        w_row=_w_row(w, table),
        g1_row=g1.shape[1],
        g2_row=g2.shape[-1] if need_x2 else 0,
        gw_row=0 if slope or not need_w else gw.shape[-1],
        F1S=int(f1 != 1),
        F2S=int(f2 != 1),
        F1C=f1,
        F2C=f2,
        F=F,
        W_INDEX=widx is not None,
        W_ROWS=wrows is not None,
        W_SLOPE=slope,
        NEED_G2=need_x2,
        NEED_GW=need_w,
        REDUCE_G2=reduce_g2,
        PREFETCH=_common.index_prefetch("tp_bwd_csr", block),
        SPLITS=splits,
        BLOCK_F=block,
        DT=_DT[x2.dtype],
    )


@tp_bwd.register_fake
def _(go, x1, x2, w, receivers, senders, rowptr, perm, srowptr, widx, wrows, key, need_x1, need_x2, need_w):
    return (
        x1.new_empty(x1.shape) if need_x1 else x1.new_empty(0),
        x2.new_empty(x2.shape) if need_x2 else x2.new_empty(0),
        w.new_empty(_weight_grad_shape(w, x2, widx)) if need_w else w.new_empty(0),
    )


_GRAPH = 7  # graph tensors after the operands: receivers, senders, rowptr, perm, srowptr, widx, wrows


def _tp_setup(ctx, inputs, output):
    x1, x2, w, *graph, key = inputs
    ctx.key = key
    ctx.save_for_backward(x1, x2, w, *graph)


def _rows_grad(gw: Tensor, graph) -> Tensor:
    """The weights' gradient per row: ``gw`` itself (no ``widx``, or the kernels summed it into
    rows), or its edges summed per row (``weight_rows_sum``, one Triton pass)."""
    widx, wrows = graph[5], graph[6]
    return gw if wrows is None or _rows_in_kernel(widx) else weight_rows_sum(gw, wrows, widx)


def _edge_cotangent(ggw: Tensor, graph) -> Tensor:
    """``ggw`` per edge: the cotangent of a weight gradient the kernels summed into rows, read by
    each edge its row lists (zero for the others). Differentiable (plain tensor operations)."""
    widx, wrows = graph[5], graph[6]
    if wrows is None or not _rows_in_kernel(widx):
        return ggw
    return torch.where(listed_edges(wrows, widx).unsqueeze(-1), ggw.index_select(0, widx), 0)


def _engine_needs(ctx, n: int) -> list[bool]:
    """``ctx.needs_input_grad[:n]`` narrowed to the inputs this backward pass reaches.

    ``needs_input_grad`` says which inputs require grad when the graph was built; the engine
    knows which of them lead to a requested result now: forces (``autograd.grad(E, pos)``)
    never reach the parameters behind a first layer's node features, and a training step's
    ``backward(inputs=parameters)`` never reaches the positions. Inputs whose node has no
    inputs of its own count as needed: leaves (the engine cannot answer for them under
    ``autograd.grad``, and its error would cost more than the question saves: a query costs
    well under a microsecond) and the placeholder nodes of a traced graph's inputs.

    The same holds while ``torch.compile`` or ``torch.export`` traces a backward pass: the
    engine runs it on fake tensors and the answers are fixed in the graph, which is what a
    compiled training step needs (the force pass then skips the parameters' terms, the
    parameter pass the positions'). Under functorch transforms (``torch.func``) every input
    that requires grad counts.
    """
    need = list(ctx.needs_input_grad[:n])
    # one input requiring grad: the engine runs this node only for it (an MD step's every call)
    if sum(need) < 2 or torch._C._are_functorch_transforms_active():
        return need
    edges = ctx.next_functions  # one per tensor input; the first n inputs are tensors
    for i in range(n):
        node = edges[i][0]
        if need[i] and node is not None and node.next_functions:
            need[i] = torch._C._will_engine_execute_node(node)
    return need


def _tp_backward(ctx, go):
    x1, x2, w, *graph = ctx.saved_tensors
    need = _engine_needs(ctx, 3)
    grads = [None] * (4 + _GRAPH)
    if any(need[:3]):
        g1, g2, gw = tp_bwd(go, x1, x2, w, *graph, ctx.key, need[0], need[1], need[2])
        grads[:3] = [g1 if need[0] else None, g2 if need[1] else None, _rows_grad(gw, graph) if need[2] else None]
    return tuple(grads)


tp_fwd.register_autograd(_tp_backward, setup_context=_tp_setup)


def _tp_bwd_setup(ctx, inputs, output):
    go, x1, x2, w, *graph, key, n1, n2, nw = inputs
    ctx.key, ctx.flags = key, (n1, n2, nw)
    ctx.save_for_backward(go, x1, x2, w, *graph)


def _present(t: Optional[Tensor]) -> bool:
    return t is not None and t.numel() > 0


def _add(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    if a is None:
        return b
    return a if b is None else a + b


def _recorded(*tensors: Optional[Tensor]) -> bool:
    """Whether a derivative computed now is itself recorded for autograd (a third derivative):
    the fused double backward has none, the composed one is differentiable."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _tp_bwd_backward(ctx, gg1, gg2, ggw):
    """Derivative of ``(g1, g2, gw) = tp_bwd(go, x1, x2, w)`` given cotangents ``gg*``.

    ``g1 = sum_p w B_a(go, x2)``, ``g2 = sum_p w B_b(go, x1)``, ``gw = <go, B(x1, x2)>``, so
    ``d go = F(gg1, x2, w) + F(x1, gg2, w) + F(x1, x2, ggw)``,
    ``d x1 = G1(go, gg2, w) + G1(go, x2, ggw)``, ``d x2 = G2(go, gg1, w) + G2(go, x1, ggw)``,
    ``d w = Gw(go, gg1, x2) + Gw(go, x1, gg2)`` with ``F = tp_fwd`` and ``G* = tp_bwd``.
    By default the fused kernels evaluate all of it in one launch (``tp_dbwd``); the
    composition above (up to ten launches) runs when the result must itself be
    differentiable or with ``FUSED_DOUBLE_BACKWARD`` off.
    """
    go, x1, x2, w, *graph = ctx.saved_tensors
    # the composition reads ggw per edge, without widx (the fused kernels read it as tp_bwd wrote gw)
    edge_graph = (*graph[:5], None, None)
    key = ctx.key
    n1, n2, nw = ctx.flags
    gg1 = gg1 if n1 and _present(gg1) else None
    gg2 = gg2 if n2 and _present(gg2) else None
    ggw = ggw if nw and _present(ggw) else None
    need = _engine_needs(ctx, 4)
    if FUSED_DOUBLE_BACKWARD and not _recorded(go, x1, x2, w, gg1, gg2, ggw):
        flags = fused_outputs(gg1 is not None, gg2 is not None, ggw is not None, tuple(need[:4]))
        outs = list(tp_dbwd(go, x1, x2, w, gg1, gg2, ggw, *graph, key, *need[:4]))
        if flags[3]:
            outs[3] = _rows_grad(outs[3], graph)
        return tuple(o if c else None for o, c in zip(outs, flags)) + (None,) * (_GRAPH + 4)

    ggw = None if ggw is None else _edge_cotangent(ggw, graph)

    def fwd(a, b, c):
        return tp_fwd(a, b, c, *(edge_graph if c is ggw else graph), key)

    def bwd(a, b, c, which):
        return tp_bwd(go, a, b, c, *(edge_graph if c is ggw else graph), key, which == 0, which == 1, which == 2)[which]

    d_go = d_x1 = d_x2 = d_w = None
    if need[0]:
        if gg1 is not None:
            d_go = _add(d_go, fwd(gg1, x2, w))
        if gg2 is not None:
            d_go = _add(d_go, fwd(x1, gg2, w))
        if ggw is not None:
            d_go = _add(d_go, fwd(x1, x2, ggw))
    if need[1]:
        if gg2 is not None:
            d_x1 = _add(d_x1, bwd(x1, gg2, w, 0))
        if ggw is not None:
            d_x1 = _add(d_x1, bwd(x1, x2, ggw, 0))
    if need[2]:
        if gg1 is not None:
            d_x2 = _add(d_x2, bwd(gg1, x2, w, 1))
        if ggw is not None:
            d_x2 = _add(d_x2, bwd(x1, x2, ggw, 1))
    if need[3]:
        if gg1 is not None:
            d_w = _add(d_w, bwd(gg1, x2, w, 2))
        if gg2 is not None:
            d_w = _add(d_w, bwd(x1, gg2, w, 2))
        if d_w is not None:
            d_w = _rows_grad(d_w, graph)
    return (d_go, d_x1, d_x2, d_w) + (None,) * (_GRAPH + 4)


tp_bwd.register_autograd(_tp_bwd_backward, setup_context=_tp_bwd_setup)


# ---------------------------------------------------------------------------------------
# weights that are a function of one variable per row (tabulated radial MLPs)
# ---------------------------------------------------------------------------------------
# ``w = w(t)`` per weight row, given as constants in one of two ways: the values ``w [R, W]`` and
# slopes ``ws = dw/dt``; or (``geometry`` given, ``ws`` None) a cubic table ``w [K, 4, W]`` of ``t``
# that the kernels evaluate (``W_TABLE``, :mod:`flashcart.cartesian._weight_table`). The forward is
# ``tp_fwd``'s; the backward contracts each edge's weight gradient with the slopes in the kernels
# (``W_SLOPE``) and returns ``t``'s gradient, so no weights' gradient ``[R, W]`` is written, zeroed
# or read back. First derivatives only: the slopes' own derivative is not given, so a second
# derivative through ``t`` is refused.


def _tabulated(t: Tensor, geometry: Optional[Tensor]) -> Optional[_Table]:
    return None if geometry is None else _Table(t.contiguous(), geometry.contiguous())


@kernel_op("flashcart::tp_fwd_tabulated")
def tp_fwd_tabulated(
    x1: Tensor,
    x2: Tensor,
    t: Tensor,
    w: Tensor,
    ws: Optional[Tensor],
    geometry: Optional[Tensor],
    receivers: Optional[Tensor],
    senders: Optional[Tensor],
    rowptr: Optional[Tensor],
    perm: Optional[Tensor],
    srowptr: Optional[Tensor],
    widx: Optional[Tensor],
    wrows: Optional[Tensor],
    key: str,
) -> Tensor:
    return _tp_fwd_impl(x1, x2, w, rowptr, senders, widx, key, _tabulated(t, geometry))


@tp_fwd_tabulated.register_fake
def _(x1, x2, t, w, ws, geometry, receivers, senders, rowptr, perm, srowptr, widx, wrows, key):
    spec, _, _, F = _tp_shapes(key, x1, x2)
    return x2.new_empty(x1.shape[0], spec.n_out_blocks * F)


@kernel_op("flashcart::tp_bwd_tabulated")
def tp_bwd_tabulated(
    go: Tensor,
    x1: Tensor,
    x2: Tensor,
    t: Tensor,
    w: Tensor,
    ws: Optional[Tensor],
    geometry: Optional[Tensor],
    receivers: Optional[Tensor],
    senders: Optional[Tensor],
    rowptr: Optional[Tensor],
    perm: Optional[Tensor],
    srowptr: Optional[Tensor],
    widx: Optional[Tensor],
    wrows: Optional[Tensor],
    key: str,
    need_x1: bool,
    need_x2: bool,
    need_t: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    table = _tabulated(t, geometry)
    return _tp_bwd_impl(go, x1, x2, w, ws, receivers, senders, perm, srowptr, widx, wrows, key, need_x1, need_x2, need_t, table)


@tp_bwd_tabulated.register_fake
def _(go, x1, x2, t, w, ws, geometry, receivers, senders, rowptr, perm, srowptr, widx, wrows, key, need_x1, need_x2, need_t):
    return (
        x1.new_empty(x1.shape) if need_x1 else x1.new_empty(0),
        x2.new_empty(x2.shape) if need_x2 else x2.new_empty(0),
        t.new_empty(t.shape[0] if widx is not None else x2.shape[0]) if need_t else t.new_empty(0),
    )


def _tab_setup(ctx, inputs, output):
    *operands, key = inputs
    ctx.key = key
    ctx.save_for_backward(*operands)


def _tab_backward(ctx, go):
    x1, x2, t, w, ws, geometry, *graph = ctx.saved_tensors
    need = _engine_needs(ctx, 3)  # x1, x2, t
    grads = [None] * (7 + _GRAPH)
    if any(need):
        g1, g2, gt = tp_bwd_tabulated(go, x1, x2, t, w, ws, geometry, *graph, ctx.key, need[0], need[1], need[2])
        grads[:3] = [g1 if need[0] else None, g2 if need[1] else None, gt if need[2] else None]
    return tuple(grads)


def _tab_bwd_setup(ctx, inputs, output):
    pass


def _tab_bwd_backward(ctx, *grads):
    raise RuntimeError(
        "second derivatives through tabulated weights (tp_fwd_tabulated: radial tables, "
        "FlashCartPotential.set_radial_tables) are not available: tables give energies, forces and stress; "
        "for higher derivatives drop the tables (set_radial_tables(None)) or differentiate through them with autograd "
        "(FLASHCART_TABLE_SLOPES=0)"
    )


tp_fwd_tabulated.register_autograd(_tab_backward, setup_context=_tab_setup)
tp_bwd_tabulated.register_autograd(_tab_bwd_backward, setup_context=_tab_bwd_setup)


# One program covers every channel of an edge when the backward contracts the weights' gradient
# with their slopes (W_SLOPE): up to this many channels, else the slopes are applied by autograd.
TABULATED_MAX_CHANNELS = 256


def tensor_product(
    tp,
    x1: Tensor,
    x2: Tensor,
    w: Tensor,
    receivers: Optional[Tensor],
    senders: Optional[Tensor],
    csr=None,
    weight_rows=None,
    weight_slopes=None,
) -> Tensor:
    """Triton path of :class:`~flashcart.cartesian.TensorProduct` (shapes checked by the caller).
    ``weight_slopes = (ws, t)``: the weights are a function ``w(t)`` of one variable per row with
    slopes ``ws`` (:class:`~flashcart.cartesian.WeightSlopes`); convolutions contract the weights'
    gradient with the slopes in the backward kernels (``tp_fwd_tabulated``). ``w`` a
    :class:`~flashcart.cartesian.WeightTable`: convolutions evaluate the table in their kernels
    (``tp_fwd_tabulated`` with its ``geometry``); other products take its weights and slopes (``_weight_table.evaluate``)."""
    key = product_key(tp.in1_l_max, tp.in2_l_max, tp.out_l_max, tp.symmetric, tp.reduce_paths)
    if isinstance(w, WeightTable):
        if receivers is not None and tp.out_features <= TABULATED_MAX_CHANNELS:
            rowptr, perm, srowptr = csr if csr is not None else edge_csr(receivers, senders, x1.shape[0])
            widx, wrows = weight_rows if weight_rows is not None else (None, None)
            table, geometry, t = w
            return tp_fwd_tabulated(x1, x2, t, table, None, geometry, receivers, senders, rowptr, perm, srowptr, widx, wrows, key)
        w, weight_slopes = evaluate_weight_table(w)
    fused_slopes = weight_slopes is not None and receivers is not None and tp.out_features <= TABULATED_MAX_CHANNELS
    if weight_slopes is not None and not fused_slopes:
        w = apply_weight_slopes(w, weight_slopes)
    if receivers is None:
        return tp_fwd(x1, x2, w, None, None, None, None, None, None, None, key)
    rowptr, perm, srowptr = csr if csr is not None else edge_csr(receivers, senders, x1.shape[0])
    widx, wrows = weight_rows if weight_rows is not None else (None, None)
    if fused_slopes:
        ws, t = weight_slopes
        return tp_fwd_tabulated(x1, x2, t, w, ws, None, receivers, senders, rowptr, perm, srowptr, widx, wrows, key)
    return tp_fwd(x1, x2, w, receivers, senders, rowptr, perm, srowptr, widx, wrows, key)


# ---------------------------------------------------------------------------------------
# direction expansion
# ---------------------------------------------------------------------------------------

_ROWS = 64


def _rows_grid(n: int):
    return (_cdiv(n, _ROWS),)


@kernel_op("flashcart::expansion_fwd")
def expansion_fwd(u: Tensor, l_max: int) -> Tensor:
    u = u.contiguous()
    out = torch.empty(u.shape[0], (l_max + 1) ** 2, dtype=u.dtype, device=u.device)
    if not guard_or_false(u.shape[0] == 0):
        EXPANSION_FWD.launch(
            expansion_module(l_max), _rows_grid(u.shape[0]), u_ptr=u, out_ptr=out, n=u.shape[0], BLOCK=_ROWS, DT=_DT[u.dtype]
        )
    return out


@expansion_fwd.register_fake
def _(u, l_max):
    return u.new_empty(u.shape[0], (l_max + 1) ** 2)


@kernel_op("flashcart::expansion_vjp")
def expansion_vjp(u: Tensor, g: Tensor, l_max: int) -> Tensor:
    u, g = u.contiguous(), g.contiguous()
    gu = torch.empty_like(u)
    if not guard_or_false(u.shape[0] == 0):
        EXPANSION_VJP.launch(
            expansion_module(l_max), _rows_grid(u.shape[0]), u_ptr=u, g_ptr=g, gu_ptr=gu, n=u.shape[0], BLOCK=_ROWS, DT=_DT[u.dtype]
        )
    return gu


@expansion_vjp.register_fake
def _(u, g, l_max):
    return torch.empty_like(u)


@kernel_op("flashcart::expansion_second")
def expansion_second(u: Tensor, g: Tensor, v: Tensor, l_max: int) -> tuple[Tensor, Tensor]:
    """``(J v, sum_p g_p H_p v)``: derivatives of ``expansion_vjp`` w.r.t. ``g`` and ``u``."""
    u, g, v = u.contiguous(), g.contiguous(), v.contiguous()
    dg = torch.empty_like(g)
    du = torch.empty_like(u)
    if not guard_or_false(u.shape[0] == 0):
        EXPANSION_SECOND.launch(
            expansion_module(l_max),
            _rows_grid(u.shape[0]),
            u_ptr=u,
            g_ptr=g,
            v_ptr=v,
            dg_ptr=dg,
            du_ptr=du,
            n=u.shape[0],
            BLOCK=_ROWS,
            DT=_DT[u.dtype],
        )
    return dg, du


@expansion_second.register_fake
def _(u, g, v, l_max):
    return torch.empty_like(g), torch.empty_like(u)


def _exp_setup(ctx, inputs, output):
    u, l_max = inputs
    ctx.l_max = l_max
    ctx.save_for_backward(u)


def _exp_backward(ctx, g):
    (u,) = ctx.saved_tensors
    return expansion_vjp(u, g, ctx.l_max), None


expansion_fwd.register_autograd(_exp_backward, setup_context=_exp_setup)


def _vjp_setup(ctx, inputs, output):
    u, g, l_max = inputs
    ctx.l_max = l_max
    ctx.save_for_backward(u, g)


def _vjp_backward(ctx, v):
    u, g = ctx.saved_tensors
    dg, du = expansion_second(u, g, v, ctx.l_max)
    return du, dg, None


expansion_vjp.register_autograd(_vjp_backward, setup_context=_vjp_setup)


def direction_expansion(u: Tensor, l_max: int) -> Tensor:
    """Triton path of :class:`~flashcart.cartesian.DirectionExpansion` for unit vectors ``[n, 3]``."""
    return expansion_fwd(u, l_max)


# ---------------------------------------------------------------------------------------
# equivariant linear maps
# ---------------------------------------------------------------------------------------

# Tiles of the grouped matmul (FLASHCART_LINEAR_TILES, read at import; None: each layer's
# default_tiles; benchmarks/linear_tiles.py assigns the module attribute to compare shapes in one process).
LINEAR_TILES = linear_tiles()


def _linear_unit_mode() -> bool:
    """``FLASHCART_LINEAR_UNIT``: ``1`` (default) compiles the grouped matmul for each launch's
    contiguous operand axes (``_linear_spec.unit_axes``: offsets without division, 16-byte
    loads); ``0`` keeps the general addressing on every axis."""
    return _switch_mode("FLASHCART_LINEAR_UNIT")


# Read at import; benchmarks and tests assign the module attribute.
LINEAR_UNIT = _linear_unit_mode()


def _uses_dot(t: Tensor) -> bool:
    """Whether the grouped matmul multiplies with ``tl.dot`` (not for float64 on CUDA)."""
    return t.dtype != torch.float64 or not t.is_cuda


def _tiles(key: str, use_dot: bool):
    """The tiles of linear map ``key``: ``FLASHCART_LINEAR_TILES`` if set, else its default."""
    if LINEAR_TILES is not None:
        return LINEAR_TILES
    s = linear_spec(key)
    return default_tiles(s.f_in, s.f_out, use_dot)


class _GroupedPlan(NamedTuple):
    """What a grouped-matmul launch of one map and kind takes that does not depend on its
    operands: per launch-table row ``(m_mul, m_const, column tiles)`` for the tile count, the
    launch options and the constant keyword values."""

    rows: tuple
    bm: int
    options: dict
    constants: dict

    def tiles(self, n_rows):
        """Programs of a launch on ``n_rows`` rows (a SymInt under tracing), as ``n_tiles``."""
        bm, total = self.bm, 0
        for m_mul, m_const, n_col_tiles in self.rows:
            total += -(-(m_mul * n_rows + m_const) // bm) * n_col_tiles
        return total


@lru_cache(maxsize=None)
def _grouped_plan(key: str, kind: int, use_dot: bool, tiles: LinearTiles, unit: bool) -> _GroupedPlan:
    rows = tuple((r[COLUMN["m_mul"]], r[COLUMN["m_const"]], -(-r[COLUMN["n_size"]] // tiles.bn)) for r in launch_rows(key)[kind])
    options = {"num_warps": tiles.warps} if tiles.stages is None else {"num_warps": tiles.warps, "num_stages": tiles.stages}
    constants = dict(
        N_GROUPS=linear_spec(key).n_mixed,
        NCOL=N_COLS,
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        USE_DOT=use_dot,
        PRECISION=tiles.precision,
    )
    constants["N_FIRST"] = constants["N_GROUPS"]  # one map: no group reads the second operands
    # passed in every launch (the pre-bound launcher and inductor read each constexpr by name)
    constants["UNIT"], constants["ALIGN"] = kernel_unit_axes(key, kind, use_dot) if unit else (0, 1)
    return _GroupedPlan(rows, tiles.bm, options, constants)


@lru_cache(maxsize=None)
def _grouped_pair_plan(key: str, key2: str, kind: int, use_dot: bool, tiles: LinearTiles, unit: bool) -> _GroupedPlan:
    """The plan of one launch running launch ``kind`` of two maps (``key``'s groups, then
    ``key2``'s): their tile rows in turn, ``N_FIRST`` the first map's groups, and the unit axes
    and alignment that hold in every group of both."""
    first, second = _grouped_plan(key, kind, use_dot, tiles, unit), _grouped_plan(key2, kind, use_dot, tiles, unit)
    constants = dict(first.constants, N_GROUPS=first.constants["N_GROUPS"] + second.constants["N_GROUPS"])
    constants["N_FIRST"] = first.constants["N_GROUPS"]
    both = launch_rows(key)[kind] + launch_rows(key2)[kind]
    constants["UNIT"], constants["ALIGN"] = kernel_unit_axes_of_rows(both, use_dot) if unit else (0, 1)
    return _GroupedPlan(first.rows + second.rows, tiles.bm, first.options, constants)


def _launch_grouped(
    a: Tensor, b: Tensor, c: Tensor, table: Tensor, key: str, kind: int, n_rows: int, split: int = 1, pair: tuple | None = None
) -> None:
    """Run the grouped matmul of launch ``kind`` (forward / input grad / weight grad) on ``n_rows`` rows.

    ``table`` is the layer's launch table (``[3, groups, N_COLS]``, on the operands' device);
    the grid size comes from the key on the host, so nothing is read back or allocated.
    Everything but the operands and the row count comes from a cached plan (``_grouped_plan``):
    eager calls are bound by such host work. ``pair``: ``(a2, b2, c2, table2, key2)``, a second
    map of the same tiles run by the same launch on the same rows (unsplit).
    """
    use_dot = _uses_dot(c)
    tiling = _tiles(key, use_dot)
    if pair is None:
        plan = _grouped_plan(key, kind, use_dot, tiling, bool(LINEAR_UNIT))
        a2, b2, c2, table2 = a, b, c, table
    else:
        a2, b2, c2, table2, key2 = pair
        plan = _grouped_pair_plan(key, key2, kind, use_dot, tiling, bool(LINEAR_UNIT))
    tiles = plan.tiles(n_rows)
    if guard_or_false(tiles == 0):
        return
    values = dict(
        plan.constants,
        a_ptr=a,
        b_ptr=b,
        c_ptr=c,
        table_ptr=table[kind],
        n_rows=n_rows,
        c_split_stride=c.stride(0) if split > 1 else 0,
        a2_ptr=a2,
        b2_ptr=b2,
        c2_ptr=c2,
        table2_ptr=table2[kind],
        SPLIT=split,
    )
    launch_kernel(grouped_matmul, a, (tiles, split), values, plan.options)


# The weight gradient reduces over every row: its output (F_out x paths * F_in per rank) has
# few tiles, so the reduction is split over a second grid axis into partial sums that one
# ``sum(0)`` adds. ``WeightGradSplit(programs, rows)``: enough splits for about ``programs``
# programs in all, at most 64, and at least ``rows`` rows per split. (64, 64) with
# ``programs=0`` is the first rule (min(64, rows // 64) splits whatever the tile count);
# benchmarks/linear_tiles.py --weight-grad assigns WEIGHT_GRAD_SPLIT to compare rules. On the
# H200 (2026-12-01 evening, 1000 rows, float32, CUDA-graph replays) the default (2048, 8) took
# every map's weight gradient of i2c3f20l2r from 0.472 ms (the first rule, 15 splits) to 0.232
# ms and of i3c3f64l2 from 2.397 ms to 1.833 ms (64 splits each).
class WeightGradSplit(NamedTuple):
    programs: int = 2048
    rows: int = 8


WEIGHT_GRAD_SPLIT = WeightGradSplit()
MAX_WEIGHT_GRAD_SPLIT = 64


def weight_grad_split(key: str, n_rows, use_dot: bool = True):
    """Splits of the weight gradient's reduction for ``n_rows`` rows (a SymInt under tracing)."""
    rule = WEIGHT_GRAD_SPLIT
    cap = MAX_WEIGHT_GRAD_SPLIT
    if rule.programs > 0:
        t = _tiles(key, use_dot)
        tiles = max(1, n_tiles(key, BWD_W, 0, t.bm, t.bn))  # the weight gradient's M and N do not grow with rows
        cap = min(cap, -(-rule.programs // tiles))
    return torch.sym_max(1, torch.sym_min(cap, n_rows // rule.rows))


# The forward and the input gradient reduce over paths x channels (K, at most a few thousand)
# and have rows x components x channels outputs: at a thousand rows some maps have fewer
# tiles than the GPU has multiprocessors (i3c3f64l2's 64-channel maps: about 140 programs of
# 4 warps on the H200's 132), so splitting K would run more programs per multiprocessor.
# ``RowMapSplit(programs, k_steps)``: enough splits for about ``programs`` programs in all,
# at most 64, each split at least ``k_steps`` K steps of the widest group. ``programs=0``
# (the default) never splits: no GPU timing has yet shown that a split pays;
# benchmarks/linear_tiles.py --split assigns ROW_MAP_SPLIT to compare rules.
class RowMapSplit(NamedTuple):
    programs: int = 0
    k_steps: int = 2


ROW_MAP_SPLIT = RowMapSplit()
MAX_ROW_MAP_SPLIT = 64


def row_map_split(key: str, kind: int, n_rows, use_dot: bool = True):
    """Splits of the reduction of the forward (``kind`` FWD) or input gradient (BWD_X) of map
    ``key`` on ``n_rows`` rows (a SymInt under tracing)."""
    rule = ROW_MAP_SPLIT
    if rule.programs <= 0:
        return 1
    t = _tiles(key, use_dot)
    k_max = max(r[COLUMN["k_const"]] for r in launch_rows(key)[kind])  # K does not grow with rows here
    cap = max(1, min(MAX_ROW_MAP_SPLIT, k_max // (rule.k_steps * t.bk)))
    tiles = torch.sym_max(1, n_tiles(key, kind, n_rows, t.bm, t.bn))
    return torch.sym_max(1, torch.sym_min(cap, -(-rule.programs // tiles)))


def _map_output(key: str, kind: int, lead: tuple, like: Tensor) -> Tensor:
    """``[*lead, width]`` for the forward (``kind`` FWD: output rows) or the input gradient
    (BWD_X: input rows) of map ``key``, like ``like``: the columns of ranks no path reaches are
    zero, the rest for the kernel to write."""
    s = linear_spec(key)
    width, offsets, l_max = (s.out_width, s.out_off, s.out_l_max) if kind == FWD else (s.in_width, s.in_off, s.in_l_max)
    out = torch.empty((*lead, width), dtype=like.dtype, device=like.device)
    if s.n_mixed <= l_max:
        out[..., offsets[s.n_mixed] :].zero_()
    return out


def _row_map(a: Tensor, w: Tensor, table: Tensor, key: str, kind: int) -> Tensor:
    """``[n, width]`` output of the forward or input gradient (:func:`_map_output`); with a
    split, the partial sums are added here."""
    n = a.shape[0]
    split = row_map_split(key, kind, n, _uses_dot(a))
    unsplit = isinstance(split, int) and split == 1
    out = _map_output(key, kind, (n,) if unsplit else (split, n), a)
    _launch_grouped(a, w, out, table, key, kind, n, split=split)
    return out if unsplit else out.sum(0)


def _check_table(table: Tensor, key: str, like: Tensor) -> None:
    s = linear_spec(key)
    if table.shape != (3, s.n_mixed, N_COLS) or table.dtype != torch.int64:
        raise ValueError(f"launch table of shape {tuple(table.shape)} does not belong to linear map {key!r}")
    if table.device != like.device:
        raise ValueError(f"linear launch table on {table.device}, operands on {like.device}: move the layer with .to()")


def _lin_rows(rows: Tensor, w: Tensor, table: Tensor, key: str, mode: int) -> Tensor:
    """A linear map's rows through its weights: the forward (``FWD``: input rows to output rows)
    or the input gradient (``BWD_X``: output-gradient rows to input-gradient rows)."""
    _check_table(table, key, rows)
    return _row_map(rows.contiguous(), w.contiguous(), table, key, mode)


@kernel_op("flashcart::lin_fwd")
def lin_fwd(x: Tensor, w: Tensor, table: Tensor, key: str) -> Tensor:
    return _lin_rows(x, w, table, key, FWD)


@lin_fwd.register_fake
def _(x, w, table, key):
    return x.new_empty(x.shape[0], linear_spec(key).out_width)


@kernel_op("flashcart::lin_bwd_x")
def lin_bwd_x(gy: Tensor, w: Tensor, table: Tensor, key: str) -> Tensor:
    return _lin_rows(gy, w, table, key, BWD_X)


@lin_bwd_x.register_fake
def _(gy, w, table, key):
    return gy.new_empty(gy.shape[0], linear_spec(key).in_width)


@kernel_op("flashcart::lin_bwd_w")
def lin_bwd_w(gy: Tensor, x: Tensor, table: Tensor, key: str) -> Tensor:
    s = linear_spec(key)
    _check_table(table, key, gy)
    gy, x = gy.contiguous(), x.contiguous()
    n = gy.shape[0]
    split = weight_grad_split(key, n, _uses_dot(gy))
    gw = torch.empty(split, s.w_numel, dtype=gy.dtype, device=gy.device)
    if guard_or_false(n == 0):
        return gw.zero_().sum(0)
    _launch_grouped(gy, x, gw, table, key, BWD_W, n, split=split)
    return gw.sum(0)


@lin_bwd_w.register_fake
def _(gy, x, table, key):
    return gy.new_empty(linear_spec(key).w_numel)


def _lin_setup(ctx, inputs, output):
    # every linear-map op takes (operand a, operand b, table, key) and its backward needs a, b and the table
    a, b, table, key = inputs
    ctx.key = key
    ctx.save_for_backward(a, b, table)


def _lin_saved(ctx):
    """``(a, b, table, key, need)``: a linear-map op's saved operands and which of their two
    gradients the engine needs."""
    a, b, table = ctx.saved_tensors
    return a, b, table, ctx.key, _engine_needs(ctx, 2)


def _lin_fwd_backward(ctx, gy):
    # y = x @ W: d x = gy @ W^T (lin_bwd_x), d W = x^T gy (lin_bwd_w)
    x, w, table, key, need = _lin_saved(ctx)
    return (lin_bwd_x(gy, w, table, key) if need[0] else None, lin_bwd_w(gy, x, table, key) if need[1] else None, None, None)


def _lin_bx_backward(ctx, g):
    # <g, gy @ W>: d gy = g @ W^T (lin_fwd), d W = lin_bwd_w(gy, g)
    gy, w, table, key, need = _lin_saved(ctx)
    return (lin_fwd(g, w, table, key) if need[0] else None, lin_bwd_w(gy, g, table, key) if need[1] else None, None, None)


def _lin_bw_backward(ctx, g):
    # <g, gy^T x>: d gy = x @ g^T (lin_fwd(x, g)), d x = gy @ g (lin_bwd_x(gy, g))
    gy, x, table, key, need = _lin_saved(ctx)
    return (lin_fwd(x, g, table, key) if need[0] else None, lin_bwd_x(gy, g, table, key) if need[1] else None, None, None)


lin_fwd.register_autograd(_lin_fwd_backward, setup_context=_lin_setup)
lin_bwd_x.register_autograd(_lin_bx_backward, setup_context=_lin_setup)
lin_bwd_w.register_autograd(_lin_bw_backward, setup_context=_lin_setup)


# ---------------------------------------------------------------------------------------
# a pair of linear maps in one launch
# ---------------------------------------------------------------------------------------
def _lin_pair_rows(r1: Tensor, w1: Tensor, r2: Tensor, w2: Tensor, t1: Tensor, t2: Tensor, k1: str, k2: str, mode: int):
    """Two maps' forwards (``mode`` FWD) or input gradients (BWD_X) on the same rows, one
    grouped-matmul launch: the second map's groups follow the first's (``grouped_matmul``'s
    ``N_FIRST``). Each output's ranks that no path reaches are zero, as :func:`_row_map`'s."""
    _check_table(t1, k1, r1)
    _check_table(t2, k2, r2)
    if r1.shape[0] != r2.shape[0]:
        raise ValueError(f"a pair of linear maps runs on the same rows, got {r1.shape[0]} and {r2.shape[0]}")
    r1, w1, r2, w2 = r1.contiguous(), w1.contiguous(), r2.contiguous(), w2.contiguous()
    n = r1.shape[0]
    y1, y2 = _map_output(k1, mode, (n,), r1), _map_output(k2, mode, (n,), r1)
    _launch_grouped(r1, w1, y1, t1, k1, mode, n, pair=(r2, w2, y2, t2, k2))
    return y1, y2


@kernel_op("flashcart::lin_pair")
def lin_pair(r1: Tensor, w1: Tensor, r2: Tensor, w2: Tensor, t1: Tensor, t2: Tensor, k1: str, k2: str, mode: int) -> tuple[Tensor, Tensor]:
    """``(lin_fwd(r1, w1), lin_fwd(r2, w2))`` (``mode`` FWD) or ``(lin_bwd_x(r1, w1),
    lin_bwd_x(r2, w2))`` (BWD_X) of maps ``k1`` and ``k2`` (launch tables ``t1``, ``t2``) in one
    launch; ``r1`` and ``r2`` have the same rows."""
    return _lin_pair_rows(r1, w1, r2, w2, t1, t2, k1, k2, mode)


@lin_pair.register_fake
def _(r1, w1, r2, w2, t1, t2, k1, k2, mode):
    widths = [linear_spec(k).out_width if mode == FWD else linear_spec(k).in_width for k in (k1, k2)]
    return r1.new_empty(r1.shape[0], widths[0]), r1.new_empty(r1.shape[0], widths[1])


def _pair_setup(ctx, inputs, output):
    r1, w1, r2, w2, t1, t2, k1, k2, mode = inputs
    ctx.keys, ctx.mode = (k1, k2), mode
    ctx.save_for_backward(r1, w1, r2, w2, t1, t2)


def _pair_backward(ctx, g1, g2):
    # FWD, y_i = r_i @ W_i: d r_i = g_i @ W_i^T (the pair's BWD_X), d W_i = lin_bwd_w(g_i, r_i).
    # BWD_X, y_i = r_i @ W_i^T (r_i an output gradient): d r_i = g_i @ W_i (the pair's FWD),
    # d W_i = lin_bwd_w(r_i, g_i). Both differentiable again (the double backward of training).
    r1, w1, r2, w2, t1, t2 = ctx.saved_tensors
    (k1, k2), mode = ctx.keys, ctx.mode
    need = _engine_needs(ctx, 4)
    grads = [None] * 9
    other = BWD_X if mode == FWD else FWD
    if need[0] and need[2]:
        grads[0], grads[2] = lin_pair(g1, w1, g2, w2, t1, t2, k1, k2, other)
    else:  # one input's gradient (a first interaction's skip input needs none for forces): that map alone
        single = lin_bwd_x if other == BWD_X else lin_fwd
        for i, (g, w, t, k) in ((0, (g1, w1, t1, k1)), (2, (g2, w2, t2, k2))):
            if need[i]:
                grads[i] = single(g, w, t, k)
    for i, (r, g, t, k) in ((1, (r1, g1, t1, k1)), (3, (r2, g2, t2, k2))):
        if need[i]:
            grads[i] = lin_bwd_w(g, r, t, k) if mode == FWD else lin_bwd_w(r, g, t, k)
    return tuple(grads)


lin_pair.register_autograd(_pair_backward, setup_context=_pair_setup)


def flat_weights(weights: torch.nn.ParameterList) -> Tensor:
    """The ranks' weight matrices of a linear map as one flat vector (rank after rank), differentiable.

    In eager mode the parameters are read from the list's ``_parameters`` dict and flattened by
    one C++ call (the same views and ``cat``): iterating a ``ParameterList`` goes through
    ``Module.__getattr__`` per item and the views through Python, together about 3x the host
    time, paid by every linear map on every call. Under compilation the plain expression.
    """
    params = parameters_of(weights)
    if torch.compiler.is_compiling():
        return torch.cat([p.reshape(-1) for p in params])
    return torch._C._nn.flatten_dense_tensors(params)


def _linear_matmul_mode() -> str:
    """``FLASHCART_LINEAR_MATMUL``: which linear maps of the Triton path run their ranks as PyTorch
    matrix products (cuBLAS on CUDA; ``EquivariantLinear._forward_torch``) instead of the
    grouped-matmul kernel. ``scalar`` (default): the maps that mix rank 0 only, with at least
    ``MATMUL_MIN_FLOPS`` per row (``linear_flops_per_row``); ``0``: none; ``1``: all."""
    raw = os.environ.get("FLASHCART_LINEAR_MATMUL", "scalar").strip() or "scalar"
    if raw not in ("0", "1", "scalar"):
        raise ValueError(f"environment variable FLASHCART_LINEAR_MATMUL must be 0, 1 or scalar, got {raw!r}")
    return raw


# Read at import; benchmarks and tests assign the module attribute.
LINEAR_MATMUL = _linear_matmul_mode()
# On the H200 (RESULTS.md, 2026-12-03) a rank-0 map of 64 channels in and out (8,192 FLOP per
# row) took 0.012-0.023 ms for forward and input gradient at 1000 rows through cuBLAS against
# 0.039-0.069 ms through the kernel, whose 64 x 64 tiles leave 16 programs; at 20 channels (800
# FLOP per row) the kernel was faster (0.011 against 0.016 ms), and so it was for every map
# mixing higher ranks, whose rank blocks cuBLAS only reads after a copy.
MATMUL_MIN_FLOPS = 8192


def linear_flops_per_row(lin) -> int:
    """Floating-point operations of linear map ``lin``'s forward per row (2 per multiply-add).
    Read from the layer's attributes (no cached spec lookup, which dynamo would warn about)."""
    n_mixed = min(lin.in_l_max, lin.out_l_max) + 1
    return sum(2 * (2 * l + 1) * lin.in_paths[l] * lin.in_features * lin.out_features for l in range(n_mixed))


def linear_as_matmul(lin) -> bool:
    """Whether linear map ``lin`` runs as matrix products (``FLASHCART_LINEAR_MATMUL``)."""
    if LINEAR_MATMUL == "scalar":
        return min(lin.in_l_max, lin.out_l_max) == 0 and linear_flops_per_row(lin) >= MATMUL_MIN_FLOPS
    return LINEAR_MATMUL == "1"


def _linear_weights(lin, like: Tensor, scale: Tensor | None) -> Tensor:
    """Map ``lin``'s flat weights (times ``scale``; kept while its parameters are frozen), or an
    empty tensor like ``like`` for a map without weights."""
    if not len(lin.weights):
        return like.new_zeros(0)
    params = parameters_of(lin.weights)
    sources = params if scale is None else [*params, scale]

    def build():
        w = flat_weights(lin.weights)
        return w if scale is None else w * scale.to(w.dtype)

    return frozen_derived(lin, "flat_weights", sources, build)


def equivariant_linear(lin, x: Tensor, scale: Tensor | None = None) -> Tensor:
    """Triton path of :class:`~flashcart.cartesian.EquivariantLinear`: all ranks in one launch,
    or the PyTorch backend's matrix products for the maps ``linear_as_matmul`` names.
    ``scale`` (a 0-d tensor or ``None``) multiplies the weights (so the output)."""
    if linear_as_matmul(lin):
        return lin._forward_torch(x, scale)
    return lin_fwd(x, _linear_weights(lin, x, scale), lin.launch_table, lin.key)


def _linear_pairs_mode() -> bool:
    """``FLASHCART_LINEAR_PAIRS``: ``1`` runs two linear maps whose outputs are added
    (:func:`~flashcart.cartesian.linear_sum`: an interaction's message map and skip connection,
    a product block's final map and skip connection) as one launch forward and one for their
    input gradients (``flashcart::lin_pair``), the default; ``0`` launches each map alone. The
    reduce-overhead force call is GPU-bound, and its 26 linear-map launches took 0.205 ms on the
    H100 (2026-12-07), about 8 us each for a few microseconds of work: a pair saves one launch
    of each, and i2c3f20l2r's force call 0.032 ms of GPU time (1.250 to 1.218 ms on the H100,
    benchmarks/RESULTS.md, 2026-12-07 evening). Read at import; any other value raises an error
    naming the variable."""
    return _switch_mode("FLASHCART_LINEAR_PAIRS", default=True)


# Read at import; tests and benchmarks assign the module attribute.
LINEAR_PAIRS = _linear_pairs_mode()


def linear_pairable(first, x1: Tensor, second, x2: Tensor) -> bool:
    """Whether maps ``first`` (on ``x1``) and ``second`` (on ``x2``) run as one pair launch:
    :data:`LINEAR_PAIRS` on, both through the grouped kernel with weights, the same rows,
    dtype and device, the same tiles, and unsplit reductions."""
    if not LINEAR_PAIRS or ROW_MAP_SPLIT.programs > 0:
        return False
    if linear_as_matmul(first) or linear_as_matmul(second) or not len(first.weights) or not len(second.weights):
        return False
    if x1.dtype != x2.dtype or x1.device != x2.device or x1.shape[0] != x2.shape[0]:
        return False
    use_dot = _uses_dot(x1)
    return _tiles(first.key, use_dot) == _tiles(second.key, use_dot)


def equivariant_linear_sum(first, x1: Tensor, second, x2: Tensor, scale: Tensor | None = None) -> Tensor:
    """Triton path of :func:`~flashcart.cartesian.linear_sum`: ``first(x1, scale) + second(x2)``,
    the two maps in one launch where :func:`linear_pairable`, else each alone."""
    if not linear_pairable(first, x1, second, x2):
        return equivariant_linear(first, x1, scale) + equivariant_linear(second, x2)
    w1, w2 = _linear_weights(first, x1, scale), _linear_weights(second, x2, None)
    y1, y2 = lin_pair(x1, w1, x2, w2, first.launch_table, second.launch_table, first.key, second.key, FWD)
    return y1 + y2


# ---------------------------------------------------------------------------------------
# eager fast path
# ---------------------------------------------------------------------------------------
# A custom op call in eager mode goes through the dispatcher and the op's Python autograd
# wrapper, which costs tens of microseconds: in a launch-bound evaluation that is a large
# part of the wall time. Outside compilation and tracing, the same implementations and the
# same derivative formulas run through plain autograd Functions instead; under
# torch.compile (or any dispatch mode: fake tensors, functionalisation) the ops are used:
# they are ``torch.library.triton_op``s, which graphs first record as ops (with their fake
# implementations) and inductor then lowers to the Triton kernels they launch (their
# launches go through ``signatures.traceable``), so compiled code and AOTInductor packages
# contain the kernels themselves and need no Python to run them.


def _eager_function(name: str, impl, setup, backward):
    def setup_context(ctx, inputs, output):
        # Single-output formulas expect a tensor (zeros when unused, as custom ops pass);
        # tp_bwd's formula skips missing cotangents of its three outputs.
        ctx.set_materialize_grads(name != "tp_bwd")
        setup(ctx, inputs, output)

    def forward(*args):
        if torch.autograd.profiler._is_profiler_enabled:
            with torch.profiler.record_function(f"flashcart::{name}"):
                return impl(*args)
        return impl(*args)

    return type(
        f"flashcart_{name}",
        (torch.autograd.Function,),
        {
            "forward": staticmethod(forward),
            "setup_context": staticmethod(setup_context),
            "backward": staticmethod(backward),
        },
    )


def _eager_ok(first: Tensor) -> bool:
    return (
        type(first) is torch.Tensor
        and not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
        and not torch._C._are_functorch_transforms_active()
    )


# ``Function.apply`` binds its arguments to ``forward``'s signature with ``inspect`` on every
# call (for default arguments, which these forwards do not have): tens of microseconds per
# launch in eager mode. Outside functorch transforms (``_eager_ok``) it then calls this C
# entry point, which the dispatchers call directly.
_C_APPLY = torch._C._FunctionBase.__dict__.get("apply")


def _dispatching(name: str, op, setup, backward):
    """Dispatcher for custom op ``op``: its autograd Function in eager mode, the op otherwise."""
    fn = _eager_function(name, op._init_fn, setup, backward)
    apply = fn.apply if _C_APPLY is None else _C_APPLY.__get__(None, fn)
    forward = fn.forward

    def call(*args):
        if _eager_ok(args[0]):
            # with grad mode off (the backward pass of a force call, energy-only calls) there is no
            # graph to record: the implementation runs without the Function's bookkeeping
            return apply(*args) if torch.is_grad_enabled() else forward(*args)
        return op(*args)

    call.op = op
    call.__name__ = name
    return call


# The module-level names, used by the entry points and by every derivative formula above
# (looked up when those run), become dispatchers; ``name.op`` is the custom op.
tp_fwd = _dispatching("tp_fwd", tp_fwd, _tp_setup, _tp_backward)
weight_rows_sum = _dispatching("weight_rows_sum", weight_rows_sum, _rows_sum_setup, _rows_sum_backward)
tp_bwd = _dispatching("tp_bwd", tp_bwd, _tp_bwd_setup, _tp_bwd_backward)
tp_fwd_tabulated = _dispatching("tp_fwd_tabulated", tp_fwd_tabulated, _tab_setup, _tab_backward)
tp_bwd_tabulated = _dispatching("tp_bwd_tabulated", tp_bwd_tabulated, _tab_bwd_setup, _tab_bwd_backward)


def tp_dbwd(*args):
    """The fused double backward: its implementation directly in eager mode (it is only called
    where nothing records autograd), the custom op under compilation or dispatch modes."""
    if _eager_ok(args[0]):
        return _tp_dbwd_op._init_fn(*args)
    return _tp_dbwd_op(*args)


tp_dbwd.op = _tp_dbwd_op
lin_fwd = _dispatching("lin_fwd", lin_fwd, _lin_setup, _lin_fwd_backward)
lin_bwd_x = _dispatching("lin_bwd_x", lin_bwd_x, _lin_setup, _lin_bx_backward)
lin_bwd_w = _dispatching("lin_bwd_w", lin_bwd_w, _lin_setup, _lin_bw_backward)
lin_pair = _dispatching("lin_pair", lin_pair, _pair_setup, _pair_backward)
expansion_fwd = _dispatching("expansion_fwd", expansion_fwd, _exp_setup, _exp_backward)
expansion_vjp = _dispatching("expansion_vjp", expansion_vjp, _vjp_setup, _vjp_backward)
