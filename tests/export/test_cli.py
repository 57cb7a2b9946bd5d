"""flashcart-export: clear errors for bad input, nothing written on error; a TorchScript export end to end."""

from __future__ import annotations

import pytest
import torch
from ase import Atoms
from ase.io import write

from flashcart.cli.export import main
from flashcart.export import load_exported

from .conftest import assert_matches, ethanol, perturbed, predictor_reference


@pytest.fixture
def structure(tmp_path):
    path = tmp_path / "ethanol.xyz"
    write(path, ethanol())
    return path


def _fails(capsys, argv, message: str, out) -> None:
    assert main([str(a) for a in argv] + ["--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")], "temporary file left behind"


def test_unknown_format(checkpoint, structure, tmp_path, capsys):
    out = tmp_path / "m.pt"
    _fails(capsys, [checkpoint, "--format", "onnx", "--structure", structure, "-o", out], "unknown --format 'onnx'", out)


def test_missing_checkpoint(structure, tmp_path, capsys):
    out = tmp_path / "m.pt"
    _fails(capsys, [tmp_path / "nope", "--format", "torchscript", "--structure", structure, "-o", out], "no checkpoint at", out)


def test_structure_with_unknown_elements(checkpoint, tmp_path, capsys):
    path = tmp_path / "salt.xyz"
    write(path, Atoms("NaClH", positions=[[0, 0, 0], [2.8, 0, 0], [0, 2, 0]]))
    out = tmp_path / "m.pt2"
    _fails(
        capsys,
        [checkpoint, "--format", "aoti", "--structure", path, "-o", out],
        "elements ['Cl', 'Na'] are not among the model's elements",
        out,
    )


def test_missing_structure_and_bad_options(checkpoint, structure, tmp_path, capsys):
    out = tmp_path / "m.pt"
    base = [checkpoint, "--format", "torchscript", "-o", out]
    _fails(capsys, base + ["--structure", tmp_path / "none.xyz"], "none.xyz does not exist", out)
    _fails(capsys, base + ["--structure", structure, "--dtype", "float16"], "--dtype must be float32 or float64", out)
    _fails(capsys, base + ["--structure", structure, "--device", "tpu"], "--device must be cpu or cuda", out)
    _fails(capsys, base + ["--structure", structure, "--max-images", "2"], "--max-images applies to --format aoti only", out)
    _fails(capsys, base + ["--structure", structure, "--triton"], "--triton applies to --format aoti --device cuda only", out)
    _fails(
        capsys, base + ["--structure", structure, "--neighbours", "kd-tree"], "--neighbours must be cells or all-pairs, got 'kd-tree'", out
    )
    wrong = tmp_path / "m.pt2"
    _fails(capsys, [checkpoint, "--format", "torchscript", "--structure", structure, "-o", wrong], "must end in .pt", wrong)
    _fails(capsys, base + ["--structure", structure, "--fixed-capacity"], "--fixed-capacity applies to --format aoti only", out)
    aoti = [checkpoint, "--format", "aoti", "--structure", structure, "-o", wrong]
    _fails(capsys, aoti + ["--edges-per-atom", "40"], "--edges-per-atom applies with --fixed-capacity only", wrong)
    _fails(capsys, aoti + ["--fixed-capacity", "--atoms-per-bin", "0"], "--atoms-per-bin must be a positive integer, got 0", wrong)
    _fails(
        capsys,
        aoti + ["--fixed-capacity", "--neighbours", "all-pairs", "--atoms-per-bin", "9"],
        "--atoms-per-bin applies to the binned search (--neighbours cells), not all-pairs",
        wrong,
    )
    _fails(
        capsys,
        aoti + ["--fixed-capacity", "--edges-per-atom", "1"],
        "edges_per_atom=1 is below what the export structure itself needs",
        wrong,
    )


def test_torchscript_end_to_end(model, checkpoint, structure, tmp_path, capsys):
    out = tmp_path / "sub" / "ethanol.pt"
    assert (
        main(
            [
                str(checkpoint),
                "--format",
                "torchscript",
                "--structure",
                str(structure),
                "-o",
                str(out),
                "--dtype",
                "float64",
                "--neighbours",
                "cells",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    assert torch.jit.load(str(out)).binned  # --neighbours reached the file (ethanol alone would get all-pairs)
    pot = load_exported(out)
    atoms = perturbed(ethanol(), 11)
    assert_matches(
        *pot(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc), *predictor_reference(model, atoms), 1e-10, "cli torchscript"
    )
    assert pot.dtype == torch.float64
