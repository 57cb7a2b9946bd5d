"""Reading, validation, neighbour lists and batching."""

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.io import write
from ase.neighborlist import neighbor_list as ase_neighbor_list

from flashcart.data import BatchLoader, DataError, collate, neighbor_list, read_structures, structure_from_atoms

KEYS = dict(energy_key="REF_energy", forces_key="REF_forces", stress_key="REF_stress")


def labelled(n=3, seed=0):
    rng = np.random.default_rng(seed)
    frames = []
    for k in range(n):
        a = Atoms("CHHO", positions=rng.normal(size=(4, 3)) * 1.5)
        a.info["REF_energy"] = -10.0 - k
        a.arrays["REF_forces"] = rng.normal(size=(4, 3))
        frames.append(a)
    return frames


def write_frames(path, frames):
    write(path, frames, format="extxyz")
    return path


def read(path):
    return read_structures(path, 4.0, progress=False, **KEYS)


def test_reads_labels(tmp_path):
    frames = labelled()
    s = read(write_frames(tmp_path / "ok.xyz", frames))
    assert len(s) == 3 and float(s[1].energy) == -11.0
    assert torch.allclose(s[2].forces, torch.tensor(frames[2].arrays["REF_forces"]))


@pytest.mark.parametrize(
    "damage, message",
    [
        ("no_energy", r"frame 1: missing energy label atoms.info\['REF_energy'\]"),
        ("no_forces", r"frame 1: missing force label"),
        ("nan_energy", r"frame 1: energy 'REF_energy' is not finite"),
        ("nan_forces", r"frame 1: forces 'REF_forces' contain non-finite values"),
        ("bad_shape", r"frame 1: forces 'REF_forces' have shape \(4, 2\), expected \(4, 3\)"),
    ],
)
def test_bad_frames_name_file_and_frame(tmp_path, damage, message):
    frames = labelled()
    a = frames[1]
    if damage == "no_energy":
        del a.info["REF_energy"]
    elif damage == "no_forces":
        del a.arrays["REF_forces"]
    elif damage == "nan_energy":
        a.info["REF_energy"] = float("nan")
    elif damage == "nan_forces":
        a.arrays["REF_forces"][0, 0] = np.nan
    else:
        f = a.arrays.pop("REF_forces")
        a.new_array("REF_forces", f[:, :2])
    path = write_frames(tmp_path / "bad.xyz", frames)
    with pytest.raises(DataError, match=message) as err:
        read(path)
    assert "bad.xyz" in str(err.value)


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.xyz"
    empty.write_text("")
    with pytest.raises(DataError, match="empty.xyz"):
        read(empty)
    with pytest.raises(DataError, match="does not exist"):
        read(tmp_path / "nope.xyz")


def test_unknown_element_in_validation_data_names_the_frame(tmp_path):
    frames = labelled()
    frames[2] = Atoms("CHHS", positions=frames[2].positions, info=frames[2].info)
    frames[2].arrays["REF_forces"] = np.zeros((4, 3))
    structures = read(write_frames(tmp_path / "valid.xyz", frames))
    z_to_type = torch.full((119,), -1)
    for t, z in enumerate([1, 6, 8]):
        z_to_type[z] = t
    with pytest.raises(ValueError, match=r"valid.xyz, frame 2: elements \['S'\]"):
        collate(structures, z_to_type)


@pytest.mark.parametrize("cutoff", [2.0, 5.0, 7.5])
def test_neighbor_list_matches_ase_for_small_periodic_cells(cutoff):
    atoms = bulk("Cu", "fcc", a=3.6)  # one atom: many images of itself
    atoms.rattle(0.01, seed=2)
    i, j, S = neighbor_list(torch.tensor(atoms.positions), cutoff, torch.tensor(atoms.cell.array), atoms.pbc)
    ai, aj, aS = ase_neighbor_list("ijS", atoms, cutoff)
    ours = sorted(zip(i.tolist(), j.tolist(), map(tuple, S.long().tolist())))
    theirs = sorted(zip(ai.tolist(), aj.tolist(), map(tuple, aS.tolist())))
    assert ours == theirs
    assert torch.all(i[1:] >= i[:-1])


def test_mixed_periodicity_and_isolated_atoms():
    slab = bulk("Cu", "fcc", a=3.6) * (2, 2, 1)
    slab.pbc = (True, True, False)
    slab.rattle(0.01, seed=3)
    i, j, S = neighbor_list(torch.tensor(slab.positions), 4.0, torch.tensor(slab.cell.array), slab.pbc)
    ai, aj, aS = ase_neighbor_list("ijS", slab, 4.0)
    ours = sorted(zip(i.tolist(), j.tolist(), map(tuple, S.long().tolist())))
    theirs = sorted(zip(ai.tolist(), aj.tolist(), map(tuple, aS.tolist())))
    assert ours == theirs
    assert any(shift != (0, 0, 0) for _, _, shift in ours)  # periodic images are part of the comparison
    assert bool((S[:, 2] == 0).all())  # no images along the non-periodic axis
    lonely = structure_from_atoms(Atoms("H", positions=[[0, 0, 0]]), 5.0, require_labels=False)
    assert lonely.n_edges == 0


def test_dynamic_batches_respect_budgets():
    rng = np.random.default_rng(1)
    structures = []
    for _ in range(40):
        n = int(rng.integers(2, 12))
        a = Atoms("H" * n, positions=rng.normal(size=(n, 3)) * 2)
        structures.append(structure_from_atoms(a, 3.0, require_labels=False))
    z_to_type = torch.full((119,), -1)
    z_to_type[1] = 0
    loader = BatchLoader(structures, 5, z_to_type, dynamic=True, shuffle=True, seed=3)
    seen = []
    for idx in loader.index_batches():
        atoms = sum(structures[i].n_atoms for i in idx)
        edges = sum(structures[i].n_edges for i in idx)
        assert len(idx) == 1 or (atoms <= loader.max_atoms and edges <= loader.max_edges)
        seen += idx
    assert sorted(seen) == list(range(40))
    first = loader.index_batches()
    loader.set_epoch(1)
    assert loader.index_batches() != first
    loader.set_epoch(0)
    assert loader.index_batches() == first


def _h_structures(n: int = 7):
    rng = np.random.default_rng(2)
    z_to_type = torch.full((119,), -1)
    z_to_type[1] = 0
    frames = [Atoms("H" * 4, positions=rng.normal(size=(4, 3)) * 1.5) for _ in range(n)]
    return [structure_from_atoms(a, 3.0, require_labels=False) for a in frames], z_to_type


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_pin_memory_without_cuda_is_a_clear_error():
    structures, z_to_type = _h_structures()
    with pytest.raises(ValueError, match="pin_memory=True needs CUDA"):
        BatchLoader(structures, 3, z_to_type, pin_memory=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("n_workers", [0, 1])
def test_pinned_batches_equal_unpinned_ones(n_workers):
    structures, z_to_type = _h_structures()
    plain = list(BatchLoader(structures, 3, z_to_type, n_workers=n_workers))
    pinned = list(BatchLoader(structures, 3, z_to_type, n_workers=n_workers, pin_memory=True))
    assert len(plain) == len(pinned) == 3
    for a, b in zip(plain, pinned):
        assert b.positions.is_pinned() and b.receivers.is_pinned()
        on_gpu = b.to("cuda")
        assert torch.equal(on_gpu.positions.cpu(), a.positions) and torch.equal(on_gpu.receivers.cpu(), a.receivers)
