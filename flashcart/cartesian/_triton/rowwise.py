"""Row-wise kernels of the RMS norm and the gate on rank blocks.

Features are in the standard layout: rank ``l``'s block ``(2l+1, F)`` at column ``l^2 F``,
``W = (l_max+1)^2 F`` columns. Both blocks multiply them by a value per (rank, channel) broadcast
over the rank's components:

* :func:`rms_norm`: ``y = x * s * g_lf``.
  - ``s = (|mean_lf I_lf| + eps)^-1/2`` per row.
  - The invariants ``I_lf = x_lf^T G_l x_lf`` are the symmetric ``(l, l) -> 0`` products of the
    features with themselves: a quadratic form per rank (``G_l``, ``(2l+1) x (2l+1)``, the same
    for every channel), evaluated in the kernel.
  - Optional gains ``g: [(l_max+1) F]``.
* :func:`gated`: ``y = v * act(z)_lf``, with the gate pre-activations ``z: [n, (l_max+1) F]``
  (``sigmoid``, ``silu`` or ``tanh``).

**Why.** As a product and ATen expressions, the norm is a tensor-product launch each way, then a
chain of small operations: ``mean``, ``abs``, ``add``, ``rsqrt`` and two multiplications, with
six backward nodes. The gate is its activation, an ``index_select`` and a multiplication. Each
operation is a launch and an autograd node, and an eager force call on the GPU is bound by that
host work (benchmarks/RESULTS.md). Here each is one kernel per row forward and one backward.

**Where.** Eager calls only (:func:`use_fused`): compiled calls keep the product and the ATen
expressions, which inductor fuses itself. A backward that must itself be differentiable
(``create_graph``, training on forces), or one that needs the gains' gradient, evaluates the
derivative of the ATen expression instead (:func:`rms_norm_reference`,
:func:`_gate_backward_formula`).

One program per row; the rank loop is unrolled (``L_MAX`` and ``F`` are constexprs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import _frozen
from .._quadratic_invariants import quadratic_invariants as invariants
from .common import kernel_constants, next_pow2
from .signatures import launch_kernel

__all__ = ["ENABLED", "ACTIVATIONS", "use_fused", "rms_norm", "rms_norm_reference", "invariants", "gated"]

# Benchmarks (benchmarks/eager_overhead.py) and tests assign it to compare with the ATen expressions.
ENABLED = True

ACTIVATIONS = {"sigmoid": 0, "silu": 1, "tanh": 2}


def use_fused(x: Tensor) -> bool:
    """Whether a block on ``x`` (on the Triton path) takes the fused kernels: plain eager calls
    (not compiled, traced, under dispatch modes or functorch transforms)."""
    return ENABLED and type(x) is torch.Tensor and _frozen._plain_eager()


def _warps(width: int) -> int:
    return 1 if width <= 512 else 4


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _act(z, ACT: tl.constexpr):
    if ACT == 0:
        return tl.sigmoid(z)
    elif ACT == 1:
        return z * tl.sigmoid(z)
    else:
        return 2.0 * tl.sigmoid(2.0 * z) - 1.0


@triton.jit
def _act_and_slope(z, ACT: tl.constexpr):
    """``act(z)`` and ``act'(z)``."""
    sig = tl.sigmoid(z) if ACT != 2 else tl.sigmoid(2.0 * z)
    if ACT == 0:
        return sig, sig * (1.0 - sig)
    elif ACT == 1:
        return z * sig, sig * (1.0 + z * (1.0 - sig))
    else:
        t = 2.0 * sig - 1.0
        return t, 1.0 - t * t


@triton.jit
def _rank_block(l: tl.constexpr, F: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr):
    """Rank ``l``'s block of a row: its columns ``l^2 F + m F + f`` as a ``[BLOCK_M, BLOCK_F]`` tile
    (component ``m``, channel ``f``) and the tile's mask."""
    m = tl.arange(0, BLOCK_M)[:, None]
    f = tl.arange(0, BLOCK_F)[None, :]
    return l * l * F + m * F + f, (m < 2 * l + 1) & (f < F)


@triton.jit
def _times_gains(t, g_ptr, l: tl.constexpr, F: tl.constexpr, BLOCK_F: tl.constexpr, GAINS: tl.constexpr):
    """``t`` (rank ``l``'s tile) times the rank's gains per channel, with ``GAINS``."""
    if GAINS:
        f = tl.arange(0, BLOCK_F)[None, :]
        t = t * tl.load(g_ptr + l * F + f, mask=f < F, other=0.0)
    return t


