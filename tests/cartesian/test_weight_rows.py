"""Tensor products reading their weights through an index (``WeightRows``): the same function as
the gathered weights, to second order, on both backends and every Triton call path."""

import pytest
import torch

from flashcart.cartesian import TensorProduct, WeightRows
from flashcart.testing import assert_close

from .test_triton_parity import (
    DEVICES,
    _compare_to_second_order,
    _graph,
    dispatch,  # noqa: F401  (the fixture)
    needs_triton,
)

N_NODES, N_EDGES = 5, 9


def _rows(device, unlisted=()):
    """Edges sharing rows two by two (one single edge, one row nobody reads), in random order;
    rows in ``unlisted`` list no edges."""
    g = torch.Generator().manual_seed(4)
    index = torch.randperm(N_EDGES, generator=g) // 2  # rows 0..3 read twice, row 4 once
    n_rows = N_EDGES // 2 + 2  # and row 5 by nobody
    edges = torch.full((n_rows, 2), -1, dtype=torch.int64)
    for e, r in enumerate(index.tolist()):
        edges[r, int(edges[r, 0] >= 0)] = e
    for r in unlisted:
        edges[r] = -1
    return WeightRows(index.to(device), edges.to(device)), n_rows


def _problem(device, F=3):
    dtype = torch.float64
    tp = TensorProduct(2, 3, 3, F, 1, backend="torch")
    receivers, senders = _graph(N_NODES, N_EDGES, device)
    g = torch.Generator().manual_seed(5)
    rows, n_rows = _rows(device)
    x1 = torch.randn(N_NODES, tp.in1_width, dtype=dtype, generator=g).to(device)
    x2 = torch.randn(N_EDGES, tp.in2_width, dtype=dtype, generator=g).to(device)
    w = torch.randn(n_rows, tp.weight_numel, dtype=dtype, generator=g).to(device)
    return tp, receivers, senders, rows, [x1, x2, w]


@pytest.mark.usefixtures("dispatch")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "variant",
    [
        "torch",
        "triton",
        "triton, two-kernel backward",
        "triton, composed double backward",
        "triton, d x1 by the sender pass",
        "triton, row sums in a pass",
        "triton, row sums in a pass, two-kernel backward",
        "triton, row sums in a pass, composed double backward",
    ],
)
def test_weight_rows_equal_gathered_weights(variant, device, monkeypatch):
    """Forward, every first derivative, and the derivative of a scalar of first derivatives
    (the force-training pattern), float64, against the weights gathered per edge: with the
    kernels adding each edge's weight gradient into its row (default) and with a separate pass."""
    import flashcart.cartesian._triton.ops as ops
    import flashcart.cartesian._triton.weight_rows as row_sums
    from flashcart.cartesian._triton import double_backward

    if variant != "torch" and needs_triton.args[0]:
        pytest.skip(needs_triton.kwargs["reason"])
    if variant == "torch" and device == "cuda":
        pytest.skip("the CPU covers the PyTorch backend's reading")
    monkeypatch.setattr(ops, "FUSED_CSR_BACKWARD", not variant.endswith("two-kernel backward"))
    monkeypatch.setattr(ops, "FUSED_DOUBLE_BACKWARD", not variant.endswith("composed double backward"))
    monkeypatch.setattr(row_sums, "IN_KERNEL", "row sums in a pass" not in variant)
    monkeypatch.setattr(double_backward, "X1_ATOMIC", not variant.endswith("d x1 by the sender pass"))
    ref, receivers, senders, rows, inputs = _problem(device)
    tp = TensorProduct(2, 3, 3, 3, 1, backend="torch" if variant == "torch" else "triton")

    def gathered(x1, x2, w):
        return ref(x1, x2, w.index_select(0, rows.index), receivers, senders)

    def indexed(x1, x2, w):
        return tp(x1, x2, w, receivers, senders, None, rows)

    _compare_to_second_order(gathered, indexed, inputs, torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["torch", "triton", "triton, row sums in a pass"])
def test_unlisted_rows_get_no_gradient(backend, device, monkeypatch):
    """A row whose edges are not listed keeps its value but gets a zero gradient (the contract for
    rows the caller knows to be constant); the listed rows get the sum over their edges."""
    import flashcart.cartesian._triton.weight_rows as row_sums

    if backend != "torch" and needs_triton.args[0]:
        pytest.skip(needs_triton.kwargs["reason"])
    if backend == "torch" and device == "cuda":
        pytest.skip("the CPU covers the PyTorch backend's reading")
    monkeypatch.setattr(row_sums, "IN_KERNEL", backend == "triton")
    backend = backend.split(",")[0]
    ref, receivers, senders, _, (x1, x2, w) = _problem(device)
    rows, _ = _rows(device, unlisted=(1,))
    tp = TensorProduct(2, 3, 3, 3, 1, backend=backend)
    w_ref, w_idx = w.clone().requires_grad_(), w.clone().requires_grad_()
    out_ref = ref(x1, x2, w_ref.index_select(0, rows.index), receivers, senders)
    out = tp(x1, x2, w_idx, receivers, senders, None, rows)
    assert_close(out, out_ref, 1e-12, "forward")
    cot = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(6)).to(device)
    (g_ref,) = torch.autograd.grad(out_ref, w_ref, cot)
    (g,) = torch.autograd.grad(out, w_idx, cot)
    assert g_ref[1].abs().max() > 0 and g[1].abs().max() == 0
    keep = torch.arange(w.shape[0], device=device) != 1
    assert_close(g[keep], g_ref[keep], 1e-12, "listed rows")


