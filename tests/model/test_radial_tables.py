"""Tabulated radial MLPs (flashcart.nn.radial_table, FlashCartPotential.set_radial_tables):
the table against the MLP it stands for, a model's energy, forces and stress with tables against
without (float64), forces as the tabulated energy's exact derivative (finite differences),
padding, pairs and compilation, and the refusals: training, stale tables, element-aware
interactions, too few intervals."""

import math

import pytest
import torch

from flashcart.model import Predictor
from flashcart.model.potential import FlashCartPotential
from flashcart.nn.radial_table import cubic_table, table_weights, table_weights_and_slopes
from flashcart.testing import TINY_MODEL, assert_close

from .conftest import crystal, molecule, triton_tiny_model

R_MAX = TINY_MODEL["r_max"]


def _radial_function(model, interaction):
    return lambda d: interaction.radial(model.basis(d) * model.envelope(d)[:, None])


def test_table_equals_the_mlp_and_its_derivative_and_vanishes_from_r_max(model):
    interaction = model.interactions[1]
    fn = _radial_function(model, interaction)
    table = cubic_table(fn, R_MAX, 4096)
    g = torch.Generator().manual_seed(3)
    d = (torch.rand(5000, generator=g, dtype=torch.float64) * R_MAX).requires_grad_(True)
    w, w_table = fn(d), table_weights(table, R_MAX, d)
    assert float((w_table - w).abs().max() / w.abs().max()) < 1e-10
    probe = torch.randn(w.shape, generator=g, dtype=torch.float64)
    (slope,) = torch.autograd.grad(w, d, probe)
    (slope_table,) = torch.autograd.grad(w_table, d, probe)
    assert float((slope_table - slope).abs().max() / slope.abs().max()) < 1e-7
    # at the knots the table holds the function's values exactly (up to the cubic's rounding)
    knots = torch.tensor([0.0, R_MAX / 4096 * 17, 1.5, R_MAX * (1 - 1 / 4096)], dtype=torch.float64)
    assert_close(table_weights(table, R_MAX, knots), fn(knots).detach(), 1e-13, "knots")
    beyond = torch.tensor([R_MAX, R_MAX + 1e-9, 2 * R_MAX], dtype=torch.float64, requires_grad=True)
    out = table_weights(table, R_MAX, beyond)
    assert bool((out == 0).all())
    (g_beyond,) = torch.autograd.grad(out.sum(), beyond)
    assert bool((g_beyond == 0).all())


def test_a_table_needs_enough_intervals(model):
    with pytest.raises(ValueError, match="at least 16 intervals"):
        cubic_table(_radial_function(model, model.interactions[0]), R_MAX, 8)


@pytest.mark.parametrize("pairs", [True, False])
def test_model_with_tables_equals_the_model_with_mlps(model, make_batch, pairs):
    model.radial_pairs = pairs
    batch = make_batch(model, [molecule(0), crystal()])
    predictor = Predictor(model)
    exact = predictor(batch, forces=True, stress=True)
    model.set_radial_tables(4096)
    tabulated = predictor(batch, forces=True, stress=True)
    for key in exact:
        assert_close(tabulated[key], exact[key], 1e-8, key)
        assert not torch.equal(tabulated[key], exact[key]), f"{key}: the tables were not read"
    model.set_radial_tables(None)
    again = predictor(batch, forces=True, stress=True)
    for key in exact:
        assert torch.equal(again[key], exact[key]), f"{key}: dropping the tables restores the MLPs"


def test_forces_are_the_exact_derivative_of_the_tabulated_energy(model, make_batch):
    """The interpolant is C1 and autograd differentiates it: forces are -dE/dx of the tabulated
    energy itself (central differences), a coarse table included, so energy is conserved."""
    model.set_radial_tables(64)  # coarse: far from the MLP, still its own exact derivative
    atoms = crystal()
    predictor = Predictor(model)
    forces = predictor(make_batch(model, [atoms]), forces=True)["forces"]
    step = 1e-5
    for atom, axis in [(0, 0), (1, 2), (1, 1)]:
        energies = []
        for sign in (1, -1):
            moved = atoms.copy()
            moved.positions[atom, axis] += sign * step
            energies.append(float(predictor(make_batch(model, [moved]), forces=False)["energy"][0]))
        numeric = -(energies[0] - energies[1]) / (2 * step)
        assert math.isclose(float(forces[atom, axis]), numeric, rel_tol=1e-6, abs_tol=1e-8)


