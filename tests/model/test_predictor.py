"""The inference engine: padding and compilation change nothing but speed."""

import pytest
import torch

from flashcart.model.potential import FlashCartPotential
from flashcart.model.predictor import Predictor
from flashcart.testing import TINY_MODEL, assert_close

from .conftest import as_batch, crystal, molecule

SMALL = {**TINY_MODEL, "n_interactions": 1, "correlation": 2, "l_max_hidden_feats": 1, "l_max_edge_attrs": 1}


def _all(pred_fn, batch):
    return pred_fn(batch, forces=True, stress=True)


def test_padding_does_not_change_energy_forces_stress(model, make_batch):
    batch = make_batch(model, [molecule(0), crystal()])
    eager = Predictor(model, pad=False)(batch, stress=True)
    padder = Predictor(model, pad=True, pad_atom_multiple=16, pad_edge_multiple=60, pad_graph_multiple=4)
    padded = padder(batch, stress=True)
    assert padder.capacities.atoms > batch.positions.shape[0] and padder.capacities.edges >= batch.receivers.shape[0]
    assert padder.padded(batch).receivers.shape[0] == padder.capacities.edges
    for k in eager:
        assert_close(padded[k], eager[k], 1e-12, k)


def test_padding_does_not_change_parameter_gradients(model, make_batch):
    batch = make_batch(model, [molecule(1), crystal()])
    grads = []
    for pad in (False, True):
        model.zero_grad()
        out = Predictor(model, pad=pad, pad_atom_multiple=32, pad_edge_multiple=32)(batch, create_graph=True)
        ((out["forces"] ** 2).sum() + out["energy"].sum()).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for a, b in zip(*grads):
        assert_close(a, b, 1e-11, "parameter gradient")


def test_capacities_only_grow():
    model = FlashCartPotential(["H", "C", "O", "Cu"], use_triton=False, **SMALL).double()
    p = Predictor(model, pad=True, pad_atom_multiple=8, pad_edge_multiple=32, pad_graph_multiple=2)
    big = as_batch(model, [molecule(0), molecule(1), molecule(2)])
    small = as_batch(model, [molecule(3)])
    p(big)
    caps = (p.capacities.atoms, p.capacities.edges, p.capacities.graphs)
    p(small)
    assert (p.capacities.atoms, p.capacities.edges, p.capacities.graphs) == caps


def test_padding_reuses_the_graph_and_follows_new_positions(model, make_batch):
    """A batch with the same graph tensors and new positions (an MD step) == a fresh padding."""
    from dataclasses import replace

    batch = make_batch(model, [molecule(0), crystal()])
    cached = Predictor(model, pad=True, pad_atom_multiple=16, pad_edge_multiple=32)
    cached(batch)
    moved = replace(batch, positions=batch.positions + 0.01 * torch.randn_like(batch.positions))
    first = cached.padded(moved)
    assert first.receivers is cached.padded(batch).receivers  # graph padding reused
    fresh = Predictor(model, pad=True, pad_atom_multiple=16, pad_edge_multiple=32).padded(moved)
    for name in ("positions", "types", "cell", "receivers", "senders", "shifts", "batch", "edge_batch"):
        assert torch.equal(getattr(first, name), getattr(fresh, name)), name
    out, ref = cached(moved, stress=True), Predictor(model)(moved, stress=True)
    for k in ref:
        assert_close(out[k], ref[k], 1e-12, k)
    # a new graph (other structures) is padded afresh
    other = make_batch(model, [molecule(1)])
    assert cached.padded(other).receivers is not first.receivers
    cached.reserve(0, 10 * cached.capacities.edges, 0)
    assert cached.padded(moved).receivers.shape[0] == cached.capacities.edges


class CountingBackend:
    def __init__(self):
        self.count = 0

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        self.count += 1
        return lookup_backend("aot_eager")(gm, example_inputs)


def test_compiled_recompiles_only_when_capacities_grow():
    torch._dynamo.reset()
    model = FlashCartPotential(["H", "C", "O", "Cu"], use_triton=False, **SMALL).double()
    backend = CountingBackend()
    p = Predictor(model, compile=True, compile_backend=backend, pad_atom_multiple=16, pad_edge_multiple=60, pad_graph_multiple=4)
    p(as_batch(model, [molecule(0), molecule(1)]))
    first = backend.count
    assert first >= 1
    p(as_batch(model, [molecule(2)]))  # fits: no recompilation
    p(as_batch(model, [molecule(3), molecule(4)]))
    assert backend.count == first
    p(as_batch(model, [molecule(k) for k in range(6)]))  # grows the capacities: compiles again, once
    grown = backend.count
    assert grown > first
    p(as_batch(model, [molecule(k) for k in range(5)]))
    assert backend.count == grown


