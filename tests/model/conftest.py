from dataclasses import replace

import pytest
import torch
from ase import Atoms
from ase.build import bulk

from flashcart.data import collate, structure_from_atoms
from flashcart.model.potential import FlashCartPotential
from flashcart.testing import TINY_MODEL


@pytest.fixture
def model():
    torch.manual_seed(0)
    m = FlashCartPotential(["H", "C", "O", "Cu"], avg_neighbors=5.0, use_triton=False, **TINY_MODEL).double()
    with torch.no_grad():  # non-trivial gates and products (zero-initialised projections otherwise)
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def triton_tiny_model() -> FlashCartPotential:
    """TINY_MODEL at 4 channels in float64 with perturbed parameters, whose products run their
    Triton kernels (interpreted on the CPU) and the rest as it is."""
    from flashcart.cartesian import TensorProduct

    torch.manual_seed(0)
    m = FlashCartPotential(["H", "C", "O", "Cu"], avg_neighbors=5.0, use_triton=True, **{**TINY_MODEL, "n_hidden_feats": 4}).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    for tp in (mod for mod in m.modules() if isinstance(mod, TensorProduct)):
        tp.backend = "triton"
    return m


def molecule(seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(6, 3, generator=g, dtype=torch.float64) * 1.2
    return Atoms("CCOHHH", positions=pos.numpy())


def crystal():
    atoms = bulk("Cu", "fcc", a=3.6) * (1, 1, 2)
    atoms.rattle(0.05, seed=1)
    return atoms


def as_batch(model, atoms_list):
    structures = [structure_from_atoms(a, model.r_max, where=f"test {k}", require_labels=False) for k, a in enumerate(atoms_list)]
    return collate(structures, model.z_to_type).to(dtype=torch.float64)


def permuted_edges(batch, seed: int):
    """``batch`` with its edges in another order: a different list of the same shapes."""
    order = torch.randperm(batch.receivers.shape[0], generator=torch.Generator().manual_seed(seed)).to(batch.receivers.device)
    return replace(
        batch,
        receivers=batch.receivers[order],
        senders=batch.senders[order],
        shifts=batch.shifts[order],
        edge_batch=batch.edge_batch[order],
    )


@pytest.fixture
def make_batch():
    return as_batch