@triton.jit
def _form_times(q_ptr, x, l: tl.constexpr, BLOCK_M: tl.constexpr):
    """``G_l x``: rank ``l``'s invariant form (``q_ptr``: the ranks' ``(2l+1)^2`` forms, rank after
    rank, row-major) times its components ``x: [BLOCK_M, BLOCK_F]`` (padding rows zero), per channel."""
    D: tl.constexpr = 2 * l + 1
    OFF: tl.constexpr = l * (2 * l - 1) * (2 * l + 1) // 3  # sum of (2k+1)^2 over k < l
    i = tl.arange(0, BLOCK_M)[:, None]
    j = tl.arange(0, BLOCK_M)[None, :]
    form = tl.load(q_ptr + OFF + i * D + j, mask=(i < D) & (j < D), other=0.0)
    return tl.sum(form[:, :, None] * x[None, :, :], 1)


@triton.jit
def rms_norm_fwd(
    x_ptr,
    q_ptr,
    g_ptr,
    y_ptr,
    stats_ptr,
    eps_ptr,
    L_MAX: tl.constexpr,
    F: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
    GAINS: tl.constexpr,
):
    """Row ``r``: the invariants ``I_lf = x_lf^T G_l x_lf``, their mean over (rank, channel),
    ``s = (|mean| + eps)^-1/2``; ``y[r] = x[r] * s * g``; ``stats[r] = (s, mean)``."""
    row = tl.program_id(0).to(tl.int64)
    W: tl.constexpr = (L_MAX + 1) * (L_MAX + 1) * F
    total = tl.sum(tl.zeros([BLOCK_F], dtype=x_ptr.dtype.element_ty), 0)
    for l in tl.static_range(L_MAX + 1):
        cols, mask = _rank_block(l, F, BLOCK_M, BLOCK_F)
        x = tl.load(x_ptr + row * W + cols, mask=mask, other=0.0)
        total += tl.sum(tl.sum(x * _form_times(q_ptr, x, l, BLOCK_M), 1), 0)
    mean = total / ((L_MAX + 1) * F)
    s = 1.0 / tl.sqrt(tl.abs(mean) + tl.load(eps_ptr))
    tl.store(stats_ptr + 2 * row, s)
    tl.store(stats_ptr + 2 * row + 1, mean)
    for l in tl.static_range(L_MAX + 1):
        cols, mask = _rank_block(l, F, BLOCK_M, BLOCK_F)
        y = _times_gains(tl.load(x_ptr + row * W + cols, mask=mask, other=0.0) * s, g_ptr, l, F, BLOCK_F, GAINS)
        tl.store(y_ptr + row * W + cols, y, mask=mask)


@triton.jit
def rms_norm_bwd(
    gy_ptr,
    x_ptr,
    q_ptr,
    g_ptr,
    stats_ptr,
    gx_ptr,
    L_MAX: tl.constexpr,
    F: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
    GAINS: tl.constexpr,
):
    """Row ``r``: ``gx = t s + 2 c G_l x`` with ``t = gy g``, ``c = <t, x> ds/dmean / K`` and
    ``ds/dmean = -s^3 sign(mean) / 2`` (the invariants' forms are symmetric)."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.load(stats_ptr + 2 * row)
    mean = tl.load(stats_ptr + 2 * row + 1)
    W: tl.constexpr = (L_MAX + 1) * (L_MAX + 1) * F
    dot = 0.0 * s
    for l in tl.static_range(L_MAX + 1):
        cols, mask = _rank_block(l, F, BLOCK_M, BLOCK_F)
        t = _times_gains(tl.load(gy_ptr + row * W + cols, mask=mask, other=0.0), g_ptr, l, F, BLOCK_F, GAINS)
        dot += tl.sum(tl.sum(t * tl.load(x_ptr + row * W + cols, mask=mask, other=0.0), 1), 0)
    sign = tl.where(mean > 0, 1.0, tl.where(mean < 0, -1.0, 0.0))
    c = 2.0 * (dot * (-0.5 * s * s * s) * sign) / ((L_MAX + 1) * F)
    for l in tl.static_range(L_MAX + 1):
        cols, mask = _rank_block(l, F, BLOCK_M, BLOCK_F)
        t = _times_gains(tl.load(gy_ptr + row * W + cols, mask=mask, other=0.0), g_ptr, l, F, BLOCK_F, GAINS)
        x = tl.load(x_ptr + row * W + cols, mask=mask, other=0.0)
        tl.store(gx_ptr + row * W + cols, t * s + c * _form_times(q_ptr, x, l, BLOCK_M), mask=mask)


@triton.jit
def gate_fwd(
    v_ptr,
    z_ptr,
    y_ptr,
    L_MAX: tl.constexpr,
    F: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
    ACT: tl.constexpr,
):
    """Row ``r``: ``y[r] = v[r] * act(z[r])`` with rank ``l``'s channel ``f`` gated by ``z[r, l F + f]``."""
    row = tl.program_id(0).to(tl.int64)
    W: tl.constexpr = (L_MAX + 1) * (L_MAX + 1) * F
    G: tl.constexpr = (L_MAX + 1) * F
    f = tl.arange(0, BLOCK_F)[None, :]
    for l in tl.static_range(L_MAX + 1):
        a = _act(tl.load(z_ptr + row * G + l * F + f, mask=f < F, other=0.0), ACT)
        cols, mask = _rank_block(l, F, BLOCK_M, BLOCK_F)
        tl.store(y_ptr + row * W + cols, tl.load(v_ptr + row * W + cols, mask=mask, other=0.0) * a, mask=mask)


