"""Triton backend == generated PyTorch backend: forward, backward, double backward.

On CPU these run under TRITON_INTERPRET=1 (the README's test command sets it); on the GPU
machine the ``gpu`` variants run the compiled kernels on CUDA tensors.
"""

import os

import pytest
import torch

from flashcart.cartesian import DirectionExpansion, EquivariantLinear, TensorProduct
from flashcart.cartesian._backend import triton_available
from flashcart.testing import assert_close

from .triton_devices import DEVICES, needs_triton

TOL = {torch.float64: (1e-12, 1e-10), torch.float32: (2e-5, 2e-4)}

CASES = [
    # l1, l2, lout, F1, F2, symmetric, shared, reduce
    (2, 3, 2, 3, 1, False, False, False),
    (2, 3, 3, 3, 3, False, False, True),
    (1, 2, 2, 1, 2, False, True, False),
    (2, 2, 2, 2, 2, True, False, True),
    (3, 3, 3, 2, 2, False, False, True),
]


@pytest.fixture(params=["eager", "custom_op"])
def dispatch(request, monkeypatch):
    """Both call paths of the Triton ops: plain autograd Functions (eager) and the
    ``torch.library`` custom ops that compiled graphs use."""
    if request.param == "custom_op":
        import flashcart.cartesian._triton.ops as ops

        monkeypatch.setattr(ops, "_eager_ok", lambda first: False)
    return request.param


def _graph(n_nodes, n_edges, device):
    g = torch.Generator().manual_seed(1)
    receivers = torch.sort(torch.randint(0, n_nodes, (n_edges,), generator=g)).values
    senders = torch.randint(0, n_nodes, (n_edges,), generator=g)
    receivers[-1] = n_nodes - 2  # leave the last node without incoming edges
    receivers = torch.sort(receivers).values
    return receivers.to(device), senders.to(device)


def _pair(cls, *args, **kw):
    ref = cls(*args, backend="torch", **kw)
    tri = cls(*args, backend="triton", **kw)
    tri.load_state_dict(ref.state_dict())
    return ref, tri


def _compare_to_second_order(fn_ref, fn_tri, inputs, dtype):
    """Outputs, VJPs and the derivative of a VJP-based scalar (force-training pattern)."""
    tol1, tol2 = TOL[dtype]
    results = []
    for fn in (fn_ref, fn_tri):
        xs = [t.detach().clone().requires_grad_() for t in inputs]
        out = fn(*xs)
        cot = torch.sin(torch.arange(out.numel(), dtype=dtype, device=out.device)).reshape(out.shape)
        grads = torch.autograd.grad(out, xs, cot, create_graph=True)
        # scalar of the first derivatives, differentiated again (like a force loss)
        s = sum((g * torch.cos(torch.arange(g.numel(), dtype=dtype, device=g.device)).reshape(g.shape)).sum() for g in grads)
        second = torch.autograd.grad(s, xs, allow_unused=True)
        results.append((out, grads, second))
    (o_r, g_r, s_r), (o_t, g_t, s_t) = results
    assert_close(o_t, o_r, tol1, "forward")
    for a, b in zip(g_t, g_r):
        assert_close(a, b, tol1, "backward")
    for a, b in zip(s_t, s_r):
        if b is None:
            assert a is None or a.abs().max() == 0
        else:
            assert_close(a, b, tol2, "double backward")


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("conv", [False, "conv", "conv, two-kernel backward"], ids=["dense", "conv", "conv-two-kernel-bwd"])
def test_tensor_product_parity(case, conv, device, dispatch, monkeypatch):
    """Convolutions run their backward both ways: one pass per sender (``tp_bwd_csr``, default)
    and the two kernels (``tp_bwd_edge`` then ``tp_bwd_x1_csr``)."""
    dtype = torch.float64
    l1, l2, lo, f1, f2, sym, shared, red = case
    if sym and conv:
        pytest.skip("symmetric products are dense")
    if conv == "conv, two-kernel backward":
        import flashcart.cartesian._triton.ops as ops

        monkeypatch.setattr(ops, "FUSED_CSR_BACKWARD", False)
    ref, tri = _pair(TensorProduct, l1, l2, lo, f1, f2, symmetric=sym, shared_weights=shared, reduce_paths=red)
    n_nodes, n_edges = 4, 7
    rows = n_edges if conv else n_nodes
    x1 = torch.randn(n_nodes, ref.in1_width, dtype=dtype, device=device)
    x2 = torch.randn(rows, ref.in2_width, dtype=dtype, device=device)
    w = torch.randn(*(() if shared else (rows,)), ref.weight_numel, dtype=dtype, device=device)
    if sym:
        inputs = [x1, w]
        make = lambda m: lambda a, c: m(a, a, c)  # noqa: E731
    elif conv:
        receivers, senders = _graph(n_nodes, n_edges, device)
        inputs = [x1, x2, w]
        make = lambda m: lambda a, b, c: m(a, b, c, receivers, senders)  # noqa: E731
    else:
        inputs = [x1, x2, w]
        make = lambda m: m  # noqa: E731
    _compare_to_second_order(make(ref), make(tri), inputs, dtype)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("F", [20, 64, 300], ids=["F20", "F64", "F300-channel-blocks"])
