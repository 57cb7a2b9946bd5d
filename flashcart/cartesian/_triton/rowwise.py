"""Row-wise kernels of the RMS norm and the gate: per-(rank, channel) scales on rank blocks.

Both blocks multiply features in the standard layout (rank ``l``'s block ``(2l+1, F)`` at
column ``l^2 F``, ``W = (l_max+1)^2 F`` columns) by a value per (rank, channel) broadcast over
the rank's components:

* :func:`rms_scale`: ``y = x * s * g_lf`` with ``s = (|mean(inv)| + eps)^-1/2`` per row
  (``inv: [n, K]`` the rank-0 invariants) and optional gains ``g: [(l_max+1) F]``;
* :func:`gated`: ``y = v * act(z)_lf`` with the gate pre-activations ``z: [n, (l_max+1) F]``
  (``sigmoid``, ``silu`` or ``tanh``).

As ATen expressions each is a chain of small operations (the norm's ``mean``, ``abs``,
``add``, ``rsqrt`` and two multiplications, six backward nodes; the gate's activation,
``index_select`` and multiplication), each a launch and an autograd node: an eager force call
on the GPU is bound by that host work (benchmarks/RESULTS.md). Here each is one kernel per
row forward and one backward. Eager calls only (:func:`use_fused`): compiled calls keep the
ATen expression, which inductor fuses itself. A backward that must itself be differentiable
(``create_graph``, training on forces) or that needs the gains' gradient evaluates the same
derivative as ATen operations instead (:func:`_rms_backward_formula`,
:func:`_gate_backward_formula`).

One program per row; the rank loop is unrolled (``L_MAX`` and ``F`` are constexprs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import _frozen
from .common import next_pow2
from .signatures import launch_kernel

__all__ = ["ENABLED", "ACTIVATIONS", "use_fused", "rms_scale", "gated"]

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
def rms_scale_fwd(
    inv_ptr,
    x_ptr,
    g_ptr,
    y_ptr,
    s_ptr,
    eps_ptr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    L_MAX: tl.constexpr,
    F: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
    GAINS: tl.constexpr,
):
    """Row ``r``: ``s = (|mean(inv[r])| + eps)^-1/2`` (stored), ``y[r] = x[r] * s * g``."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    inv = tl.load(inv_ptr + row * K + k, mask=k < K, other=0.0)
    s = 1.0 / tl.sqrt(tl.abs(tl.sum(inv, 0) / K) + tl.load(eps_ptr))
    tl.store(s_ptr + row, s)
    W: tl.constexpr = (L_MAX + 1) * (L_MAX + 1) * F
    m = tl.arange(0, BLOCK_M)[:, None]
    f = tl.arange(0, BLOCK_F)[None, :]
    for l in tl.static_range(L_MAX + 1):
        mask = (m < 2 * l + 1) & (f < F)
        cols = l * l * F + m * F + f
        y = tl.load(x_ptr + row * W + cols, mask=mask, other=0.0) * s
        if GAINS:
            y = y * tl.load(g_ptr + l * F + f, mask=f < F, other=0.0)
        tl.store(y_ptr + row * W + cols, y, mask=mask)


