"""TorchScript export (openmm-torch's TorchForce contract) against the Predictor."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from flashcart.export import build_torchscript, export_torchscript, load_exported
from flashcart.export.torchscript import EV_TO_KJ_PER_MOL

from .conftest import assert_matches, crystal, ethanol, perturbed, predictor_reference


def _torchforce_call(module, atoms, dtype=torch.float64):
    """What TorchForce does: positions (nm) in, energy (kJ/mol) out, forces by autograd; back to eV, Å."""
    x = torch.tensor(atoms.positions / 10.0, dtype=dtype, requires_grad=True)
    box = torch.tensor(atoms.cell.array / 10.0, dtype=dtype) if atoms.pbc.any() else None
    with torch.jit.optimized_execution(False):  # no profiling re-optimisation between calls of different sizes
        energy = module(x, box)
    (grad,) = torch.autograd.grad(energy, x)
    return energy.detach() / EV_TO_KJ_PER_MOL, -grad / (10.0 * EV_TO_KJ_PER_MOL)


# Both neighbour searches: the dense one (the default below BINNED_FROM_ATOMS atoms, as here)
# and the binned one (the default from there).
@pytest.fixture(scope="module", params=["all-pairs", "cells"])
def molecule_module(model, tmp_path_factory, request):
    path = tmp_path_factory.mktemp("ts") / "ethanol.pt"
    export_torchscript(model, ethanol(), path, torch.float64, neighbours=request.param)
    return torch.jit.load(str(path)), path


@pytest.fixture(scope="module", params=["all-pairs", "cells"])
def crystal_module(model, tmp_path_factory, request):
    path = tmp_path_factory.mktemp("ts") / "crystal.pt"
    export_torchscript(model, crystal(), path, torch.float64, neighbours=request.param)
    return torch.jit.load(str(path)), path


def test_the_default_search_follows_the_atom_count(model):
    from flashcart.export.torchscript import BINNED_FROM_ATOMS, default_neighbours

    assert default_neighbours(BINNED_FROM_ATOMS - 1) == "all-pairs" and default_neighbours(BINNED_FROM_ATOMS) == "cells"
    assert build_torchscript(model, ethanol(), torch.float64).binned is False
    assert build_torchscript(model, ethanol(), torch.float64, neighbours="cells").binned is True
    with pytest.raises(ValueError, match="neighbours must be cells or all-pairs, got 'kd-tree'"):
        build_torchscript(model, ethanol(), torch.float64, neighbours="kd-tree")


def test_molecule_float64_matches_predictor_at_new_positions(model, molecule_module):
    module, _ = molecule_module
    for seed in range(3):
        atoms = perturbed(ethanol(), seed)
        assert_matches(*_torchforce_call(module, atoms), *predictor_reference(model, atoms), 1e-10, f"ethanol seed {seed}")


def test_periodic_float64_matches_predictor_for_changing_boxes(model, crystal_module):
    """Moved atoms, deformed boxes (NPT), a box needing two images per side: images follow the box of each call."""
    module, _ = crystal_module
    base = crystal()
    cases = [perturbed(base, 0), perturbed(base, 1, strain=0.03), perturbed(base, 2, strain=0.05)]
    small = base.copy()
    small.set_cell(base.cell.array * 0.72, scale_atoms=True)  # face distances below the 4 Å cutoff
    cases.append(small)
    for k, atoms in enumerate(cases):
        assert_matches(*_torchforce_call(module, atoms), *predictor_reference(model, atoms), 1e-10, f"crystal case {k}")


def test_float32_matches_predictor(model):
    for atoms in (ethanol(), crystal()):
        module = build_torchscript(model, atoms, torch.float32)
        moved = perturbed(atoms, 5, strain=0.02)
        got = _torchforce_call(module, moved, torch.float32)
        assert got[0].dtype == torch.float32
        assert_matches(*got, *predictor_reference(model, moved, torch.float32), 1e-5, f"float32 {moved.get_chemical_formula()}")


def test_contract_errors(molecule_module, crystal_module):
    mol, _ = molecule_module
    per, _ = crystal_module
    x = torch.tensor(ethanol().positions / 10.0)
    with pytest.raises((RuntimeError, torch.jit.Error), match="non-periodic structure; it takes no box"):
        mol(x, torch.eye(3, dtype=torch.float64))
    with pytest.raises((RuntimeError, torch.jit.Error), match=r"positions must have shape \[9, 3\]"):
        mol(x[:5])
    with pytest.raises((RuntimeError, torch.jit.Error), match="needs the box"):
        per(torch.tensor(crystal().positions / 10.0))


def test_partially_periodic_structure_is_refused(model):
    atoms = crystal()
    atoms.pbc = (True, True, False)
    with pytest.raises(ValueError, match="periodic in all three directions"):
        build_torchscript(model, atoms, torch.float64)


def test_load_exported_wraps_torchscript(model, crystal_module):
    _, path = crystal_module
    pot = load_exported(path)
    assert pot.format == "torchscript" and pot.elements == model.elements and pot.dtype == torch.float64
    atoms = perturbed(crystal(), 7, strain=0.02)
    assert_matches(*pot(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc), *predictor_reference(model, atoms), 1e-10, "loader")
    with pytest.raises(ValueError, match="only the atoms it was exported for"):
        pot(atoms.positions[:4], atoms.numbers[:4], atoms.cell.array, atoms.pbc)


def test_file_loads_with_torch_alone(molecule_module, tmp_path):
    """The .pt needs nothing but torch: load and differentiate it where flashcart cannot be imported."""
    module, path = molecule_module
    atoms = ethanol()
    x = torch.tensor(atoms.positions / 10.0)
    expected = float(module(x))
    script = textwrap.dedent(
        f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "flashcart":
                    raise ImportError("flashcart is blocked in this test")
        sys.meta_path.insert(0, Block())
        import torch
        m = torch.jit.load({str(path)!r})
        x = torch.tensor({atoms.positions.tolist()!r}, dtype=torch.float64).div(10).requires_grad_(True)
        e = m(x)
        e.backward()
        assert x.grad.shape == (9, 3)
        try:
            import flashcart
        except ImportError:
            print(repr(float(e)))
        """
    )
    out = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert abs(float(out.stdout.strip().splitlines()[-1]) - expected) <= 1e-9 * max(1.0, abs(expected))


