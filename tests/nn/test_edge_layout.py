"""The neighbour list's layout (CSR and radial pairs) computed once per list by the Predictor."""

import copy
from dataclasses import replace

import pytest
import torch

import flashcart.nn.edge_layout as edge_layout
from flashcart.model import Predictor
from flashcart.nn.edge_layout import edge_layout_mode
from flashcart.nn.edge_pairs import pair_capacity
from flashcart.testing import assert_close

from ..model.conftest import as_batch, crystal, molecule
from .test_edge_pairs import _dead_edge_problem, _training_gradients, thin_cell, tiny_model


def _counting(m):
    """``m`` with its ``edge_layout`` counted: returns the list of the edge counts it was called for."""
    calls = []
    make = m.edge_layout

    def counted(receivers, *args, **kwargs):
        calls.append(receivers.shape[0])
        return make(receivers, *args, **kwargs)

    m.edge_layout = counted
    return calls


def _outputs_without_layout(m, b, monkeypatch, **kw):
    monkeypatch.setattr(edge_layout, "EDGE_LAYOUT", False)
    try:
        return Predictor(m, **kw)(b, stress=True)
    finally:
        monkeypatch.setattr(edge_layout, "EDGE_LAYOUT", True)


@pytest.mark.parametrize("pad", [False, True], ids=["unpadded", "padded"])
def test_precomputed_layout_gives_the_same_model_to_second_order(pad, monkeypatch):
    """Real edges beyond the cutoff count as live in a precomputed layout's pairs (each its own
    pair's row) and as dead inside a call (one shared zero row): the same function to second order
    (float64, 1e-12), padded or not."""
    m, b = _dead_edge_problem(False)
    m.radial_pairs = True
    monkeypatch.setattr(edge_layout, "EDGE_LAYOUT", False)
    ref, ref_grads = _training_gradients(m, b)
    monkeypatch.setattr(edge_layout, "EDGE_LAYOUT", True)
    calls = _counting(m)
    out = Predictor(m, pad=pad, pad_edge_multiple=64)(b, stress=True, create_graph=True)
    assert calls == [Predictor(m, pad=pad, pad_edge_multiple=64).padded(b).receivers.shape[0] if pad else b.receivers.shape[0]]
    loss = (out["energy"] ** 2).sum() + (out["forces"] ** 2).sum() + (out["stress"] ** 2).sum()
    grads = torch.autograd.grad(loss, [p for p in m.parameters() if p.requires_grad], allow_unused=True)
    for k in ref:
        assert_close(out[k].detach(), ref[k], 1e-12, k)
    for g, r in zip(grads, ref_grads):
        assert (g is None) == (r is None)
        if g is not None:
            assert_close(g, r, 1e-12, "parameter gradient")


def test_layout_computed_once_per_list_and_again_for_a_new_or_changed_list():
    m = tiny_model()
    b = as_batch(m, [crystal(), molecule()])
    calls = _counting(m)
    p = Predictor(m, pad=True, pad_edge_multiple=32)
    first = p(b)
    moved = replace(b, positions=b.positions + 0.01 * torch.randn_like(b.positions))
    p(moved)
    p(b)
    assert len(calls) == 1  # one list, three calls
    layout = p._layout_cache.layout
    # the same layout as a fresh computation, pairs included (CPU: pairs in every call)
    fresh = Predictor(m, pad=True, pad_edge_multiple=32)
    padded = fresh.padded(b)
    again = type(m).edge_layout(
        m, padded.receivers, padded.senders, padded.shifts, b.receivers.shape[0], padded.positions.shape[0], compiled=False
    )
    assert layout.pairs is not None
    for x, y in zip(layout[:3] + tuple(layout.pairs), again[:3] + tuple(again.pairs)):
        assert torch.equal(x, y)
    # another list: computed again
    p(as_batch(m, [thin_cell()]))
    assert len(calls) == 2
    # the same list tensors written in place: computed again
    p(b)
    assert len(calls) == 3
    p.padded(b).senders.add_(0)  # bumps the version counter, same values
    assert_close(p(b)["forces"], first["forces"], 1e-12, "forces")
    assert len(calls) == 4
    # the radial pairs switched off: computed again, without pairs
    m.radial_pairs = False
    p(b)
    assert len(calls) == 5 and p._layout_cache.layout.pairs is None


