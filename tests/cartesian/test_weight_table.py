"""Tensor products whose weights are read from a cubic table of one variable per row
(``WeightTable``): a convolution's Triton kernels evaluate the table per edge (``W_TABLE``), in the
forward, and contract each edge's weight gradient with the table's derivative in the backward. The
results equal autograd through the cubic evaluated with ATen operations, on every call path."""

import pytest
import torch

from flashcart.cartesian import TensorProduct, WeightTable
from flashcart.cartesian._weight_table import evaluate, table_geometry
from flashcart.testing import assert_close

from .test_triton_parity import (
    DEVICES,
    _graph,
    dispatch,  # noqa: F401  (the fixture)
    needs_triton,
)
from .test_weight_rows import N_EDGES, N_NODES, _rows
from .test_weight_slopes import assert_same_results

pytestmark = pytest.mark.skipif(*needs_triton.args, **needs_triton.kwargs)

R_MAX, INTERVALS = 5.0, 16


def _cubic(table: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The reference: the table's piecewise cubic at ``t``, differentiable by autograd, zero
    from ``R_MAX`` on."""
    h = R_MAX / INTERVALS
    k = (t.detach().clamp(max=R_MAX) / h).floor().clamp(0, INTERVALS - 1)
    s = (t.clamp(max=R_MAX) / h - k)[:, None]
    c = table[k.long()]
    w = c[:, 0] + s * c[:, 1] + s**2 * c[:, 2] + s**3 * c[:, 3]
    return torch.where((t < R_MAX)[:, None], w, 0.0)


def _problem(device, F, rows: bool, l_in: int = 2):
    """Input 1 ``[nodes, ...]`` (ranks ``0..l_in``), input 2 one channel per edge (ranks 0..3), a
    random table and each weight row's variable: inside the table, on knots, and past ``R_MAX``
    (the padding edges' lengths)."""
    g = torch.Generator().manual_seed(21)
    dtype = torch.float64
    tp = TensorProduct(l_in, 3, 3, F, 1, backend="torch")
    receivers, senders = _graph(N_NODES, N_EDGES, device)
    weight_rows, n_rows = _rows(device) if rows else (None, N_EDGES)
    x1 = torch.randn(N_NODES, tp.in1_width, dtype=dtype, generator=g).to(device)
    x2 = torch.randn(N_EDGES, tp.in2_width, dtype=dtype, generator=g).to(device)
    table = torch.randn(INTERVALS, 4, tp.weight_numel, dtype=dtype, generator=g).to(device)
    t = torch.rand(n_rows, dtype=dtype, generator=g) * R_MAX
    t[0], t[-1] = 2 * R_MAX, R_MAX * 3 / INTERVALS  # past the cutoff; on a knot
    geometry = table_geometry(INTERVALS, R_MAX, dtype, device)
    return tp, receivers, senders, weight_rows, x1, x2, table, geometry, t.to(device)


@pytest.mark.usefixtures("dispatch")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("F", [3, 20])
@pytest.mark.parametrize(
    "variant",
    [
        "rows",
        "rows, two-kernel backward",
        "rows, row sums in a pass, unpipelined",
        "rows, no input-1 gradient",
        "rows, no input-1 gradient, sender walk",
        "per edge",
        "per edge, two-kernel backward, unpipelined",
        "per edge, no input-1 gradient, sender walk, first convolution",
    ],
)
def test_table_in_the_kernels_equals_autograd_through_the_cubic(variant, F, device, monkeypatch):
    """Forward and the gradients of input 1, input 2 and ``t`` (float64, 1e-12) against the
    PyTorch backend differentiating the cubic: one pass per sender (``tp_bwd_csr``), per-edge
    kernels (``tp_bwd_edge`` and ``tp_bwd_x1_csr``; ``tp_bwd_edge`` alone when input 1 needs no
    gradient, as in a first convolution), the forward pipelined or not, weight rows summed by the
    kernels or in a pass, and per-edge weights; without input 1's gradient also as the sender walk
    (``FLASHCART_SENDER_WALK_BACKWARD``), with a first convolution's scalar node features."""
    import flashcart.cartesian._triton.ops as ops
    import flashcart.cartesian._triton.weight_rows as row_sums

    monkeypatch.setattr(ops, "FUSED_CSR_BACKWARD", "two-kernel" not in variant)
    monkeypatch.setattr(ops, "SENDER_WALK_BACKWARD", "sender walk" in variant)
    monkeypatch.setattr(ops, "TP_PIPELINE", "unpipelined" not in variant)
    monkeypatch.setattr(row_sums, "IN_KERNEL", "in a pass" not in variant)
    l_in = 0 if "first convolution" in variant else 2
    ref, receivers, senders, rows, x1, x2, table, geometry, t = _problem(device, F, variant.startswith("rows"), l_in)
    tri = TensorProduct(l_in, 3, 3, F, 1, backend="triton")
    need_x1 = "no input-1" not in variant
    cot = torch.randn(N_NODES, ref.out_width, dtype=t.dtype, generator=torch.Generator().manual_seed(22)).to(device)
    grads = assert_same_results(
        lambda a, b, s: ref(a, b, _cubic(table, s).index_select(0, rows.index) if rows else _cubic(table, s), receivers, senders),
        lambda a, b, s: tri(a, b, WeightTable(table, geometry, s), receivers, senders, None, rows),
        (x1, x2, t),
        need_x1,
        cot,
    )
    assert grads[-1][0] == 0  # past the cutoff: no gradient


@pytest.mark.usefixtures("dispatch")
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_table_on_the_other_paths_equals_its_evaluation(backend):
    """The PyTorch backend and dense products evaluate the table with ATen operations
    (``evaluate``): the same results as the cubic through autograd."""
    ref, receivers, senders, _, x1, x2, table, geometry, t = _problem("cpu", 3, False)
    tp = TensorProduct(2, 3, 3, 3, 1, backend=backend)
    s_ref, s = t.clone().requires_grad_(), t.clone().requires_grad_()
    for conv in (True, False):
        args = (receivers, senders) if conv else ()
        a = x1.index_select(0, senders) if not conv else x1
        out_ref = ref(a, x2, _cubic(table, s_ref), *args)
        out = tp(a, x2, WeightTable(table, geometry, s), *args)
        assert_close(out, out_ref, 1e-12, "forward")
        cot = torch.randn_like(out)
        assert_close(torch.autograd.grad(out, s, cot)[0], torch.autograd.grad(out_ref, s_ref, cot)[0], 1e-12, "gradient of t")


def test_evaluate_gives_the_cubic_and_its_derivative():
    _, _, _, _, _, _, table, geometry, t = _problem("cpu", 3, False)
    s = t.clone().requires_grad_()
    w_ref = _cubic(table, s)
    slope_ref = torch.stack([torch.autograd.grad(w_ref[:, j].sum(), s, retain_graph=True)[0] for j in range(w_ref.shape[1])], 1)
    w, (slope, t_out) = evaluate(WeightTable(table, geometry, t))
    assert t_out is t
    assert_close(w, w_ref.detach(), 1e-13, "values")
    assert_close(slope, slope_ref, 1e-12, "slopes")


def test_second_derivatives_through_a_table_are_refused():
    _, receivers, senders, rows, x1, x2, table, geometry, t = _problem("cpu", 3, True)
    tri = TensorProduct(2, 3, 3, 3, 1, backend="triton")
    t = t.clone().requires_grad_()
    out = tri(x1, x2, WeightTable(table, geometry, t), receivers, senders, None, rows)
    (g,) = torch.autograd.grad(out.square().sum(), t, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivatives through tabulated weights"):
        torch.autograd.grad(g.sum(), t)


def test_bad_weight_tables_are_refused():
    _, receivers, senders, rows, x1, x2, table, geometry, t = _problem("cpu", 3, True)
    tp = TensorProduct(2, 3, 3, 3, 1, backend="torch")
    with pytest.raises(ValueError, match=r"table must have shape \[intervals, 4, "):
        tp(x1, x2, WeightTable(table[:, :3], geometry, t), receivers, senders, None, rows)
    with pytest.raises(ValueError, match="geometry must be"):
        tp(x1, x2, WeightTable(table, geometry.float(), t), receivers, senders, None, rows)
    with pytest.raises(ValueError, match=r"weight_rows.edges must be int64 of shape \[5, 2\]"):
        tp(x1, x2, WeightTable(table, geometry, t[:-1]), receivers, senders, None, rows)
    with pytest.raises(ValueError, match="constants"):
        tp(x1, x2, WeightTable(table.clone().requires_grad_(), geometry, t), receivers, senders, None, rows)
    with pytest.raises(ValueError, match="its own slopes"):
        tp(x1, x2, WeightTable(table, geometry, t), receivers, senders, None, rows, (table[0], t))
    shared = TensorProduct(2, 3, 3, 3, 1, shared_weights=True, backend="torch")
    with pytest.raises(ValueError, match="not shared"):
        shared(x1, x2[:, : shared.in2_width], WeightTable(table, geometry, t), receivers, senders)