def test_csr_backward_one_pass_equals_two_kernels(F, device, monkeypatch):
    """``tp_bwd_csr`` against ``tp_bwd_edge`` + ``tp_bwd_x1_csr`` at the published models' channel
    counts (input 2's channel sum in-kernel, one program per sender) and beyond 256 channels
    (channel blocks, the sum by the caller); every subset of gradients with input 1's."""
    import flashcart.cartesian._triton.ops as ops
    from flashcart.cartesian import edge_csr
    from flashcart.cartesian._triton.source import product_key

    dtype = torch.float64
    tp = TensorProduct(2, 3, 3, F, 1, backend="triton")
    n_nodes, n_edges = 6, 15
    receivers, senders = _graph(n_nodes, n_edges, device)
    csr = edge_csr(receivers, senders, n_nodes)
    g = torch.Generator().manual_seed(3)
    x1 = torch.randn(n_nodes, tp.in1_width, dtype=dtype, generator=g).to(device)
    x2 = torch.randn(n_edges, tp.in2_width, dtype=dtype, generator=g).to(device)
    w = torch.randn(n_edges, tp.weight_numel, dtype=dtype, generator=g).to(device)
    go = torch.randn(n_nodes, tp.out_width, dtype=dtype, generator=g).to(device)
    args = (go, x1, x2, w, receivers, senders, *csr, None, None, product_key(2, 3, 3, False, False))
    for need in [(True, True, True), (True, True, False), (True, False, True)]:
        results = []
        for fused in (True, False):
            monkeypatch.setattr(ops, "FUSED_CSR_BACKWARD", fused)
            results.append(ops.tp_bwd(*args, *need))
        for a, b, what in zip(*results, ("x1", "x2", "w")):
            assert a.shape == b.shape, what
            if a.numel():
                assert_close(a, b, 1e-12, f"gradient of {what}, needs {need}")


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("F", [3, 20, 300], ids=["F3", "F20", "F300-channel-blocks"])
@pytest.mark.parametrize("l_in", [0, 2], ids=["first-convolution", "l1-2"])
@pytest.mark.parametrize("rows", [False, True], ids=["per-edge", "weight-rows"])
def test_sender_walk_without_input_1_gradient_equals_per_edge(rows, l_in, F, device, monkeypatch):
    """``FLASHCART_SENDER_WALK_BACKWARD=1``: a convolution backward without input 1's gradient
    (a first convolution's) as the split sender walk (``tp_bwd_csr``, input 1's gradient dropped)
    against one program per edge (``tp_bwd_edge``), float64 1e-12: every subset of input 2's and
    the weights' gradients, weights per edge or per row (the kernels adding each listed edge's
    gradient into its row), a node without edges, channel blocks past 256 channels."""
    import flashcart.cartesian._triton.ops as ops
    from flashcart.cartesian import edge_csr
    from flashcart.cartesian._triton.source import product_key

    from .test_weight_rows import N_EDGES, N_NODES, _rows

    dtype = torch.float64
    tp = TensorProduct(l_in, 3, 3, F, 1, backend="triton")
    receivers, senders = _graph(N_NODES, N_EDGES, device)
    senders = torch.where(senders == N_NODES - 1, 0, senders)  # the last node sends nothing
    csr = edge_csr(receivers, senders, N_NODES)
    weight_rows, n_rows = _rows(device) if rows else (None, N_EDGES)
    g = torch.Generator().manual_seed(31)
    x1 = torch.randn(N_NODES, tp.in1_width, dtype=dtype, generator=g).to(device)
    x2 = torch.randn(N_EDGES, tp.in2_width, dtype=dtype, generator=g).to(device)
    w = torch.randn(n_rows, tp.weight_numel, dtype=dtype, generator=g).to(device)
    go = torch.randn(N_NODES, tp.out_width, dtype=dtype, generator=g).to(device)
    widx, wrows = (weight_rows.index, weight_rows.edges) if rows else (None, None)
    args = (go, x1, x2, w, receivers, senders, *csr, widx, wrows, product_key(l_in, 3, 3, False, False))
    walks = []
    launch = ops._bwd_csr
    monkeypatch.setattr(ops, "_bwd_csr", lambda *a: walks.append(1) or launch(*a))
    for need in [(False, True, True), (False, True, False), (False, False, True)]:
        results = []
        for walk in (True, False):
            monkeypatch.setattr(ops, "SENDER_WALK_BACKWARD", walk)
            results.append(ops.tp_bwd(*args, *need))
        assert len(walks) == 1, "the sender walk ran once, with the switch on"
        walks.clear()
        for a, b, what in zip(*results, ("x1", "x2", "w")):
            assert a.shape == b.shape, what
            if a.numel():
                assert a.abs().max() > 0, what
                assert_close(a, b, 1e-12, f"gradient of {what}, needs {need}")


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("F", [3, 20, 70], ids=["F3", "F20", "F70-channel-blocks"])
def test_pipelined_forward_equals_plain(F, device, monkeypatch):
    """``tp_fwd``'s receiver walk software pipelined (``FLASHCART_TP_PIPELINE=1``: the next edge's
    operands loaded a step ahead) against the plain walk, on a graph with a receiver without
    edges, weights per edge and read through an index, and a second-order check against the
    PyTorch backend. (Dense products walk one row per program: they never pipeline.)"""
    import flashcart.cartesian._triton.ops as ops
    from flashcart.cartesian import WeightRows

    dtype = torch.float64
    ref, tri = _pair(TensorProduct, 2, 3, 3, F, 1)
    n_nodes, n_edges = 5, 12
    g = torch.Generator().manual_seed(5)
    x1 = torch.randn(n_nodes, tri.in1_width, dtype=dtype, generator=g).to(device)
    x2 = torch.randn(n_edges, tri.in2_width, dtype=dtype, generator=g).to(device)
    w = torch.randn(n_edges, tri.weight_numel, dtype=dtype, generator=g).to(device)
    graph = _graph(n_nodes, n_edges, device)
    # edges 2k and 2k+1 read row k of six weight rows
    shared = WeightRows(torch.arange(n_edges, device=device) // 2, torch.arange(n_edges, device=device).view(-1, 2))
    outs = {}
    for pipelined in (False, True):
        monkeypatch.setattr(ops, "TP_PIPELINE", pipelined)
        outs[pipelined] = (tri(x1, x2, w, *graph), tri(x1, x2, w[: n_edges // 2], *graph, weight_rows=shared))
    for plain, piped in zip(outs[False], outs[True]):
        assert_close(piped, plain, 1e-12, "pipelined forward")
    _compare_to_second_order(lambda a, b, c: ref(a, b, c, *graph), lambda a, b, c: tri(a, b, c, *graph), [x1, x2, w], dtype)


def _conv_problem(ref, tri, device, seed, weights="edge", n_nodes=5, n_edges=24):
    """float64 inputs ``[x1, x2, w]`` of a convolution on :func:`_graph` and the two calls
    ``(fn_ref, fn_tri)`` taking them. ``weights``: ``"edge"`` (a row per edge), ``"rows"`` (edges
    2k and 2k+1 read row k, the Triton call through ``WeightRows``) or ``"shared"`` (1-D)."""
    from flashcart.cartesian import WeightRows

    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(n_nodes, tri.in1_width, dtype=torch.float64, generator=g).to(device)
    x2 = torch.randn(n_edges, tri.in2_width, dtype=torch.float64, generator=g).to(device)
    lead = {"edge": (n_edges,), "rows": (n_edges // 2,), "shared": ()}[weights]
    w = torch.randn(*lead, tri.weight_numel, dtype=torch.float64, generator=g).to(device)
    graph = _graph(n_nodes, n_edges, device)
    if weights == "rows":
        rows = WeightRows(torch.arange(n_edges, device=device) // 2, torch.arange(n_edges, device=device).view(-1, 2))
        return (
            [x1, x2, w],
            (lambda a, b, c: ref(a, b, c.index_select(0, rows.index), *graph)),
            (lambda a, b, c: tri(a, b, c, *graph, weight_rows=rows)),
        )
    return [x1, x2, w], (lambda a, b, c: ref(a, b, c, *graph)), (lambda a, b, c: tri(a, b, c, *graph))


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "splits, variant",
    [
        (2, "one-pass backward"),
        (3, "two-kernel backward"),
        (5, "weight rows"),
        (4, "shared weights"),
        (2, "F70, channel blocks"),
    ],
)
def test_split_walks_equal_the_reference(splits, variant, device, monkeypatch):
    """Each node's edges walked by several programs (``SPLITS``: partial sums per node, added by
    the launcher) in the forward, the backward's sender walks (``TP_SPLITS``) and both passes of
    the fused double backward (``DBWD_SPLITS``, one more): forward and backward at 1e-12, double backward at 1e-10 in float64 against the
    PyTorch backend. The graph has a node without edges and parts without edges (5 splits of
    degrees below 5)."""
    import flashcart.cartesian._triton.common as common
    import flashcart.cartesian._triton.ops as ops

    monkeypatch.setattr(common, "TP_SPLITS", splits)
    monkeypatch.setattr(common, "DBWD_SPLITS", splits + 1)
    monkeypatch.setattr(ops, "FUSED_CSR_BACKWARD", variant != "two-kernel backward")
    F = 70 if variant.startswith("F70") else 3
    ref, tri = _pair(TensorProduct, 2, 3, 3, F, 1, shared_weights=variant == "shared weights")
    weights = {"weight rows": "rows", "shared weights": "shared"}.get(variant, "edge")
    inputs, fn_ref, fn_tri = _conv_problem(ref, tri, device, seed=8, weights=weights)
    _compare_to_second_order(fn_ref, fn_tri, inputs, torch.float64)


@pytest.mark.parametrize("variable, default", [("FLASHCART_TP_SPLITS", None), ("FLASHCART_DBWD_SPLITS", 4)])
def test_splits_mode_from_environment(variable, default, monkeypatch):
    from flashcart.cartesian._triton.common import AUTO_SPLITS, splits_mode

    default = AUTO_SPLITS if default is None else default  # FLASHCART_TP_SPLITS: auto
    for raw, want in (("", default), ("1", 1), ("4", 4), ("16", 16)):
        monkeypatch.setenv(variable, raw)
        assert splits_mode(variable) == want
    tp = variable == "FLASHCART_TP_SPLITS"
    if tp:
        monkeypatch.setenv(variable, "auto")
        assert splits_mode(variable) == AUTO_SPLITS
    for raw in ("0", "17", "-2", "Auto", *(() if tp else ("auto",))):
        monkeypatch.setenv(variable, raw)
        also = " or 'auto'" if tp else ""
        with pytest.raises(ValueError, match=f"{variable} must be an integer from 1 to 16{also}, got '{raw}'"):
            splits_mode(variable)


def test_auto_splits_follow_the_path_count(monkeypatch):
    """``FLASHCART_TP_SPLITS=auto``: 16 // paths walk splits, 1 to 4, for the forward and backward
    walks of convolutions only, or 4 with static shapes at up to 32 channels (one warp a
    program); the double backward keeps ``DBWD_SPLITS``."""
    import flashcart.cartesian._triton.common as common

    for static in (False, True):
        assert [common.auto_splits(n, static=static) for n in (1, 4, 5, 8, 9, 17, 23)] == [4, 4, 3, 2, 1, 1, 1]
        assert [common.auto_splits(n, 64, static) for n in (4, 8, 17)] == [4, 2, 1]
    assert [common.auto_splits(n, 20, False) for n in (4, 8, 17)] == [4, 2, 1]
    assert [common.auto_splits(n, c, True) for n in (4, 8, 17) for c in (1, 20, 32)] == [4] * 9
    monkeypatch.setattr(common, "TP_SPLITS", common.AUTO_SPLITS)
    monkeypatch.setattr(common, "DBWD_SPLITS", 3)
    for static in (False, True):
        monkeypatch.setattr(common, "STATIC_SHAPES", static)
        assert common.walk_splits(True, 4) == 4 and common.walk_splits(True, 17) == 1
        assert common.walk_splits(True, 17, channels=20) == (4 if static else 1)
        assert common.walk_splits(True, 17, channels=64) == 1
        assert common.walk_splits(False, 4, channels=20) == 1  # dense: a row is one step
        assert common.walk_splits(True, 17, double_backward=True, channels=20) == 3
    monkeypatch.setattr(common, "TP_SPLITS", 2)
    assert common.walk_splits(True, 17, channels=20) == 2  # a number: every walk alike


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_auto_split_walks_equal_the_reference(device, monkeypatch):
    """A 4-path convolution (rank-0 node features with edge attributes to rank 3, as the first
    interaction's) under ``FLASHCART_TP_SPLITS=auto`` walks each node's edges in 4 programs and
    still matches the PyTorch backend to second order (float64)."""
    import flashcart.cartesian._triton.common as common
    import flashcart.cartesian._triton.ops as ops

    monkeypatch.setattr(common, "TP_SPLITS", common.AUTO_SPLITS)
    seen = []  # the splits whose partial sums the forward and the backward's sender walk add

    def sum_splits(t, splits):
        seen.append(splits)
        return common.sum_splits(t, splits)

    monkeypatch.setattr(ops, "_sum_splits", sum_splits)
    ref, tri = _pair(TensorProduct, 0, 3, 3, 3, 1)
    assert len(tri.paths) == 4 and common.walk_splits(True, len(tri.paths)) == 4
    inputs, fn_ref, fn_tri = _conv_problem(ref, tri, device, seed=9)
    _compare_to_second_order(fn_ref, fn_tri, inputs, torch.float64)
    assert seen and set(seen) == {4}


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits, variant", [(1, "one-pass backward"), (1, "two-kernel backward"), (5, "weight rows")])
def test_index_prefetch_equals_the_reference(splits, variant, device, monkeypatch):
    """The node walks with and without their index prefetch (``FLASHCART_INDEX_PREFETCH``: the
    sender walks of the backward and the double backward load ``perm``/``recv`` up to two edges
    ahead, the double backward's receiver walk ``send`` one edge ahead) match the PyTorch backend
    to second order in float64. With 5 splits some programs walk one edge or none, where the
    prefetch's masked loads past the end are all there is."""
    import flashcart.cartesian._triton.common as common
    import flashcart.cartesian._triton.ops as ops

    monkeypatch.setattr(common, "TP_SPLITS", splits)
    monkeypatch.setattr(common, "DBWD_SPLITS", splits)
    monkeypatch.setattr(ops, "FUSED_CSR_BACKWARD", variant != "two-kernel backward")
    ref, tri = _pair(TensorProduct, 2, 3, 3, 3, 1)
    weights = "rows" if variant == "weight rows" else "edge"
    inputs, fn_ref, fn_tri = _conv_problem(ref, tri, device, seed=10, weights=weights)
    for prefetch in ("0", "1"):  # "auto" picks per kernel among these
        monkeypatch.setattr(common, "INDEX_PREFETCH", prefetch)
        _compare_to_second_order(fn_ref, fn_tri, inputs, torch.float64)


def test_index_prefetch_mode_and_auto_rule(monkeypatch):
    """``FLASHCART_INDEX_PREFETCH``: ``0``, ``1``, ``auto`` or unset (``auto``); anything else is an
    error naming it. ``auto``: the backward's one-pass sender walk prefetches with one warp per
    program (up to 32 channels), the sender walks of the two-kernel backward and the double
    backward always, the double backward's receiver walk never."""
    import flashcart.cartesian._triton.common as common

    for raw, want in (("0", "0"), ("1", "1"), ("auto", "auto"), ("", "auto")):
        monkeypatch.setenv("FLASHCART_INDEX_PREFETCH", raw)
        assert common._index_prefetch_mode() == want
    monkeypatch.setenv("FLASHCART_INDEX_PREFETCH", "yes")
    with pytest.raises(ValueError, match="FLASHCART_INDEX_PREFETCH must be one of 0, 1, auto, got 'yes'"):
        common._index_prefetch_mode()
    kernels = ("tp_bwd_x1_csr", "tp_bwd_csr", "tp_dbwd_x1_csr", "tp_dbwd_row")
    monkeypatch.setattr(common, "INDEX_PREFETCH", "auto")
    assert [common.index_prefetch(k, 32) for k in kernels] == [True, True, True, False]
    assert [common.index_prefetch(k, 64) for k in kernels] == [True, False, True, False]
    for mode in ("0", "1"):
        monkeypatch.setattr(common, "INDEX_PREFETCH", mode)
        assert {common.index_prefetch(k, b) for k in kernels for b in (16, 64)} == {mode == "1"}


@pytest.mark.parametrize(
    "variable, module, reader, default",
    [
        ("FLASHCART_TP_PIPELINE", "ops", "_pipeline_mode", True),
        ("FLASHCART_FUSED_CSR_BACKWARD", "ops", "_csr_backward_mode", True),
        ("FLASHCART_SENDER_WALK_BACKWARD", "ops", "_sender_walk_mode", False),
        ("FLASHCART_STATIC_SHAPES", "signatures", "_static_shapes_mode", True),
        ("FLASHCART_LINEAR_PAIRS", "ops", "_linear_pairs_mode", True),
        ("FLASHCART_LINEAR_UNIT", "ops", "_linear_unit_mode", True),
    ],
)
def test_switch_modes_from_environment(variable, module, reader, default, monkeypatch):
    """The kernels' on/off switches: ``0``, ``1`` or unset (the default); anything else is an error naming the variable."""
    import importlib

    mod = importlib.import_module(f"flashcart.cartesian._triton.{module}")
    for raw, want in (("0", False), ("1", True), ("", default)):
        monkeypatch.setenv(variable, raw)
        assert getattr(mod, reader)() is want
    monkeypatch.setenv(variable, "on")
    with pytest.raises(ValueError, match=f"{variable} must be 0 or 1, got 'on'"):
        getattr(mod, reader)()


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_expansion_parity(device, dispatch):
    r = torch.randn(10, 3, dtype=torch.float64, device=device)
    ref, tri = _pair(DirectionExpansion, 3)
    _compare_to_second_order(ref, tri, [r], torch.float64)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_linear_parity(device, dispatch):
    ref, tri = _pair(EquivariantLinear, 3, 2, 3, 5, in_paths=[2, 1, 3, 1])
    ref, tri = ref.to(device, torch.float64), tri.to(device, torch.float64)
    x = torch.randn(6, ref.in_width, dtype=torch.float64, device=device)
    ws = [p.detach() for p in ref.weights]

    def call(m):
        def fn(x, *w):
            return torch.func.functional_call(m, {f"weights.{i}": wi for i, wi in enumerate(w)}, (x,))

        return fn

    _compare_to_second_order(call(ref), call(tri), [x, *ws], torch.float64)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tiles", ["16x16x16x1", "32x16x32x2x2", "64x64x16x4x3"])
@pytest.mark.parametrize("unit", [True, False])
@pytest.mark.parametrize("features", [(9, 20), (8, 12)])
def test_linear_parity_for_other_tile_shapes(device, tiles, unit, features, monkeypatch):
    """FLASHCART_LINEAR_TILES shapes (several tiles per group, K steps with a masked tail, a
    row count that is no multiple of the tile), with the contiguous axes compiled as such or
    not (FLASHCART_LINEAR_UNIT; 9 input channels: no alignment, 8 -> 12: 4-element alignment):
    output, input and weight gradients equal the PyTorch backend's."""
    import flashcart.cartesian._triton.ops as ops
    from flashcart.cartesian._triton.linear_kernel import linear_tiles

    monkeypatch.setattr(ops, "LINEAR_TILES", linear_tiles(tiles))
    monkeypatch.setattr(ops, "LINEAR_UNIT", unit)
    ref, tri = _pair(EquivariantLinear, 3, 2, *features, in_paths=[2, 3, 1, 2])
    ref, tri = ref.to(device, torch.float64), tri.to(device, torch.float64)
    x = torch.randn(37, ref.in_width, dtype=torch.float64, device=device)
    gy = torch.randn(37, ref.out_width, dtype=torch.float64, device=device)
    results = []
    for m in (ref, tri):
        xi = x.clone().requires_grad_()
        y = m(xi)
        grads = torch.autograd.grad(y, [xi, *m.weights], gy)
        results.append((y, *grads))
    for a, b in zip(*results):
        assert_close(b, a, 1e-12, "linear map with other tiles")


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_linear_matmul_route_takes_the_maps_it_names(device, monkeypatch):
    """FLASHCART_LINEAR_MATMUL: ``scalar`` runs the maps mixing rank 0 only, with at least
    ``MATMUL_MIN_FLOPS`` per row, as matrix products and the others through the grouped kernel,
    ``1`` every map, ``0`` none; all give the kernel path's output and gradients (float64, 1e-12),
    and the kernel is launched for exactly the maps not routed."""
    import flashcart.cartesian._triton.ops as ops

    monkeypatch.setattr(ops, "MATMUL_MIN_FLOPS", 96)
    small = EquivariantLinear(0, 0, 3, 4, backend="triton").to(device, torch.float64)  # 2 * 3 * 4 = 24 FLOP per row
    scalar = EquivariantLinear(2, 0, 4, 6, backend="triton").to(device, torch.float64)  # mixes rank 0 only; 2 * 4 * 6 = 48: below
    scalar_wide = EquivariantLinear(0, 3, 8, 6, in_paths=[2], backend="triton").to(device, torch.float64)  # 2 * 16 * 6 = 192
    ranks = EquivariantLinear(3, 2, 9, 20, in_paths=[2, 3, 1, 2], backend="triton").to(device, torch.float64)
    maps = (small, scalar, scalar_wide, ranks)
    assert [ops.linear_flops_per_row(m) for m in maps] == [24, 48, 192, 2 * 20 * (18 + 3 * 27 + 5 * 9)]
    xs = [torch.randn(11, m.in_width, dtype=torch.float64, device=device) for m in maps]

    def results():
        out = []
        for m, x in zip(maps, xs):
            xi = x.clone().requires_grad_()
            y = m(xi)
            out.append((y, *torch.autograd.grad(y, [xi, *m.weights], torch.ones_like(y) + y.detach())))
        return out

    launched = []
    real = ops._launch_grouped

    def counted(a, b, c, table, key, *rest, **kw):
        launched.append(key)
        return real(a, b, c, table, key, *rest, **kw)

    monkeypatch.setattr(ops, "_launch_grouped", counted)
    expected = {"0": {m.key for m in maps}, "scalar": {small.key, scalar.key, ranks.key}, "1": set()}
    outs = {}
    for mode, keys in expected.items():
        launched.clear()
        monkeypatch.setattr(ops, "LINEAR_MATMUL", mode)
        outs[mode] = results()
        assert set(launched) == keys, mode
    for mode in ("scalar", "1"):
        for a, b in zip(outs["0"], outs[mode]):
            for u, v in zip(a, b):
                assert_close(v, u, 1e-12, f"linear maps with FLASHCART_LINEAR_MATMUL={mode}")


def test_linear_matmul_mode_from_environment(monkeypatch):
    from flashcart.cartesian._triton import ops

    for raw, want in (("0", "0"), ("", "scalar"), ("1", "1"), ("scalar", "scalar")):
        monkeypatch.setenv("FLASHCART_LINEAR_MATMUL", raw)
        assert ops._linear_matmul_mode() == want
    for raw in ("on", "100", "100kF"):
        monkeypatch.setenv("FLASHCART_LINEAR_MATMUL", raw)
        with pytest.raises(ValueError, match=f"FLASHCART_LINEAR_MATMUL must be 0, 1 or scalar, got '{raw}'"):
            ops._linear_matmul_mode()


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rule, splits", [((0, 64), 1), ((2048, 8), 4), ((2048, 1), 37), ((6, 1), 2)])
def test_weight_gradient_split_rules(device, rule, splits, monkeypatch):
    """The weight gradient's reduction split into partial sums (ops.WeightGradSplit: a programs
    target, rows per split; a K chunk per split that is no multiple of the K step, splits whose
    chunk is empty; the map has 3 weight-gradient tiles, so a target of 6 programs gives 2
    splits) equals the PyTorch backend's, whatever the number of splits."""
    import flashcart.cartesian._triton.ops as ops

    monkeypatch.setattr(ops, "WEIGHT_GRAD_SPLIT", ops.WeightGradSplit(*rule))
    ref, tri = _pair(EquivariantLinear, 3, 2, 9, 20, in_paths=[2, 3, 1, 2])
    ref, tri = ref.to(device, torch.float64), tri.to(device, torch.float64)
    assert int(ops.weight_grad_split(tri.key, 37)) == splits
    x = torch.randn(37, ref.in_width, dtype=torch.float64, device=device)
    gy = torch.randn(37, ref.out_width, dtype=torch.float64, device=device)
    grads = [torch.autograd.grad(m(x), list(m.weights), gy) for m in (ref, tri)]
    for a, b in zip(*grads):
        assert_close(b, a, 1e-12, f"weight gradient in {splits} splits")


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rule, fwd_splits, bwd_splits", [((0, 2), 1, 1), ((4096, 1), 3, 2), ((4096, 2), 1, 1), ((30, 1), 2, 2)])
def test_forward_and_input_gradient_split_rules(device, rule, fwd_splits, bwd_splits, monkeypatch):
    """The forward's and the input gradient's reductions split into partial sums
    (ops.RowMapSplit: a programs target, K steps per split; the forward's widest K is 3 paths x
    20 channels = 60, the input gradient's 40; with 16-wide K steps a 60-long K in 3 splits has
    chunks of 32, 28 and none) equal the PyTorch backend's, ranks no path reaches included."""
    import flashcart.cartesian._triton.ops as ops
    from flashcart.cartesian._linear_spec import BWD_X, FWD

    monkeypatch.setattr(ops, "ROW_MAP_SPLIT", ops.RowMapSplit(*rule))
    monkeypatch.setattr(ops, "LINEAR_TILES", ops.linear_tiles("32x32x16x4x2"))
    ref, tri = _pair(EquivariantLinear, 2, 3, 20, 40, in_paths=[2, 3, 1])  # rank 3 of the output: no path
    ref, tri = ref.to(device, torch.float64), tri.to(device, torch.float64)
    n = 23  # 16 forward tiles (rows 23, 69, 115 over 32, two column tiles) and 8 input-gradient ones: (30, 1) gives 2 splits each
    assert int(ops.row_map_split(tri.key, FWD, n)) == fwd_splits and int(ops.row_map_split(tri.key, BWD_X, n)) == bwd_splits
    x = torch.randn(n, ref.in_width, dtype=torch.float64, device=device, requires_grad=True)
    gy = torch.randn(n, ref.out_width, dtype=torch.float64, device=device)
    outs = [m(x) for m in (ref, tri)]
    assert_close(outs[1], outs[0], 1e-12, f"forward in {fwd_splits} splits")
    grads = [torch.autograd.grad(y, x, gy)[0] for y in outs]
    assert_close(grads[1], grads[0], 1e-12, f"input gradient in {bwd_splits} splits")


def run_compile_check(*args: str, **env: str) -> list[str]:
    """``python -m flashcart.cartesian._triton.compile_check ARGS`` in a child process without
    ``TRITON_INTERPRET`` (the interpreter replaces ``@triton.jit``), with the environment variables
    ``env`` set; its output lines, after checking that it succeeded."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    child = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    run = subprocess.run(
        [sys.executable, "-m", "flashcart.cartesian._triton.compile_check", *args], env=child, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.splitlines()


@pytest.mark.skipif(not triton_available(), reason="needs triton")
def test_instruction_counts_of_the_first_convolution():
    """``compile_check --instructions`` on the first convolution's kernels (scalar node features,
    edge ranks 0..3, 32 channels, a table): the forward sums nothing across channels; the per-edge
    backward and the sender walk sum each edge's 16 input-2 components and ``t``'s gradient over
    the warp's 32 lanes, 17 sums of 5 shuffles each; nothing spills."""
    counts = {}
    for line in run_compile_check("--key", "0,3,3,0,0", "--block-f", "32", "--only", "table", "--instructions"):
        label, _, fields = line.partition(" REG:")
        counts[label.strip()] = dict(f.split(":") for f in ("REG:" + fields).split())
    assert {"tp_fwd conv, pipelined, table", "tp_bwd_edge conv g2+gw, slopes, table", "tp_bwd_csr g1+g2+gw, slopes, table"} <= counts.keys()
    for label, c in counts.items():
        assert int(c["all"]) == sum(int(c[k]) for k in ("fp", "load", "store", "shuffle", "spill", "other")), label
        assert int(c["fp"]) > 0 and int(c["load"]) > 0 and c["spill"] == "0", label
    assert counts["tp_fwd conv, pipelined, table"]["shuffle"] == "0"
    assert counts["tp_bwd_edge conv g2+gw, slopes, table"]["shuffle"] == str(17 * 5)
    assert counts["tp_bwd_csr g1+g2+gw, slopes, table"]["shuffle"] == str(17 * 5)


@pytest.mark.skipif(not triton_available(), reason="needs triton")
def test_linear_kernel_compiles_for_sm90_without_spills():
    """The grouped matmul compiled for sm_90 (bundled ptxas, no GPU, a process without
    TRITON_INTERPRET) keeps its default tiles in registers, float32 and float64 (with 64-bit
    index division the old 32x32x32 float32 tile used 255 registers and spilled 112 bytes; the
    wide tile without tl.dot, in float64, spills 120)."""
    for dtype, tiles in (("fp32", ["32x32x16x4x2", "64x64x16x4x2", "64x64x32x4x3:tf32x3"]), ("fp64", ["32x32x16x4x2"])):
        lines = [line for line in run_compile_check("--linear-tiles", *tiles, "--dtype", dtype) if line.startswith("linear")]
        assert len(lines) == len(tiles) and all("STACK:0 " in line + " " and "LOCAL:0" in line for line in lines), lines


@pytest.mark.skipif(not triton_available(), reason="needs triton")
def test_linear_unit_axes_compile_to_16_byte_loads():
    """Compiled for sm_90 as the launcher compiles it (a published 64-channel map's forward,
    input and weight gradients, operands 16-byte aligned), the grouped matmul copies its
    float32 operand tiles with 16-byte ``cp.async`` and no 4-byte ones (with the general
    addressing every copy was 4 bytes), without spills, and without ``tl.dot`` (float64) too."""
    key = "3|3|64|64|4,6,7,6"
    for dtype, tiles in (("fp32", ["64x64x16x4x2", "32x32x16x4x2"]), ("fp64", ["32x32x16x4x2"])):
        for kind in ("0", "1", "2"):
            args = ["--linear-tiles", *tiles, "--dtype", dtype, "--linear-key", key, "--linear-kind", kind]
            lines = [line for line in run_compile_check(*args) if line.startswith("linear")]
            assert len(lines) == len(tiles), lines
            for line in lines:
                assert "STACK:0 " in line and "LOCAL:0" in line, line
                assert " 16B:" in line and " 4B:" not in line, line


def test_linear_unit_axes_follow_the_launch_table():
    """``unit_axes``: the bits name exactly the operand axes whose offset is the index itself in
    every group (checked by evaluating the table's offset formula), and ``ALIGN`` divides every
    base offset, every other axis's strides and the sizes along unit axes (the hints the kernel
    gives the compiler)."""
    from flashcart.cartesian._linear_spec import BIG, COLUMN, UNIT_BITS, launch_rows, unit_axes

    for key, aligned in (("3|3|64|64|4,6,7,6", 4), ("2|2|20|20|1,1,1", 4), ("3|2|9|20|2,3,1,2", 1), ("2|3|6|10|1,2,1", 2)):
        for kind in range(3):
            unit, align = unit_axes(key, kind)
            assert align == aligned, (key, kind)
            rows = launch_rows(key)[kind]
            for (x, axis), bit in UNIT_BITS.items():
                offsets = []
                for r in rows:
                    d, hi, lo = (r[COLUMN[f"{x}_{c}"]] for c in (f"d{axis}", f"s{axis}_hi", f"s{axis}_lo"))
                    offsets.append([(i // d) * hi + (i % d) * lo for i in range(50)])
                    if not unit & bit:
                        assert hi % align == 0 and lo % align == 0
                is_index = all(o == list(range(50)) for o in offsets)
                assert bool(unit & bit) == is_index, (key, kind, x, axis)
            for r in rows:
                assert all(r[COLUMN[f"{x}_off"]] % align == 0 for x in "abc")
    # forward: A along K, B (the weights [F_out, K]) along K, C along N; never a divisor but BIG on them
    assert unit_axes("3|3|64|64|4,6,7,6", 0)[0] == UNIT_BITS["a", "j"] | UNIT_BITS["b", "i"] | UNIT_BITS["c", "j"]
    assert BIG > 2**20


def test_linear_tiles_setting_is_checked():
    from flashcart.cartesian._triton.linear_kernel import LinearTiles, default_tiles, linear_tiles

    assert linear_tiles("") is None  # each layer's default_tiles
    assert default_tiles(20, 64) == LinearTiles(32, 32, 16, 4, 2) == default_tiles(64, 64, use_dot=False) and default_tiles(
        64, 128
    ) == LinearTiles(64, 64, 16, 4, 2)
    assert linear_tiles("64x32x16x8x3") == LinearTiles(64, 32, 16, 8, 3)
    assert linear_tiles("64x32x16:tf32x3") == LinearTiles(64, 32, 16, 4, None, "tf32x3")
    for bad in ("32x32", "24x32x32", "8x32x32", "32x32x32x3", "axbxc", "32x32x32x4x0", "32x32x32:tf32"):
        with pytest.raises(ValueError, match="FLASHCART_LINEAR_TILES"):
            linear_tiles(bad)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_triton_gradcheck_and_gradgradcheck(device, dispatch):
    # the interpreter is slow: random-projection (fast-mode) checks there, full checks on CUDA
    fast = device == "cpu"
    tp = TensorProduct(2, 2, 2, 2, 1, backend="triton")
    receivers, senders = _graph(4, 6, device)
    x1 = torch.randn(4, tp.in1_width, dtype=torch.float64, device=device, requires_grad=True)
    x2 = torch.randn(6, tp.in2_width, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(6, tp.weight_numel, dtype=torch.float64, device=device, requires_grad=True)
    fn = lambda a, b, c: tp(a, b, c, receivers, senders)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x1, x2, w), fast_mode=fast)
    assert torch.autograd.gradgradcheck(fn, (x1, x2, w), fast_mode=fast)
    exp = DirectionExpansion(2, backend="triton")
    r = torch.randn(5, 3, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(exp, (r,), fast_mode=fast)
    assert torch.autograd.gradgradcheck(exp, (r,), fast_mode=fast)
    lin = EquivariantLinear(2, 2, 2, 3, in_paths=[1, 2, 1], backend="triton").to(device, torch.float64)
    x = torch.randn(3, lin.in_width, dtype=torch.float64, device=device, requires_grad=True)
    ws = [p.detach().clone().requires_grad_() for p in lin.weights]

    def lin_fn(x, *w):
        return torch.func.functional_call(lin, {f"weights.{i}": wi for i, wi in enumerate(w)}, (x,))

    assert torch.autograd.gradcheck(lin_fn, (x, *ws), fast_mode=fast)
    assert torch.autograd.gradgradcheck(lin_fn, (x, *ws), fast_mode=fast)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES[:3], ids=str)
def test_float32_parity_on_gpu(case, no_tf32):
    l1, l2, lo, f1, f2, sym, shared, red = case
    ref, tri = _pair(TensorProduct, l1, l2, lo, f1, f2, shared_weights=shared, reduce_paths=red)
    receivers, senders = _graph(50, 400, "cuda")
    x1 = torch.randn(50, ref.in1_width, device="cuda")
    x2 = torch.randn(400, ref.in2_width, device="cuda")
    w = torch.randn(*(() if shared else (400,)), ref.weight_numel, device="cuda")
    make = lambda m: lambda a, b, c: m(a, b, c, receivers, senders)  # noqa: E731
    _compare_to_second_order(make(ref), make(tri), [x1, x2, w], torch.float32)


@pytest.mark.gpu
def test_equivariance_on_gpu():
    from flashcart.testing import assert_equivariant

    tp = TensorProduct(2, 3, 2, 4, 1, backend="triton")
    receivers, senders = _graph(20, 80, "cuda")
    x1 = torch.randn(20, tp.in1_width, dtype=torch.float64, device="cuda")
    x2 = torch.randn(80, tp.in2_width, dtype=torch.float64, device="cuda")
    w = torch.randn(80, tp.weight_numel, dtype=torch.float64, device="cuda")
    fn = lambda a, b: tp(a, b, w, receivers, senders)  # noqa: E731
    assert_equivariant(fn, [(x1, 2, None), (x2, 3, None)], 2, tp.n_paths_per_rank)
    exp = DirectionExpansion(3, backend="triton")
    assert_equivariant(exp, [(torch.randn(30, 3, dtype=torch.float64, device="cuda"), -1, None)], 3)