def _graph_ops(m, b, compile_layout: bool, monkeypatch) -> set:
    """The ATen ops of the traced graph of a compiled force call."""
    ops = set()

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function":
                ops.add(getattr(node.target, "__name__", str(node.target)))
        return gm.forward

    torch._dynamo.reset()
    monkeypatch.setattr(edge_layout, "EDGE_LAYOUT", compile_layout)
    out = Predictor(m, compile=True, compile_backend=backend)(b)
    monkeypatch.setattr(edge_layout, "EDGE_LAYOUT", True)
    return ops, out


def test_compiled_call_sorts_nothing_with_a_layout(monkeypatch):
    """The compiled function's graph holds no sort, binary search or scan with the layout passed
    in; without it (FLASHCART_EDGE_LAYOUT=0) it does, and the results agree."""
    m = tiny_model()
    b = as_batch(m, [crystal()])
    with_ops, out = _graph_ops(m, b, True, monkeypatch)
    without_ops, ref = _graph_ops(m, b, False, monkeypatch)
    per_list = {"sort", "searchsorted", "cumsum"}
    assert not any(any(p in op for p in per_list) for op in with_ops), sorted(with_ops)
    assert all(any(p in op for op in without_ops) for p in per_list), sorted(without_ops)
    for k in ref:
        assert_close(out[k], ref[k], 1e-12, k)


def test_compiled_and_eager_calls_with_the_layout(monkeypatch):
    """A compiled call (inductor, padded) with the layout == an eager call without it, and a list
    that is not pair-complete is refused by a compiled call, falls back in an eager one."""
    m = tiny_model()
    b = as_batch(m, [crystal(), molecule()])
    ref = _outputs_without_layout(copy.deepcopy(m), b, monkeypatch)
    torch._dynamo.reset()
    out = Predictor(m, compile=True, pad_edge_multiple=32)(b, stress=True)
    for k in ref:
        assert_close(out[k], ref[k], 1e-11, k)
    keep = b.receivers < b.senders
    half = replace(b, receivers=b.receivers[keep], senders=b.senders[keep], shifts=b.shifts[keep], edge_batch=b.edge_batch[keep])
    eager = Predictor(m)
    eager(half)
    assert eager._layout_cache.layout.pairs is None  # not pair-complete: one MLP row per edge
    m.radial_pairs = False
    half_ref = Predictor(m)(half)
    m.radial_pairs = True
    assert_close(eager(half)["forces"], half_ref["forces"], 1e-12, "forces")
    with pytest.raises(ValueError, match="the batch's neighbour list is not pair-complete"):
        Predictor(m, compile=True, compile_backend="eager", pad=False)(half)


def test_the_mlp_runs_once_per_pair_with_the_layout():
    m = tiny_model()
    b = as_batch(m, [crystal()])
    rows = []
    m.interactions[0].radial.layers[0].register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
    Predictor(m)(b)
    assert rows == [pair_capacity(b.receivers.shape[0])]


def test_bad_setting(monkeypatch):
    monkeypatch.setenv("FLASHCART_EDGE_LAYOUT", "yes")
    with pytest.raises(ValueError, match="FLASHCART_EDGE_LAYOUT must be 0 or 1, got 'yes'"):
        edge_layout_mode()
    monkeypatch.setenv("FLASHCART_EDGE_LAYOUT", "0")
    assert edge_layout_mode() is False
    monkeypatch.delenv("FLASHCART_EDGE_LAYOUT")
    assert edge_layout_mode() is True
