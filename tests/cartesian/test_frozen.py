"""Tensors derived from frozen parameters (flashcart.cartesian._frozen): reused while the
parameters are frozen and unchanged, rebuilt after any change, never used where autograd,
compilation or another dtype needs a fresh one; models give the same results with and without."""

import copy
from dataclasses import replace

import pytest
import torch

from flashcart.cartesian import _frozen
from flashcart.cartesian._backend import interpreter_enabled, triton_available
from flashcart.cartesian._frozen import frozen_derived
from flashcart.data import collate, structure_from_atoms
from flashcart.model.potential import FlashCartPotential
from flashcart.model.predictor import Predictor
from flashcart.testing import TINY_MODEL


class Scaled(torch.nn.Module):
    """``w * 2`` derived through the cache; counts its builds."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(3.0))
        self.builds = 0

    def derived(self) -> torch.Tensor:
        def build():
            self.builds += 1
            return self.w * 2

        return frozen_derived(self, "w2", [self.w], build)


@pytest.fixture
def cache_on(monkeypatch):
    monkeypatch.setattr(_frozen, "ENABLED", True)
    yield
    _frozen.clear()


@pytest.mark.usefixtures("cache_on")
def test_built_once_while_frozen_and_again_after_each_change():
    m = Scaled()
    m.w.requires_grad_(False)
    first = m.derived()
    assert m.derived() is first and m.builds == 1
    with torch.no_grad():
        m.w.add_(1.0)  # an optimiser step: the version counter moves
    assert torch.equal(m.derived(), (torch.arange(3.0) + 1) * 2) and m.builds == 2
    m.load_state_dict({"w": torch.tensor([5.0, 6.0, 7.0])})
    assert torch.equal(m.derived(), torch.tensor([10.0, 12.0, 14.0])) and m.builds == 3
    m.double()  # another dtype (and storage)
    assert m.derived().dtype == torch.float64 and m.builds == 4
    with torch.inference_mode():  # inference tensors are kept apart from normal ones
        assert m.derived().is_inference()
    assert m.builds == 5
    out = m.derived()
    assert not out.is_inference() and m.builds == 5


@pytest.mark.usefixtures("cache_on")
def test_not_cached_when_parameters_require_grad_or_when_off():
    m = Scaled()  # requires grad: the derived tensor belongs to the autograd graph
    a, b = m.derived(), m.derived()
    assert a is not b and a.grad_fn is not None and m.builds == 2
    m.w.requires_grad_(False)
    _frozen.ENABLED = False
    m.derived(), m.derived()
    assert m.builds == 4


@pytest.mark.usefixtures("cache_on")
def test_not_cached_under_torch_compile():
    m = Scaled()
    m.w.requires_grad_(False)
    compiled = torch.compile(lambda: m.derived() + 0, backend="eager", fullgraph=True)
    assert torch.equal(compiled(), torch.arange(3.0) * 2)
    assert m not in _frozen._CACHE


def _model(triton: bool) -> FlashCartPotential:
    torch.manual_seed(0)
    opts = {**TINY_MODEL, "path_reduced_product": True, "layer_norm": True}
    if triton:  # the interpreter is slow: one layer
        opts["n_interactions"] = 1
    m = FlashCartPotential(["H", "C", "O"], avg_neighbors=5.0, use_triton=triton, **opts).double()
    with torch.no_grad():  # non-trivial gates, gains and product weights
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    if triton:  # the Triton path on CPU tensors (TRITON_INTERPRET=1), where the linear maps' flat weights are cached
        for mod in m.modules():
            if hasattr(mod, "backend"):
                mod.backend = "triton"
    return m


def _batch(model):
    from ase import Atoms

    g = torch.Generator().manual_seed(3)
    atoms = Atoms("CCOHHH", positions=(torch.randn(6, 3, generator=g, dtype=torch.float64) * 1.2).numpy())
    return collate([structure_from_atoms(atoms, model.r_max, require_labels=False)], model.z_to_type).to(dtype=torch.float64)


INTERPRETER = pytest.mark.skipif(not interpreter_enabled() or not triton_available(), reason="needs Triton and TRITON_INTERPRET=1")


@pytest.mark.parametrize("triton", [False, pytest.param(True, marks=INTERPRETER)])
@pytest.mark.usefixtures("cache_on")
def test_force_calls_follow_training_steps(triton):
    """Frozen force calls between optimiser steps equal a fresh copy evaluated without the cache."""
    model = _model(triton)
    batch = _batch(model)
    predictor = Predictor(model, pad=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    energies = []
    for _ in range(2):
        out = predictor(batch, forces=True)  # parameters frozen for the call: derived tensors cached
        assert any(m in _frozen._CACHE for m in model.modules())
        _frozen.ENABLED = False
        reference = Predictor(copy.deepcopy(model), pad=False)(batch, forces=True)
        _frozen.ENABLED = True
        torch.testing.assert_close(out["energy"], reference["energy"], rtol=0, atol=1e-12)
        torch.testing.assert_close(out["forces"], reference["forces"], rtol=0, atol=1e-12)
        energies.append(float(out["energy"].sum()))
        opt.zero_grad()
        if triton:  # (a training step through the interpreter's double backward takes minutes)
            b = batch
            energy = model(b.positions, b.types, b.cell, b.shifts, b.receivers, b.senders, b.batch, b.edge_batch, b.n_graphs)
            (energy**2).sum().backward()
        else:
            train = predictor(batch, forces=True, create_graph=True)  # parameters require grad: nothing cached is used
            ((train["energy"] ** 2).sum() + (train["forces"] ** 2).sum()).backward()
        opt.step()
    assert len(set(energies)) == 2  # the steps changed the model, and the cached calls saw it


@pytest.mark.usefixtures("cache_on")
def test_node_embeddings_and_energy_affine_follow_their_buffers_and_types():
    """The embedding rows and each atom's energy scale and shift, gathered once per types tensor in
    frozen eager calls, follow in-place changes of the shifts and scales and a new types tensor."""
    model = _model(False)
    batch = _batch(model)
    predictor = Predictor(model, pad=False)
    with predictor.frozen():
        first = predictor(batch, forces=False)["energy"]
        assert any(slot[0].startswith("site_affine") for slot in _frozen._CACHE[model])
        assert ("rows", False) in _frozen._CACHE[model.embedding]
        with torch.no_grad():
            model.atomic_shifts.add_(0.5)  # in place: every atom's energy 0.5 eV higher
        shifted = predictor(batch, forces=False)["energy"]
        torch.testing.assert_close(shifted, first + 0.5 * batch.positions.shape[0], rtol=0, atol=1e-12)
        with torch.no_grad():
            model.scale.mul_(2.0)
        scaled = predictor(batch, forces=False)["energy"]
        # E = sum_i (s_i e_i + a_i): doubling every s_i doubles sum_i s_i e_i = first - sum_i (a_i - 0.5)
        n, shifts = batch.positions.shape[0], model.atomic_shifts[batch.types].sum()
        torch.testing.assert_close(scaled, 2 * (first - (shifts - 0.5 * n)) + shifts, rtol=0, atol=1e-9)
        other = replace(batch, types=batch.types.flip(0).clone())  # another types tensor: other gathers
        swapped = predictor(other, forces=False)["energy"]
    _frozen.ENABLED = False
    reference = Predictor(copy.deepcopy(model), pad=False)(other, forces=False)["energy"]
    _frozen.ENABLED = True
    torch.testing.assert_close(swapped, reference, rtol=0, atol=1e-12)
