"""The edge features (:mod:`flashcart.nn.edge_features`) as one Triton kernel each way.

* ``edge_features_fwd``: per edge, the vector from the positions, the cell and the shift, its
  length, the unit vector, the envelope and the radial basis times the envelope. It replaces about
  35 ATen operations (gathers, the image shift, the norms, the basis and the envelope
  polynomials), each a launch and an autograd node in an eager call.
* ``edge_features_bwd``: per edge, the vector's gradient from those of the unit vectors and the
  radial features (the basis' and the envelope's derivatives evaluated in the kernel). Two
  ``index_add_`` then scatter it to the senders and receivers, and, for the stress, one more to
  the cells.

Eager calls only (:func:`flashcart.nn.edge_features.edge_features` decides). A backward that must
itself be differentiable (``create_graph``: training on forces) differentiates the ATen
expression (:func:`~flashcart.nn.edge_features.edge_features_reference`) instead.

Scalars that must keep the features' precision (``r_max``, ``r_min``, pi, ``eps``) reach the
kernels in a small tensor of the features' dtype (``common.kernel_constants``, as the RMS norm's
``eps``): a Python float argument or literal would reach them as float32.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..cartesian._triton.common import kernel_constants, next_pow2
from ..cartesian._triton.signatures import launch_kernel
from .radial import ChebyshevBasis, PolynomialEnvelope

__all__ = ["edge_features"]

BLOCK_EDGES = 128

# The parameter tensor (``_parameters``): the envelope's r_max, the basis' r_min and r_max - r_min,
# pi, the expansion's eps.


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _edge_vector(pos_ptr, cell_ptr, shift_ptr, recv_ptr, send_ptr, graph_ptr, BLOCK: tl.constexpr, n_edges):
    """This program's edges ``e`` (``[BLOCK]``), which of them exist, their vectors
    ``x[sender] - x[receiver] + S @ cell[graph]`` (a ``[BLOCK]`` per component), ``|vec|^2`` and
    ``d = sqrt(|vec|^2 + 1e-30)``."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = e < n_edges
    dt = pos_ptr.dtype.element_ty
    r = tl.load(recv_ptr + e, mask=live, other=0)
    s = tl.load(send_ptr + e, mask=live, other=0)
    g = tl.load(graph_ptr + e, mask=live, other=0)
    s0 = tl.load(shift_ptr + 3 * e, mask=live, other=0).to(dt)
    s1 = tl.load(shift_ptr + 3 * e + 1, mask=live, other=0).to(dt)
    s2 = tl.load(shift_ptr + 3 * e + 2, mask=live, other=0).to(dt)
    c = cell_ptr + 9 * g
    ix = s0 * tl.load(c, mask=live, other=0.0) + s1 * tl.load(c + 3, mask=live, other=0.0) + s2 * tl.load(c + 6, mask=live, other=0.0)
    iy = s0 * tl.load(c + 1, mask=live, other=0.0) + s1 * tl.load(c + 4, mask=live, other=0.0) + s2 * tl.load(c + 7, mask=live, other=0.0)
    iz = s0 * tl.load(c + 2, mask=live, other=0.0) + s1 * tl.load(c + 5, mask=live, other=0.0) + s2 * tl.load(c + 8, mask=live, other=0.0)
    vx = tl.load(pos_ptr + 3 * s, mask=live, other=0.0) - tl.load(pos_ptr + 3 * r, mask=live, other=0.0) + ix
    vy = tl.load(pos_ptr + 3 * s + 1, mask=live, other=0.0) - tl.load(pos_ptr + 3 * r + 1, mask=live, other=0.0) + iy
    vz = tl.load(pos_ptr + 3 * s + 2, mask=live, other=0.0) - tl.load(pos_ptr + 3 * r + 2, mask=live, other=0.0) + iz
    d2 = vx * vx + vy * vy + vz * vz
    return e, live, vx, vy, vz, d2, tl.sqrt(d2 + 1e-30)


