"""``FLASHCART_LINEAR_PAIRS``: two linear maps whose outputs are added (``linear_sum``) run in one
grouped-matmul launch forward and one for their input gradients (``flashcart::lin_pair``)."""

import pytest
import torch

from flashcart.cartesian import EquivariantLinear, linear_sum
from flashcart.cartesian._backend import triton_available

from .test_triton_parity import _compare_to_second_order, dispatch, run_compile_check  # noqa: F401  (dispatch: a fixture)
from .triton_devices import DEVICES, needs_triton

# (first map: l_in, l_out, F_in, F_out, in_paths), (second map ...): an interaction's message map
# (paths per rank) with its skip connection from scalar node features (ranks 1..2 of the skip zero)
# or from rank-2 features; a product block's final map with its skip connection; 9 -> 12 channels
# (no aligned axes in the first map, 4-element alignment in the second)
MAPS = [
    ((2, 2, 5, 5, [3, 4, 4]), (0, 2, 5, 5, None)),
    ((2, 2, 5, 5, [3, 4, 4]), (2, 2, 5, 5, None)),
    ((2, 2, 4, 4, None), (3, 2, 4, 4, None)),
    ((1, 2, 9, 12, [2, 1]), (2, 2, 8, 12, None)),
]


def _maps(spec, backend):
    torch.manual_seed(3)
    first = EquivariantLinear(*spec[0][:4], in_paths=spec[0][4], backend="torch")
    second = EquivariantLinear(*spec[1][:4], in_paths=spec[1][4], backend="torch")
    if backend == "torch":
        return first, second
    tri = [EquivariantLinear(*s[:4], in_paths=s[4], backend="triton") for s in spec]
    tri[0].load_state_dict(first.state_dict())
    tri[1].load_state_dict(second.state_dict())
    return tri


class _Sum(torch.nn.Module):
    """``linear_sum`` of two maps as a module, so ``functional_call`` can swap both maps' weights."""

    def __init__(self, first, second, scale):
        super().__init__()
        self.first, self.second, self.scale = first, second, scale

    def forward(self, x1, x2):
        return linear_sum(self.first, x1, self.second, x2, self.scale)


def _call(first, second, scale):
    module = _Sum(first, second, scale)

    def fn(x1, x2, *w):
        n1 = len(first.weights)
        params = {f"first.weights.{i}": wi for i, wi in enumerate(w[:n1])}
        params |= {f"second.weights.{i}": wi for i, wi in enumerate(w[n1:])}
        return torch.func.functional_call(module, params, (x1, x2))

    return fn


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", MAPS, ids=["message+scalar skip", "message+skip", "final+skip", "aligned"])
def test_pair_equals_the_pytorch_maps_to_second_order(spec, device, dispatch, monkeypatch):  # noqa: F811
    """With pairs on (float64): ``linear_sum`` on the Triton path (one launch forward, one for the
    input gradients) equals the PyTorch backend's two maps added: output, every first derivative
    (both inputs, both maps' weights) and the derivative of a scalar of first derivatives, with a
    scale on the first map."""
    import flashcart.cartesian._triton.ops as ops

    monkeypatch.setattr(ops, "LINEAR_PAIRS", True)
    ref, tri = _maps(spec, "torch"), _maps(spec, "triton")
    ref = [m.to(device, torch.float64) for m in ref]
    tri = [m.to(device, torch.float64) for m in tri]
    g = torch.Generator().manual_seed(5)
    x1 = torch.randn(7, ref[0].in_width, dtype=torch.float64, generator=g).to(device)
    x2 = torch.randn(7, ref[1].in_width, dtype=torch.float64, generator=g).to(device)
    ws = [p.detach() for m in ref for p in m.weights]
    scale = torch.tensor(0.37, dtype=torch.float64, device=device)
    assert ops.linear_pairable(tri[0], x1, tri[1], x2)
    _compare_to_second_order(_call(*ref, scale), _call(*tri, scale), [x1, x2, *ws], torch.float64)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_pair_runs_one_launch_forward_and_one_for_the_input_gradients(device, monkeypatch):
    """A force-style call (forward, then the inputs' gradients): one grouped-matmul launch runs
    both maps forward, one both input gradients, each weight gradient its own; with pairs off,
    each map launches alone (two and two) and the results are the same bits."""
    import flashcart.cartesian._triton.ops as ops

    launches = []
    real = ops._launch_grouped

    def record(a, b, c, table, key, kind, n_rows, split=1, pair=None):
        launches.append((kind, pair is not None))
        return real(a, b, c, table, key, kind, n_rows, split=split, pair=pair)

    monkeypatch.setattr(ops, "_launch_grouped", record)
    first, second = (m.to(device, torch.float64) for m in _maps(MAPS[0], "triton"))
    x1 = torch.randn(6, first.in_width, dtype=torch.float64, device=device)
    x2 = torch.randn(6, second.in_width, dtype=torch.float64, device=device)
    results = []
    for pairs in (True, False):
        monkeypatch.setattr(ops, "LINEAR_PAIRS", pairs)
        launches.clear()
        a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
        y = linear_sum(first, a, second, b)
        grads = torch.autograd.grad(y, [a, b, *first.weights, *second.weights], torch.cos(y))
        results.append((y, *grads))
        fwd, bwd_x, bwd_w = (sorted(p for k, p in launches if k == kind) for kind in (ops.FWD, ops.BWD_X, ops.BWD_W))
        assert (fwd, bwd_x, bwd_w) == (([True], [True], [False, False]) if pairs else ([False] * 2, [False] * 2, [False] * 2))
    for u, v in zip(*results):
        assert torch.equal(u, v)


