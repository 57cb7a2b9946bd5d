"""The RMS norm's invariants as quadratic forms in ATen operations in compiled calls
(``FLASHCART_NORM_FORMS``, :func:`flashcart.nn.blocks.norm_forms_mode`)."""

import pytest
import torch

import flashcart.nn.blocks as blocks
from flashcart.cartesian._quadratic_invariants import quadratic_invariants
from flashcart.model import Predictor
from flashcart.nn.blocks import RMSNorm, norm_forms_mode
from flashcart.testing import assert_close

from ..model.conftest import as_batch, crystal, molecule, triton_tiny_model


@pytest.mark.parametrize("l_max", [0, 1, 2, 3])
def test_quadratic_forms_equal_the_symmetric_product(l_max):
    """``quadratic_invariants`` == the norm's symmetric ``(l, l) -> 0`` product (float64, 1e-13),
    and its gradient and second derivative equal the product's (double backward through both)."""
    F = 3
    norm = RMSNorm(l_max, F, backend="torch").double()
    g = torch.Generator().manual_seed(l_max)
    x = torch.randn(5, (l_max + 1) ** 2 * F, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(5, (l_max + 1) * F, dtype=torch.float64, generator=g)
    results = []
    for fn in (lambda x: quadratic_invariants(x, norm.forms, l_max, F), lambda x: norm.invariants(x, x, norm.ones)):
        inv = fn(x)
        (gx,) = torch.autograd.grad((inv * v).sum(), x, create_graph=True)
        (ggx,) = torch.autograd.grad((gx**2).sum(), x)
        results.append((inv, gx, ggx))
    for a, b, what in zip(*results, ("invariants", "gradient", "second derivative")):
        assert_close(a, b, 1e-13, what)


def _traced_ops(model, batch, **call) -> tuple[list, dict]:
    """The call targets of a compiled call's traced graph, and its results."""
    ops = []

    def backend(gm, example_inputs):
        ops.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    return ops, Predictor(model, compile=True, compile_backend=backend, pad=False)(batch, **call)


def test_compiled_calls_with_the_forms_equal_eager_ones(monkeypatch):
    """A compiled (inductor) call on the Triton path with the forms == the eager call with the
    fused row-wise norm: energy, forces and stress (float64, 1e-11); a compiled training step's
    parameter gradients (forces with create_graph, a second derivative through the forms) ==
    eager ones; and the traced graph holds one symmetric product fewer per norm."""
    model = triton_tiny_model()
    batch = as_batch(model, [molecule(1), crystal()])
    norms = sum(isinstance(m, RMSNorm) for m in model.modules())
    assert norms >= 2
    monkeypatch.setattr(blocks, "_NORM_FORMS", False)
    product_ops, _ = _traced_ops(model, batch)
    monkeypatch.setattr(blocks, "_NORM_FORMS", True)
    forms_ops, _ = _traced_ops(model, batch)
    products = lambda ops: sum("tp_fwd" in op for op in ops)  # noqa: E731
    assert products(product_ops) - products(forms_ops) == norms, (products(product_ops), products(forms_ops))

    eager = Predictor(model)(batch, stress=True)
    torch._dynamo.reset()
    compiled = Predictor(model, compile=True, pad_atom_multiple=16, pad_edge_multiple=64)
    out = compiled(batch, stress=True)
    for k in eager:
        assert_close(out[k], eager[k], 1e-11, f"compiled against eager: {k}")

    params = [p for p in model.parameters() if p.requires_grad]

    def loss(pred, targets, atoms, graphs):
        forces = torch.where(atoms[:, None], pred["forces"], torch.zeros_like(pred["forces"]))
        return (forces**2).sum() + (torch.where(graphs, pred["energy"], torch.zeros_like(pred["energy"])) ** 2).sum()

    batch.energy = torch.zeros(batch.n_graphs, dtype=torch.float64)
    batch.forces = torch.zeros_like(batch.positions)
    _, grads = compiled.loss_and_grads(batch, loss, params)
    pred = Predictor(model)(batch, create_graph=True)
    reference = torch.autograd.grad((pred["forces"] ** 2).sum() + (pred["energy"] ** 2).sum(), params, allow_unused=True)
    for k, (a, b) in enumerate(zip(grads, reference)):
        if b is None:
            assert a is None or not a.abs().max(), k
        else:
            assert_close(a, b, 1e-10, f"parameter gradient {k}")


def test_bad_setting(monkeypatch):
    monkeypatch.setenv("FLASHCART_NORM_FORMS", "yes")
    with pytest.raises(ValueError, match="FLASHCART_NORM_FORMS must be 0 or 1, got 'yes'"):
        norm_forms_mode()
    for raw, expected in (("", False), ("0", False), ("1", True)):
        monkeypatch.setenv("FLASHCART_NORM_FORMS", raw)
        assert norm_forms_mode() is expected
