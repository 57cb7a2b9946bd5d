"""Tensor products whose weights are a function of one variable per row (``WeightSlopes``): the
Triton backward contracts each edge's weight gradient with the slopes in its kernels
(``W_SLOPE``); the result equals autograd through ``values + (t - t.detach()) * slopes`` on the
PyTorch backend, on every Triton call path."""

import pytest
import torch

from flashcart.cartesian import TensorProduct, WeightSlopes
from flashcart.cartesian._weight_slopes import apply_weight_slopes
from flashcart.testing import assert_close

from .test_triton_parity import (
    DEVICES,
    _graph,
    dispatch,  # noqa: F401  (the fixture)
    needs_triton,
)
from .test_weight_rows import N_EDGES, N_NODES, _rows

pytestmark = pytest.mark.skipif(*needs_triton.args, **needs_triton.kwargs)


def _problem(device, F, rows: bool, unlisted=()):
    """Input 1 ``[nodes, ...]`` (ranks 0..2), input 2 one channel per edge (ranks 0..3), and the
    weights' values, slopes and variables: per weight row (``rows``) or per edge."""
    g = torch.Generator().manual_seed(11)
    dtype = torch.float64
    tp = TensorProduct(2, 3, 3, F, 1, backend="torch")
    receivers, senders = _graph(N_NODES, N_EDGES, device)
    weight_rows, n_rows = _rows(device, unlisted) if rows else (None, N_EDGES)
    x1 = torch.randn(N_NODES, tp.in1_width, dtype=dtype, generator=g).to(device)
    x2 = torch.randn(N_EDGES, tp.in2_width, dtype=dtype, generator=g).to(device)
    w = torch.randn(n_rows, tp.weight_numel, dtype=dtype, generator=g).to(device)
    ws = torch.randn(n_rows, tp.weight_numel, dtype=dtype, generator=g).to(device)
    t = torch.rand(n_rows, dtype=dtype, generator=g).to(device)
    return tp, receivers, senders, weight_rows, x1, x2, w, ws, t


@pytest.mark.usefixtures("dispatch")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("F", [3, 20])
@pytest.mark.parametrize(
    "variant",
    [
        "rows",
        "rows, two-kernel backward",
        "rows, row sums in a pass",
        "rows, no input-1 gradient",
        "rows, no input-1 gradient, sender walk",
        "per edge",
        "per edge, two-kernel backward",
        "per edge, no input-1 gradient, sender walk",
    ],
)
def test_slopes_in_the_kernels_equal_autograd_through_the_slopes(variant, F, device, monkeypatch):
    """Forward and the gradients of input 1, input 2 and ``t`` (float64, 1e-12) against the
    PyTorch backend differentiating :func:`apply_weight_slopes`: one pass per sender
    (``tp_bwd_csr``), per-edge kernels (``tp_bwd_edge``, also what a first convolution runs, whose
    input 1 needs no gradient), weight rows summed by the kernels or in a pass, and per-edge
    weights; without input 1's gradient also as the sender walk (``FLASHCART_SENDER_WALK_BACKWARD``)."""
    import flashcart.cartesian._triton.ops as ops
    import flashcart.cartesian._triton.weight_rows as row_sums

    monkeypatch.setattr(ops, "FUSED_CSR_BACKWARD", "two-kernel" not in variant)
    monkeypatch.setattr(ops, "SENDER_WALK_BACKWARD", "sender walk" in variant)
    monkeypatch.setattr(row_sums, "IN_KERNEL", "in a pass" not in variant)
    ref, receivers, senders, rows, x1, x2, w, ws, t = _problem(device, F, variant.startswith("rows"))
    tri = TensorProduct(2, 3, 3, F, 1, backend="triton")
    need_x1 = "no input-1" not in variant
    cot = torch.randn(N_NODES, ref.out_width, dtype=w.dtype, generator=torch.Generator().manual_seed(12)).to(device)
    assert_same_results(
        lambda a, b, s: ref(
            a,
            b,
            apply_weight_slopes(w, (ws, s)).index_select(0, rows.index) if rows else apply_weight_slopes(w, (ws, s)),
            receivers,
            senders,
        ),
        lambda a, b, s: tri(a, b, w, receivers, senders, None, rows, WeightSlopes(ws, s)),
        (x1, x2, t),
        need_x1,
        cot,
    )