def test_evaluator_interface(model, molecule_module):
    """load_exported(...).evaluate is the simulation engine's Evaluator interface (host float64 results)."""
    _, path = molecule_module
    pot = load_exported(path)
    atoms = perturbed(ethanol(), 8)
    result = pot.evaluate(atoms.positions, atoms.numbers)  # cell None: a molecule
    assert result.forces.dtype.name == "float64" and result.stress is None
    assert_matches(result.energy, result.forces, *predictor_reference(model, atoms), 1e-10, "evaluate")
    with pytest.raises(ValueError, match="not stress"):
        pot.evaluate(atoms.positions, atoms.numbers, stress=True)
    pot.check_numbers(atoms.numbers)
    with pytest.raises(ValueError, match=r"elements \['Na'\] are not among"):
        pot.check_numbers([11, 1])
    with pytest.raises(ValueError, match="only the atoms it was exported for"):
        pot.check_numbers(atoms.numbers[::-1])
    assert pot.neighbor_list_builds == 1


@pytest.mark.parametrize("neighbours", ["all-pairs", "cells"])
def test_isolated_atoms(model, neighbours):
    """No pair within the cutoff: the energy of the isolated atoms (additive), zero forces."""
    from ase import Atoms

    far = Atoms("COH", positions=[[0, 0, 0], [9.0, 0, 0], [0, 9.5, 0]])
    results = []
    for atoms in (far, far[:1], far[1:2], far[2:]):
        module = build_torchscript(model, atoms, torch.float64, neighbours=neighbours)
        results.append(_torchforce_call(module, atoms))
    energy, forces = results[0]
    assert float(forces.abs().max()) == 0.0
    assert abs(float(energy) - sum(float(e) for e, _ in results[1:])) < 1e-12