def test_pairs_need_the_same_output_layout():
    """``linear_sum`` refuses maps whose outputs differ, naming both layouts."""
    first, second = EquivariantLinear(1, 2, 4, 4), EquivariantLinear(1, 1, 4, 4)
    with pytest.raises(ValueError, match="one output layout, got l_max 2 with 4 channels and l_max 1 with 4"):
        linear_sum(first, torch.zeros(3, first.in_width), second, torch.zeros(3, second.in_width))


@needs_triton
def test_pair_op_refuses_different_row_counts():
    """``flashcart::lin_pair`` runs both maps on the same rows: other counts are an error naming both."""
    import flashcart.cartesian._triton.ops as ops

    first, second = _maps(MAPS[1], "triton")
    w1, w2 = (torch.cat([p.detach().reshape(-1) for p in m.weights]) for m in (first, second))
    x1, x2 = torch.zeros(4, first.in_width), torch.zeros(5, second.in_width)
    with pytest.raises(ValueError, match="same rows, got 4 and 5"):
        ops.lin_pair(x1, w1, x2, w2, first.launch_table, second.launch_table, first.key, second.key, ops.FWD)


@needs_triton
def test_maps_that_cannot_pair_run_alone(monkeypatch):
    """Pairs need both maps in the grouped kernel with weights, the same rows and the same
    tiles: a map through matrix products (``FLASHCART_LINEAR_MATMUL=1``), other row counts or
    other tiles run each map alone."""
    import flashcart.cartesian._triton.ops as ops

    monkeypatch.setattr(ops, "LINEAR_PAIRS", True)
    first, second = _maps(MAPS[1], "triton")
    x1, x2 = torch.zeros(4, first.in_width), torch.zeros(4, second.in_width)
    assert ops.linear_pairable(first, x1, second, x2)
    assert not ops.linear_pairable(first, x1, second, torch.zeros(5, second.in_width))
    wide = EquivariantLinear(2, 2, 64, 64, backend="triton")
    assert not ops.linear_pairable(first, x1, wide, torch.zeros(4, wide.in_width))  # wide against narrow tiles
    monkeypatch.setattr(ops, "LINEAR_MATMUL", "1")
    assert not ops.linear_pairable(first, x1, second, x2)
    monkeypatch.setattr(ops, "LINEAR_MATMUL", "scalar")
    monkeypatch.setattr(ops, "LINEAR_PAIRS", False)
    assert not ops.linear_pairable(first, x1, second, x2)


@pytest.mark.skipif(not triton_available(), reason="needs triton")
@pytest.mark.parametrize("kind", ["0", "1"], ids=["forward", "input gradient"])
def test_pair_launch_compiles_for_sm90_without_spills(kind):
    """The pair's launch (an interaction's message map with its scalar skip connection, 20
    channels) compiled for sm_90 (bundled ptxas, no GPU): no spills, and within 16 registers per
    thread of the message map alone (the pair adds a select per operand pointer)."""
    args = ["--linear-tiles", "32x32x16x4x2", "--linear-key", "2|2|20|20|3,4,4", "--linear-kind", kind]

    def usage(*extra):
        (line,) = [s for s in run_compile_check(*args, *extra) if s.startswith("linear")]
        return dict(f.split(":") for f in line.split()[2:] if ":" in f)

    alone, pair = usage(), usage("--linear-pair-key", "0|2|20|20|1")
    assert pair["STACK"] == "0" and pair["LOCAL"] == "0", pair
    assert int(pair["REG"]) <= int(alone["REG"]) + 16, (pair, alone)