@pytest.mark.slow
def test_compiled_equals_eager_with_inductor_including_training_gradients():
    torch._dynamo.reset()
    model = FlashCartPotential(["H", "C", "O", "Cu"], use_triton=False, **SMALL).double()
    batch = as_batch(model, [molecule(0), crystal()])
    results = []
    for compile in (False, True):
        model.zero_grad()
        out = Predictor(model, compile=compile, pad=True, pad_atom_multiple=16, pad_edge_multiple=64)(batch, stress=True, create_graph=True)
        ((out["forces"] ** 2).sum() + out["energy"].sum()).backward()
        results.append((out, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (eo, eg), (co, cg) = results
    for k in eo:
        assert_close(co[k].detach(), eo[k].detach(), 1e-10, k)
    for a, b in zip(eg, cg):
        assert_close(b, a, 1e-10, "parameter gradient")


@pytest.mark.parametrize("pad", [False, True])
def test_a_structure_without_pairs_has_the_energy_of_its_isolated_atoms(model, make_batch, pad):
    """No pair within the cutoff (isolated atoms, one atom): no edges at all unpadded. The
    energy is the sum of each atom alone, the forces zero (the generated backend once failed to
    reshape its zero-row blocks)."""
    from ase import Atoms

    atoms = Atoms("COH", positions=[[0, 0, 0], [9.0, 0, 0], [0, 9.5, 0]])
    batch = make_batch(model, [atoms])
    assert batch.receivers.shape[0] == 0
    out = Predictor(model, pad=pad)(batch, stress=True)
    alone = sum(float(Predictor(model, pad=pad)(make_batch(model, [Atoms(s)]))["energy"][0]) for s in "COH")
    assert abs(float(out["energy"][0]) - alone) < 1e-12
    assert float(out["forces"].abs().max()) == 0.0 and float(out["stress"].abs().max()) == 0.0
    assert float(out["energy"][0]) != 0.0


def _labelled(batch):
    from dataclasses import replace

    g = torch.Generator().manual_seed(8)
    stress = torch.randn(batch.n_graphs, 3, 3, dtype=torch.float64, generator=g)
    stress[0] = float("nan")  # the molecule has no stress label
    return replace(
        batch,
        energy=torch.randn(batch.n_graphs, dtype=torch.float64, generator=g),
        forces=torch.randn(batch.positions.shape[0], 3, dtype=torch.float64, generator=g),
        stress=stress,
    )


@pytest.mark.parametrize("derivatives", [True, False], ids=["energy forces stress", "energy only"])
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled (aot_eager)"])
def test_loss_and_grads_equal_the_outer_backward(compile, derivatives):
    """``Predictor.loss_and_grads`` (loss and parameter gradients in one function, on padded
    tensors) == the trainer's other way: the prediction with ``create_graph``, ``loss_value`` on
    the real rows, ``backward(inputs=parameters)``; float64, energy + forces + stress terms or
    energy alone (no derivative of the positions: the prediction must still record the graph);
    a batch of another size reuses the compiled function (same capacities)."""
    from functools import partial

    from flashcart.training.losses import loss_value, masked_loss_value

    torch._dynamo.reset()
    model = FlashCartPotential(["H", "C", "O", "Cu"], use_triton=False, **SMALL).double()
    params = [p for p in model.parameters() if p.requires_grad]
    terms = [
        {"property": "energy", "reduce": "mse", "normalization": "per_atom", "weight": 1.0},
        {"property": "forces", "reduce": "mse", "normalization": "none", "weight": 10.0},
        {"property": "stress", "reduce": "mae", "normalization": "none", "weight": 0.5},
    ]
    loss = {"weighted_sum": terms if derivatives else terms[:1]}
    backend = CountingBackend()
    p = Predictor(model, compile=compile, pad=True, pad_atom_multiple=32, pad_edge_multiple=1024, compile_backend=backend)
    loss_fn = partial(masked_loss_value, loss)
    for k, atoms in enumerate(([molecule(0), crystal()], [crystal(), molecule(1), molecule(2)])):
        batch = _labelled(as_batch(model, atoms))
        model.zero_grad()
        pred = Predictor(model, pad=False)(batch, forces=derivatives, stress=derivatives, create_graph=True)
        want = loss_value(loss, pred, batch)
        want.backward(inputs=params)
        value, grads = p.loss_and_grads(batch, loss_fn, params, forces=derivatives, stress=derivatives)
        assert_close(value, want.detach(), 1e-11, "loss")
        assert len(grads) == len(params)
        for param, g in zip(params, grads):
            assert (g is None) == (param.grad is None)
            if g is not None:
                assert not g.requires_grad
                assert_close(g, param.grad, 1e-10, "parameter gradient")
        if k == 0:
            first = backend.count
    assert backend.count == first and (first >= 1 if compile else first == 0)


def test_many_compiled_predictors_in_one_process(model, make_batch):
    """Dynamo keeps at most 8 graphs per code object, and every Predictor's compiled function once
    shared one: the ninth Predictor compiled in a process for a new shape (fullgraph) failed."""
    torch._dynamo.reset()
    for k in range(1, 11):
        batch = make_batch(model, [molecule(s) for s in range(k)])
        out = Predictor(model, compile=True, compile_backend="eager", pad=False)(batch)
        assert_close(out["forces"], Predictor(model)(batch)["forces"], 1e-12, "forces")
