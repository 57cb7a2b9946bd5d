"""Exports on CUDA (run with -m gpu): the .pt2 with the Triton kernels compiled in, the TorchScript file on CUDA."""

from __future__ import annotations

import pytest
import torch

from flashcart.export import export_torchscript, load_exported
from flashcart.export.aoti import build_aoti_graph
from flashcart.model import FlashCartPotential

from .conftest import ELEMENTS, assert_matches, crystal, ethanol, make_model, other_molecule, package_inputs, perturbed, predictor_reference
from .test_aoti import RUNNER

pytestmark = pytest.mark.gpu


def _triton_model() -> FlashCartPotential:
    ref = make_model()
    tri = FlashCartPotential(ELEMENTS, avg_neighbors=5.0, **{**ref.options, "use_triton": True}).double()
    tri.load_state_dict(ref.state_dict())
    return tri


def test_cuda_graph_uses_the_triton_kernels():
    program, _, _ = build_aoti_graph(_triton_model(), ethanol(), torch.float64, "cuda", triton=True)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert any("flashcart" in t for t in targets), sorted(targets)[:20]


# Each stage runs in its own process with faulthandler on, so a crash inside inductor or the
# package (a segfault stopped this test on the H200 once) fails the test with the stage named
# and the native traceback, instead of ending the pytest session.
_EXPORT = """
import sys, torch
from flashcart.export import export_aoti
from tests.export.test_gpu_export import _triton_model
from tests.export.conftest import ethanol
dtype = getattr(torch, sys.argv[2])
fixed = len(sys.argv) > 5 and sys.argv[5] == "fixed"
sizes = dict(edges_per_atom=64, atoms_per_bin=12) if fixed else {}
try:
    export_aoti(
        _triton_model(), ethanol(), sys.argv[1], dtype, "cuda", max_images=2, triton=sys.argv[3] == "1", neighbours=sys.argv[4],
        fixed_capacity=fixed, **sizes,
    )
except RuntimeError as err:
    if "when loaded in a fresh process; nothing was written" not in str(err):
        raise
    print("REFUSED", err)
"""


def _stage(name: str, code: str, *args, cwd, isolated: bool = False, stderr: bool = False) -> str:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, *(["-I"] if isolated else []), "-X", "faulthandler", "-c", code, *map(str, args)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"stage {name!r} exited with {proc.returncode}:\n{proc.stderr[-6000:]}"
    return proc.stdout + proc.stderr if stderr else proc.stdout


# triton=True: the package with the Triton kernels compiled in crashed inside torch 2.11's
# package loader on the H200 when its wrapper linked the C++ runtime statically (CXX=/opt/gcc/bin/g++;
# 2026-12-01); the export now compiles with a compiler that links libstdc++.so. If a package still
# does not load, the export's load check must refuse it and write nothing; once it loads, it must
# compute what the Predictor computes like the others.
# neighbours="cells": the binned search (the default on every device since these passed on the H200).
@pytest.mark.parametrize(
    "dtype, tol, triton, neighbours",
    [
        (torch.float64, 1e-10, False, "all-pairs"),
        (torch.float64, 1e-10, False, "cells"),
        (torch.float32, 1e-5, False, "all-pairs"),
        (torch.float32, 1e-5, True, "all-pairs"),
        (torch.float32, 1e-5, True, "cells"),
    ],
)
def test_cuda_package_matches_predictor(tmp_path, dtype, tol, triton, neighbours):
    path = tmp_path / "m.pt2"
    out = _stage("export", _EXPORT, path, str(dtype).replace("torch.", ""), int(triton), neighbours, cwd=tmp_path)
    if "REFUSED" in out:
        assert triton and not path.exists() and not list(tmp_path.glob(".m.pt2*")), out
        assert "export without --triton" in out, out
        pytest.xfail("the package with the Triton kernels does not load (torch's package loader crashes); the export refused it")
    small = crystal()
    small.set_cell(small.cell.array * 0.72, scale_atoms=True)
    tiny = crystal()
    tiny.set_cell(tiny.cell.array * 0.45, scale_atoms=True)
    cases = {
        "ethanol, moved": perturbed(ethanol(), 1),
        "other molecule": other_molecule(),
        "strained crystal": perturbed(crystal(), 2, strain=0.03),
        "small cell": small,
        "too small cell": tiny,
    }
    inputs = package_inputs(cases, dtype, "cuda")
    torch.save(inputs, tmp_path / "inputs.pt")
    # in a process where flashcart cannot be imported: the kernels are compiled into the package
    said = _stage(
        "load and run without flashcart",
        RUNNER,
        path,
        tmp_path / "inputs.pt",
        tmp_path / "out.pt",
        cwd=tmp_path,
        isolated=True,
        stderr=True,
    )
    results = torch.load(tmp_path / "out.pt")
    for name, atoms in cases.items():
        if name == "too small cell":
            # torch 2.13 raises the package's message; torch 2.11 prints it on stderr, raises a generic error
            assert isinstance(results[name], str) and "more periodic images than this package enumerates" in results[name] + said
            continue
        assert not isinstance(results[name], str), f"{name}: {results[name]}"
        energy, forces = results[name]
        assert forces.is_cuda and forces.dtype == dtype
        energy, forces = energy.cpu(), forces.cpu()
        # reference: the Predictor on the CPU with the generated PyTorch backend
        assert_matches(energy, forces, *predictor_reference(make_model(), atoms, dtype), tol, name)