def assert_same_results(reference, tested, inputs, need_x1: bool, cot):
    """``tested(x1, x2, t)`` equals ``reference`` (float64, 1e-12): the output, and the gradients
    (of ``cot``) of input 1 (with ``need_x1``), input 2 and ``t``, each nonzero."""
    results = []
    for fn in (reference, tested):
        a, b, s = (x.clone().requires_grad_(need) for x, need in zip(inputs, (need_x1, True, True)))
        out = fn(a, b, s)
        results.append((out, torch.autograd.grad(out, (a, b, s) if need_x1 else (b, s), cot)))
    (out_ref, grads_ref), (out, grads) = results
    assert_close(out, out_ref, 1e-12, "forward")
    names = ["input 1", "input 2", "t"][3 - len(grads) :]
    for g, g_ref, name in zip(grads, grads_ref, names):
        assert g_ref.abs().max() > 0, name
        assert_close(g, g_ref, 1e-12, f"gradient of {name}")
    return grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_kernel", [True, False])
def test_unlisted_rows_get_no_gradient_of_their_variable(in_kernel, device, monkeypatch):
    """As with plain weight rows: a row whose edges are not listed gets a zero gradient, the
    listed rows the sum over their edges; twice the same bits (two edges per row, in any order)."""
    import flashcart.cartesian._triton.weight_rows as row_sums

    monkeypatch.setattr(row_sums, "IN_KERNEL", in_kernel)
    ref, receivers, senders, rows, x1, x2, w, ws, t = _problem(device, 3, True, unlisted=(1,))
    tri = TensorProduct(2, 3, 3, 3, 1, backend="triton")
    full_rows, _ = _rows(device)
    cot = torch.randn(N_NODES, ref.out_width, dtype=w.dtype, generator=torch.Generator().manual_seed(13)).to(device)
    s_ref, s = t.clone().requires_grad_(), t.clone().requires_grad_()
    out_ref = ref(x1, x2, apply_weight_slopes(w, (ws, s_ref)).index_select(0, full_rows.index), receivers, senders)
    (g_ref,) = torch.autograd.grad(out_ref, s_ref, cot)
    grads = [torch.autograd.grad(tri(x1, x2, w, receivers, senders, None, rows, WeightSlopes(ws, s)), s, cot)[0] for _ in range(2)]
    assert torch.equal(grads[0], grads[1])
    assert g_ref[1] != 0 and grads[0][1] == 0
    keep = torch.arange(w.shape[0], device=device) != 1
    assert_close(grads[0][keep], g_ref[keep], 1e-12, "listed rows")


def test_second_derivatives_through_slopes_are_refused():
    """The slopes' own derivative is not given: a second derivative through ``t`` is an error that
    says so, not a silently wrong number."""
    _, receivers, senders, rows, x1, x2, w, ws, t = _problem("cpu", 3, True)
    tri = TensorProduct(2, 3, 3, 3, 1, backend="triton")
    t = t.clone().requires_grad_()
    out = tri(x1, x2, w, receivers, senders, None, rows, WeightSlopes(ws, t))
    (g,) = torch.autograd.grad(out.square().sum(), t, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivatives through tabulated weights"):
        torch.autograd.grad(g.sum(), t)


def test_bad_weight_slopes_are_refused():
    _, receivers, senders, rows, x1, x2, w, ws, t = _problem("cpu", 3, True)
    tp = TensorProduct(2, 3, 3, 3, 1, backend="torch")
    with pytest.raises(ValueError, match="slopes must have the weights' shape"):
        tp(x1, x2, w, receivers, senders, None, rows, WeightSlopes(ws[:, :-1], t))
    with pytest.raises(ValueError, match=r"t must have shape \[6\]"):
        tp(x1, x2, w, receivers, senders, None, rows, WeightSlopes(ws, t[:-1]))
    with pytest.raises(ValueError, match="constants"):
        tp(x1, x2, w.clone().requires_grad_(), receivers, senders, None, rows, WeightSlopes(ws, t))
    shared = TensorProduct(2, 3, 3, 3, 1, shared_weights=True, backend="torch")
    with pytest.raises(ValueError, match="not shared"):
        shared(x1, x2[:, : shared.in2_width], w[0], receivers, senders, None, None, WeightSlopes(ws[0], t[:1]))
