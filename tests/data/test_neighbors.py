"""Neighbour lists equal ASE's on the hard cases, for every backend and dtype; the skin check."""

import numpy as np
import pytest
import torch
from ase.neighborlist import primitive_neighbor_list

from flashcart.data.neighbors import displacements, max_displacement_exceeds, neighbor_list, vesin_available

BACKENDS = [
    "all_pairs",
    "cell_list",
    pytest.param("vesin", marks=pytest.mark.skipif(not vesin_available(), reason="vesin-torch is not installed")),
]


def _cases():
    rng = np.random.default_rng(0)
    out = {}
    # periodic triclinic, positions outside the cell (unwrapped: up to 20 cells away)
    cell = np.array([[7.0, 0.0, 0.0], [2.1, 6.5, 0.0], [-1.3, 1.7, 8.2]])
    unwrapped = rng.uniform(0, 1, (40, 3)) @ cell + rng.normal(0, 4.0, (40, 3)) + rng.integers(-20, 21, (40, 3)) @ cell
    out["triclinic_unwrapped"] = (unwrapped, cell, (True, True, True), 5.0)
    # a larger triclinic cell: several bins per direction in the cell list
    cell = np.array([[14.0, 0.0, 0.0], [3.0, 13.0, 0.0], [-2.0, 2.5, 12.5]])
    out["triclinic_many_bins"] = (rng.uniform(-0.2, 1.2, (160, 3)) @ cell, cell, (True, True, True), 3.5)
    # skewed cell much thinner than the cutoff: dozens of images of each atom
    cell = np.array([[2.2, 0.0, 0.0], [1.9, 1.8, 0.0], [0.7, 0.9, 2.1]])
    out["small_cell_many_images"] = (rng.uniform(0, 1, (2, 3)) @ cell, cell, (True, True, True), 6.0)
    out["one_atom_fcc"] = (np.array([[0.01, -0.02, 0.03]]), np.array([[0.0, 1.8, 1.8], [1.8, 0.0, 1.8], [1.8, 1.8, 0.0]]), (True,) * 3, 7.5)
    # open boundaries: no cell, and a cell that must be ignored
    mol = rng.normal(0, 2.5, (30, 3))
    out["molecule"] = (mol, np.zeros((3, 3)), (False, False, False), 3.0)
    out["molecule_with_cell"] = (mol, np.eye(3) * 4.0, (False, False, False), 3.0)
    # slab: periodic in-plane, open along z, atoms spread far along z; also with a zero c vector
    cell = np.array([[5.0, 0.0, 0.0], [1.5, 4.7, 0.0], [0.0, 0.0, 20.0]])
    slab = rng.uniform(0, 1, (30, 3)) @ cell
    slab[:, 2] = rng.uniform(-10, 30, 30)
    out["slab"] = (slab, cell, (True, True, False), 4.5)
    out["slab_zero_c"] = (slab, cell * np.array([[1.0], [1.0], [0.0]]), (True, True, False), 4.5)
    # wire: one short periodic direction
    cell = np.array([[2.0, 0.0, 0.0], [0.0, 15.0, 0.0], [0.0, 0.0, 15.0]])
    out["wire"] = (rng.uniform(0, 1, (6, 3)) @ cell, cell, (True, False, False), 5.0)
    return out


CASES = _cases()


def ase_edges(pos, cell, pbc, cutoff, self_interaction=False):
    i, j, S = primitive_neighbor_list("ijS", pbc, cell, pos, cutoff, self_interaction=self_interaction)
    return sorted(zip(i.tolist(), j.tolist(), map(tuple, S.tolist())))