def test_padded_and_compiled_calls_read_the_tables(model, make_batch):
    """Padding edges (2 r_max long) get zero weights from a table; a compiled call traces the
    table as one graph (dynamo, fullgraph) and equals the eager one."""
    torch._dynamo.reset()
    batch = make_batch(model, [molecule(1), crystal()])
    exact = Predictor(model)(batch, forces=True, stress=True)
    model.set_radial_tables(64)  # coarse: results far enough from the MLP's to tell which ran
    eager = Predictor(model)(batch, forces=True, stress=True)
    assert float((eager["forces"] - exact["forces"]).abs().max()) > 1e-9
    padded = Predictor(model, pad=True, pad_atom_multiple=16, pad_edge_multiple=64)(batch, forces=True, stress=True)
    compiled = Predictor(model, compile=True, compile_backend="eager", pad_atom_multiple=16, pad_edge_multiple=64)(
        batch, forces=True, stress=True
    )
    for key in eager:
        assert_close(padded[key], eager[key], 1e-12, f"padded {key}")
        assert_close(compiled[key], eager[key], 1e-12, f"compiled {key}")


def test_compiled_calls_store_the_tables_lengths_once(model, make_batch):
    """With tables, a compiled call passes each pair's lengths through the fusion barrier
    (flashcart.nn.fusion_barrier): with the list's layout passed in, inductor otherwise recomputed
    them inside every table weight (0.5 ms more per call on an H100). Once per interaction."""
    torch._dynamo.reset()
    batch = make_batch(model, [crystal()])
    model.set_radial_tables(64)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    Predictor(model, compile=True, compile_backend=backend)(batch, forces=True)
    barriers = [n for gm in graphs for n in gm.graph.nodes if n.target is torch.ops.flashcart.realized.default]
    assert len(barriers) == len(model.interactions)


def test_tables_refuse_training_stale_mlps_and_element_aware_interactions(model, make_batch):
    batch = make_batch(model, [molecule(2)])
    model.set_radial_tables(256)
    with pytest.raises(RuntimeError, match="for inference"):
        Predictor(model)(batch, forces=True, create_graph=True)  # training: the MLPs would get no gradient
    with torch.no_grad():
        model.interactions[0].radial.layers[0].weight.mul_(1.5)
    with pytest.raises(RuntimeError, match="changed after their tables were built"):
        Predictor(model)(batch, forces=True)
    model.set_radial_tables(256)  # rebuilt: usable again
    Predictor(model)(batch, forces=True)

    aware = FlashCartPotential(["H", "C", "O", "Cu"], use_triton=False, **{**TINY_MODEL, "element_agnostic_interaction": False})
    with pytest.raises(ValueError, match="element-agnostic"):
        aware.set_radial_tables(256)


def test_tables_move_and_cast_with_the_model_and_are_not_saved(model):
    model.set_radial_tables(128)
    assert model.interactions[0].radial_table.dtype == torch.float64
    assert not any("radial_table" in key for key in model.state_dict())
    model.float()
    assert model.interactions[0].radial_table.dtype == torch.float32


def test_tables_survive_moves_and_copies_and_a_copy_of_stale_tables_stays_stale(model, make_batch):
    import copy

    batch = make_batch(model, [molecule(4)])
    model.set_radial_tables(128)
    expected = Predictor(model)(batch, forces=True)
    model.to("cpu", torch.float64)  # a move or cast is no change of the MLPs
    twin = copy.deepcopy(model)
    out = Predictor(twin)(batch, forces=True)
    assert torch.equal(out["forces"], expected["forces"]) and torch.equal(out["energy"], expected["energy"])
    with torch.no_grad():
        model.interactions[1].radial.layers[-1].weight.add_(0.01)
    stale_twin = copy.deepcopy(model)
    for m in (model, stale_twin):
        with pytest.raises(RuntimeError, match="changed after their tables were built"):
            Predictor(m)(batch, forces=True)


