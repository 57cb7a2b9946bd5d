"""The weights' gradient per row of a product reading its weights through an index (Triton).

Two ways, chosen by ``FLASHCART_WEIGHT_ROW_SUM`` (read at import into :data:`IN_KERNEL`; tests and
benchmarks flip the module attribute):

* ``atomic`` (default): the product's backward kernels add each listed edge's weight gradient
  into its row of a zeroed ``[R, W]`` output (``W_ROWS``, see ``signatures``), and the fused double
  backward reads the rows' cotangent through the index: no ``[E, W]`` tensor, no extra pass. A
  row sums at most two edges into zero, and floating-point addition is commutative, so the
  result is the same whichever edge's addition lands first.
* ``pass``: the kernels write per-edge gradients ``[E, W]`` and :func:`weight_rows_sum` sums them.

``weight_rows_sum(g [E, W], edges [R, 2], index [E]) -> [R, W]``: row ``r`` is
``g[edges[r, 0]] + g[edges[r, 1]]`` (``-1`` adds nothing), one pass that reads the listed rows
of ``g`` and writes each output row once: no atomics, and the same float sum as the PyTorch
formula (:func:`flashcart.cartesian._weight_rows.weight_rows_sum`). ``index`` (each edge's row)
serves the derivative: edge ``e`` gets its row's cotangent if the row lists it, else zero.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import guard_or_false

from .._weight_rows import listed_edges
from .common import cdiv, kernel_op, next_pow2
from .signatures import launch_kernel

__all__ = ["weight_rows_sum", "IN_KERNEL", "row_sum_mode", "rows_in_kernel", "weight_grad_shape"]

_ENV = "FLASHCART_WEIGHT_ROW_SUM"


def row_sum_mode() -> bool:
    """``FLASHCART_WEIGHT_ROW_SUM``: ``atomic`` (default, ``True``): the kernels sum each row's edges;
    ``pass`` (``False``): a separate pass does. Anything else is an error naming the variable."""
    raw = os.environ.get(_ENV, "").strip() or "atomic"
    if raw not in ("atomic", "pass"):
        raise ValueError(f"environment variable {_ENV} must be 'atomic' or 'pass', got {raw!r}")
    return raw == "atomic"


IN_KERNEL = row_sum_mode()


def rows_in_kernel(widx: Tensor | None) -> bool:
    """Whether the product kernels sum the weight gradient into rows (``W_ROWS``) for a call
    reading its weights through ``widx``."""
    return widx is not None and IN_KERNEL


def weight_grad_shape(w: Tensor, x2: Tensor, widx: Tensor | None) -> tuple:
    """Shape of the weights' gradient the product kernels return (and of its cotangent in the
    double backward): like ``w``, or per edge ``[edges, W]`` when they read ``widx`` without
    summing into rows."""
    return (x2.shape[0], w.shape[-1]) if widx is not None and not IN_KERNEL else tuple(w.shape)


_BLOCK_W = 512  # columns per program at most (4 warps at float32)


@triton.jit
def weight_rows_sum_kernel(g_ptr, edges_ptr, out_ptr, W, BLOCK_W: tl.constexpr):
    r = tl.cast(tl.program_id(0), tl.int64)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    m = cols < W
    e0 = tl.load(edges_ptr + 2 * r)
    e1 = tl.load(edges_ptr + 2 * r + 1)
    # -1 (no edge): read row 0 and drop it (a scalar-and-vector mask fails in the interpreter)
    a = tl.load(g_ptr + tl.maximum(e0, 0) * W + cols, mask=m, other=0.0)
    b = tl.load(g_ptr + tl.maximum(e1, 0) * W + cols, mask=m, other=0.0)
    a = tl.where(e0 >= 0, a, tl.zeros_like(a))
    b = tl.where(e1 >= 0, b, tl.zeros_like(b))
    tl.store(out_ptr + r * W + cols, a + b, mask=m)


@kernel_op("flashcart::weight_rows_sum")
def weight_rows_sum(g: Tensor, edges: Tensor, index: Tensor) -> Tensor:
    g, edges = g.contiguous(), edges.contiguous()
    rows, width = edges.shape[0], g.shape[1]
    out = torch.empty(rows, width, dtype=g.dtype, device=g.device)
    if guard_or_false(rows == 0) or width == 0:
        return out
    block = min(_BLOCK_W, next_pow2(width))
    values = dict(g_ptr=g, edges_ptr=edges, out_ptr=out, W=width, BLOCK_W=block)
    launch_kernel(weight_rows_sum_kernel, g, (rows, cdiv(width, block)), values, {"num_warps": max(1, min(4, block // 128))})
    return out


@weight_rows_sum.register_fake
def _(g, edges, index):
    return g.new_empty(edges.shape[0], g.shape[1])


def _setup(ctx, inputs, output):
    _, edges, index = inputs
    ctx.save_for_backward(edges, index)


def _backward(ctx, grad_rows):
    """Edge ``e`` gets the cotangent of its row if the row lists it (differentiable: plain tensor
    operations)."""
    edges, index = ctx.saved_tensors
    picked = grad_rows.index_select(0, index)
    return torch.where(listed_edges(edges, index).unsqueeze(-1), picked, 0), None, None


weight_rows_sum.register_autograd(_backward, setup_context=_setup)
