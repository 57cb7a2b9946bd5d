"""The model with ``FLASHCART_LINEAR_PAIRS``: each interaction's message map and skip connection,
and each path-reduced product block's final map and skip connection, one launch forward and one
for their input gradients (interpreted Triton kernels on the CPU, float64)."""

import torch

from flashcart.cartesian import EquivariantLinear
from flashcart.model.predictor import Predictor
from flashcart.nn.blocks import Interaction, ProductBlock
from flashcart.testing import assert_close

from ..cartesian.triton_devices import needs_triton
from .conftest import as_batch, crystal, molecule, triton_tiny_model


def _loss(pred, targets, atoms, graphs):
    forces = torch.where(atoms[:, None], pred["forces"], torch.zeros_like(pred["forces"]))
    return (forces**2).sum() + (torch.where(graphs, pred["energy"], torch.zeros_like(pred["energy"])) ** 2).sum()


@needs_triton
def test_model_with_linear_pairs_equals_it_without(monkeypatch):
    """Linear maps on the Triton path, pairs on against off: energy, forces, stress and a force
    training step's parameter gradients (second derivatives through the pairs) agree to 1e-12
    eager and 1e-11 compiled; a force call launches two grouped matmuls fewer per pair site."""
    import flashcart.cartesian._triton.ops as ops

    model = triton_tiny_model()
    for lin in (m for m in model.modules() if isinstance(m, EquivariantLinear)):
        lin.backend = "triton"
    sites = sum(isinstance(m, Interaction) for m in model.modules())
    sites += sum(isinstance(m, ProductBlock) and m.path_reduced and bool(m.steps) for m in model.modules())
    assert sites >= 2
    batch = as_batch(model, [molecule(1), crystal()])
    batch.energy = torch.zeros(batch.n_graphs, dtype=torch.float64)
    batch.forces = torch.zeros_like(batch.positions)
    params = [p for p in model.parameters() if p.requires_grad]
    launches = []
    real = ops._launch_grouped

    def record(*args, **kw):
        launches.append(kw.get("pair") is not None)
        return real(*args, **kw)

    monkeypatch.setattr(ops, "_launch_grouped", record)
    results = {}
    for pairs in (False, True):
        monkeypatch.setattr(ops, "LINEAR_PAIRS", pairs)
        launches.clear()
        out = Predictor(model)(batch, stress=True)
        force_call = list(launches)
        pred = Predictor(model)(batch, create_graph=True)
        every_atom, every_graph = torch.ones(batch.positions.shape[0], dtype=torch.bool), torch.ones(batch.n_graphs, dtype=torch.bool)
        grads = torch.autograd.grad(_loss(pred, None, every_atom, every_graph), params, allow_unused=True)
        results[pairs] = (out, grads, force_call)
    (off, g_off, l_off), (on, g_on, l_on) = results[False], results[True]
    # every site's forward is a pair, and its input gradients where both inputs need one (a first
    # interaction's skip input, the species embedding, needs none for forces); a pair saves a launch
    assert sites < sum(l_on) <= 2 * sites and not any(l_off)
    assert len(l_off) - len(l_on) == sum(l_on), (len(l_off), len(l_on))
    for k in off:
        assert_close(on[k], off[k], 1e-12, f"pairs against single maps: {k}")
    for a, b in zip(g_on, g_off):
        if b is not None:
            assert_close(a, b, 1e-12, "parameter gradient")

    torch._dynamo.reset()
    compiled = Predictor(model, compile=True, pad_atom_multiple=16, pad_edge_multiple=64)
    out = compiled(batch, stress=True)
    for k in off:
        assert_close(out[k], off[k], 1e-11, f"compiled with pairs against eager: {k}")
    _, grads = compiled.loss_and_grads(batch, _loss, params)
    for a, b in zip(grads, g_off):
        if b is not None:
            assert_close(a, b, 1e-11, "compiled parameter gradient")
