"""Fixed-capacity ``.pt2`` packages: static sizes (no host synchronisation, capturable in a CUDA
graph), the Predictor's results within their capacity, NaN beyond it, and the loader's
explanation of that NaN."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms

from flashcart.export import export_aoti, load_exported
from flashcart.export.aoti import Capacity, plan_capacity

from .conftest import FIXED, assert_matches, crystal, ethanol, package_inputs, predictor_reference
from .test_aoti import _cases, run_isolated


def _dense_cell() -> Atoms:
    a = crystal()
    a.set_cell(a.cell.array * 0.6, scale_atoms=True)  # 102 pairs per atom within 4 Å: beyond 64 slots
    return a


def _crowded_molecule() -> Atoms:
    rng = np.random.default_rng(4)
    return Atoms("C20", positions=rng.uniform(-1.2, 1.2, (20, 3)))  # one bin of 20 atoms (the package holds 12)


def test_fixed_package_without_flashcart_matches_predictor_and_returns_nan_beyond(small_model, package64_fixed, tmp_path):
    cases = {**_cases(), "dense cell": _dense_cell(), "crowded molecule": _crowded_molecule()}
    results, _ = run_isolated(package64_fixed, package_inputs(cases, torch.float64), tmp_path)
    for name in ("exported structure, moved", "other molecule", "crystal", "small cell", "slab", "isolated atoms", "one atom"):
        assert not isinstance(results[name], str), f"{name}: {results[name]}"
        energy, forces = results[name]
        assert energy.shape == () and energy.dtype == torch.float64 and forces.shape == (len(cases[name]), 3)
        assert_matches(energy, forces, *predictor_reference(small_model, cases[name]), 1e-10, name)
    # what the dynamic package raises for, and what does not fit, is NaN (no synchronisation inside)
    for name in ("too small cell", "unknown element", "dense cell", "crowded molecule"):
        assert not isinstance(results[name], str), f"{name}: {results[name]}"
        energy, forces = results[name]
        assert torch.isnan(energy) and torch.isnan(forces).all(), name


def test_load_exported_names_why_a_fixed_package_returned_nan(small_model, package64_fixed):
    pot = load_exported(package64_fixed)
    assert pot.capacity == Capacity(**FIXED) and pot.neighbours == "cells"
    atoms = crystal()
    assert_matches(
        *pot(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc), *predictor_reference(small_model, atoms), 1e-10, "crystal"
    )
    dense = _dense_cell()
    with pytest.raises(
        ValueError,
        match=r"816 pairs within the cutoff on 8 atoms \(102\.0 per atom\).*64 edge slots.*--edges-per-atom K .*`, K at least 102\.",
    ):
        pot(dense.positions, dense.numbers, dense.cell.array, dense.pbc)
    crowded = _crowded_molecule()
    with pytest.raises(
        ValueError, match=r"holds 20 atoms, more than the package's 12 atoms per bin.*--atoms-per-bin W .*`, W at least 20\."
    ):
        pot(crowded.positions, crowded.numbers, crowded.cell.array, crowded.pbc)
    salt = _cases()["unknown element"]
    with pytest.raises(ValueError, match=r"elements \['Na'\] are not among the model's elements"):
        pot(salt.positions, salt.numbers, salt.cell.array, salt.pbc)
    tiny = _cases()["too small cell"]
    with pytest.raises(ValueError, match=r"needs \[3, 3, 3\] periodic images.*--max-images K"):
        pot(tiny.positions, tiny.numbers, tiny.cell.array, tiny.pbc)
    with pytest.raises(ValueError, match="cuda_graph=True needs a fixed-capacity package on CUDA"):
        load_exported(package64_fixed, cuda_graph=True)


def test_capacities_from_the_export_structure_and_their_errors(small_model, tmp_path):
    atoms = crystal()
    cap = plan_capacity(atoms, small_model.r_max, (1, 1, 1), "cells")
    assert cap == Capacity(edges_per_atom=20, atoms_per_bin=14)  # 142 pairs on 8 atoms x 1.1; fullest bin 8 x 1.5 + 2
    assert plan_capacity(atoms, small_model.r_max, (1, 1, 1), "all-pairs") == Capacity(20, None)
    with pytest.raises(
        ValueError, match=r"edges_per_atom=17 is below what the export structure itself needs \(142 pairs on 8 atoms: at least 18\)"
    ):
        plan_capacity(atoms, small_model.r_max, (1, 1, 1), "cells", edges_per_atom=17)
    with pytest.raises(ValueError, match=r"atoms_per_bin=7 is below the export structure's fullest bin \(8 atoms\)"):
        plan_capacity(atoms, small_model.r_max, (1, 1, 1), "cells", atoms_per_bin=7)
    with pytest.raises(ValueError, match="atoms_per_bin applies to the binned search"):
        plan_capacity(atoms, small_model.r_max, (1, 1, 1), "all-pairs", atoms_per_bin=9)
    with pytest.raises(ValueError, match="fixed-capacity packages only"):
        export_aoti(small_model, ethanol(), tmp_path / "m.pt2", torch.float64, edges_per_atom=30)
    with pytest.raises(ValueError, match="edges_per_atom must be a positive integer, got 0"):
        export_aoti(small_model, ethanol(), tmp_path / "m.pt2", torch.float64, fixed_capacity=True, edges_per_atom=0)
    assert list(tmp_path.iterdir()) == []


class _FakeRunner:
    """Stands in for a loaded package: its metadata says fixed capacity on ``device``."""

    def __init__(self, path, run_single_threaded, device):
        self.path, self.single_threaded, self.device = path, run_single_threaded, device

    def get_metadata(self):
        import json

        from flashcart.export.aoti import FORMAT

        return {
            "flashcart_format": FORMAT,
            "elements": json.dumps(["C", "H", "O"]),
            "cutoff": "4.0",
            "max_images": json.dumps([2, 2, 2]),
            "neighbours": "cells",
            "dtype": "float32",
            "device": self.device,
            "capacity": json.dumps(FIXED),
        }


@pytest.mark.parametrize("device, cuda_graph, graphed", [("cuda", None, True), ("cuda", False, False), ("cpu", None, False)])
def test_a_graphed_package_runs_through_the_single_threaded_runner(tmp_path, monkeypatch, device, cuda_graph, graphed):
    """The default runner queries the CUDA event of its previous run, and after a captured run
    that query fails ("invalid argument", H200, torch 2.11: the GPU test's second atom count);
    ``load_exported`` therefore captures through a runner loaded with ``run_single_threaded=True``,
    and keeps the default runner where nothing is captured."""
    loads = []

    def fake_load(path, run_single_threaded=False, device_index=-1):
        loads.append(_FakeRunner(path, run_single_threaded, device))
        return loads[-1]

    monkeypatch.setattr(torch._inductor, "aoti_load_package", fake_load)
    path = tmp_path / "m.pt2"
    path.write_bytes(b"stands in for a package")
    pot = load_exported(path, cuda_graph=cuda_graph)
    assert [r.single_threaded for r in loads] == ([False, True] if graphed else [False])
    assert pot._runner is loads[-1]
    if graphed:
        assert pot._graphed is not None and pot._graphed.runner is loads[-1]
    else:
        assert pot._graphed is None


def test_a_package_that_cannot_be_loaded_for_graphs_is_an_error_naming_it(tmp_path, monkeypatch):
    def fake_load(path, run_single_threaded=False, device_index=-1):
        if run_single_threaded:
            raise RuntimeError("no such runner")
        return _FakeRunner(path, run_single_threaded, "cuda")

    monkeypatch.setattr(torch._inductor, "aoti_load_package", fake_load)
    path = tmp_path / "m.pt2"
    path.write_bytes(b"stands in for a package")
    with pytest.raises(ValueError, match=r"m\.pt2: cannot be loaded for CUDA graphs \(RuntimeError: no such runner\)"):
        load_exported(path)