@triton.jit
def gate_bwd(
    gy_ptr,
    v_ptr,
    z_ptr,
    gv_ptr,
    gz_ptr,
    L_MAX: tl.constexpr,
    F: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
    ACT: tl.constexpr,
):
    """Row ``r``: ``gv = gy * act(z)``, ``gz[l F + f] = act'(z) * sum_m gy v`` over rank ``l``'s components."""
    row = tl.program_id(0).to(tl.int64)
    W: tl.constexpr = (L_MAX + 1) * (L_MAX + 1) * F
    G: tl.constexpr = (L_MAX + 1) * F
    f1 = tl.arange(0, BLOCK_F)
    f = f1[None, :]
    for l in tl.static_range(L_MAX + 1):
        a, slope = _act_and_slope(tl.load(z_ptr + row * G + l * F + f, mask=f < F, other=0.0), ACT)
        cols, mask = _rank_block(l, F, BLOCK_M, BLOCK_F)
        gy = tl.load(gy_ptr + row * W + cols, mask=mask, other=0.0)
        tl.store(gv_ptr + row * W + cols, gy * a, mask=mask)
        gz = tl.sum(gy * tl.load(v_ptr + row * W + cols, mask=mask, other=0.0), 0) * tl.sum(slope, 0)
        tl.store(gz_ptr + row * G + l * F + f1, gz, mask=f1 < F)


# ---------------------------------------------------------------------------------------------
# launches
# ---------------------------------------------------------------------------------------------


def _layout(l_max: int, F: int) -> dict:
    return dict(L_MAX=l_max, F=F, BLOCK_M=next_pow2(2 * l_max + 1), BLOCK_F=next_pow2(F))


def _rms_forward(x: Tensor, forms: Tensor, gains: Tensor | None, eps: float, l_max: int, F: int) -> tuple[Tensor, Tensor]:
    n = x.shape[0]
    y = torch.empty_like(x)
    stats = torch.empty(n, 2, dtype=x.dtype, device=x.device)
    if n:
        values = dict(
            x_ptr=x, q_ptr=forms, g_ptr=gains if gains is not None else x, y_ptr=y, stats_ptr=stats, eps_ptr=kernel_constants((eps,), x)
        )
        values.update(GAINS=gains is not None, **_layout(l_max, F))
        launch_kernel(rms_norm_fwd, x, (n,), values, {"num_warps": _warps(x.shape[1])})
    return y, stats


def _rms_backward(gy, x, forms, gains, stats, l_max: int, F: int) -> Tensor:
    gx = torch.empty_like(x)
    if x.shape[0]:
        values = dict(gy_ptr=gy, x_ptr=x, q_ptr=forms, g_ptr=gains if gains is not None else x, stats_ptr=stats, gx_ptr=gx)
        values.update(GAINS=gains is not None, **_layout(l_max, F))
        launch_kernel(rms_norm_bwd, x, (x.shape[0],), values, {"num_warps": _warps(x.shape[1])})
    return gx


def _column_index(l_max: int, F: int, device) -> Tensor:
    """``[W]``: column -> ``l F + f`` (the (rank, channel) it belongs to)."""
    return torch.cat([l * F + torch.arange(F, device=device).repeat(2 * l + 1) for l in range(l_max + 1)])


