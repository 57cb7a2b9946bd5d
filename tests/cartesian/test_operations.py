"""TensorProduct, EquivariantLinear and DirectionExpansion: modes, equivariance, gradients."""

import pytest
import torch

from flashcart.cartesian import DirectionExpansion, EquivariantLinear, TensorProduct, rotate
from flashcart.testing import assert_close, assert_equivariant, random_rotation

from .reference import tensor_product_reference

# float64 for every test here (tests/conftest.py restores the previous default afterwards)
pytestmark = pytest.mark.usefixtures("float64")


def graph(n_nodes=5, n_edges=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    receivers = torch.sort(torch.randint(0, n_nodes, (n_edges,), generator=g)).values
    senders = torch.randint(0, n_nodes, (n_edges,), generator=g)
    return receivers, senders


def inputs(tp, rows, n_nodes=None, shared=False):
    x1 = torch.randn(n_nodes or rows, tp.in1_width)
    x2 = torch.randn(rows, tp.in2_width)
    w = torch.randn(tp.weight_numel) if shared else torch.randn(rows, tp.weight_numel)
    return x1, x2, w


CASES = [
    # l1, l2, lout, F1, F2, symmetric, shared, reduce
    (2, 3, 2, 4, 4, False, False, False),
    (2, 3, 3, 4, 1, False, False, True),
    (1, 2, 3, 1, 3, False, True, False),
    (2, 2, 2, 3, 3, True, False, False),
    (2, 2, 2, 3, 3, True, True, True),
    (3, 1, 2, 2, 2, False, False, True),
    (0, 2, 2, 3, 1, False, False, False),
]


@pytest.fixture(params=["generated", "dense"])
def torch_path(request, monkeypatch):
    """The PyTorch backend's two ways: the dense coupling contractions (the default,
    TensorProduct._rows_dense), and the generated straight-line code per path."""
    import flashcart.cartesian.tensor_product as module

    if request.param == "generated":
        monkeypatch.setattr(module, "DENSE_DEVICES", ())
    return request.param


@pytest.mark.parametrize("case", CASES, ids=str)
def test_dense_product_matches_full_tensor_reference(case, torch_path):
    l1, l2, lo, f1, f2, sym, shared, red = case
    tp = TensorProduct(l1, l2, lo, f1, f2, symmetric=sym, shared_weights=shared, reduce_paths=red, backend="torch")
    x1, x2, w = inputs(tp, 6, shared=shared)
    if sym:
        x2 = x1
    assert_close(tp(x1, x2, w), tensor_product_reference(tp, x1, x2, w), 1e-12)


@pytest.mark.parametrize("case", [c for c in CASES if not c[5]], ids=str)
def test_convolution_product_matches_reference(case, torch_path):
    l1, l2, lo, f1, f2, _, shared, red = case
    tp = TensorProduct(l1, l2, lo, f1, f2, shared_weights=shared, reduce_paths=red, backend="torch")
    receivers, senders = graph()
    x1, x2, w = inputs(tp, len(senders), n_nodes=5, shared=shared)
    out = tp(x1, x2, w, receivers=receivers, senders=senders)
    assert out.shape == (5, tp.out_width)
    assert_close(out, tensor_product_reference(tp, x1, x2, w, receivers, senders), 1e-12)


def test_product_rejects_bad_shapes_with_clear_messages():
    tp = TensorProduct(1, 1, 1, 2, 2, backend="torch")
    x1, x2, w = inputs(tp, 3)
    with pytest.raises(ValueError, match="weights must have shape"):
        tp(x1, x2, w[:, :-1])
    with pytest.raises(ValueError, match="x2 must have shape"):
        tp(x1, x2[:, :-1], w)
    with pytest.raises(ValueError, match="both receivers and senders"):
        tp(x1, x2, w, receivers=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="must be equal or one of them must be 1"):
        TensorProduct(1, 1, 1, 2, 3)


@pytest.mark.parametrize("lo", range(5))
def test_every_product_path_up_to_rank_4_is_equivariant(lo):
    tp = TensorProduct(4, 4, lo, 2, 2, backend="torch")
    x1, x2, w = inputs(tp, 4)
    assert_equivariant(tp, [(x1, 4, None), (x2, 4, None), (w, None, None)], lo, tp.n_paths_per_rank)


def test_convolution_is_equivariant():
    tp = TensorProduct(2, 3, 2, 3, 1, backend="torch")
    receivers, senders = graph()
    x1, x2, w = inputs(tp, len(senders), n_nodes=5)
    assert_equivariant(lambda a, b: tp(a, b, w, receivers, senders), [(x1, 2, None), (x2, 3, None)], 2, tp.n_paths_per_rank)


def test_expansion_is_equivariant():
    exp = DirectionExpansion(4, backend="torch")
    assert_equivariant(exp, [(torch.randn(8, 3), -1, None)], 4)


def test_linear_is_equivariant_and_mixes_paths():
    lin = EquivariantLinear(3, 2, 4, 5, in_paths=[1, 3, 2, 2], backend="torch")
    x = torch.randn(6, lin.in_width)
    assert_equivariant(lin, [(x, 3, [1, 3, 2, 2])], 2)


def test_linear_drops_and_zero_fills_ranks():
    lin = EquivariantLinear(1, 3, 2, 2, backend="torch")
    x = torch.randn(3, lin.in_width)
    y = lin(x)
    assert y.shape == (3, 16 * 2)
    assert torch.equal(y[:, 4 * 2 :], torch.zeros(3, 12 * 2))
    w0 = lin.weights[0] / 2**0.5
    assert_close(y[:, :2], x[:, :2] @ w0.T, 1e-12)


def test_linear_matches_einsum_reference():
    lin = EquivariantLinear(2, 2, 3, 4, in_paths=[2, 1, 3], backend="torch")
    x = torch.randn(5, lin.in_width)
    start, expected = 0, []
    for l, p in enumerate([2, 1, 3]):
        blk = x[:, start : start + (2 * l + 1) * p * 3].reshape(5, 2 * l + 1, p * 3)
        start += (2 * l + 1) * p * 3
        expected.append(torch.einsum("nif,of->nio", blk, lin.weights[l]).reshape(5, -1) / (3 * p) ** 0.5)
    assert_close(lin(x), torch.cat(expected, 1), 1e-12)


def test_rotate_composes_and_inverts():
    x = torch.randn(3, 16 * 2)
    R1, R2 = random_rotation(), random_rotation(improper=True)
    assert_close(rotate(rotate(x, R1, 3), R2, 3), rotate(x, R2 @ R1, 3), 1e-12)
    assert_close(rotate(rotate(x, R1, 3), R1.T, 3), x, 1e-12)


# ---- gradients --------------------------------------------------------------------------


def _gradchecks(fn, args):
    assert torch.autograd.gradcheck(fn, args)
    assert torch.autograd.gradgradcheck(fn, args)


@pytest.mark.parametrize("n_edges", [0, 1])
def test_convolution_without_edges_or_with_one(n_edges, torch_path):
    tp = TensorProduct(2, 3, 2, 4, 1, backend="torch")
    receivers, senders = graph(3, n_edges)
    x1, x2, w = inputs(tp, n_edges, n_nodes=3)
    out = tp(x1, x2, w, receivers=receivers, senders=senders)
    assert out.shape == (3, tp.out_width)
    expected = tensor_product_reference(tp, x1, x2, w, receivers, senders) if n_edges else torch.zeros(3, tp.out_width)
    assert_close(out, expected, 1e-12)


def test_coupling_survives_float32_and_back():
    """The dense coupling follows the module's dtype and device, but from its float64 master:
    a float64 module that went through float32 computes the float64 product."""
    tp = TensorProduct(2, 3, 2, 4, 1, backend="torch")
    exact = tp.coupling.clone()
    assert tp.float().coupling.dtype == torch.float32
    assert torch.equal(tp.double().coupling, exact) and "coupling" not in tp.state_dict()


@pytest.mark.parametrize("conv", [False, True])
def test_product_gradcheck_and_gradgradcheck(conv, torch_path):
    tp = TensorProduct(2, 2, 2, 2, 1, backend="torch")
    if conv:
        receivers, senders = graph(4, 7)
        x1, x2, w = inputs(tp, 7, n_nodes=4)
        fn = lambda a, b, c: tp(a, b, c, receivers, senders)  # noqa: E731
    else:
        x1, x2, w = inputs(tp, 3)
        fn = tp
    _gradchecks(fn, [t.requires_grad_() for t in (x1, x2, w)])


def test_expansion_gradcheck_and_gradgradcheck():
    exp = DirectionExpansion(3, backend="torch")
    _gradchecks(exp, [torch.randn(4, 3, requires_grad=True)])


def test_linear_gradcheck_and_gradgradcheck():
    lin = EquivariantLinear(2, 2, 2, 3, backend="torch")
    x = torch.randn(3, lin.in_width, requires_grad=True)
    w = [p.detach().clone().requires_grad_() for p in lin.weights]

    def fn(x, *ws):
        return torch.func.functional_call(lin, {f"weights.{i}": wi for i, wi in enumerate(ws)}, (x,))

    _gradchecks(fn, [x, *w])


@pytest.mark.parametrize("n_nodes, n_edges", [(1, 0), (1, 3), (6, 1), (7, 40), (64, 2000), (32767, 300), (32768, 300), (40000, 700)])
def test_edge_csr_against_counts(n_nodes, n_edges):
    """Row pointers (binary searches of the sorted indices) equal the counted ones; ``perm`` sorts
    the edges by sender, stably; nodes without edges get empty rows. The senders are sorted as
    int16 up to 32,767 nodes and as int32 above (``sort_key_dtype``); every output stays int64."""
    from flashcart.cartesian import edge_csr

    g = torch.Generator().manual_seed(n_nodes * 1000 + n_edges)
    receivers = torch.sort(torch.randint(0, max(1, n_nodes // 2), (n_edges,), generator=g)).values  # later nodes receive none
    senders = torch.randint(0, n_nodes, (n_edges,), generator=g)
    rowptr, perm, srowptr = edge_csr(receivers, senders, n_nodes)
    count_r = torch.bincount(receivers, minlength=n_nodes)
    count_s = torch.bincount(senders, minlength=n_nodes)
    zero = torch.zeros(1, dtype=torch.long)
    assert torch.equal(rowptr, torch.cat([zero, count_r.cumsum(0)]))
    assert torch.equal(srowptr, torch.cat([zero, count_s.cumsum(0)]))
    assert rowptr.dtype == perm.dtype == srowptr.dtype == torch.int64
    assert torch.equal(senders[perm], torch.sort(senders).values)
    for node in senders.unique().tolist():  # stable: a sender's edges keep their order
        mine = perm[srowptr[node] : srowptr[node + 1]]
        assert torch.equal(mine, torch.sort(mine).values) and bool((senders[mine] == node).all())


def test_edge_csr_is_reused_per_neighbour_list_until_it_changes(monkeypatch):
    """``edge_csr_reused`` returns the same tensors for the same unchanged receivers and senders,
    and a fresh result after an in-place write, for other senders or another node count; with
    ``_frozen.ENABLED`` off it computes every time."""
    from flashcart.cartesian import _frozen
    from flashcart.cartesian._layout import edge_csr, edge_csr_reused

    receivers = torch.tensor([0, 0, 1, 2, 2, 2])
    senders = torch.tensor([1, 2, 0, 0, 1, 1])
    first = edge_csr_reused(receivers, senders, 3)
    assert all(a is b for a, b in zip(first, edge_csr_reused(receivers, senders, 3)))
    for a, b in zip(first, edge_csr(receivers, senders, 3)):
        assert torch.equal(a, b)
    assert edge_csr_reused(receivers, senders, 4)[0].shape[0] == 5
    other = senders.clone()
    assert edge_csr_reused(receivers, other, 3)[1] is not first[1]
    senders[0] = 2  # in place: the version counter moves
    fresh = edge_csr_reused(receivers, senders, 3)
    for a, b in zip(fresh, edge_csr(receivers, senders, 3)):
        assert torch.equal(a, b)
    assert not torch.equal(fresh[2], first[2])
    monkeypatch.setattr(_frozen, "ENABLED", False)
    assert edge_csr_reused(receivers, senders, 3)[1] is not edge_csr_reused(receivers, senders, 3)[1]


def test_sort_key_dtype_holds_every_index():
    from flashcart.cartesian._layout import sort_key_dtype

    assert sort_key_dtype(1) == sort_key_dtype(32767) == torch.int16
    assert sort_key_dtype(32768) == sort_key_dtype(2**31 - 1) == torch.int32
    assert sort_key_dtype(2**31) == torch.int64
