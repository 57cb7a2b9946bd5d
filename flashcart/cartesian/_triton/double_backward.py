"""Fused double backward of the Triton tensor product: the ``flashcart::tp_dbwd`` custom op.

Given the backward ``(g1, g2, gw) = tp_bwd(go, x1, x2, w)`` and cotangents ``gg1, gg2, ggw``
of its outputs (any of them absent), ``tp_dbwd`` returns the derivatives of
``<gg1, g1> + <gg2, g2> + <ggw, gw>`` with respect to ``go, x1, x2, w`` in one launch of the
generated kernels of ``codegen_double`` (two in convolution mode with the sender pass: see
:data:`X1_ATOMIC`), instead of up to ten ``tp_fwd``/``tp_bwd`` launches with substituted operands.

The op itself has no derivative: ``ops._tp_bwd_backward`` calls it only when the double
backward is not recorded for a further derivative (grad mode off, or nothing requires
grad); otherwise, and with ``FLASHCART_FUSED_DOUBLE_BACKWARD=0``, it composes the
differentiable ``tp_fwd``/``tp_bwd`` ops.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import guard_or_false

from . import common as _common
from .common import DT, block_f, cdiv, kernel_op, sum_splits, tp_shapes, walk_splits
from .signatures import TP_DBWD_ROW, TP_DBWD_X1_CSR
from .source import double_backward_module
from .weight_rows import rows_in_kernel, weight_grad_shape

__all__ = ["tp_dbwd", "fused_outputs", "env_mode", "x1_by_atomics", "SPLIT_ROW_PASS", "ROW_GROUPS", "X1_ATOMIC"]

_ENV = "FLASHCART_FUSED_DOUBLE_BACKWARD"
# value -> (fused, SPLIT_ROW_PASS, ROW_GROUPS, X1_ATOMIC)
ENV_MODES = {
    "1": (True, False, False, True),
    "0": (False, False, False, False),
    "sender": (True, False, False, False),
    "split": (True, True, False, False),
    "grouped": (True, False, True, False),
}


def env_mode() -> tuple[bool, bool, bool, bool]:
    """``FLASHCART_FUSED_DOUBLE_BACKWARD``: ``1`` (default) fused in one launch, ``0`` composed,
    ``sender``, ``split`` or ``grouped`` fused with that layout (each with the sender pass for
    d x1); anything else is an error naming it."""
    raw = os.environ.get(_ENV, "").strip() or "1"
    if raw not in ENV_MODES:
        raise ValueError(f"environment variable {_ENV} must be one of {', '.join(ENV_MODES)}, got {raw!r}")
    return ENV_MODES[raw]


# Receiver-pass layout in convolution mode (read at import, module attributes for benchmarks):
# SPLIT_ROW_PASS: False evaluates d go, d x2 and d w in one receiver pass (each edge operand
# read once, more registers per thread); True runs d go in a pass of its own.
# ROW_GROUPS: True splits the receiver pass's paths by output rank over a grid axis (one
# program per receiver, channel block and output rank): fewer registers per program (no
# spills where the merged pass spills), the small edge and node operands read once per rank,
# each weight column still once. benchmarks/kernels.py compares them on the GPU.
# X1_ATOMIC (default): the receiver pass also adds each edge's d x1 term into its sender's row
# by atomic adds (the weights, their cotangent and the edge operands read once instead of
# twice; no sender pass: H100, 2026-12-07, -18 % at 64 channels, the training step -3.7 %).
# The float sums then depend on the order the adds land in, so with
# torch.use_deterministic_algorithms(True), and with ``sender``, the sender pass
# (tp_dbwd_x1_csr, one program per sender, no atomics) runs instead.
_, SPLIT_ROW_PASS, ROW_GROUPS, X1_ATOMIC = env_mode()


def x1_by_atomics(conv: bool, need_x1: bool) -> bool:
    """Whether this launch adds convolution-mode ``d x1`` in the receiver pass (:data:`X1_ATOMIC`,
    one-pass layout, deterministic algorithms off) instead of running ``tp_dbwd_x1_csr``."""
    one_pass = not (SPLIT_ROW_PASS or ROW_GROUPS)
    return X1_ATOMIC and one_pass and conv and need_x1 and not torch.are_deterministic_algorithms_enabled()


def fused_outputs(has_gg1: bool, has_gg2: bool, has_ggw: bool, need: tuple[bool, bool, bool, bool]) -> tuple[bool, bool, bool, bool]:
    """Which of ``(d go, d x1, d x2, d w)`` are computed: needed and with at least one term.

    ``d go`` has a term per cotangent; ``d x1`` needs ``gg2`` or ``ggw``; ``d x2`` needs
    ``gg1`` or ``ggw``; ``d w`` needs ``gg1`` or ``gg2``. The others are zero (``None``).
    """
    n_go, n_x1, n_x2, n_w = need
    return (
        n_go and (has_gg1 or has_gg2 or has_ggw),
        n_x1 and (has_gg2 or has_ggw),
        n_x2 and (has_gg1 or has_ggw),
        n_w and (has_gg1 or has_gg2),
    )


def _check_like(t: Optional[Tensor], shape, what: str) -> None:
    if t is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"tp_dbwd: {what} has shape {tuple(t.shape)}, expected {tuple(shape)} (the shape of its operand)")


@kernel_op("flashcart::tp_dbwd")
def tp_dbwd(
    go: Tensor,
    x1: Tensor,
    x2: Tensor,
    w: Tensor,
    gg1: Optional[Tensor],
    gg2: Optional[Tensor],
    ggw: Optional[Tensor],
    receivers: Optional[Tensor],
    senders: Optional[Tensor],
    rowptr: Optional[Tensor],
    perm: Optional[Tensor],
    srowptr: Optional[Tensor],
    widx: Optional[Tensor],
    wrows: Optional[Tensor],
    key: str,
    need_go: bool,
    need_x1: bool,
    need_x2: bool,
    need_w: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(d go, d x1, d x2, d w)``, each shaped like its operand, or empty where
    :func:`fused_outputs` says it is not computed.

    Shapes: ``go [rows_out, n_out_blocks * F]`` (rows_out: nodes in convolution mode, rows in
    dense mode), ``x1 [nodes or rows, (l1+1)^2 * F1]``, ``x2 [edges or rows, (l2+1)^2 * F2]``,
    ``w [edges or rows, n_paths * F]`` or shared ``[n_paths * F]``; ``gg1/gg2/ggw`` like
    ``x1/x2/w``. Graph tensors as in ``tp_fwd`` (all ``None`` in dense mode). With ``widx``
    (edge ``e`` reads weight row ``widx[e]`` of ``w [R, n_paths * F]``) ``ggw`` and ``d w`` are laid
    out like the weight gradient ``tp_bwd`` returns: per row, shaped like ``w``, with
    ``weight_rows.IN_KERNEL`` (``d w`` sums the edges ``wrows`` lists; an edge its row does not list
    reads a zero cotangent), else per edge, ``[edges, n_paths * F]`` (the caller sums ``d w`` into
    rows; ``wrows`` is not read).
    """
    spec, f1, f2, F = tp_shapes(key, x1, x2)
    _check_like(gg1, x1.shape, "gg1")
    _check_like(gg2, x2.shape, "gg2")
    in_rows = rows_in_kernel(widx)
    _check_like(ggw, weight_grad_shape(w, x2, widx), "ggw")
    has1, has2, hasw = gg1 is not None, gg2 is not None, ggw is not None
    c_go, c_x1, c_x2, c_w = fused_outputs(has1, has2, hasw, (need_go, need_x1, need_x2, need_w))
    conv = receivers is not None
    go, x1, x2, w = go.contiguous(), x1.contiguous(), x2.contiguous(), w.contiguous()
    gg1 = gg1.contiguous() if has1 else None
    gg2 = gg2.contiguous() if has2 else None
    ggw = ggw.contiguous() if hasw else None
    dev, dt = x2.device, x2.dtype
    shared = w.dim() == 1
    block, warps = block_f(F)
    n_blocks = cdiv(F, block) if F else 0
    red1, red2 = f1 == 1 and F > 1, f2 == 1 and F > 1
    programs = x1.shape[0] if conv else x2.shape[0]
    splits = walk_splits(conv, spec.n_paths, double_backward=True)  # programs per node: per-node results are partial sums per split
    c1, c2 = spec.in1_comps, spec.in2_comps
    # an absent output is an empty tensor of its own (custom-op outputs must not alias each other)
    d_go = go.new_empty(splits * go.shape[0], go.shape[1]) if c_go else x2.new_empty(0)
    x1_atomic = x1_by_atomics(conv, c_x1)
    # with atomics every edge's term is added into its sender's row of one zeroed block; else
    # the sender pass writes a partial sum per walk split
    x1_alloc, x1_rows = (torch.zeros, x1.shape[0]) if x1_atomic else (torch.empty, splits * x1.shape[0])
    d_x1 = x1_alloc(x1_rows, c1 * (n_blocks if red1 else F), dtype=dt, device=dev) if c_x1 else x2.new_empty(0)
    module = double_backward_module(key)
    groups = module.N_ROW_GROUPS if ROW_GROUPS and conv else 1
    d_x2 = torch.empty(x2.shape[0], groups * c2 * (n_blocks if red2 else F), dtype=dt, device=dev) if c_x2 else x2.new_empty(0)
    if not c_w:
        d_w = x2.new_empty(0)
    elif in_rows:  # each listed edge's term is added into its row
        d_w = torch.zeros(w.shape, dtype=dt, device=dev)
    else:
        d_w = torch.empty(splits * programs if shared else x2.shape[0], spec.n_paths * F, dtype=dt, device=dev)
    unused = go  # any tensor: pointer arguments the kernel does not read (flag off)
    row_x1 = c_x1 and (not conv or x1_atomic)
    if not guard_or_false(programs == 0) and F and (c_go or c_x2 or c_w or row_x1):
        # one pass for all row results, or (SPLIT_ROW_PASS, convolution) d go in a pass of its
        # own: fewer registers per pass, the edge operands read twice
        split = SPLIT_ROW_PASS and conv and c_go and (c_x2 or c_w)
        passes = [(True, False, False), (False, c_x2, c_w)] if split else [(c_go, c_x2, c_w)]
        for n_go, n_x2, n_w in passes:
            TP_DBWD_ROW.launch(
                module,
                (splits * programs, n_blocks, groups),
                num_warps=warps,
                go_ptr=go,
                x1_ptr=x1,
                x2_ptr=x2,
                w_ptr=w,
                widx_ptr=widx if widx is not None else unused,
                wrows_ptr=wrows if in_rows else unused,
                gg1_ptr=gg1 if has1 else unused,
                gg2_ptr=gg2 if has2 else unused,
                ggw_ptr=ggw if hasw else unused,
                dgo_ptr=d_go if n_go else unused,
                dx1_ptr=d_x1 if row_x1 else unused,
                dx2_ptr=d_x2 if n_x2 else unused,
                dw_ptr=d_w if n_w else unused,
                rowptr_ptr=rowptr if conv else unused,
                send_ptr=senders if conv else unused,
                go_row=go.shape[1],
                x1_row=x1.shape[1],
                x2_row=x2.shape[1],
                w_row=0 if shared else w.shape[1],
                dx1_row=d_x1.shape[-1] if row_x1 else 0,
                dx2_row=d_x2.shape[-1] if n_x2 else 0,
                dw_row=d_w.shape[-1] if n_w else 0,
                F1S=int(f1 != 1),
                F2S=int(f2 != 1),
                F1C=f1,
                F2C=f2,
                F=F,
                CONV=conv,
                HAS_GG1=has1,
                HAS_GG2=has2,
                HAS_GGW=hasw,
                NEED_GO=n_go,
                NEED_X1=row_x1,
                NEED_X2=n_x2,
                NEED_W=n_w,
                RED_X1=red1,
                RED_X2=red2,
                SHARED_W=shared,
                W_INDEX=widx is not None,
                W_ROWS=in_rows,
                ROW_GROUPS=groups > 1,
                X1_ATOMIC=x1_atomic,
                PREFETCH=_common.index_prefetch("tp_dbwd_row", block),
                SPLITS=splits,
                BLOCK_F=block,
                DT=DT[dt],
            )
    elif F == 0 or guard_or_false(programs == 0):
        for t, c in ((d_go, c_go), (d_x1, row_x1), (d_x2, c_x2), (d_w, c_w and not in_rows)):
            if c:
                t.zero_()
    if c_x1 and conv and not x1_atomic:
        if not guard_or_false(x1.shape[0] == 0) and F:
            TP_DBWD_X1_CSR.launch(
                module,
                (splits * x1.shape[0], n_blocks),
                num_warps=warps,
                go_ptr=go,
                x2_ptr=x2,
                w_ptr=w,
                widx_ptr=widx if widx is not None else unused,
                wrows_ptr=wrows if in_rows else unused,
                gg2_ptr=gg2 if has2 else unused,
                ggw_ptr=ggw if hasw else unused,
                dx1_ptr=d_x1,
                srowptr_ptr=srowptr,
                perm_ptr=perm,
                recv_ptr=receivers,
                go_row=go.shape[1],
                x2_row=x2.shape[1],
                w_row=0 if shared else w.shape[1],
                dx1_row=d_x1.shape[1],
                F2S=int(f2 != 1),
                F2C=f2,
                F=F,
                HAS_GG2=has2,
                HAS_GGW=hasw,
                RED_X1=red1,
                W_INDEX=widx is not None,
                W_ROWS=in_rows,
                PREFETCH=_common.index_prefetch("tp_dbwd_x1_csr", block),
                SPLITS=splits,
                BLOCK_F=block,
                DT=DT[dt],
            )
        else:
            d_x1.zero_()
    d_go = sum_splits(d_go, splits) if c_go else d_go
    d_x1 = sum_splits(d_x1, splits) if c_x1 and conv and not x1_atomic else d_x1
    # broadcast inputs: per-channel-block partial sums -> one channel
    if c_x1 and red1 and n_blocks > 1:
        d_x1 = d_x1.view(x1.shape[0], n_blocks, c1).sum(1)
    if c_x2 and red2 and groups * n_blocks > 1:
        d_x2 = d_x2.view(x2.shape[0], groups * n_blocks, c2).sum(1)
    elif c_x2 and groups > 1:
        d_x2 = d_x2.view(x2.shape[0], groups, c2 * F).sum(1)
    if c_w and shared:
        d_w = d_w.sum(0)
    return d_go, d_x1, d_x2, d_w


@tp_dbwd.register_fake
def _(go, x1, x2, w, gg1, gg2, ggw, receivers, senders, rowptr, perm, srowptr, widx, wrows, key, need_go, need_x1, need_x2, need_w):
    flags = fused_outputs(gg1 is not None, gg2 is not None, ggw is not None, (need_go, need_x1, need_x2, need_w))
    shapes = (go.shape, x1.shape, x2.shape, weight_grad_shape(w, x2, widx))
    return tuple(t.new_empty(s) if c else t.new_empty(0) for t, s, c in zip((go, x1, x2, w), shapes, flags))