@triton.jit
def _envelope(d, par_ptr, P: tl.constexpr):
    """``u(t)`` and ``du/dd`` of ``t = min(d / r_max, 1)`` (the clamp's derivative inclusive at 1, as ATen's)."""
    r_max = tl.load(par_ptr + 0)
    raw = d / r_max
    t = tl.minimum(raw, 1.0)
    A: tl.constexpr = -((P + 1) * (P + 2) // 2)
    B: tl.constexpr = P * (P + 2)
    C: tl.constexpr = -(P * (P + 1) // 2)
    t_pm1 = t * 0.0 + 1.0
    for _ in tl.static_range(P - 1):
        t_pm1 = t_pm1 * t
    t_p = t_pm1 * t
    poly = A + t * (B + C * t)
    env = 1.0 + t_p * poly
    slope = (P * t_pm1 * poly + t_p * (B + 2 * C * t)) / r_max
    return env, tl.where(raw <= 1.0, slope, 0.0)


@triton.jit
def _basis(d, par_ptr, N: tl.constexpr, BLOCK_N: tl.constexpr, COSINE: tl.constexpr):
    """``[BLOCK, BLOCK_N]`` basis values ``B_k(t)`` and their derivatives ``dB_k/dd`` of
    ``t = clamp((d - r_min) / (r_max - r_min), 0, 1)`` (columns ``k >= N`` zero)."""
    dt = d.dtype
    span = tl.load(par_ptr + 2)
    raw = (d - tl.load(par_ptr + 1)) / span
    t = tl.minimum(tl.maximum(raw, 0.0), 1.0)
    dt_dd = tl.where((raw >= 0.0) & (raw <= 1.0), 1.0 / span, 0.0)
    k = tl.arange(0, BLOCK_N)[None, :]
    if COSINE:
        # T_k(cos(pi t)) = cos(k pi t), as the ATen expression evaluates it
        pit = tl.load(par_ptr + 3) * t
        angle = pit[:, None] * k.to(dt)
        values = tl.cos(angle)
        slopes = -tl.sin(angle) * (k.to(dt) * tl.load(par_ptr + 3)) * dt_dd[:, None]
    else:
        # Chebyshev polynomials of x = 2 t - 1 by their recursion, and their derivatives
        x = 2.0 * t - 1.0
        one = x * 0.0 + 1.0
        t_prev, t_cur = one, x
        s_prev, s_cur = x * 0.0, one
        values = tl.where(k == 0, one[:, None], 0.0) + tl.where(k == 1, x[:, None], 0.0)
        slopes = tl.where(k == 1, one[:, None], 0.0)
        for j in tl.static_range(2, N):
            t_next = 2.0 * x * t_cur - t_prev
            s_next = 2.0 * t_cur + 2.0 * x * s_cur - s_prev
            values += tl.where(k == j, t_next[:, None], 0.0)
            slopes += tl.where(k == j, s_next[:, None], 0.0)
            t_prev, t_cur = t_cur, t_next
            s_prev, s_cur = s_cur, s_next
        slopes = slopes * (2.0 * dt_dd)[:, None]
    keep = k < N
    return tl.where(keep, values, 0.0), tl.where(keep, slopes, 0.0)


@triton.jit
def edge_features_fwd(
    pos_ptr,
    cell_ptr,
    shift_ptr,
    recv_ptr,
    send_ptr,
    graph_ptr,
    par_ptr,
    unit_ptr,
    radial_ptr,
    env_ptr,
    n_edges,
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    COSINE: tl.constexpr,
    P: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Edges ``e``: ``unit[e] = vec / max(|vec|, eps)``, ``env[e] = u(d)``, ``radial[e, k] = B_k(d) u(d)``."""
    e, live, vx, vy, vz, d2, d = _edge_vector(pos_ptr, cell_ptr, shift_ptr, recv_ptr, send_ptr, graph_ptr, BLOCK, n_edges)
    den = tl.maximum(tl.sqrt(d2), tl.load(par_ptr + 4))
    tl.store(unit_ptr + 3 * e, vx / den, mask=live)
    tl.store(unit_ptr + 3 * e + 1, vy / den, mask=live)
    tl.store(unit_ptr + 3 * e + 2, vz / den, mask=live)
    env, _ = _envelope(d, par_ptr, P)
    tl.store(env_ptr + e, env, mask=live)
    values, _ = _basis(d, par_ptr, N, BLOCK_N, COSINE)
    k = tl.arange(0, BLOCK_N)[None, :]
    tl.store(radial_ptr + N * e[:, None] + k, values * env[:, None], mask=live[:, None] & (k < N))


@triton.jit
def edge_features_bwd(
    pos_ptr,
    cell_ptr,
    shift_ptr,
    recv_ptr,
    send_ptr,
    graph_ptr,
    par_ptr,
    g_unit_ptr,
    g_radial_ptr,
    g_vec_ptr,
    n_edges,
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    COSINE: tl.constexpr,
    P: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Edges ``e``: ``g_vec = J_unit^T g_unit + (sum_k g_radial[k] d radial_k / dd) vec / d``."""
    e, live, vx, vy, vz, d2, d = _edge_vector(pos_ptr, cell_ptr, shift_ptr, recv_ptr, send_ptr, graph_ptr, BLOCK, n_edges)
    norm = tl.sqrt(d2)
    eps = tl.load(par_ptr + 4)
    # unit = vec / max(|vec|, eps): (g - u (u . g)) / |vec| where |vec| >= eps (the clamp passes
    # the norm's gradient there, inclusive, as ATen's), g / eps below
    gx = tl.load(g_unit_ptr + 3 * e, mask=live, other=0.0)
    gy = tl.load(g_unit_ptr + 3 * e + 1, mask=live, other=0.0)
    gz = tl.load(g_unit_ptr + 3 * e + 2, mask=live, other=0.0)
    den = tl.maximum(norm, eps)
    ux, uy, uz = vx / den, vy / den, vz / den
    along = tl.where(norm >= eps, ux * gx + uy * gy + uz * gz, 0.0)
    # d radial_k / dd = B_k' u + B_k u'
    env, env_slope = _envelope(d, par_ptr, P)
    values, slopes = _basis(d, par_ptr, N, BLOCK_N, COSINE)
    k = tl.arange(0, BLOCK_N)[None, :]
    g_radial = tl.load(g_radial_ptr + N * e[:, None] + k, mask=live[:, None] & (k < N), other=0.0)
    g_d = tl.sum(g_radial * (slopes * env[:, None] + values * env_slope[:, None]), 1)
    radial_part = g_d / d
    tl.store(g_vec_ptr + 3 * e, (gx - ux * along) / den + radial_part * vx, mask=live)
    tl.store(g_vec_ptr + 3 * e + 1, (gy - uy * along) / den + radial_part * vy, mask=live)
    tl.store(g_vec_ptr + 3 * e + 2, (gz - uz * along) / den + radial_part * vz, mask=live)


# ---------------------------------------------------------------------------------------------
# launches
# ---------------------------------------------------------------------------------------------


def _parameters(basis: ChebyshevBasis, envelope: PolynomialEnvelope, eps: float, like: Tensor) -> Tensor:
    """The kernels' constants in ``like``'s dtype and device (see the module docstring)."""
    return kernel_constants((envelope.r_max, basis.r_min, basis.r_max - basis.r_min, math.pi, eps), like)


def _layout(basis: ChebyshevBasis, envelope: PolynomialEnvelope) -> dict:
    return dict(N=basis.n, BLOCK_N=next_pow2(basis.n), COSINE=basis.mapping == "cosine", P=envelope.p, BLOCK=BLOCK_EDGES)


def _graph_args(positions, cell, shifts, receivers, senders, edge_batch, par) -> dict:
    return dict(pos_ptr=positions, cell_ptr=cell, shift_ptr=shifts, recv_ptr=receivers, send_ptr=senders, graph_ptr=edge_batch, par_ptr=par)


def _grid(n_edges: int) -> tuple[int]:
    return (triton.cdiv(n_edges, BLOCK_EDGES),)


class _EdgeFeatures(torch.autograd.Function):
    @staticmethod
    def forward(ctx, positions, cell, shifts, receivers, senders, edge_batch, basis, envelope, eps):
        positions, cell, shifts = positions.contiguous(), cell.contiguous(), shifts.contiguous()
        n_edges = receivers.shape[0]
        par = _parameters(basis, envelope, eps, positions)
        unit = torch.empty(n_edges, 3, dtype=positions.dtype, device=positions.device)
        radial = torch.empty(n_edges, basis.n, dtype=positions.dtype, device=positions.device)
        env = torch.empty(n_edges, dtype=positions.dtype, device=positions.device)
        values = _graph_args(positions, cell, shifts, receivers, senders, edge_batch, par)
        values.update(unit_ptr=unit, radial_ptr=radial, env_ptr=env, n_edges=n_edges, **_layout(basis, envelope))
        launch_kernel(edge_features_fwd, positions, _grid(n_edges), values, {"num_warps": 4})
        ctx.save_for_backward(positions, cell, shifts, receivers, senders, edge_batch)
        ctx.basis, ctx.envelope, ctx.eps, ctx.par = basis, envelope, eps, par
        ctx.mark_non_differentiable(env)
        return unit, radial, env

    @staticmethod
    def backward(ctx, g_unit, g_radial, _g_env):
        positions, cell, shifts, receivers, senders, edge_batch = ctx.saved_tensors
        if torch.is_grad_enabled():
            # a differentiable backward (create_graph): the ATen expression's derivative
            return _reference_backward(ctx, g_unit, g_radial) + (None,) * 7
        need_pos, need_cell = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n_edges = receivers.shape[0]
        g_vec = torch.empty(n_edges, 3, dtype=positions.dtype, device=positions.device)
        values = _graph_args(positions, cell, shifts, receivers, senders, edge_batch, ctx.par)
        values.update(
            g_unit_ptr=g_unit.contiguous(),
            g_radial_ptr=g_radial.contiguous(),
            g_vec_ptr=g_vec,
            n_edges=n_edges,
            **_layout(ctx.basis, ctx.envelope),
        )
        launch_kernel(edge_features_bwd, positions, _grid(n_edges), values, {"num_warps": 4})
        g_pos = torch.zeros_like(positions).index_add_(0, senders, g_vec).index_add_(0, receivers, g_vec, alpha=-1) if need_pos else None
        g_cell = None
        if need_cell:
            g_cell = torch.zeros_like(cell).index_add_(0, edge_batch, shifts.to(g_vec.dtype)[:, :, None] * g_vec[:, None, :])
        return g_pos, g_cell, None, None, None, None, None, None, None


def _reference_backward(ctx, g_unit: Tensor, g_radial: Tensor) -> tuple:
    """The positions' and cell's gradients through the ATen expression (differentiable)."""
    from .edge_features import edge_features_reference

    positions, cell, shifts, receivers, senders, edge_batch = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [t if t.requires_grad else t.detach().requires_grad_(True) for t in (positions, cell)]
        feats = edge_features_reference(leaves[0], leaves[1], shifts, receivers, senders, edge_batch, ctx.basis, ctx.envelope, ctx.eps)
        asked = [leaf for leaf, need in zip(leaves, ctx.needs_input_grad[:2]) if need]
        grads = iter(torch.autograd.grad((feats.unit, feats.radial), asked, (g_unit, g_radial), create_graph=True, allow_unused=True))
    return tuple(next(grads) if need else None for need in ctx.needs_input_grad[:2])


def edge_features(positions, cell, shifts, receivers, senders, edge_batch, basis, envelope, eps) -> tuple[Tensor, Tensor, Tensor]:
    """``(unit [E, 3], radial [E, n], env [E])`` as :func:`~flashcart.nn.edge_features.edge_features_reference`
    computes them (``env`` not differentiable here)."""
    return _EdgeFeatures.apply(positions, cell, shifts, receivers, senders, edge_batch, basis, envelope, eps)
