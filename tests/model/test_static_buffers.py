"""Neighbour lists kept at fixed addresses for CUDA-graph replays (flashcart.model.static_buffers,
FLASHCART_STATIC_LIST): values written into the previous list's tensors, new tensors marked as
static inputs, and a Predictor that changes lists in place giving the same results as one that
does not, in the order A, B, A."""

import pytest
import torch

import flashcart.model.static_buffers as static_buffers
from flashcart.model import Predictor
from flashcart.model.static_buffers import keep_addresses, static_list_mode
from flashcart.nn.edge_layout import EdgeLayout
from flashcart.nn.edge_pairs import EdgePairs
from flashcart.testing import assert_close

from .conftest import crystal, molecule, permuted_edges


def _layout(seed: int, n: int = 5, e: int = 8) -> EdgeLayout:
    g = torch.Generator().manual_seed(seed)
    pairs = EdgePairs(
        torch.randint(0, e, (e // 2 + 1,), generator=g), torch.randint(0, 4, (e,), generator=g), torch.tensor(3), torch.zeros(4, 2)
    )
    return EdgeLayout(torch.arange(n + 1), torch.randperm(e, generator=g), torch.arange(n + 1), pairs)


def test_keep_addresses_copies_into_tensors_of_the_same_layout_and_marks_new_ones_static():
    first = keep_addresses(None, _layout(0))
    assert all(getattr(t, "_dynamo_static_input_type", None) == "unguarded" for t in (first.rowptr, first.perm, first.pairs.leader))
    second = _layout(1)
    kept = keep_addresses(first, second)
    assert type(kept) is EdgeLayout and type(kept.pairs) is EdgePairs
    assert kept.perm is first.perm and kept.pairs.pair_of_edge is first.pairs.pair_of_edge
    assert torch.equal(kept.perm, second.perm) and torch.equal(kept.pairs.leader, second.pairs.leader)
    grown = _layout(2, n=7, e=12)
    regrown = keep_addresses(kept, grown)
    assert regrown.rowptr is grown.rowptr and regrown.perm is grown.perm  # other shapes: the new tensors
    assert getattr(grown.perm, "_dynamo_static_input_type", None) == "unguarded"
    assert keep_addresses(kept, EdgeLayout(*second[:3], None)).pairs is None


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_predictor_with_static_lists_equals_one_without(model, make_batch, monkeypatch, compiled):
    """Three lists in turn (A, B, A; same capacities): each call's energy, forces and stress equal
    a Predictor's that pads every list anew, while the padded list and its layout stay in the
    same tensors."""
    torch._dynamo.reset()
    options = dict(pad=True, pad_atom_multiple=32, pad_edge_multiple=256)
    if compiled:
        options |= dict(compile=True, compile_backend="eager")
    static, plain = Predictor(model, **options), Predictor(model, pad=True, pad_atom_multiple=32, pad_edge_multiple=256)
    assert not static._static_list(static.padded(make_batch(model, [molecule(1)])))  # off by default, and needs CUDA graphs
    monkeypatch.setattr(static_buffers, "STATIC_LIST", True)
    static._static_list = lambda b: True  # what compiled CUDA-graph calls on CUDA tensors do, on the CPU
    batches = {"A": make_batch(model, [molecule(1), crystal()]), "B": make_batch(model, [molecule(2), molecule(3)])}
    addresses = set()
    for name in "ABA":
        out, ref = static(batches[name], forces=True, stress=True), plain(batches[name], forces=True, stress=True)
        for key in ref:
            assert_close(out[key], ref[key], 1e-12, f"list {name}: {key}")
        padded, layout = static._prepared(batches[name])
        addresses.add((padded.receivers.data_ptr(), padded.shifts.data_ptr(), layout.perm.data_ptr() if layout else None))
    assert len(addresses) == 1


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_an_unpadded_predictor_with_static_lists_equals_one_without(model, make_batch, monkeypatch, compiled):
    """Unpadded (the profiler's Predictor): lists A, A, B, A, C in turn, where B is A's edges in
    another order (the same shapes) and C another structure. Each call equals a plain Predictor's;
    A and B share one set of copies at fixed addresses, the caller's tensors are never written,
    and C's other shapes get copies of their own."""
    torch._dynamo.reset()
    options = dict(pad=False)
    if compiled:
        options |= dict(compile=True, compile_backend="eager")
    static, plain = Predictor(model, **options), Predictor(model, pad=False)
    monkeypatch.setattr(static_buffers, "STATIC_LIST", True)
    static._static_list = lambda b: True  # what compiled CUDA-graph calls on CUDA tensors do, on the CPU
    a = make_batch(model, [molecule(1), crystal()])
    batches = {"A": a, "B": permuted_edges(a, 0), "C": make_batch(model, [molecule(2)])}
    callers = {k: [t.clone() for t in (b.receivers, b.senders, b.shifts)] for k, b in batches.items()}
    addresses = {}
    for name in "AABAC":
        out, ref = static(batches[name], forces=True, stress=True), plain(batches[name], forces=True, stress=True)
        for key in ref:
            assert_close(out[key], ref[key], 1e-12, f"list {name}: {key}")
        kept, layout = static._prepared(batches[name])
        assert kept.receivers is not batches[name].receivers and torch.equal(kept.receivers, batches[name].receivers)
        assert getattr(kept.shifts, "_dynamo_static_input_type", None) == "unguarded"
        addresses.setdefault(name, set()).add(
            (kept.receivers.data_ptr(), kept.shifts.data_ptr(), layout.perm.data_ptr() if layout else None)
        )
        for k, b in batches.items():  # the caller's lists as they were
            assert all(torch.equal(t, c) for t, c in zip((b.receivers, b.senders, b.shifts), callers[k])), f"list {k} written"
    assert len(addresses["A"] | addresses["B"]) == 1
    assert addresses["C"].isdisjoint(addresses["A"])


def test_static_list_setting_from_the_environment(monkeypatch):
    for raw, expected in (("", True), ("0", False), ("1", True)):
        monkeypatch.setenv("FLASHCART_STATIC_LIST", raw)
        assert static_list_mode() is expected
    monkeypatch.setenv("FLASHCART_STATIC_LIST", "on")
    with pytest.raises(ValueError, match="FLASHCART_STATIC_LIST must be 0 or 1, got 'on'"):
        static_list_mode()