def test_far_lengths_give_zero_weights_and_finite_zero_gradients():
    """Lengths far beyond r_max (padding, parked atoms) are masked before any power is taken:
    exactly zero weights and gradients, in float32 too."""
    table = torch.randn(64, 4, 5).float()
    d = torch.tensor([1.0, R_MAX, 1e6, 3e12], requires_grad=True)
    w = table_weights(table, R_MAX, d)
    assert bool((w[1:] == 0).all()) and bool(w[0].abs().sum() > 0)
    (g,) = torch.autograd.grad(w.sum(), d)
    assert bool(g.isfinite().all()) and bool((g[1:] == 0).all())


def test_slopes_equal_the_tables_derivative_and_vanish_from_r_max():
    """table_weights_and_slopes: the same values as table_weights and, as slopes, its autograd
    derivative in the length (float64 1e-12), zero from r_max on, far lengths included."""
    table = torch.randn(64, 4, 5, dtype=torch.float64)
    d = torch.cat([torch.rand(50, dtype=torch.float64) * R_MAX, torch.tensor([0.0, R_MAX, 1e6], dtype=torch.float64)])
    w, slopes = table_weights_and_slopes(table, R_MAX, d)
    assert not w.requires_grad and not slopes.requires_grad
    d = d.clone().requires_grad_()
    w_ref = table_weights(table, R_MAX, d)
    jac = torch.stack([torch.autograd.grad(w_ref[:, k].sum(), d, retain_graph=True)[0] for k in range(5)], dim=1)
    assert_close(w, w_ref.detach(), 1e-12, "values")
    assert_close(slopes, jac, 1e-12, "slopes")
    assert bool((slopes[-2:] == 0).all()) and bool((w[-2:] == 0).all())


@pytest.mark.parametrize("pairs, kernel", [(True, False), (False, False), (False, True)], ids=["pairs", "edges", "table in kernels"])
def test_slopes_in_the_products_kernels_equal_autograd_through_the_tables(make_batch, monkeypatch, pairs, kernel):
    """The Triton model (kernels interpreted on the CPU) with tables: each product's backward
    contracts the weights' gradient with the tables' slopes (FLASHCART_TABLE_SLOPES, the default)
    instead of returning it to autograd, with the weights and slopes evaluated by ATen operations
    per pair or per edge, or by the products' kernels from the table itself (FLASHCART_TABLE_KERNEL,
    the default); energy, forces and stress equal autograd through the tables (float64, 1e-12),
    eager, padded and compiled (inductor)."""
    import flashcart.nn.blocks as blocks

    monkeypatch.setattr(blocks, "_TABLE_KERNEL", kernel)

    torch._dynamo.reset()
    model = triton_tiny_model()
    model.radial_pairs = pairs
    model.set_radial_tables(64)
    batch = make_batch(model, [molecule(3), crystal()])
    monkeypatch.setattr(blocks, "_TABLE_SLOPES", False)
    reference = Predictor(model)(batch, forces=True, stress=True)
    monkeypatch.setattr(blocks, "_TABLE_SLOPES", True)
    calls = {
        "eager": Predictor(model),
        "padded": Predictor(model, pad=True, pad_atom_multiple=16, pad_edge_multiple=64),
        "compiled": Predictor(model, compile=True, pad_atom_multiple=16, pad_edge_multiple=64),
    }
    for name, predictor in calls.items():
        out = predictor(batch, forces=True, stress=True)
        for key in reference:
            assert_close(out[key], reference[key], 1e-12, f"{name} {key}")


@pytest.mark.parametrize("name", ["FLASHCART_TABLE_SLOPES", "FLASHCART_TABLE_KERNEL"])
def test_table_settings_from_the_environment(monkeypatch, name):
    from flashcart.nn.radial_table import table_kernel_enabled, table_slopes_enabled

    read = {"FLASHCART_TABLE_SLOPES": table_slopes_enabled, "FLASHCART_TABLE_KERNEL": table_kernel_enabled}[name]
    for raw, expected in (("", True), ("1", True), ("0", False)):
        monkeypatch.setenv(name, raw)
        assert read() is expected
    monkeypatch.setenv(name, "yes")
    with pytest.raises(ValueError, match=f"{name} must be 0 or 1, got 'yes'"):
        read()