def test_bad_weight_rows_are_refused():
    ref, receivers, senders, rows, (x1, x2, w) = _problem("cpu")
    with pytest.raises(ValueError, match="weight_rows needs convolution mode"):
        ref(x1, torch.zeros(N_NODES, ref.in2_width, dtype=x1.dtype), w[:N_NODES], None, None, None, rows)
    with pytest.raises(ValueError, match="weight_rows.index must be int64"):
        ref(x1, x2, w, receivers, senders, None, WeightRows(rows.index.int(), rows.edges))
    with pytest.raises(ValueError, match="weight_rows.index must be int64 of shape \\[9\\]"):
        ref(x1, x2, w, receivers, senders, None, WeightRows(rows.index[:-1], rows.edges))
    with pytest.raises(ValueError, match="weight_rows.edges must be int64 of shape \\[6, 2\\]"):
        ref(x1, x2, w, receivers, senders, None, WeightRows(rows.index, rows.edges[:-1]))
    with pytest.raises(ValueError, match="shape \\[R, "):
        ref(x1, x2, w[:, :-1], receivers, senders, None, rows)
    shared = TensorProduct(2, 3, 3, 3, 1, shared_weights=True, backend="torch")
    with pytest.raises(ValueError, match="not shared"):
        shared(x1, x2, w[0], receivers, senders, None, rows)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [7, 340, 1300], ids=lambda w: f"W{w}")
def test_rows_sum_kernel_equals_the_formula(width, device):
    """The Triton pass that sums each row's edges (no atomics) against the PyTorch formula, bit
    for bit, with its derivative to second order (float64); several column blocks at W 1300."""
    if needs_triton.args[0]:
        pytest.skip(needs_triton.kwargs["reason"])
    from flashcart.cartesian._triton.ops import weight_rows_sum as kernel_sum
    from flashcart.cartesian._weight_rows import weight_rows_sum

    rows, _ = _rows(device, unlisted=(2,))
    g = torch.randn(N_EDGES, width, dtype=torch.float64, generator=torch.Generator().manual_seed(7)).to(device)
    assert torch.equal(kernel_sum(g, rows.edges, rows.index), weight_rows_sum(g, rows.edges))
    _compare_to_second_order(
        lambda t: weight_rows_sum(t, rows.edges) ** 2, lambda t: kernel_sum(t, rows.edges, rows.index) ** 2, [g], torch.float64
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("csr", [True, False], ids=["one-pass backward", "two-kernel backward"])
def test_kernels_sum_rows_deterministically(csr, device, monkeypatch):
    """With the kernels adding each listed edge's weight gradient into its row (``atomic``), the
    weight gradient and the second-order terms come out the same bits on every run (float32: a
    row adds at most two edges into zero, in either order), agree with the separate pass to
    rounding (the compiler may contract a per-edge sum differently in the two kernels), and no
    row-sum pass runs."""
    if needs_triton.args[0]:
        pytest.skip(needs_triton.kwargs["reason"])
    import flashcart.cartesian._triton.ops as ops
    import flashcart.cartesian._triton.weight_rows as row_sums

    monkeypatch.setattr(ops, "FUSED_CSR_BACKWARD", csr)
    _, receivers, senders, rows, inputs = _problem(device, F=5)
    tp = TensorProduct(2, 3, 3, 5, 1, backend="triton")
    passes = []
    counted = ops.weight_rows_sum
    monkeypatch.setattr(ops, "weight_rows_sum", lambda *a: passes.append(1) or counted(*a))
    results = []
    for in_kernel in (True, True, False):
        monkeypatch.setattr(row_sums, "IN_KERNEL", in_kernel)
        passes.clear()
        x1, x2, w = (t.detach().float().requires_grad_() for t in inputs)
        out = tp(x1, x2, w, receivers, senders, None, rows)
        cot = torch.cos(torch.arange(out.numel(), device=device, dtype=out.dtype)).reshape(out.shape)
        gx1, gx2, gw = torch.autograd.grad(out, (x1, x2, w), cot, create_graph=True)
        # a force-loss pattern: the first derivatives' scalar differentiated again
        second = torch.autograd.grad((gx1**2).sum() + (gx2 * x2).sum() + (gw**2).sum(), (x1, x2, w))
        results.append((gw, *second))
        assert (len(passes) == 0) if in_kernel else (len(passes) >= 2)
    for a, b, c, what in zip(*results, ("gw", "d x1", "d x2", "d w")):
        assert a.shape == b.shape == c.shape, what
        assert torch.equal(a, b), f"{what} differs between two runs: {(a - b).abs().max().item():.3g}"
        assert_close(a, c, 1e-5, f"{what} against the pass")


def test_row_sum_mode_from_environment(monkeypatch):
    from flashcart.cartesian._triton.weight_rows import row_sum_mode

    for raw, want in (("", True), ("atomic", True), ("pass", False)):
        monkeypatch.setenv("FLASHCART_WEIGHT_ROW_SUM", raw)
        assert row_sum_mode() is want
    monkeypatch.setenv("FLASHCART_WEIGHT_ROW_SUM", "1")
    with pytest.raises(ValueError, match="FLASHCART_WEIGHT_ROW_SUM must be 'atomic' or 'pass', got '1'"):
        row_sum_mode()