def rms_norm_reference(x: Tensor, forms: Tensor, gains: Tensor | None, eps: float, l_max: int, F: int) -> Tensor:
    """What :func:`rms_norm` computes, as ATen operations (differentiable to any order)."""
    y = x * torch.rsqrt(invariants(x, forms, l_max, F).mean(dim=1, keepdim=True).abs() + eps)
    return y if gains is None else y * gains.index_select(0, _column_index(l_max, F, x.device))


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, forms, gains, eps, l_max, F):
        x, forms = x.contiguous(), forms.contiguous()
        gains = gains.contiguous() if gains is not None else None
        y, stats = _rms_forward(x, forms, gains, eps, l_max, F)
        ctx.save_for_backward(x, forms, gains, stats)
        ctx.eps, ctx.l_max, ctx.F = eps, l_max, F
        return y

    @staticmethod
    def backward(ctx, gy):
        x, forms, gains, stats = ctx.saved_tensors
        if not torch.is_grad_enabled() and not (ctx.needs_input_grad[2] and gains is not None):
            return _rms_backward(gy.contiguous(), x, forms, gains, stats, ctx.l_max, ctx.F), None, None, None, None, None
        # a differentiable backward (create_graph) or the gains' gradient: the ATen derivative
        create = torch.is_grad_enabled()
        inputs = [x] + ([gains] if gains is not None else [])
        with torch.enable_grad():
            leaves = [t if t.requires_grad else t.detach().requires_grad_(True) for t in inputs]
            y = rms_norm_reference(leaves[0], forms, leaves[1] if gains is not None else None, ctx.eps, ctx.l_max, ctx.F)
            grads = torch.autograd.grad(y, leaves, gy, create_graph=create)
        g_x = grads[0] if ctx.needs_input_grad[0] else None
        g_gains = grads[1] if gains is not None and ctx.needs_input_grad[2] else None
        return g_x, None, g_gains, None, None, None


def rms_norm(x: Tensor, forms: Tensor, gains: Tensor | None, eps: float, l_max: int, F: int) -> Tensor:
    """``x * (|mean_lf I_lf| + eps)^-1/2 * gains`` with ``I_lf = x_lf^T G_l x_lf`` (:func:`invariants`;
    ``forms``: the ``G_l``, rank after rank) and gains per (rank, channel) ``[(l_max+1) F]`` broadcast
    over components (``None``: none). ``x: [n, (l_max+1)^2 F]``."""
    return _RMSNorm.apply(x, forms, gains, eps, l_max, F)


def _gate_forward(v: Tensor, z: Tensor, act: int, l_max: int, F: int) -> Tensor:
    y = torch.empty_like(v)
    if v.shape[0]:
        values = dict(v_ptr=v, z_ptr=z, y_ptr=y, ACT=act, **_layout(l_max, F))
        launch_kernel(gate_fwd, v, (v.shape[0],), values, {"num_warps": _warps(v.shape[1])})
    return y


def _gate_backward(gy: Tensor, v: Tensor, z: Tensor, act: int, l_max: int, F: int) -> tuple[Tensor, Tensor]:
    gv, gz = torch.empty_like(v), torch.empty_like(z)
    if v.shape[0]:
        values = dict(gy_ptr=gy, v_ptr=v, z_ptr=z, gv_ptr=gv, gz_ptr=gz, ACT=act, **_layout(l_max, F))
        launch_kernel(gate_bwd, v, (v.shape[0],), values, {"num_warps": _warps(v.shape[1])})
    return gv, gz


def _torch_act_and_slope(z: Tensor, act: int) -> tuple[Tensor, Tensor]:
    """``act(z)`` and ``act'(z)`` as ATen operations (differentiable)."""
    if act == 2:
        t = torch.tanh(z)
        return t, 1 - t * t
    sig = torch.sigmoid(z)
    if act == 0:
        return sig, sig * (1 - sig)
    return z * sig, sig * (1 + z * (1 - sig))


def _gate_backward_formula(gy, v, z, act: int, l_max: int, F: int, needs: tuple[bool, bool]):
    """The gate's derivative as ATen operations (differentiable: double backward)."""
    index = _column_index(l_max, F, gy.device)
    a, slope = _torch_act_and_slope(z, act)
    g_v = gy * a.index_select(1, index) if needs[0] else None
    g_z = torch.zeros_like(z).index_add(1, index, gy * v) * slope if needs[1] else None
    return g_v, g_z


class _Gated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v, z, act, l_max, F):
        v, z = v.contiguous(), z.contiguous()
        ctx.save_for_backward(v, z)
        ctx.act, ctx.l_max, ctx.F = act, l_max, F
        return _gate_forward(v, z, act, l_max, F)

    @staticmethod
    def backward(ctx, gy):
        v, z = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[:2])
        if torch.is_grad_enabled():
            g_v, g_z = _gate_backward_formula(gy, v, z, ctx.act, ctx.l_max, ctx.F, needs)
        else:
            g_v, g_z = _gate_backward(gy.contiguous(), v, z, ctx.act, ctx.l_max, ctx.F)
        return g_v, g_z, None, None, None


def gated(v: Tensor, z: Tensor, activation: str, l_max: int, F: int) -> Tensor:
    """``v * act(z)``, rank ``l``'s channel ``f`` (every component) times ``act(z[:, l F + f])``.
    ``v: [n, (l_max+1)^2 F]``, ``z: [n, (l_max+1) F]``; ``activation`` one of :data:`ACTIVATIONS`."""
    return _Gated.apply(v, z, ACTIVATIONS[activation], l_max, F)