def our_edges(i, j, S):
    return sorted(zip(i.tolist(), j.tolist(), map(tuple, S.long().tolist())))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_equals_ase(case, backend, dtype):
    pos, cell, pbc, cutoff = CASES[case]
    p, c = torch.tensor(pos, dtype=dtype), torch.tensor(cell, dtype=dtype)
    i, j, S = neighbor_list(p, cutoff, c, pbc, backend=backend)
    # ASE on the very numbers we were given (float32 inputs cast exactly to float64)
    assert our_edges(i, j, S) == ase_edges(p.double().numpy(), c.double().numpy(), pbc, cutoff)
    assert i.dtype == j.dtype == torch.int64 and S.dtype == dtype and S.shape == (i.shape[0], 3)
    assert bool((i[1:] >= i[:-1]).all()), "edges must be grouped by receiver"
    assert bool((S == S.round()).all())
    open_dirs = [k for k in range(3) if not pbc[k]]
    assert bool((S[:, open_dirs] == 0).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_self_interaction_and_small_chunks(backend):
    pos, cell, pbc, cutoff = CASES["triclinic_many_bins"]
    p, c = torch.tensor(pos), torch.tensor(cell)
    i, j, S = neighbor_list(p, cutoff, c, pbc, self_interaction=True, backend=backend, chunk=997)
    assert our_edges(i, j, S) == ase_edges(pos, cell, pbc, cutoff, self_interaction=True)
    assert bool((i[1:] >= i[:-1]).all())


@pytest.mark.skipif(not vesin_available(), reason="vesin-torch is not installed")
def test_reused_vesin_calculator_returns_independent_lists():
    """The cached vesin calculator reuses its buffers: earlier results must stay intact."""
    first = CASES["triclinic_many_bins"]
    second = CASES["slab"]
    a = neighbor_list(torch.tensor(first[0]), 4.5, torch.tensor(first[1]), first[2], backend="vesin")
    b = neighbor_list(torch.tensor(second[0]), 4.5, torch.tensor(second[1]), second[2], backend="vesin")
    assert our_edges(*a) == ase_edges(first[0], first[1], first[2], 4.5)
    assert our_edges(*b) == ase_edges(second[0], second[1], second[2], 4.5)


def test_backends_agree_in_order_free_terms_and_auto_is_one_of_them():
    pos, cell, pbc, cutoff = CASES["triclinic_many_bins"]
    p, c = torch.tensor(pos), torch.tensor(cell)
    lists = {b: our_edges(*neighbor_list(p, cutoff, c, pbc, backend=b)) for b in ("auto", "cell_list", "all_pairs")}
    assert lists["auto"] == lists["cell_list"] == lists["all_pairs"]
    assert len(lists["auto"]) > 1000


def test_auto_without_vesin_picks_the_torch_search_by_size(monkeypatch):
    import flashcart.data.neighbors as nl

    monkeypatch.setattr(nl, "_vesin_module", False)  # as where vesin-torch is missing
    used = []
    for name in ("all_pairs", "cell_list_pairs"):
        real = getattr(nl, name)
        monkeypatch.setattr(nl, name, lambda *a, _real=real, _name=name, **k: used.append(_name) or _real(*a, **k))
    for case, expected in (("molecule", "all_pairs"), ("small_cell_many_images", "all_pairs"), ("triclinic_many_bins", "cell_list_pairs")):
        pos, cell, pbc, cutoff = CASES[case]
        i, j, S = nl.neighbor_list(torch.tensor(pos), cutoff, torch.tensor(cell), pbc)
        assert used[-1] == expected, case
        assert our_edges(i, j, S) == ase_edges(pos, cell, pbc, cutoff), case
    with pytest.raises(ImportError, match="vesin-torch"):
        nl.neighbor_list(torch.zeros(2, 3), 1.0, backend="vesin")


def test_empty_and_isolated():
    i, j, S = neighbor_list(torch.zeros(0, 3), 5.0)
    assert i.shape == j.shape == (0,) and S.shape == (0, 3)
    for backend in ("cell_list", "all_pairs"):
        i, j, S = neighbor_list(torch.tensor([[0.0, 0, 0], [10.0, 0, 0]]), 5.0, backend=backend)
        assert i.numel() == 0 and S.shape == (0, 3)


def test_bad_input_is_named():
    pos = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="singular cell"):
        neighbor_list(pos, 3.0, torch.tensor([[1.0, 0, 0], [2.0, 0, 0], [0, 0, 1.0]]), (True, True, False))
    with pytest.raises(ValueError, match="pbc must be 3 booleans"):
        neighbor_list(pos, 3.0, torch.eye(3), (True, False))
    with pytest.raises(ValueError, match="NaN"):
        neighbor_list(torch.tensor([[0.0, float("nan"), 0.0]]), 3.0)
    with pytest.raises(ValueError, match="backend must be one of"):
        neighbor_list(pos, 3.0, backend="kd_tree")
    with pytest.raises(ValueError, match="cutoff must be a positive"):
        neighbor_list(pos, -1.0)
    with pytest.raises(ValueError, match=r"\[n, 3\]"):
        neighbor_list(torch.zeros(3), 3.0)


