"""The radial MLPs once per pair of reverse edges: the grouping, and the same model to every order."""

import os

import pytest
import torch
from ase.build import bulk
from ase.build import molecule as ase_molecule

from flashcart.cartesian import TensorProduct
from flashcart.data import collate, structure_from_atoms
from flashcart.model import Predictor
from flashcart.model.potential import FlashCartPotential
from flashcart.nn.edge_pairs import edge_pairs, pair_capacity, pairs_fit
from flashcart.testing import TINY_MODEL, assert_close

from ..model.conftest import as_batch, crystal, molecule


def thin_cell():
    """One Cu atom in a small cell at r_max 4: every pair of images of the atom with itself."""
    atoms = bulk("Cu", "fcc", a=3.6)
    atoms.rattle(0.05, seed=2)
    return atoms


def tiny_model(**options):
    torch.manual_seed(0)
    m = FlashCartPotential(["H", "C", "O", "Cu"], avg_neighbors=5.0, use_triton=False, **{**TINY_MODEL, **options}).double()
    with torch.no_grad():  # non-trivial gates and products (zero-initialised projections otherwise)
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def _keys(b, e):
    return (int(b.receivers[e]), int(b.senders[e]), tuple(int(v) for v in b.shifts[e]))


@pytest.mark.parametrize("structures", [[molecule()], [crystal()], [thin_cell()], [molecule(1), thin_cell(), crystal()]])
def test_groups_are_reverse_pairs(structures):
    m = tiny_model()
    b = as_batch(m, structures)
    n_edges = b.receivers.shape[0]
    live = torch.ones(n_edges, dtype=torch.bool)
    pairs = edge_pairs(b.receivers, b.senders, b.shifts, live, b.positions.shape[0])
    assert pairs.leader.shape == (pair_capacity(n_edges),) and pairs.pair_of_edge.shape == (n_edges,)
    assert int(pairs.n_groups) == n_edges // 2 and pairs_fit(pairs, b.shifts, b.positions.shape[0])
    members = {}
    for e in range(n_edges):
        members.setdefault(int(pairs.pair_of_edge[e]), []).append(e)
    assert sorted(members) == list(range(n_edges // 2))
    for g, (e1, e2) in ((g, es) for g, es in members.items() if len(es) == 2):
        r, s, t = _keys(b, e1)
        assert _keys(b, e2) == (s, r, tuple(-v for v in t))  # the reverse edge
        assert int(pairs.leader[g]) in (e1, e2)
        # the product sums the row's gradient over exactly these two edges, leader first
        assert sorted(pairs.row_edges[g].tolist()) == [e1, e2] and int(pairs.row_edges[g, 0]) == int(pairs.leader[g])
    assert all(len(es) == 2 for es in members.values())
    assert pairs.row_edges[n_edges // 2 :].eq(-1).all()  # the unused row


def test_dead_edges_share_one_group_and_missing_reverses_overflow():
    m = tiny_model()
    b = as_batch(m, [crystal()])
    n_edges, n = b.receivers.shape[0], b.positions.shape[0]
    live = torch.rand(n_edges, generator=torch.Generator().manual_seed(0)) < 0.5
    pairs = edge_pairs(b.receivers, b.senders, b.shifts, live, n)
    dead = pairs.pair_of_edge[~live]
    assert dead.unique().numel() == 1 and not bool((pairs.pair_of_edge[live] == dead[0]).any())
    assert pairs.row_edges[dead[0]].eq(-1).all()  # a constant (zero) row: no gradient is summed into it
    listed = pairs.row_edges[pairs.row_edges >= 0]
    assert listed.unique().numel() == listed.numel() and live[listed].all()
    # half a list: every edge is a group of its own, more than P
    keep = b.receivers < b.senders
    half = edge_pairs(b.receivers[keep], b.senders[keep], b.shifts[keep], torch.ones(int(keep.sum()), dtype=torch.bool), n)
    assert int(half.n_groups) == int(keep.sum()) and not pairs_fit(half, b.shifts[keep], n)


def _training_gradients(m, b):
    """Energy, forces, stress, and the parameter gradients of a force-and-stress loss (double backward)."""
    out = m.predict(b, stress=True, create_graph=True)
    loss = (out["energy"] ** 2).sum() + (out["forces"] ** 2).sum() + (out["stress"] ** 2).sum()
    grads = torch.autograd.grad(loss, [p for p in m.parameters() if p.requires_grad], allow_unused=True)
    return {k: v.detach() for k, v in out.items()}, grads


@pytest.mark.parametrize("structures", [[molecule()], [thin_cell()], [molecule(1), thin_cell(), crystal()]])
def test_pairs_give_the_same_model_to_second_order(structures):
    m = tiny_model()
    _compare_pairs_to_second_order(m, as_batch(m, structures))


def _dead_edge_problem(use_triton: bool, device: str = "cpu"):
    """A model with r_max 3 on a list built at r_max 4.5: about half the edges are dead (zero
    envelope), one group whose row no gradient reaches."""
    m = tiny_model(r_max=3.0).to(device)
    if use_triton:  # the products' Triton kernels (interpreted on the CPU), the rest as it is
        for tp in (mod for mod in m.modules() if isinstance(mod, TensorProduct)):
            tp.backend = "triton"
    b = as_batch(tiny_model(r_max=4.5), [molecule(2), thin_cell()]).to(device)
    image = (b.shifts.to(b.positions.dtype)[:, :, None] * b.cell[b.edge_batch]).sum(1)
    d = (b.positions[b.senders] - b.positions[b.receivers] + image).norm(dim=1)
    assert 0.2 < float((d >= 3.0).double().mean()) < 0.8
    return m, b


def _compare_pairs_to_second_order(m, b):
    """Energy, forces, stress and second-order parameter gradients with the radial MLPs per pair
    against per edge (float64, 1e-12), checking that the MLP ran once per pair."""
    m.radial_pairs = False
    ref, ref_grads = _training_gradients(m, b)
    m.radial_pairs = True
    rows = []
    hook = m.interactions[0].radial.layers[0].register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
    out, grads = _training_gradients(m, b)
    hook.remove()
    assert rows == [pair_capacity(b.receivers.shape[0])]
    for k in ref:
        assert_close(out[k], ref[k], 1e-12, k)
    for g, r in zip(grads, ref_grads):
        assert (g is None) == (r is None)
        if g is not None:
            assert_close(g, r, 1e-12, "parameter gradient")


INTERPRETED = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter off")


@pytest.mark.parametrize("use_triton", [False, pytest.param(True, marks=INTERPRETED)], ids=["torch", "triton"])
def test_dead_edges_to_second_order(use_triton):
    """The dead edges' row lists no edges (WeightRows): exact to second order, both backends (the
    Triton kernels read the rows through the pair index)."""
    _compare_pairs_to_second_order(*_dead_edge_problem(use_triton))


@pytest.mark.gpu
def test_dead_edges_to_second_order_on_gpu():
    _compare_pairs_to_second_order(*_dead_edge_problem(True, "cuda"))


def _mlp_rows(m) -> list:
    """The row counts the first radial MLP sees (recorded while a compiled call is traced)."""
    rows = []
    m.interactions[0].radial.layers[0].register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
    return rows


def test_pairs_do_not_ask_whether_exporting(monkeypatch):
    """torch.compiler.is_exporting() is also true while dynamo traces a CUDA call for
    torch.compile (torch 2.11): the pairs once went unused in every compiled CUDA call."""
    m = tiny_model()
    m.radial_pairs = True
    b = as_batch(m, [crystal()])
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    rows = _mlp_rows(m)
    m.predict(b)
    assert rows == [pair_capacity(b.receivers.shape[0])]


def test_padded_predictor_and_incomplete_lists():
    m = tiny_model()
    b = as_batch(m, [crystal(), molecule()])
    m.radial_pairs = False
    ref = m.predict(b, stress=True)
    m.radial_pairs = True
    padded = Predictor(m, pad=True)(b, stress=True)  # padding edges are dead: one more group
    for k in ref:
        assert_close(padded[k], ref[k], 1e-12, k)
    from dataclasses import replace

    def without(drop):
        keep = ~drop
        return replace(b, receivers=b.receivers[keep], senders=b.senders[keep], shifts=b.shifts[keep], edge_batch=b.edge_batch[keep])

    # five edges without their reverses: eager calls group them (they fit), or fall back
    few = torch.zeros(b.receivers.shape[0], dtype=torch.bool)
    few[(b.receivers < b.senders).nonzero()[:5, 0]] = True
    half = b.receivers < b.senders
    for cut in (without(few), without(half)):
        m.radial_pairs = False
        cut_ref = m.predict(cut)
        m.radial_pairs = True
        assert_close(m.predict(cut)["forces"], cut_ref["forces"], 1e-12, "forces")
    # compiled calls cannot fall back: the Predictor checks each new list; five singles fit the
    # padded rows, half a list does not
    compiled = Predictor(m, compile=True, compile_backend="eager", pad_edge_multiple=8)
    assert_close(compiled(without(few))["forces"], m.predict(without(few))["forces"], 1e-12, "forces")
    with pytest.raises(ValueError, match="not pair-complete"):
        Predictor(m, compile=True, compile_backend="eager", pad_edge_multiple=8)(without(half))


def test_element_features_and_bad_setting():
    m = tiny_model(element_agnostic_interaction=False)
    m.radial_pairs = True
    assert not m.radial_pairs_used(cuda=False)
    m = tiny_model()
    # "auto": the CPU, and compiled CUDA calls; eager CUDA calls would synchronise to check the list
    assert m.radial_pairs_used(cuda=False) and not m.radial_pairs_used(cuda=True)
    assert m.radial_pairs_used(cuda=True, compiled=True) and m.radial_pairs_used(cuda=False, compiled=True)
    m.radial_pairs = True
    assert m.radial_pairs_used(cuda=True)
    m.radial_pairs = "yes"
    with pytest.raises(ValueError, match="radial_pairs"):
        m.predict(as_batch(m, [molecule()]))


def test_real_molecule_with_hydrogens():
    atoms = ase_molecule("CH3CH2OH")
    m = tiny_model()
    b = collate([structure_from_atoms(atoms, m.r_max, where="ethanol", require_labels=False)], m.z_to_type).to(dtype=torch.float64)
    m.radial_pairs = False
    ref = m.predict(b)
    m.radial_pairs = True
    assert_close(m.predict(b)["forces"], ref["forces"], 1e-12, "forces")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_pairs_on_gpu(mode):
    """Compiled calls with the products reading the pair rows (custom ops traced with the index,
    CUDA graphs) against eager calls with one MLP row per edge."""
    import copy

    torch._dynamo.reset()
    m, b = _dead_edge_problem(True, "cuda")
    m.radial_pairs = False
    ref = Predictor(m)(b, stress=True)
    paired = copy.deepcopy(m)  # a model of its own for each setting
    paired.radial_pairs = True
    rows = _mlp_rows(paired)
    compiled = Predictor(paired, compile=True, compile_mode=mode)
    for _ in range(3):
        out = compiled(b, stress=True)
    assert rows and max(rows) < b.receivers.shape[0]  # traced once per pair, not per (padded) edge
    for k in ref:
        assert_close(out[k], ref[k], 1e-10, k)


@pytest.mark.gpu
def test_compiled_training_with_pairs_on_gpu():
    """A compiled training step (create_graph, loss, parameter gradients) with the products
    reading the pair rows: the same gradients as eager calls with one MLP row per edge (on the
    CPU a custom autograd.Function once gave wrong second derivatives under inductor)."""
    import copy

    torch._dynamo.reset()
    m, b = _dead_edge_problem(True, "cuda")
    results = []
    for pairs, compile in ((False, False), (True, True)):
        model = copy.deepcopy(m)
        model.radial_pairs = pairs
        rows = _mlp_rows(model)
        out = Predictor(model, compile=compile)(b, stress=True, create_graph=True)
        assert not pairs or (rows and max(rows) < b.receivers.shape[0])
        ((out["forces"] ** 2).sum() + out["energy"].sum()).backward()
        results.append((out, [p.grad for p in model.parameters() if p.grad is not None]))
    (eo, eg), (co, cg) = results
    for k in eo:
        assert_close(co[k].detach(), eo[k].detach(), 1e-10, k)
    assert len(eg) == len(cg)
    for a, c in zip(eg, cg):
        assert_close(c, a, 1e-9, "parameter gradient")
