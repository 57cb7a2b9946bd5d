"""Losses on padded tensors (the compiled training step's) equal the losses on the real rows."""

import itertools

import pytest
import torch

from flashcart.testing import assert_close
from flashcart.training.losses import loss_value, masked_loss_value

REDUCES = ["sae", "mae", "sse", "mse", "rmse", "maxe", "norm_sum", "norm_mean", "huber_sum", "huber_mean"]
NORMS = ["none", "per_atom", "per_sqrt_atom"]


class _Labels:
    def __init__(self, energy, forces, stress, n_atoms):
        self.energy, self.forces, self.stress, self.n_atoms = energy, forces, stress, n_atoms


def _case(stress_labels: int):
    """Three graphs of 2, 3 and 4 atoms (``stress_labels`` of them with a stress label), padded
    to 13 atoms and 5 graphs with junk predictions in the padding rows."""
    g = torch.Generator().manual_seed(3)
    n_atoms = torch.tensor([2, 3, 4])
    n, G, n_cap, g_cap = 9, 3, 13, 5
    pred = {
        "energy": torch.randn(g_cap, dtype=torch.float64, generator=g),
        "forces": torch.randn(n_cap, 3, dtype=torch.float64, generator=g),
        "stress": torch.randn(g_cap, 3, 3, dtype=torch.float64, generator=g),
    }
    stress = torch.randn(G, 3, 3, dtype=torch.float64, generator=g)
    stress[stress_labels:] = float("nan")
    labels = _Labels(torch.randn(G, dtype=torch.float64, generator=g), torch.randn(n, 3, dtype=torch.float64, generator=g), stress, n_atoms)
    targets = {
        "energy": torch.cat([labels.energy, torch.zeros(g_cap - G, dtype=torch.float64)]),
        "forces": torch.cat([labels.forces, torch.zeros(n_cap - n, 3, dtype=torch.float64)]),
        "stress": torch.cat([stress, torch.full((g_cap - G, 3, 3), float("nan"), dtype=torch.float64)]),
        "n_atoms": torch.cat([n_atoms, torch.ones(g_cap - G, dtype=n_atoms.dtype)]),
    }
    atoms, graphs = torch.arange(n_cap) < n, torch.arange(g_cap) < G
    return pred, labels, targets, atoms, graphs, (n, G)


@pytest.mark.parametrize("stress_labels", [2, 0], ids=["some stress labels", "no stress label"])
@pytest.mark.parametrize("reduce", REDUCES)
def test_masked_loss_equals_the_loss_of_the_real_rows(reduce, stress_labels):
    """Every reduce and normalisation, value and gradient (float64), including a batch whose
    stress labels are all missing (the loss term is zero, with a zero gradient, not NaN)."""
    pred, labels, targets, atoms, graphs, (n, G) = _case(stress_labels)
    for prop, norm in itertools.chain([("energy", m) for m in NORMS], [("forces", "none"), ("stress", "none")]):
        loss = {"property": prop, "reduce": reduce, "normalization": norm, "delta": 0.5}
        leaf = {k: v.clone().requires_grad_() for k, v in pred.items()}
        real = {"energy": leaf["energy"][:G], "forces": leaf["forces"][:n], "stress": leaf["stress"][:G]}
        want = loss_value(loss, real, labels)
        if want.requires_grad:
            (want_grad,) = torch.autograd.grad(want, leaf[prop])
        else:  # no row counts: reduce_errors returns a constant zero
            want_grad = torch.zeros_like(leaf[prop])
        leaf2 = {k: v.clone().requires_grad_() for k, v in pred.items()}
        got = masked_loss_value(loss, leaf2, targets, atoms, graphs)
        (got_grad,) = torch.autograd.grad(got, leaf2[prop])
        what = f"{prop} {norm} {reduce}"
        assert_close(got, want, 1e-12, what)
        assert torch.isfinite(got_grad).all(), what
        assert_close(got_grad, want_grad, 1e-12, f"{what} gradient")


def test_masked_weighted_sum():
    pred, labels, targets, atoms, graphs, (n, G) = _case(2)
    loss = {
        "weighted_sum": [
            {"property": "energy", "reduce": "mse", "normalization": "per_atom", "weight": 1.0},
            {"property": "forces", "reduce": "norm_mean", "normalization": "none", "weight": 10.0},
            {"property": "stress", "reduce": "mae", "normalization": "none", "weight": 0.5},
        ]
    }
    real = {"energy": pred["energy"][:G], "forces": pred["forces"][:n], "stress": pred["stress"][:G]}
    assert_close(masked_loss_value(loss, pred, targets, atoms, graphs), loss_value(loss, real, labels), 1e-12)