def test_skin_contract_list_with_skin_holds_every_pair_until_flagged():
    """Built at cutoff r + skin, the list contains every pair within r at displaced positions as
    long as no atom moved more than skin / 2; the check says so, and flags a larger move."""
    pos, cell, pbc, _ = CASES["triclinic_many_bins"]
    r, skin = 3.0, 0.6
    ref = torch.tensor(pos)
    c = torch.tensor(cell)
    i, j, S = neighbor_list(ref, r + skin, c, pbc)
    old = set(our_edges(i, j, S))
    rng = np.random.default_rng(3)
    step = rng.normal(size=(len(pos), 3))
    step *= (0.499 * skin) / np.linalg.norm(step, axis=1, keepdims=True)  # every atom moves just under skin / 2
    moved = ref + torch.tensor(step)
    flag = max_displacement_exceeds(moved, ref, skin, c, pbc)
    assert flag.shape == () and flag.dtype == torch.bool and not bool(flag)
    new = set(our_edges(*neighbor_list(moved, r, c, pbc)))
    assert new <= old and len(new) > 100
    moved[7] += torch.tensor([0.0, 0.0, 0.51 * skin])
    assert bool(max_displacement_exceeds(moved, ref, skin, c, pbc))


def test_wrapping_is_not_a_displacement_but_open_directions_are():
    cell = torch.tensor([[6.0, 0.0, 0.0], [1.0, 5.0, 0.0], [0.0, 0.0, 7.0]], dtype=torch.float64)
    ref = torch.tensor([[0.1, 0.2, 0.3], [3.0, 2.0, 1.0]], dtype=torch.float64)
    jumped = ref + torch.tensor([[1.0, 0.0, 0.0], [0.0, -1.0, 1.0]], dtype=torch.float64) @ cell
    jumped[0, 0] += 0.05
    assert not bool(max_displacement_exceeds(jumped, ref, 0.2, cell, (True, True, True)))
    torch.testing.assert_close(displacements(jumped, ref, cell), torch.tensor([[0.05, 0, 0], [0, 0, 0]], dtype=torch.float64))
    # along an open direction a lattice-sized jump is a real move
    assert bool(max_displacement_exceeds(jumped, ref, 0.2, cell, (True, True, False)))
    assert bool(max_displacement_exceeds(jumped, ref, 0.2))  # no cell: plain displacement
    with pytest.raises(ValueError, match="skin"):
        max_displacement_exceeds(ref, ref, -0.1)
    with pytest.raises(ValueError, match="differ in shape"):
        max_displacement_exceeds(ref[:1], ref, 0.1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["cell_list", "all_pairs", "vesin"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_equals_ase(case, backend):
    if backend == "vesin" and not vesin_available():
        pytest.skip("vesin-torch is not installed")
    pos, cell, pbc, cutoff = CASES[case]
    p, c = torch.tensor(pos, dtype=torch.float32, device="cuda"), torch.tensor(cell, dtype=torch.float32, device="cuda")
    if backend == "vesin" and case == "small_cell_many_images":
        # vesin 0.6.2's CUDA kernel holds at most 216 pairs per atom (measured on the H200);
        # "auto" then falls back to the torch cell list
        with pytest.raises(RuntimeError, match="maximum capacity"):
            neighbor_list(p, cutoff, c, pbc, backend=backend)
        backend = "auto"
    i, j, S = neighbor_list(p, cutoff, c, pbc, backend=backend)
    assert i.device.type == j.device.type == S.device.type == "cuda"
    assert our_edges(i.cpu(), j.cpu(), S.cpu()) == ase_edges(p.double().cpu().numpy(), c.double().cpu().numpy(), pbc, cutoff)
    assert bool((i[1:] >= i[:-1]).all())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_skin_check_does_not_synchronise():
    pos, cell, pbc, _ = CASES["triclinic_many_bins"]
    ref = torch.tensor(pos, dtype=torch.float32, device="cuda")
    c = torch.tensor(cell, dtype=torch.float32, device="cuda")
    pbc_t = torch.tensor(pbc, device="cuda")
    moved = ref + 0.01
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        flag = max_displacement_exceeds(moved, ref, 0.5, c, pbc_t)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert flag.device.type == "cuda" and not bool(flag)
