"""AOTInductor packages against the Predictor, run where flashcart cannot be imported.

Compiling a package takes minutes of CPU, so the float64 package is built once per session
(through ``flashcart-export``, fixture ``package64`` in conftest) for a small model, and every
structure is checked against that one file.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from ase import Atoms

from flashcart.export import build_torchscript, export_aoti, load_exported
from flashcart.units import KJ_PER_MOL_PER_EV

from .conftest import (
    ELEMENTS,
    FAST_COMPILE,
    assert_matches,
    crystal,
    ethanol,
    other_molecule,
    package_inputs,
    perturbed,
    predictor_reference,
)


def _cases():
    small = crystal()
    small.set_cell(small.cell.array * 0.72, scale_atoms=True)  # needs 2 images per side
    tiny = crystal()
    tiny.set_cell(tiny.cell.array * 0.45, scale_atoms=True)  # needs 3: beyond the package
    slab = perturbed(crystal(), 4)
    slab.pbc = (True, True, False)
    salt = Atoms("NaCH", positions=[[0, 0, 0], [2.0, 0, 0], [2.5, 1.0, 0]])
    return {
        "exported structure, moved": perturbed(ethanol(), 1),
        "other molecule": other_molecule(),
        "crystal": perturbed(crystal(), 2),
        "small cell": small,
        "slab": slab,
        "too small cell": tiny,
        "unknown element": salt,
        "isolated atoms": Atoms("COH", positions=[[0, 0, 0], [9.0, 0, 0], [0, 9.5, 0]]),
        "one atom": Atoms("O"),
    }


RUNNER = textwrap.dedent(
    """
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "flashcart":
                raise ImportError("flashcart is blocked in this test")
    sys.meta_path.insert(0, Block())
    import torch
    try:
        import flashcart
        raise SystemExit("flashcart is importable")
    except ImportError:
        pass
    runner = torch._inductor.aoti_load_package(sys.argv[1])
    results = {}
    for name, args in torch.load(sys.argv[2]).items():
        try:
            results[name] = runner(*args)
        except Exception as err:
            results[name] = str(err)
    torch.save(results, sys.argv[3])
    """
)


def run_isolated(package, inputs: dict, tmp_path) -> tuple[dict, subprocess.CompletedProcess]:
    """``package`` run on each of ``inputs`` (:func:`~.conftest.package_inputs`) by :data:`RUNNER`,
    in a process that cannot import flashcart: ``({name: (energy, forces) or error text}, process)``."""
    torch.save(inputs, tmp_path / "inputs.pt")
    cmd = [sys.executable, "-I", "-c", RUNNER, str(package), str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(tmp_path / "out.pt"), proc


@pytest.mark.parametrize("package", ["package64", "package64_all_pairs"])
def test_package_without_flashcart_matches_predictor(small_model, package, tmp_path, request):
    """Both neighbour searches (binned, the default; all pairs)."""
    package64 = request.getfixturevalue(package)
    cases = _cases()
    results, proc = run_isolated(package64, package_inputs(cases, torch.float64), tmp_path)
    for name in ("exported structure, moved", "other molecule", "crystal", "small cell", "slab"):
        assert not isinstance(results[name], str), f"{name}: {results[name]}"
        energy, forces = results[name]
        assert energy.shape == () and energy.dtype == torch.float64
        assert_matches(energy, forces, *predictor_reference(small_model, cases[name]), 1e-10, name)
    # no pair within the cutoff: the energy of isolated atoms (as the TorchScript file gives it), no forces
    for name in ("isolated atoms", "one atom"):
        assert not isinstance(results[name], str), f"{name}: {results[name]}"
        energy, forces = results[name]
        module = build_torchscript(small_model, cases[name], torch.float64)
        expected = float(module(torch.tensor(cases[name].positions / 10.0))) / KJ_PER_MOL_PER_EV
        assert abs(float(energy) - expected) < 1e-12 and float(forces.abs().max()) == 0.0, name
    # the package's own checks refuse these. Torch 2.13 raises their message; torch 2.11's
    # runner prints it on stderr ("Error: ...") and raises a generic "API call failed"
    overflow, unknown = results["too small cell"], results["unknown element"]
    assert isinstance(overflow, str) and isinstance(unknown, str)
    said = overflow + unknown + proc.stderr
    assert "more periodic images than this package enumerates" in said
    assert "--max-images" in said and "max_images=[2, 2, 2]" in said
    assert "outside the model's elements ['H', 'C', 'O', 'Cu']" in said


@pytest.mark.parametrize("neighbours", ["cells", "all-pairs"])
def test_a_structure_with_more_pairs_than_the_export_structure_has_candidates(small_model, tmp_path, neighbours):
    """Inductor bounded the number of pairs by the export structure's all-pairs count (24 atoms
    x 27 images = 15,552 for a small periodic water box) and refused anything larger at run time
    ("Expected u0 <= 15552 but received 17450"); the export switches those scalar assertions
    off, so the package takes any size, with either neighbour search."""
    from ..simulation.systems import pairs_within, water_box

    small, large = water_box(n_side=2), water_box(n_side=6)
    path = export_aoti(
        small_model, small, tmp_path / "water.pt2", torch.float64, max_images=1, inductor_configs=FAST_COMPILE, neighbours=neighbours
    )
    assert load_exported(path).neighbours == neighbours
    assert pairs_within(large, small_model.r_max) > len(small) ** 2 * 27
    energy, forces = load_exported(path)(large.positions, large.numbers, large.cell.array, large.pbc)
    assert_matches(energy, forces, *predictor_reference(small_model, large), 1e-10, f"{len(large)}-atom water")


def test_load_exported_reads_metadata(small_model, package64):
    pot = load_exported(package64)
    assert (pot.format, pot.elements, pot.cutoff, pot.dtype, pot.max_images) == (
        "aoti",
        ELEMENTS,
        small_model.r_max,
        torch.float64,
        [2, 2, 2],
    )
    atoms = perturbed(crystal(), 9, strain=0.03)
    assert_matches(
        *pot(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc), *predictor_reference(small_model, atoms), 1e-10, "loader"
    )
    with pytest.raises(ValueError, match="expected positions"):
        pot(atoms.positions[:, :2], atoms.numbers, atoms.cell.array, atoms.pbc)
    # what the package refuses, the loader names (whichever way the torch version reports it)
    tiny = _cases()["too small cell"]
    with pytest.raises(ValueError, match=r"needs \[3, 3, 3\] periodic images.*max_images=\[2, 2, 2\].*--max-images K"):
        pot(tiny.positions, tiny.numbers, tiny.cell.array, tiny.pbc)
    salt = _cases()["unknown element"]
    with pytest.raises(ValueError, match=r"elements \['Na'\] are not among the model's elements"):
        pot(salt.positions, salt.numbers, salt.cell.array, salt.pbc)


def test_max_images_below_the_structure_need_is_refused(small_model, tmp_path):
    small = crystal()
    small.set_cell(small.cell.array * 0.72, scale_atoms=True)
    with pytest.raises(ValueError, match="below what the export structure itself needs"):
        export_aoti(small_model, small, tmp_path / "x.pt2", torch.float64, max_images=1)
    assert not list(tmp_path.iterdir())


def _copying_compiler(package, tmp_path, monkeypatch):
    """``aoti_compile_and_package`` made to copy ``package`` (a real one); returns a target file
    holding a previous package."""
    target = tmp_path / "m.pt2"
    target.write_bytes(b"the previous package")
    monkeypatch.setattr(
        torch._inductor,
        "aoti_compile_and_package",
        lambda program, package_path, inductor_configs: __import__("shutil").copyfile(package, package_path),
    )
    return target


def test_a_package_that_does_not_load_is_refused_and_nothing_is_written(small_model, package64, tmp_path, monkeypatch):
    """The export loads every package in a fresh process first (the CUDA packages with Triton
    kernels crashed in torch's loader on the H200): a crash there fails the export with the
    file named and leaves an existing file untouched. Here a real package is "compiled" (copied)
    and the loading process is made to crash."""
    import flashcart.export.aoti as aoti

    target = _copying_compiler(package64, tmp_path, monkeypatch)
    monkeypatch.setattr(
        aoti, "_LOAD_CHECK", "import os, signal, sys; print('loading', sys.argv[1], file=sys.stderr); os.kill(os.getpid(), signal.SIGSEGV)"
    )
    with pytest.raises(RuntimeError, match=r"crashed \(signal 11\) when loaded in a fresh process; nothing was written") as err:
        export_aoti(small_model, ethanol(), target, torch.float64, max_images=2, triton=True, device="cpu")
    assert "loading" in str(err.value) and ".m.pt2." in str(err.value)  # the temporary file, with the child's error output
    assert target.read_bytes() == b"the previous package" and sorted(p.name for p in tmp_path.iterdir()) == ["m.pt2"]
    # the real check on the real package passes, and a file that is not a package fails it
    monkeypatch.undo()
    aoti.check_package_loads(package64, timeout=300)
    (tmp_path / "bad.pt2").write_bytes(b"not a zip archive")
    with pytest.raises(RuntimeError, match=r"bad\.pt2 failed \(exit status 1\) when loaded in a fresh process\.\n") as err:
        aoti.check_package_loads(tmp_path / "bad.pt2", timeout=300)
    assert "nothing was written" not in str(err.value)  # a standalone check of an existing file
    # a package with Triton kernels: the error names the C++ compiler and what to do
    monkeypatch.setenv("CXX", "/usr/bin/true")
    with pytest.raises(RuntimeError, match=r"C\+\+ wrapper was compiled with \S+\. .*static.*CXX=/usr/bin/g\+\+.*without --triton"):
        aoti.check_package_loads(tmp_path / "bad.pt2", timeout=300, triton_kernels=True)


def test_a_package_that_computes_something_else_is_refused_and_nothing_is_written(small_model, package64, tmp_path, monkeypatch):
    """The export runs every package on its export structure in the fresh process and compares
    with the model (on the H200 a package with the Triton kernels gave the right forces and an
    energy off by half): a package that disagrees fails the export with both energies named and
    an existing file untouched. Here a real package is "compiled" (copied) and the process
    reports an energy 0.01 eV off; the real package passes the same check."""
    import flashcart.export.aoti as aoti

    target = _copying_compiler(package64, tmp_path, monkeypatch)
    real = aoti._LOAD_CHECK
    monkeypatch.setattr(aoti, "_LOAD_CHECK", real.replace("energy.detach().cpu()", "energy.detach().cpu() + 0.01"))
    with pytest.raises(RuntimeError, match=r"does not compute what the model computes.*relative difference .*; nothing was written") as err:
        export_aoti(small_model, ethanol(), target, torch.float64, max_images=2, device="cpu")
    assert "eV against" in str(err.value) and "without --triton" not in str(err.value)
    assert target.read_bytes() == b"the previous package" and sorted(p.name for p in tmp_path.iterdir()) == ["m.pt2"]
    monkeypatch.setattr(aoti, "_LOAD_CHECK", real)
    export_aoti(small_model, ethanol(), target, torch.float64, max_images=2, device="cpu")  # the copied real package
    assert target.read_bytes() == package64.read_bytes()
    reference = aoti.model_reference(small_model, ethanol(), torch.float64, "cpu")
    aoti.check_package_loads(
        package64, timeout=300, example=aoti._example(ethanol(), torch.float64, torch.device("cpu")), reference=reference
    )
    shifted = (reference[0] + 1.0, reference[1])
    with pytest.raises(RuntimeError, match=r"relative difference .* \(allowed 1e-08\)\. Export without --triton"):
        aoti.check_package_loads(
            package64,
            timeout=300,
            triton_kernels=True,
            example=aoti._example(ethanol(), torch.float64, torch.device("cpu")),
            reference=shifted,
        )


@pytest.mark.slow
def test_float32_package(small_model, tmp_path):
    """float32, exported on the periodic cell (images from it), evaluated on it and on a molecule."""
    path = export_aoti(small_model, crystal(), tmp_path / "crystal.pt2", torch.float32, inductor_configs=FAST_COMPILE)
    pot = load_exported(path)
    assert pot.dtype == torch.float32 and pot.max_images == [1, 1, 1]
    for atoms in (perturbed(crystal(), 3, strain=0.02), other_molecule()):
        energy, forces = pot(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
        assert forces.dtype == torch.float32
        assert_matches(energy, forces, *predictor_reference(small_model, atoms, torch.float32), 1e-5, atoms.get_chemical_formula())


def test_an_unknown_neighbour_search_is_refused_and_nothing_is_written(small_model, tmp_path):
    with pytest.raises(ValueError, match="neighbours must be cells or all-pairs, got 'kd-tree'"):
        export_aoti(small_model, ethanol(), tmp_path / "m.pt2", torch.float64, neighbours="kd-tree")
    assert list(tmp_path.iterdir()) == []
