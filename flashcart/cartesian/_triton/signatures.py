"""Argument names of the generated Triton kernels: one list shared by generator and launcher.

``codegen`` writes each kernel's parameter list from a :class:`KernelSignature`, and ``ops``
launches the kernel through :meth:`KernelSignature.launch`, which passes every argument by
name and refuses a missing or unknown name, so the two sides cannot drift apart through
argument order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from ..._env import env_switch
from . import launcher

__all__ = [
    "KernelSignature",
    "launch_kernel",
    "TP_FWD",
    "TP_BWD_EDGE",
    "TP_BWD_X1_CSR",
    "TP_BWD_CSR",
    "TP_DBWD_ROW",
    "TP_DBWD_X1_CSR",
    "EXPANSION_FWD",
    "EXPANSION_VJP",
    "EXPANSION_SECOND",
    "STATIC_SHAPES",
    "SHAPE_ARGS",
    "product_signature",
]


@dataclass(frozen=True)
class KernelSignature:
    """Name, run-time arguments and ``tl.constexpr`` arguments of one generated kernel (in order)."""

    name: str
    args: tuple[str, ...]  # run-time arguments; the first is a tensor (the launch's tracing probe)
    constexprs: tuple[str, ...]

    def header(self, indent: str = "    ") -> list[str]:
        """Source lines of the ``@triton.jit`` decorator and the ``def`` line with every parameter."""
        params = [f"{indent}{a}," for a in self.args] + [f"{indent}{c}: tl.constexpr," for c in self.constexprs]
        return ["@triton.jit", f"def {self.name}(", *params, "):"]

    @cached_property
    def static(self) -> tuple[str, ...]:
        """The constexprs that are sizes (:data:`SHAPE_ARGS`: channels, row widths)."""
        return tuple(c for c in self.constexprs if c in SHAPE_ARGS)

    @cached_property
    def _names(self) -> frozenset[str]:
        return frozenset(self.args) | frozenset(self.constexprs)

    def launch(self, module: Any, grid: tuple, num_warps: int | None = None, **values: Any) -> None:
        """Run ``module.<name>[grid]`` with every argument passed by keyword.

        ``values`` must name exactly the kernel's arguments and constexprs (Triton's interpreter
        silently drops unknown keywords, so the check is done here).
        """
        expected = self._names
        if values.keys() != expected:
            missing, unknown = sorted(expected - values.keys()), sorted(values.keys() - expected)
            raise TypeError(f"kernel {self.name}: missing arguments {missing}, unknown arguments {unknown}")
        options = {} if num_warps is None else {"num_warps": num_warps}
        for name in self.static:  # compile-time sizes: plain ints (a traced size is specialised)
            if type(values[name]) is not int:
                values[name] = int(values[name])
        launch_kernel(getattr(module, self.name), values[self.args[0]], grid, values, options)


def launch_kernel(kernel: Any, probe: Any, grid: tuple, values: dict[str, Any], options: dict[str, Any]) -> None:
    """``kernel[grid](**values, **options)`` as an op runs it: through ``torch.library.wrap_triton``
    when ``probe`` is a tracing tensor (:func:`traceable`), else a real launch, pre-bound when
    enabled (:mod:`.launcher`)."""
    wrapped = traceable(kernel, probe)
    if wrapped is kernel:
        launcher.launch(kernel, grid, values, options)
    else:
        if launcher.ENABLED:
            launcher.plain_launches[f"traced ({type(probe).__name__})"] += 1
        wrapped[grid](**values, **options)


def traceable(kernel: Any, probe: Any) -> Any:
    """``kernel`` as launched inside a ``torch.library.triton_op`` (see ``common.kernel_op``): plain when it runs on real
    tensors (eager calls, and the op's own execution); wrapped with ``torch.library.wrap_triton``
    when ``probe`` (one of its tensor arguments) is a tracing tensor (fake, or functional in Python
    or C++: export, AOTInductor, ``torch.compile``), so the launch is recorded as a Triton-kernel node that
    inductor compiles into its output (an AOTInductor package then needs no Python to run it)."""
    tracing = torch.compiler.is_compiling() or (
        isinstance(probe, torch.Tensor)
        and (type(probe) not in (torch.Tensor, torch.nn.Parameter) or torch._is_functional_tensor(probe))  # C++ functionalisation
    )
    return torch.library.wrap_triton(kernel) if tracing else kernel


def _static_shapes_mode() -> bool:
    """``FLASHCART_STATIC_SHAPES``: ``1`` (default) compiles the tensor products' kernels for their
    channel counts and row widths (:data:`SHAPE_ARGS` as ``tl.constexpr``: every operand address
    is a base plus constant offsets, so no address arithmetic per load; one compiled kernel per
    model layer, as the widths are the model's); ``0`` takes them as run-time arguments. With it
    the product kernels also load without masks (the lanes past the channel count load the last
    channel again, ``codegen._channels_clamped``). Compiled for sm_90 at 20 channels the second
    convolution's one-pass backward with a table then holds 128 registers without spills (255
    and 256 spilled bytes) and its kernel shrinks from 2,744 to 1,848 instructions
    (``compile_check --instructions``). On the H100 (i2c3f20l2r's second convolution, weight
    rows) the fused double backward went from 1.509 to 1.119 ms at 20 channels and from 3.492 to
    3.065 ms at 64, and with the walks split 4 ways (``common.auto_splits``) the backward from
    0.618 to 0.544 ms; the force call with tables did not change (1.515 and 1.517 ms of GPU time;
    benchmarks/RESULTS.md, 2026-12-07 afternoon). Read at import: the generated modules'
    parameter lists follow it (their cache files are named by it)."""
    return env_switch("FLASHCART_STATIC_SHAPES", default=True)


STATIC_SHAPES = _static_shapes_mode()

# The products' sizes: channel strides and counts of the inputs (F1S, F2S, F1C, F2C), the output
# channels (F) and the row widths of every operand and result (elements).
SHAPE_ARGS = frozenset(
    {"F1S", "F2S", "F1C", "F2C", "F"}
    | {"x1_row", "x2_row", "w_row", "out_row", "go_row", "g1_row", "g2_row", "gw_row", "dx1_row", "dx2_row", "dw_row"}
)


def product_signature(name: str, args: tuple[str, ...], constexprs: tuple[str, ...]) -> KernelSignature:
    """A tensor-product kernel's signature: with :data:`STATIC_SHAPES` its :data:`SHAPE_ARGS` move
    from the run-time arguments to the constexprs (first, in their order)."""
    if not STATIC_SHAPES:
        return KernelSignature(name, args, constexprs)
    return KernelSignature(name, tuple(a for a in args if a not in SHAPE_ARGS), (*(a for a in args if a in SHAPE_ARGS), *constexprs))


# Tensor products (one generated module per configuration, see codegen.generate_product_source).
# *_ptr: tensor data; *_row: row strides (elements); F1S/F2S: channel stride of input 1/2
# (0 for a broadcast one-channel input); F1C/F2C: channels of input 1/2; F: output channels.
# W_INDEX: edge/row e reads weight row widx[e] (widx_ptr, int64), else row e. W_ROWS (with
# W_INDEX): the weight gradient is per weight row [R, n_paths * F], each listed edge's gradient
# (wrows_ptr: [R, 2] int64, the edges each row sums, -1 for none) added atomically into its
# zeroed row; without it the weight gradient stays per edge/row (the caller sums the edges of
# each row, see ops.weight_rows_sum). In the fused double backward W_ROWS also reads ggw per
# weight row (zero for an edge its row does not list).
# W_SLOPE (tp_bwd_edge, tp_bwd_csr, with NEED_GW): the weights are a function of one variable t per
# weight row, w = w(t), whose derivative dw/dt is read from ws_ptr (laid out as w); instead of the
# weights' gradient the kernel writes the gradient of t, sum_p,f gw * dw/dt, one scalar per edge
# into gw_ptr ([rows]), or with W_ROWS added atomically per weight row ([R], zeroed). One program
# then covers every channel (the sum is over channels).
# W_TABLE (tp_fwd, tp_bwd_edge, tp_bwd_x1_csr, tp_bwd_csr): w_ptr is a cubic table [tab_n, 4, w_row]
# (flashcart.cartesian._weight_table) of one variable t per weight row (t_ptr); geom_ptr holds its
# cutoff and intervals per unit of t in the kernel's dtype. Each weight row's weights (and with
# W_SLOPE its slopes) are the table's cubic at t[row], evaluated in the kernel: no [R, W] weights.
# PIPELINE (tp_fwd): load the next edge's operands before computing the current edge's messages.
# PREFETCH (the sender walks tp_bwd_x1_csr, tp_bwd_csr, tp_dbwd_x1_csr; the fused double backward's
# receiver walk tp_dbwd_row): each step loads the indices of the edges after it (perm, recv; send),
# so its operand loads do not wait on dependent index loads (common.index_prefetch).
# SPLITS (the kernels walking a node's edges, convolution mode): grid axis 0 holds SPLITS programs
# per node, each walking a consecutive part of the node's edges; per-node results are partial sums
# in rows s * nodes + node of a [SPLITS * nodes, ...] output that the launcher sums (per-edge
# results are written once, as without splits). 1: one program per node.
_TABLE = ("t_ptr", "geom_ptr", "tab_n")  # W_TABLE's arguments
TP_FWD = product_signature(
    "tp_fwd",
    args=(
        "x1_ptr",
        "x2_ptr",
        "w_ptr",
        "widx_ptr",
        *_TABLE,
        "out_ptr",
        "rowptr_ptr",
        "send_ptr",
        "x1_row",
        "x2_row",
        "w_row",
        "out_row",
        "F1S",
        "F2S",
        "F1C",
        "F2C",
        "F",
    ),
    constexprs=("CONV", "W_INDEX", "W_TABLE", "PIPELINE", "SPLITS", "BLOCK_F", "DT"),
)
# The backward's tensors and their row strides, then the channel arguments (tp_bwd_edge, tp_bwd_csr).
_BWD_TENSORS = ("go_ptr", "x1_ptr", "x2_ptr", "w_ptr", "ws_ptr", "widx_ptr", "wrows_ptr", "g1_ptr", "g2_ptr", "gw_ptr", *_TABLE)
_BWD_ROWS = ("go_row", "x1_row", "x2_row", "w_row", "g1_row", "g2_row", "gw_row")
_CHANNELS = ("F1S", "F2S", "F1C", "F2C", "F")
TP_BWD_EDGE = product_signature(
    "tp_bwd_edge",
    args=(*_BWD_TENSORS, "recv_ptr", "send_ptr", *_BWD_ROWS, *_CHANNELS),
    constexprs=("CONV", "W_INDEX", "W_ROWS", "W_SLOPE", "W_TABLE", "NEED_G1", "NEED_G2", "NEED_GW", "REDUCE_G2", "BLOCK_F", "DT"),
)
TP_BWD_X1_CSR = product_signature(
    "tp_bwd_x1_csr",
    args=(
        "go_ptr",
        "x2_ptr",
        "w_ptr",
        "widx_ptr",
        *_TABLE,
        "g1_ptr",
        "srowptr_ptr",
        "perm_ptr",
        "recv_ptr",
        "go_row",
        "x2_row",
        "w_row",
        "g1_row",
        "F2S",
        "F2C",
        "F",
    ),
    constexprs=("W_INDEX", "W_TABLE", "PREFETCH", "SPLITS", "BLOCK_F", "DT"),
)
# The convolution backward in one pass per sender: the gradient of input 1 (as tp_bwd_x1_csr) and,
# for each of the sender's edges, those of input 2 and the weights (as tp_bwd_edge), every edge
# operand read once.
TP_BWD_CSR = product_signature(
    "tp_bwd_csr",
    args=(*_BWD_TENSORS, "srowptr_ptr", "perm_ptr", "recv_ptr", *_BWD_ROWS, *_CHANNELS),
    constexprs=("W_INDEX", "W_ROWS", "W_SLOPE", "W_TABLE", "NEED_G2", "NEED_GW", "REDUCE_G2", "PREFETCH", "SPLITS", "BLOCK_F", "DT"),
)

# Fused double backward (codegen_double.generate_double_backward_source, its own module per
# configuration). gg1/gg2/ggw: cotangents of the backward's three outputs, laid out like
# x1/x2/w (so they share x1_row/x2_row/w_row); d*: the four results. HAS_*: that cotangent
# is present; NEED_*: that result is computed (the launcher clears a flag whose terms are all
# absent); RED_X1/RED_X2: the input is broadcast (one channel), so each program stores its
# channel sum in the column block of its channel block; SHARED_W: 1-D weights, the weight
# gradient is summed over each program's edges and stored per program row. ROW_GROUPS
# (convolution mode): grid axis 2 splits the paths by output rank (N_ROW_GROUPS groups, fewer
# registers per program); the input-2 result is then a partial sum per group. X1_ATOMIC
# (convolution mode, with NEED_X1): each edge's d x1 term is added atomically into its sender's
# row of a zeroed d x1 (no tp_dbwd_x1_csr pass).
TP_DBWD_ROW = product_signature(
    "tp_dbwd_row",
    args=(
        "go_ptr",
        "x1_ptr",
        "x2_ptr",
        "w_ptr",
        "widx_ptr",
        "wrows_ptr",
        "gg1_ptr",
        "gg2_ptr",
        "ggw_ptr",
        "dgo_ptr",
        "dx1_ptr",
        "dx2_ptr",
        "dw_ptr",
        "rowptr_ptr",
        "send_ptr",
        "go_row",
        "x1_row",
        "x2_row",
        "w_row",
        "dx1_row",
        "dx2_row",
        "dw_row",
        "F1S",
        "F2S",
        "F1C",
        "F2C",
        "F",
    ),
    constexprs=(
        "CONV",
        "HAS_GG1",
        "HAS_GG2",
        "HAS_GGW",
        "NEED_GO",
        "NEED_X1",
        "NEED_X2",
        "NEED_W",
        "RED_X1",
        "RED_X2",
        "SHARED_W",
        "W_INDEX",
        "W_ROWS",
        "ROW_GROUPS",
        "X1_ATOMIC",
        "PREFETCH",
        "SPLITS",
        "BLOCK_F",
        "DT",
    ),
)
TP_DBWD_X1_CSR = product_signature(
    "tp_dbwd_x1_csr",
    args=(
        "go_ptr",
        "x2_ptr",
        "w_ptr",
        "widx_ptr",
        "wrows_ptr",
        "gg2_ptr",
        "ggw_ptr",
        "dx1_ptr",
        "srowptr_ptr",
        "perm_ptr",
        "recv_ptr",
        "go_row",
        "x2_row",
        "w_row",
        "dx1_row",
        "F2S",
        "F2C",
        "F",
    ),
    constexprs=("HAS_GG2", "HAS_GGW", "RED_X1", "W_INDEX", "W_ROWS", "PREFETCH", "SPLITS", "BLOCK_F", "DT"),
)

# Direction expansion (codegen.generate_expansion_source); n: rows, BLOCK: rows per program.
EXPANSION_FWD = KernelSignature("expansion_fwd", args=("u_ptr", "out_ptr", "n"), constexprs=("BLOCK", "DT"))
EXPANSION_VJP = KernelSignature("expansion_vjp", args=("u_ptr", "g_ptr", "gu_ptr", "n"), constexprs=("BLOCK", "DT"))
EXPANSION_SECOND = KernelSignature(
    "expansion_second", args=("u_ptr", "g_ptr", "v_ptr", "dg_ptr", "du_ptr", "n"), constexprs=("BLOCK", "DT")
)
