"""The Triton ops are ``torch.library.triton_op``s: traced graphs see their kernels.

AOTInductor (``flashcart-export --format aoti`` on CUDA) and ``torch.compile`` lower a
``triton_op`` to the Triton kernels it launches, so the compiled artifact contains the
kernels and needs no Python to run them. These tests trace each op on fake tensors with
dynamic row counts (as an exported graph has them: atoms and edges vary) through
AOTAutograd's functionalisation, the step inductor starts from, and check that no opaque
FlashCart op is left and that each launch became a Triton-kernel node whose grid follows the
symbolic row count, and that inductor's analysis of each kernel (run for an sm_90 target)
finds it writing its results only: a kernel found writing an input makes inductor clone that
input around the launch and copy it back (the launch tables of the linear maps, once, which
the H200 then read corrupted). No kernel runs, so this needs neither a GPU nor the interpreter; under
``TRITON_INTERPRET=1`` (where the kernels are interpreted functions, which cannot be traced,
and the ops are plain custom ops) the tests run in a child process without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._functorch.aot_autograd import aot_export_module
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from flashcart.cartesian import EquivariantLinear
from flashcart.cartesian._backend import interpreter_enabled
from flashcart.cartesian._layout import edge_csr
from flashcart.cartesian._triton import ops
from flashcart.cartesian._triton.source import product_key, product_spec

INTERPRETED = interpreter_enabled()
uninterpreted = pytest.mark.skipif(INTERPRETED, reason="runs in test_without_the_interpreter's child process")


@pytest.mark.skipif(not INTERPRETED, reason="the tests below run in this process")
def test_without_the_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__).resolve())]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # every test below ran there (only this one skipped itself)
    assert proc.stdout.splitlines()[-1].startswith("14 passed, 1 skipped"), proc.stdout[-500:]


class _Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        out = self.fn(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _trace(fn, *real: torch.Tensor, static: tuple[int, ...] = ()) -> torch.fx.GraphModule:
    """``fn`` traced on fake copies of ``real`` whose first dimension is symbolic (except for
    the arguments whose positions are in ``static``)."""
    with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()) as mode:

        def fake(k, t):
            first = DimDynamic.STATIC if k in static else DimDynamic.DYNAMIC
            sizes = [first] + [DimDynamic.STATIC] * (t.dim() - 1)
            return mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes))

        graph, _ = aot_export_module(_Call(fn), tuple(fake(k, t) for k, t in enumerate(real)), trace_joint=False)
    return graph


# The arguments each kernel writes (its results); every other tensor argument is only read.
WRITES = {
    "tp_fwd": {"out_ptr"},
    "tp_bwd_edge": {"g1_ptr", "g2_ptr", "gw_ptr"},
    "tp_bwd_x1_csr": {"g1_ptr"},
    "tp_bwd_csr": {"g1_ptr", "g2_ptr", "gw_ptr"},
    "tp_dbwd_row": {"dgo_ptr", "dx1_ptr", "dx2_ptr", "dw_ptr"},
    "tp_dbwd_x1_csr": {"dx1_ptr"},
    "expansion_fwd": {"out_ptr"},
    "expansion_vjp": {"gu_ptr"},
    "expansion_second": {"dg_ptr", "du_ptr"},
    "grouped_matmul": {"c_ptr", "c2_ptr"},
}


def _assert_lowered(graph: torch.fx.GraphModule, kernels: int) -> None:
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert not [t for t in targets if "flashcart" in t], "an opaque FlashCart op is left in the traced graph"
    nodes = [n for n in graph.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    assert len(nodes) == kernels, [str(n.target) for n in nodes]
    for n in nodes:  # the grid follows the symbolic row count instead of the example's size
        grid = n.kwargs["grid"][0]
        assert any(isinstance(g, torch.fx.Node) for g in grid), grid
        name = kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__
        written = set(n.kwargs["tensors_to_clone"])
        assert written and written <= WRITES[name], f"inductor finds {name} writing {sorted(written)}"


class _Sm90:
    """Triton's active driver for the lowering's kernel analysis: an H100/H200 target on a
    machine without a GPU (the analysis generates each kernel's IR for the current target)."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


@pytest.fixture(autouse=True)
def _sm90_target():
    if INTERPRETED:
        yield
        return
    from triton.runtime import driver

    previous = driver._active  # None until a driver was asked for (there is none without a GPU)
    driver.set_active(_Sm90())
    try:
        yield
    finally:
        driver._active = previous


@uninterpreted
@pytest.mark.parametrize("conv", [True, False, "weight rows"], ids=["conv", "dense", "conv-weight-rows"])
@pytest.mark.parametrize("one_pass", [True, False], ids=["one-pass-bwd", "two-kernel-bwd"])
def test_tensor_product_and_its_backward_lower_to_kernels(conv, one_pass, monkeypatch):
    """``weight rows``: the weights read through an index (``widx``; ``wrows`` is not read by
    the kernels, only by the autograd formulas)."""
    monkeypatch.setattr(ops, "FUSED_CSR_BACKWARD", one_pass)
    key = product_key(2, 3, 2, False, False)
    spec, F, n, e = product_spec(key), 4, 7, 20
    torch.manual_seed(0)
    receivers = torch.randint(0, n, (e,)).sort().values
    senders = torch.randint(0, n, (e,))
    graph_tensors = (receivers, senders, *edge_csr(receivers, senders, n)) if conv else ()
    if conv == "weight rows":
        widx = torch.randperm(e) // 2
        wrows = torch.stack([(widx == r).nonzero()[:, 0] for r in range(e // 2)])
        graph_tensors += (widx, wrows)
    rows_out = n if conv else e
    x1 = torch.randn(n if conv else e, spec.in1_comps * F)
    x2, w = torch.randn(e, spec.in2_comps), torch.randn(e // 2 if conv == "weight rows" else e, spec.n_paths * F)
    go = torch.randn(rows_out, spec.n_out_blocks * F)

    def fn(x1, x2, w, go, *g):
        g = (None,) * 7 if not conv else g if len(g) == 7 else (*g, None, None)
        out = ops.tp_fwd.op(x1, x2, w, *g, key)
        return (out, *ops.tp_bwd.op(go, x1, x2, w, *g, key, True, True, True))

    # conv: forward, then the backward in one pass per sender (tp_bwd_csr) or as per-edge and
    # sender-grouped kernels; dense: forward, per-row backward
    _assert_lowered(_trace(fn, x1, x2, w, go, *graph_tensors), 3 if conv and not one_pass else 2)


@uninterpreted
def test_expansion_ops_lower_to_kernels():
    u = torch.nn.functional.normalize(torch.randn(11, 3), dim=1)
    g, v = torch.randn(11, 16), torch.randn(11, 3)

    def fn(u, g, v):
        return (ops.expansion_fwd.op(u, 3), ops.expansion_vjp.op(u, g, 3), *ops.expansion_second(u, g, v, 3))

    _assert_lowered(_trace(fn, u, g, v), 3)


@uninterpreted
def test_linear_ops_lower_to_kernels():
    lin = EquivariantLinear(2, 2, 4, 3, backend="triton")
    x, gy = torch.randn(9, lin.in_width), torch.randn(9, lin.out_width)
    w = torch.cat([p.detach().reshape(-1) for p in lin.weights])

    def fn(x, gy, w, table):
        key = lin.key
        return ops.lin_fwd.op(x, w, table, key), ops.lin_bwd_x.op(gy, w, table, key), ops.lin_bwd_w.op(gy, x, table, key)

    _assert_lowered(_trace(fn, x, gy, w, lin.launch_table, static=(2, 3)), 3)


@uninterpreted
def test_linear_pair_lowers_to_kernels():
    """``flashcart::lin_pair``, forward and input gradients: one kernel each, writing both outputs
    (``c_ptr`` and ``c2_ptr``) and nothing else."""
    first = EquivariantLinear(2, 2, 4, 4, in_paths=[2, 3, 3], backend="triton")
    second = EquivariantLinear(0, 2, 4, 4, backend="triton")
    x1, x2, gy = torch.randn(9, first.in_width), torch.randn(9, second.in_width), torch.randn(9, first.out_width)
    w1 = torch.cat([p.detach().reshape(-1) for p in first.weights])
    w2 = torch.cat([p.detach().reshape(-1) for p in second.weights])

    def fn(x1, x2, gy, w1, w2, t1, t2):
        keys = (first.key, second.key)
        return (*ops.lin_pair.op(x1, w1, x2, w2, t1, t2, *keys, ops.FWD), *ops.lin_pair.op(gy, w1, gy, w2, t1, t2, *keys, ops.BWD_X))

    graph = _trace(fn, x1, x2, gy, w1, w2, first.launch_table, second.launch_table, static=(3, 4, 5, 6))
    _assert_lowered(graph, 2)
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    for n in (n for n in graph.graph.nodes if "triton_kernel_wrapper" in str(n.target)):
        assert kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__ == "grouped_matmul"
        assert set(n.kwargs["tensors_to_clone"]) == {"c_ptr", "c2_ptr"}


@uninterpreted
@pytest.mark.parametrize("x1_atomic", [True, False])
def test_fused_double_backward_lowers_to_kernels(x1_atomic, monkeypatch):
    from flashcart.cartesian._triton import double_backward
    from flashcart.cartesian._triton.double_backward import tp_dbwd

    monkeypatch.setattr(double_backward, "X1_ATOMIC", x1_atomic)
    key = product_key(2, 3, 2, False, False)
    spec, F, n, e = product_spec(key), 4, 7, 20
    torch.manual_seed(0)
    receivers = torch.randint(0, n, (e,)).sort().values
    senders = torch.randint(0, n, (e,))
    csr = edge_csr(receivers, senders, n)
    x1, x2, w = torch.randn(n, spec.in1_comps * F), torch.randn(e, spec.in2_comps), torch.randn(e, spec.n_paths * F)
    go = torch.randn(n, spec.n_out_blocks * F)
    gg1, gg2, ggw = torch.randn_like(x1), torch.randn_like(x2), torch.randn_like(w)

    def fn(go, x1, x2, w, gg1, gg2, ggw, receivers, senders, rowptr, perm, srowptr):
        return tp_dbwd(go, x1, x2, w, gg1, gg2, ggw, receivers, senders, rowptr, perm, srowptr, None, None, key, True, True, True, True)

    # the receiver pass (d go, d x2, d w, and d x1 by atomic adds: inductor must see that
    # write too), or it and the sender pass (d x1, FLASHCART_FUSED_DOUBLE_BACKWARD=sender)
    graph = _trace(fn, go, x1, x2, w, gg1, gg2, ggw, receivers, senders, *csr)
    _assert_lowered(graph, 1 if x1_atomic else 2)
    written = set().union(*(n.kwargs["tensors_to_clone"] for n in graph.graph.nodes if "triton_kernel_wrapper" in str(n.target)))
    assert "dx1_ptr" in written


class _Captured(Exception):
    pass


@uninterpreted
@pytest.mark.parametrize("inline", [False, True])
def test_compiled_calls_inline_the_ops_unless_asked_not_to(monkeypatch, inline):
    """Under the Predictor's compile settings, ``torch.compile`` keeps each Triton op as one
    opaque call with ``FLASHCART_INLINE_TRITON_OPS=0``, else (the default) its kernel launches."""
    from torch._dynamo.backends.common import aot_autograd

    from flashcart.model.predictor import _compile_context

    if inline:
        monkeypatch.delenv("FLASHCART_INLINE_TRITON_OPS", raising=False)  # the default
    else:
        monkeypatch.setenv("FLASHCART_INLINE_TRITON_OPS", "0")
    key = product_key(2, 3, 2, False, False)
    spec, F, e = product_spec(key), 4, 20
    x1, x2, w = torch.randn(e, spec.in1_comps * F), torch.randn(e, spec.in2_comps), torch.randn(e, spec.n_paths * F)
    graphs = []

    def capture(gm, _):  # the forward graph inductor would get; stop before a kernel runs
        graphs.append(gm)
        raise _Captured

    def fn(x1, x2, w):
        return ops.tp_fwd.op(x1, x2, w, None, None, None, None, None, None, None, key) * 2.0

    torch._dynamo.reset()
    try:
        with _compile_context(True), pytest.raises(torch._dynamo.exc.BackendCompilerFailed):
            torch.compile(fn, backend=aot_autograd(fw_compiler=capture), fullgraph=True)(x1, x2, w)
    finally:
        torch._dynamo.reset()
    assert graphs
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    opaque = [t for t in targets if "flashcart" in t]
    kernels = [t for t in targets if "triton_kernel_wrapper" in t]
    assert (kernels and not opaque) if inline else (opaque and not kernels), targets


def test_inline_setting_is_checked(monkeypatch):
    from flashcart.model.predictor import inline_triton_ops

    monkeypatch.setenv("FLASHCART_INLINE_TRITON_OPS", "yes")
    with pytest.raises(ValueError, match="FLASHCART_INLINE_TRITON_OPS"):
        inline_triton_ops()
