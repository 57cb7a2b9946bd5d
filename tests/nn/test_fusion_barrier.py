"""flashcart.nn.fusion_barrier: the identity, to any order, stored once in compiled graphs."""

from __future__ import annotations

import torch

from flashcart.nn.fusion_barrier import _realized, realized


def test_eager_calls_get_the_tensor_itself():
    x = torch.randn(5)
    assert realized(x) is x


def test_the_op_is_the_identity_with_identity_gradients_to_second_order():
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    y = _realized(x)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    assert torch.autograd.gradcheck(lambda t: _realized(t) ** 3, (x,))
    assert torch.autograd.gradgradcheck(lambda t: _realized(t) ** 3, (x,))


def test_compiled_graphs_record_the_op_and_match_eager():
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    def f(d, table):
        d = realized(d.index_select(0, torch.tensor([2, 0, 1])))
        return (d[:, None] * table).sin().sum()

    d = torch.tensor([0.5, 1.5, 2.5], dtype=torch.float64, requires_grad=True)
    table = torch.randn(3, 6, dtype=torch.float64)
    ops = lambda gm: {n.target for n in gm.graph.nodes if n.op == "call_function"}  # noqa: E731
    torch.compile(f, backend=backend, fullgraph=True)(d, table)
    assert torch.ops.flashcart.realized.default in ops(graphs[0])

    compiled = torch.compile(f, backend="inductor", fullgraph=True)
    (g,) = torch.autograd.grad(compiled(d, table), d)
    (ref,) = torch.autograd.grad(f(d, table), d)
    torch.testing.assert_close(g, ref, rtol=1e-12, atol=1e-12)
