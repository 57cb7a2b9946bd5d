"""Every product and linear map of the published architecture, on both backends.

The interaction multiplies node ranks 0..2 (0 in the first layer) by edge ranks 0..3 into
ranks 0..3; the product layer multiplies rank-3 features by rank-3 features into ranks 0..3
(middle steps) and 0..2 or 0 (last step), path-resolved (full) or path-reduced; the RMS
norm takes the symmetric (l, l) -> 0 invariants of rank-3 features.
"""

import pytest
import torch

from flashcart.cartesian import EquivariantLinear, TensorProduct
from flashcart.testing import assert_equivariant

from .test_triton_parity import DEVICES, _compare_to_second_order, _graph, _pair, dispatch, needs_triton  # noqa: F401

# l1, l2, lout, F1, F2, symmetric, shared weights, reduce paths, convolution
PRODUCTS = {
    "interaction first layer": (0, 3, 3, 2, 1, False, False, False, True),
    "interaction": (2, 3, 3, 2, 1, False, False, False, True),
    "full product middle step": (3, 3, 3, 2, 2, False, True, False, False),
    "full product last step": (3, 3, 2, 2, 2, False, True, False, False),
    "full product last layer": (3, 3, 0, 2, 2, False, True, False, False),
    "reduced product middle step": (3, 3, 3, 2, 2, False, True, True, False),
    "reduced product last step": (3, 3, 2, 2, 2, False, True, True, False),
    "element-dependent product": (3, 3, 3, 2, 2, False, False, True, False),
    "RMS-norm invariants": (3, 3, 0, 2, 2, True, True, False, False),
}


def _inputs(tp, conv, shared, dtype, device, n_nodes=4, n_edges=6):
    rows = n_edges if conv else n_nodes
    x1 = torch.randn(n_nodes, tp.in1_width, dtype=dtype, device=device)
    x2 = torch.randn(rows, tp.in2_width, dtype=dtype, device=device)
    w = torch.randn(*(() if shared else (rows,)), tp.weight_numel, dtype=dtype, device=device)
    graph = _graph(n_nodes, n_edges, device) if conv else None
    return x1, x2, w, graph


def _call(tp, sym, graph):
    if sym:
        return lambda a, c: tp(a, a, c)
    if graph is not None:
        return lambda a, b, c: tp(a, b, c, *graph)
    return tp


def test_path_counts_are_the_published_ones():
    assert TensorProduct(2, 3, 3, 4, 1).n_paths_per_rank == [3, 5, 5, 4]
    assert TensorProduct(0, 3, 3, 4, 1).n_paths_per_rank == [1, 1, 1, 1]
    assert TensorProduct(3, 3, 3, 4, 4).n_paths_per_rank == [4, 6, 7, 6]
    assert TensorProduct(3, 3, 2, 4, 4).n_paths_per_rank == [4, 6, 7]


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_triton_matches_torch_to_second_order(name, device, dispatch):  # noqa: F811
    l1, l2, lo, f1, f2, sym, shared, red, conv = PRODUCTS[name]
    ref, tri = _pair(TensorProduct, l1, l2, lo, f1, f2, symmetric=sym, shared_weights=shared, reduce_paths=red)
    x1, x2, w, graph = _inputs(ref, conv, shared, torch.float64, device)
    inputs = [x1, w] if sym else [x1, x2, w]
    _compare_to_second_order(_call(ref, sym, graph), _call(tri, sym, graph), inputs, torch.float64)


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_products_are_equivariant_under_proper_and_improper_rotations(name):
    l1, l2, lo, f1, f2, sym, shared, red, conv = PRODUCTS[name]
    tp = TensorProduct(l1, l2, lo, f1, f2, symmetric=sym, shared_weights=shared, reduce_paths=red, backend="torch")
    x1, x2, w, graph = _inputs(tp, conv, shared, torch.float64, "cpu")
    out_paths = None if red else tp.n_paths_per_rank
    if sym:
        assert_equivariant(lambda a: tp(a, a, w), [(x1, l1, None)], lo, out_paths)
    elif graph is not None:
        assert_equivariant(lambda a, b: tp(a, b, w, *graph), [(x1, l1, None), (x2, l2, None)], lo, out_paths)
    else:
        assert_equivariant(lambda a, b: tp(a, b, w), [(x1, l1, None), (x2, l2, None)], lo, out_paths)


@pytest.mark.parametrize("name", ["interaction", "full product middle step", "reduced product last step"])
def test_gradcheck_and_gradgradcheck(name):
    """Float64 derivatives of the generated PyTorch code; the Triton kernels equal these to
    second order (above), which carries the check over to them."""
    l1, l2, lo, f1, f2, sym, shared, red, conv = PRODUCTS[name]
    tp = TensorProduct(l1, l2, lo, 1, 1, shared_weights=shared, reduce_paths=red, backend="torch")
    x1, x2, w, graph = _inputs(tp, conv, shared, torch.float64, "cpu", n_nodes=2, n_edges=3)
    args = tuple(t.requires_grad_() for t in (x1, x2, w))
    fn = _call(tp, sym, graph)
    # fast mode compares random projections of the Jacobians (the straight-line rank-3 code
    # makes the full finite-difference Jacobian of the double backward take minutes)
    assert torch.autograd.gradcheck(fn, args, fast_mode=True)
    assert torch.autograd.gradgradcheck(fn, args, fast_mode=True)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_paths", [[4, 6, 7, 6], [3, 5, 5, 4]], ids=["product mix", "interaction mix"])
def test_path_mixing_linear_parity(in_paths, device, dispatch):  # noqa: F811
    ref, tri = _pair(EquivariantLinear, 3, 3, 2, 3, in_paths=in_paths)
    ref, tri = ref.to(device, torch.float64), tri.to(device, torch.float64)
    x = torch.randn(5, ref.in_width, dtype=torch.float64, device=device)

    def call(m):
        def fn(x, *w):
            return torch.func.functional_call(m, {f"weights.{i}": wi for i, wi in enumerate(w)}, (x,))

        return fn

    _compare_to_second_order(call(ref), call(tri), [x, *[p.detach() for p in ref.weights]], torch.float64)
