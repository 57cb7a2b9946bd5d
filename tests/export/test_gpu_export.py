"""Exports on CUDA (run with -m gpu): the .pt2 with the Triton kernels compiled in, the TorchScript file on CUDA."""

from __future__ import annotations

import pytest
import torch

from flashcart.export import export_aoti, export_torchscript, load_exported
from flashcart.export.aoti import build_aoti_graph
from flashcart.model import FlashCartPotential

from .conftest import ELEMENTS, assert_matches, crystal, ethanol, make_model, other_molecule, perturbed, predictor_reference

pytestmark = pytest.mark.gpu


def _triton_model() -> FlashCartPotential:
    ref = make_model()
    tri = FlashCartPotential(ELEMENTS, avg_neighbors=5.0, **{**ref.options, "use_triton": True}).double()
    tri.load_state_dict(ref.state_dict())
    return tri


def test_cuda_graph_uses_the_triton_kernels():
    program, _, _ = build_aoti_graph(_triton_model(), ethanol(), torch.float64, "cuda")
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert any("flashcart" in t for t in targets), sorted(targets)[:20]


@pytest.mark.parametrize("dtype, tol, triton", [(torch.float64, 1e-10, True), (torch.float32, 1e-5, True), (torch.float32, 1e-5, False)])
def test_cuda_package_matches_predictor(tmp_path, dtype, tol, triton):
    model = _triton_model()
    path = export_aoti(model, ethanol(), tmp_path / "m.pt2", dtype, "cuda", max_images=2, triton=triton)
    pot = load_exported(path)
    assert pot.device.type == "cuda"
    small = crystal()
    small.set_cell(small.cell.array * 0.72, scale_atoms=True)
    for atoms in (perturbed(ethanol(), 1), other_molecule(), perturbed(crystal(), 2, strain=0.03), small):
        energy, forces = pot(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
        assert forces.is_cuda and forces.dtype == dtype
        # reference: the Predictor on the CPU with the generated PyTorch backend
        assert_matches(energy.cpu(), forces.cpu(), *predictor_reference(make_model(), atoms, dtype), tol, atoms.get_chemical_formula())
    tiny = crystal()
    tiny.set_cell(tiny.cell.array * 0.45, scale_atoms=True)
    with pytest.raises(RuntimeError, match="more periodic images than this package enumerates"):
        pot(tiny.positions, tiny.numbers, tiny.cell.array, tiny.pbc)


def test_cuda_torchscript_matches_predictor(tmp_path):
    model = make_model()
    path = export_torchscript(model, crystal(), tmp_path / "c.pt", torch.float32, "cuda")
    pot = load_exported(path)
    assert pot.device.type == "cuda"
    atoms = perturbed(crystal(), 3, strain=0.03)
    energy, forces = pot(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
    assert_matches(energy.cpu(), forces.cpu(), *predictor_reference(model, atoms, torch.float32), 1e-5, "torchscript cuda")