@triton.jit
def rms_scale_bwd(
    gy_ptr,
    x_ptr,
    g_ptr,
    inv_ptr,
    s_ptr,
    gx_ptr,
    ginv_ptr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    L_MAX: tl.constexpr,
    F: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
    GAINS: tl.constexpr,
):
    """Row ``r``: ``gx = gy g s`` and ``ginv = <gy g, x> * ds/dmean / K`` for every column of inv,
    with ``ds/dmean = -s^3 sign(mean) / 2``."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.load(s_ptr + row)
    W: tl.constexpr = (L_MAX + 1) * (L_MAX + 1) * F
    m = tl.arange(0, BLOCK_M)[:, None]
    f = tl.arange(0, BLOCK_F)[None, :]
    dot = 0.0 * s
    for l in tl.static_range(L_MAX + 1):
        mask = (m < 2 * l + 1) & (f < F)
        cols = l * l * F + m * F + f
        t = tl.load(gy_ptr + row * W + cols, mask=mask, other=0.0)
        if GAINS:
            t = t * tl.load(g_ptr + l * F + f, mask=f < F, other=0.0)
        tl.store(gx_ptr + row * W + cols, t * s, mask=mask)
        dot += tl.sum(tl.sum(t * tl.load(x_ptr + row * W + cols, mask=mask, other=0.0), 1), 0)
    k = tl.arange(0, BLOCK_K)
    mean = tl.sum(tl.load(inv_ptr + row * K + k, mask=k < K, other=0.0), 0) / K
    sign = tl.where(mean > 0, 1.0, tl.where(mean < 0, -1.0, 0.0))
    gmean = dot * (-0.5 * s * s * s) * sign
    tl.store(ginv_ptr + row * K + k, tl.zeros([BLOCK_K], dtype=inv_ptr.dtype.element_ty) + gmean / K, mask=k < K)


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
    m = tl.arange(0, BLOCK_M)[:, None]
    f = tl.arange(0, BLOCK_F)[None, :]
    for l in tl.static_range(L_MAX + 1):
        a = _act(tl.load(z_ptr + row * G + l * F + f, mask=f < F, other=0.0), ACT)
        mask = (m < 2 * l + 1) & (f < F)
        cols = l * l * F + m * F + f
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
    m = tl.arange(0, BLOCK_M)[:, None]
    f1 = tl.arange(0, BLOCK_F)
    f = f1[None, :]
    for l in tl.static_range(L_MAX + 1):
        a, slope = _act_and_slope(tl.load(z_ptr + row * G + l * F + f, mask=f < F, other=0.0), ACT)
        mask = (m < 2 * l + 1) & (f < F)
        cols = l * l * F + m * F + f
        gy = tl.load(gy_ptr + row * W + cols, mask=mask, other=0.0)
        tl.store(gv_ptr + row * W + cols, gy * a, mask=mask)
        gz = tl.sum(gy * tl.load(v_ptr + row * W + cols, mask=mask, other=0.0), 0) * tl.sum(slope, 0)
        tl.store(gz_ptr + row * G + l * F + f1, gz, mask=f1 < F)


# ---------------------------------------------------------------------------------------------
# launches
# ---------------------------------------------------------------------------------------------


def _layout(l_max: int, F: int) -> dict:
    return dict(L_MAX=l_max, F=F, BLOCK_M=next_pow2(2 * l_max + 1), BLOCK_F=next_pow2(F))


_EPS: dict = {}


def _eps(eps: float, like: Tensor) -> Tensor:
    """``eps`` as a one-element tensor of ``like``'s dtype and device (a float argument would
    reach the kernel as float32), made once per value, dtype and device."""
    key = (eps, like.dtype, like.device)
    t = _EPS.get(key)
    if t is None:
        t = _EPS[key] = torch.full((1,), eps, dtype=like.dtype, device=like.device)
    return t


def _rms_forward(inv: Tensor, x: Tensor, gains: Tensor | None, eps: float, l_max: int, F: int) -> tuple[Tensor, Tensor]:
    n, K = inv.shape
    y = torch.empty_like(x)
    s = torch.empty(n, dtype=x.dtype, device=x.device)
    if n:
        values = dict(inv_ptr=inv, x_ptr=x, g_ptr=gains if gains is not None else x, y_ptr=y, s_ptr=s, eps_ptr=_eps(eps, x), K=K)
        values.update(BLOCK_K=next_pow2(K), GAINS=gains is not None, **_layout(l_max, F))
        launch_kernel(rms_scale_fwd, x, (n,), values, {"num_warps": _warps(x.shape[1])})
    return y, s


def _rms_backward(gy, x, gains, inv, s, l_max: int, F: int) -> tuple[Tensor, Tensor]:
    n, K = inv.shape
    gx, ginv = torch.empty_like(x), torch.empty_like(inv)
    if n:
        values = dict(gy_ptr=gy, x_ptr=x, g_ptr=gains if gains is not None else x, inv_ptr=inv, s_ptr=s, gx_ptr=gx, ginv_ptr=ginv, K=K)
        values.update(BLOCK_K=next_pow2(K), GAINS=gains is not None, **_layout(l_max, F))
        launch_kernel(rms_scale_bwd, x, (n,), values, {"num_warps": _warps(x.shape[1])})
    return gx, ginv


def _column_index(l_max: int, F: int, device) -> Tensor:
    """``[W]``: column -> ``l F + f`` (the (rank, channel) it belongs to)."""
    return torch.cat([l * F + torch.arange(F, device=device).repeat(2 * l + 1) for l in range(l_max + 1)])


def _rms_backward_formula(gy, x, gains, inv, eps: float, l_max: int, F: int, needs: tuple[bool, bool, bool]):
    """The norm's derivative as ATen operations (differentiable: double backward, gains' gradient)."""
    s = torch.rsqrt(inv.mean(dim=1, keepdim=True).abs() + eps)
    t = gy if gains is None else gy * gains.index_select(0, _column_index(l_max, F, gy.device))
    g_inv = g_x = g_gains = None
    if needs[0]:
        mean = inv.mean(dim=1, keepdim=True)
        g_mean = (t * x).sum(dim=1, keepdim=True) * (-0.5 * s**3) * torch.sgn(mean)
        g_inv = (g_mean / inv.shape[1]).expand_as(inv)
    if needs[1]:
        g_x = t * s
    if needs[2] and gains is not None:
        per_column = (gy * x * s).sum(0)
        g_gains = torch.zeros_like(gains).index_add(0, _column_index(l_max, F, gy.device), per_column)
    return g_inv, g_x, g_gains


class _RMSScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inv, x, gains, eps, l_max, F):
        inv, x = inv.contiguous(), x.contiguous()
        gains = gains.contiguous() if gains is not None else None
        y, s = _rms_forward(inv, x, gains, eps, l_max, F)
        ctx.save_for_backward(inv, x, gains, s)
        ctx.eps, ctx.l_max, ctx.F = eps, l_max, F
        return y

    @staticmethod
    def backward(ctx, gy):
        inv, x, gains, s = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[:3])
        if torch.is_grad_enabled() or (needs[2] and gains is not None):
            g_inv, g_x, g_gains = _rms_backward_formula(gy, x, gains, inv, ctx.eps, ctx.l_max, ctx.F, needs)
        else:
            g_x, g_inv = _rms_backward(gy.contiguous(), x, gains, inv, s, ctx.l_max, ctx.F)
            g_gains = None
        return g_inv, g_x, g_gains, None, None, None


def rms_scale(inv: Tensor, x: Tensor, gains: Tensor | None, eps: float, l_max: int, F: int) -> Tensor:
    """``x * (|mean(inv, 1)| + eps)^-1/2 * gains`` (gains per (rank, channel), ``[(l_max+1) F]``,
    broadcast over components; ``None``: none). ``inv: [n, K]``, ``x: [n, (l_max+1)^2 F]``."""
    return _RMSScale.apply(inv, x, gains, eps, l_max, F)


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