@pytest.mark.parametrize("neighbours", ["all-pairs", "cells"])
def test_cuda_torchscript_matches_predictor(tmp_path, neighbours):
    model = make_model()
    path = export_torchscript(model, crystal(), tmp_path / "c.pt", torch.float32, "cuda", neighbours=neighbours)
    pot = load_exported(path)
    assert pot.device.type == "cuda"
    atoms = perturbed(crystal(), 3, strain=0.03)
    energy, forces = pot(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
    assert_matches(energy.cpu(), forces.cpu(), *predictor_reference(model, atoms, torch.float32), 1e-5, "torchscript cuda")


@pytest.mark.parametrize("dtype, tol, triton", [(torch.float32, 1e-5, True), (torch.float64, 1e-10, False)])
def test_cuda_fixed_capacity_package_in_cuda_graphs_matches_predictor(tmp_path, dtype, tol, triton):
    """A fixed-capacity CUDA package (no host synchronisation inside): first run as it is in a
    process that cannot import flashcart, then captured by ``load_exported`` as one CUDA graph
    per atom count: the Predictor's results for several structures, a replay at new positions,
    and NaN (a ``ValueError`` from the loader) beyond its capacity.

    On the H200 (2026-12-02) this test's package failed on its first in-process call ("invalid
    argument" from the package's runner, before any capture), while the benchmark's packages of
    i2c3f20l2r ran and replayed correctly; the isolated stage says whether the package itself runs."""
    from .test_fixed_capacity import _dense_cell

    path = tmp_path / "m.pt2"
    _stage("export", _EXPORT, path, str(dtype).replace("torch.", ""), int(triton), "cells", "fixed", cwd=tmp_path)
    small = crystal()
    small.set_cell(small.cell.array * 0.72, scale_atoms=True)
    cases = [perturbed(ethanol(), 1), other_molecule(), perturbed(crystal(), 2, strain=0.03), small, perturbed(ethanol(), 5)]
    inputs = package_inputs({str(k): a for k, a in enumerate(cases)}, dtype, "cuda")
    torch.save(inputs, tmp_path / "inputs.pt")
    _stage("run without flashcart", RUNNER, path, tmp_path / "inputs.pt", tmp_path / "out.pt", cwd=tmp_path, isolated=True)
    isolated = torch.load(tmp_path / "out.pt")
    for k, atoms in enumerate(cases):
        assert not isinstance(isolated[str(k)], str), f"{atoms.get_chemical_formula()}: {isolated[str(k)]}"
        energy, forces = isolated[str(k)]
        assert_matches(energy.cpu(), forces.cpu(), *predictor_reference(make_model(), atoms, dtype), tol, atoms.get_chemical_formula())
    pot = load_exported(path, cuda_graph=True)
    assert pot._graphed is not None and pot.capacity.edges_per_atom == 64
    for atoms in cases:
        energy, forces = pot(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
        assert forces.is_cuda and forces.dtype == dtype
        assert_matches(energy.cpu(), forces.cpu(), *predictor_reference(make_model(), atoms, dtype), tol, atoms.get_chemical_formula())
    graphed = pot._graphed
    # one graph per atom count: 9 (ethanol, twice) and 8 (acetic acid, then both 8-atom crystals:
    # the graph captured on a molecule replays for a periodic cell, its sizes follow from N alone)
    assert graphed.failed is None and graphed.captures == 2
    dense = _dense_cell()
    with pytest.raises(ValueError, match="--edges-per-atom K"):
        pot(dense.positions, dense.numbers, dense.cell.array, dense.pbc)
