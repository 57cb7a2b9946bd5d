"""Shared fixtures of the export tests: a tiny model (perturbed so every layer matters),
its checkpoint, structures, and the Predictor's reference values."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule
from ase.io import write

import flashcart.export
from flashcart.cli.export import main as export_main
from flashcart.data import collate, structure_from_atoms
from flashcart.model import FlashCartPotential, Predictor, save_checkpoint
from flashcart.testing import TINY_MODEL

ELEMENTS = ["H", "C", "O", "Cu"]


def make_model() -> FlashCartPotential:
    torch.manual_seed(0)
    m = FlashCartPotential(ELEMENTS, avg_neighbors=5.0, use_triton=False, **TINY_MODEL).double()
    with torch.no_grad():  # non-trivial gates and products (zero-initialised projections otherwise)
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
        m.atomic_shifts.copy_(torch.tensor([-0.5, -1.2, -2.1, -3.3], dtype=torch.float64))
    return m


@pytest.fixture(scope="session")
def model() -> FlashCartPotential:
    return make_model()


@pytest.fixture(scope="session")
def checkpoint(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("export_ckpt") / "best"
    save_checkpoint(model, path)
    return path


def ethanol() -> Atoms:
    a = molecule("CH3CH2OH")
    a.rattle(0.05, seed=1)
    return a


def other_molecule() -> Atoms:
    """Not the exported structure: other atoms, count and order."""
    a = molecule("CH3COOH")
    a.rattle(0.05, seed=2)
    return a


def crystal() -> Atoms:
    """A periodic cell with all four elements (triclinic, atoms outside the cell too)."""
    a = bulk("Cu", "fcc", a=3.6) * (2, 2, 2)
    a.symbols[1], a.symbols[2], a.symbols[5] = "C", "O", "H"
    a.rattle(0.1, seed=3)
    a.positions[0] += a.cell[0] * 1.5  # outside the cell: wrapped inside the exported files
    return a


def predictor_reference(model: FlashCartPotential, atoms: Atoms, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Energy [] eV and forces [N, 3] eV/Å from the Predictor (model in ``dtype``)."""
    m = copy.deepcopy(model).to(dtype)
    s = structure_from_atoms(atoms, m.r_max, require_labels=False)
    out = Predictor(m)(collate([s], m.z_to_type).to(dtype=dtype))
    return out["energy"][0], out["forces"]


def perturbed(atoms: Atoms, seed: int, strain: float = 0.0) -> Atoms:
    """Moved atoms (and, with ``strain``, a deformed cell, as in NPT)."""
    a = atoms.copy()
    a.rattle(0.08, seed=seed)
    if strain and a.pbc.any():
        rng = np.random.default_rng(seed)
        a.set_cell(a.cell.array @ (np.eye(3) + strain * rng.standard_normal((3, 3))), scale_atoms=True)
    return a


def assert_matches(energy, forces, ref_energy, ref_forces, rel: float, what: str) -> None:
    """Energy and forces within ``rel`` of the reference, relative to ``max(1, |reference|)``."""
    e_err = abs(float(energy) - float(ref_energy)) / max(1.0, abs(float(ref_energy)))
    f = torch.as_tensor(forces, dtype=torch.float64)
    rf = ref_forces.to(torch.float64)
    assert f.shape == rf.shape, f"{what}: forces shape {tuple(f.shape)} != {tuple(rf.shape)}"
    f_err = float((f - rf).abs().max()) / max(1.0, float(rf.abs().max()))
    assert e_err <= rel and f_err <= rel, f"{what}: energy error {e_err:.2e}, force error {f_err:.2e} (allowed {rel:.0e})"


# Smaller than TINY_MODEL (one interaction, rank 1) to keep the compile short; every layer type is present.
# The C++ wrapper of a package built at -O0: compiles in about half the time (tests only).
FAST_COMPILE = {"aot_inductor.compile_wrapper_opt_level": "O0"}
SMALL = {**TINY_MODEL, "n_interactions": 1, "correlation": 2, "l_max_hidden_feats": 1, "l_max_edge_attrs": 1}


@pytest.fixture(scope="session")
def small_model() -> FlashCartPotential:
    torch.manual_seed(1)
    m = FlashCartPotential(ELEMENTS, avg_neighbors=5.0, use_triton=False, **SMALL).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
        m.atomic_shifts.copy_(torch.tensor([-0.5, -1.2, -2.1, -3.3], dtype=torch.float64))
    return m


def cli_package(model: FlashCartPotential, tmp, name: str, *options: str):
    """A float64 package of ``model`` for up to 2 images per side, exported on ethanol by the command
    line as it is (with a quicker C++ build of the wrapper) into ``tmp / name``."""
    save_checkpoint(model, tmp / "best")
    write(tmp / "ethanol.xyz", ethanol())
    out = tmp / name
    argv = [str(tmp / "best"), "--format", "aoti", "--structure", str(tmp / "ethanol.xyz"), "-o", str(out), *options]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flashcart.export, "export_aoti", functools.partial(flashcart.export.export_aoti, inductor_configs=FAST_COMPILE))
        assert export_main(argv + ["--dtype", "float64", "--max-images", "2", "--no-progress"]) == 0
    return out


def package_inputs(cases: dict, dtype: torch.dtype, device: str = "cpu") -> dict:
    """``{name: (positions, atomic_numbers, cell, pbc)}``: a package's inputs for each structure of ``cases``."""
    return {
        name: (
            torch.tensor(a.positions, dtype=dtype, device=device),
            torch.tensor(a.numbers, dtype=torch.long, device=device),
            torch.tensor(a.cell.array, dtype=dtype, device=device),
            torch.tensor(a.pbc, dtype=torch.bool, device=device),
        )
        for name, a in cases.items()
    }


@pytest.fixture(scope="session")
def package64(small_model, tmp_path_factory):
    """float64 package exported from a checkpoint by the command line, for up to 2 images per side."""
    return cli_package(small_model, tmp_path_factory.mktemp("aoti"), "ethanol.pt2")


@pytest.fixture(scope="session")
def package64_all_pairs(small_model, tmp_path_factory):
    """As ``package64`` (the default binned search), with the dense all-pairs search."""
    tmp = tmp_path_factory.mktemp("aoti_all_pairs")
    out = tmp / "ethanol.pt2"
    flashcart.export.export_aoti(
        small_model, ethanol(), out, torch.float64, max_images=2, inductor_configs=FAST_COMPILE, neighbours="all-pairs"
    )
    return out


FIXED = {"edges_per_atom": 64, "atoms_per_bin": 12}  # the fixed-capacity package's sizes (ethanol needs 8 and 9)


@pytest.fixture(scope="session")
def package64_fixed(small_model, tmp_path_factory):
    """As ``package64``, with fixed capacities (:data:`FIXED`)."""
    sizes = ["--edges-per-atom", str(FIXED["edges_per_atom"]), "--atoms-per-bin", str(FIXED["atoms_per_bin"])]
    return cli_package(small_model, tmp_path_factory.mktemp("aoti_fixed"), "ethanol_fixed.pt2", "--fixed-capacity", *sizes)
