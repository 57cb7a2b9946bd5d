"""The fused edge-feature kernels (flashcart.nn.edge_kernels) equal the ATen expression they
replace (flashcart.nn.edge_features.edge_features_reference): unit vectors, radial features and
envelope, the positions' and cells' gradients (the kernels), and second derivatives (the ATen
derivative they fall back to), float64 to 1e-12, for both radial mappings, with edges inside
the inner radius, beyond the cutoff and of zero length. A whole eager force-and-stress call with
them equals one without. On CPU under TRITON_INTERPRET=1; on CUDA with -m gpu."""

import pytest
import torch

from flashcart.nn import edge_features as ef
from flashcart.nn.radial import ChebyshevBasis, PolynomialEnvelope

from ..cartesian.triton_devices import DEVICES, needs_triton

TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=2e-5, atol=5e-5)}  # float32: sums of ~10 edges of size ~10
EPS = 1e-4  # the direction expansion's default


def _graph(dtype, device, seed=0, zero_length=True):
    """Two periodic graphs of 7 atoms, 60 edges (grouped by receiver), with an edge of zero length
    (an atom to itself, no shift; unless not ``zero_length``), one shorter than r_min, and many
    beyond the cutoff."""
    g = torch.Generator().manual_seed(seed)
    n, e = 7, 60
    pos = torch.rand(n, 3, generator=g, dtype=torch.float64) * 4
    pos[1] = pos[0] + torch.tensor([0.3, 0.0, 0.0], dtype=torch.float64)  # 0.3 Å from atom 0: inside r_min
    cell = torch.eye(3, dtype=torch.float64) * 5 + 0.3 * torch.rand(2, 3, 3, generator=g, dtype=torch.float64)
    receivers = torch.sort(torch.randint(0, n, (e,), generator=g)).values
    senders = torch.randint(0, n, (e,), generator=g)
    shifts = torch.randint(-1, 2, (e, 3), generator=g)
    shifts[(senders == receivers) & (shifts == 0).all(1), 0] = 1  # no other zero-length edge
    if zero_length:
        receivers[0], senders[0], shifts[0] = 0, 0, 0
    receivers[1], senders[1], shifts[1] = 0, 1, 0  # 0.3 Å
    edge_batch = (senders >= 4).long()
    return (
        pos.to(dtype=dtype, device=device),
        cell.to(dtype=dtype, device=device),
        shifts.to(device),
        receivers.to(device),
        senders.to(device),
        edge_batch.to(device),
    )


def _features(mapping, p):
    return ChebyshevBasis(8, 5.0, 0.5, mapping), PolynomialEnvelope(5.0, p)


def _fused(*args):
    from flashcart.nn import edge_kernels

    return edge_kernels.edge_features(*args)


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mapping,p", [("cosine", 6), ("affine", 6), ("cosine", 1), ("affine", 3)])
def test_kernels_equal_the_aten_expression(device, dtype, mapping, p):
    basis, envelope = _features(mapping, p)
    # a zero-length edge's gradient (g / eps, added to an atom and taken off it again) leaves
    # float32 sums with errors near 1e-3 in either evaluation: float64 only
    pos, cell, shifts, receivers, senders, edge_batch = _graph(dtype, device, zero_length=dtype == torch.float64)
    pos.requires_grad_(True)
    cell.requires_grad_(True)
    graph = (shifts, receivers, senders, edge_batch, basis, envelope, EPS)
    ref = ef.edge_features_reference(pos, cell, *graph)
    out = _fused(pos, cell, *graph)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, **TOL[dtype])
    assert bool((ref.env[2:] == 0).any()) and bool((ref.env > 0).any()), "the graph has edges on both sides of the cutoff"

    g = torch.Generator().manual_seed(5)
    cot = [torch.randn(t.shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device) for t in (ref.unit, ref.radial)]
    # The zero-length edge's gradient is cot / EPS (~1e4), added to atom 0 and taken off it
    # again: exact in exact arithmetic, but it rounds atom 0's running sum at 1e4's ulp
    # (~2e-12), in whichever order the two evaluations accumulate. So in float64 the other
    # edges are compared at 1e-12 without it, and it is checked alone: no gradient at all.
    others = torch.ones(ref.unit.shape[0], dtype=torch.bool, device=device)
    others[0] = dtype != torch.float64

    def grads(features, part):
        return torch.autograd.grad(features[:2], (pos, cell), [c * part[:, None] for c in cot], retain_graph=True)

    g_out, g_ref = grads(out, others), grads(ref, others)
    for a, b in zip(g_out, g_ref):
        torch.testing.assert_close(a, b, **TOL[dtype])
    assert bool(g_ref[0].abs().sum() > 0) and bool(g_ref[1].abs().sum() > 0)
    if dtype == torch.float64:  # the zero-length edge alone: r = 0 exactly, no gradient either way
        for a, b in zip(grads(out, ~others), grads(ref, ~others)):
            assert bool((a == 0).all()) and bool((b == 0).all())

    if dtype == torch.float64:
        # second derivatives (the ATen fallback of a differentiable backward); the ATen
        # expression's own are not finite at a zero-length edge, so the graph has none here
        pos, cell, shifts, receivers, senders, edge_batch = _graph(dtype, device, zero_length=False)
        pos.requires_grad_(True)
        cell.requires_grad_(True)
        graph = (shifts, receivers, senders, edge_batch, basis, envelope, EPS)
        g_out = torch.autograd.grad(_fused(pos, cell, *graph)[:2], (pos, cell), cot, create_graph=True)
        g_ref = torch.autograd.grad(ef.edge_features_reference(pos, cell, *graph)[:2], (pos, cell), cot, create_graph=True)
        probe = [torch.randn(t.shape, generator=g, dtype=dtype).to(device) for t in g_ref]
        gg_out = torch.autograd.grad(g_out, (pos, cell), probe)
        gg_ref = torch.autograd.grad(g_ref, (pos, cell), probe)
        for a, b in zip(gg_out, gg_ref):
            torch.testing.assert_close(a, b, **TOL[dtype])


@needs_triton
def test_kernel_values_match_the_definitions_at_chosen_distances():
    """Independent of the ATen expression: edges along x at chosen lengths give the basis and
    envelope polynomials of docs/model.md, evaluated here in plain Python."""
    import math

    dists = [0.3, 0.5, 1.7, 4.999, 5.0, 7.0]
    n = len(dists)
    pos = torch.zeros(n + 1, 3, dtype=torch.float64)
    pos[1:, 0] = torch.tensor(dists, dtype=torch.float64)
    cell = torch.eye(3, dtype=torch.float64)[None] * 20
    receivers = torch.zeros(n, dtype=torch.long)
    senders = torch.arange(1, n + 1)
    shifts = torch.zeros(n, 3, dtype=torch.long)
    basis, envelope = _features("cosine", 6)
    unit, radial, env = _fused(pos, cell, shifts, receivers, senders, torch.zeros(n, dtype=torch.long), basis, envelope, EPS)
    for i, d in enumerate(dists):
        t = min(d / 5.0, 1.0)
        u = 1 - 28 * t**6 + 48 * t**7 - 21 * t**8
        s = min(max((d - 0.5) / 4.5, 0.0), 1.0)
        assert env[i].item() == pytest.approx(u, abs=1e-13)
        for k in range(8):
            assert radial[i, k].item() == pytest.approx(math.cos(k * math.pi * s) * u, abs=1e-13)
        assert unit[i].tolist() == pytest.approx([1.0, 0.0, 0.0], abs=1e-15)


@needs_triton
def test_edge_features_take_the_kernels_only_when_asked_in_eager_triton_calls(monkeypatch):
    from flashcart.nn import edge_kernels

    launched = []
    real = edge_kernels.launch_kernel
    monkeypatch.setattr(edge_kernels, "launch_kernel", lambda kernel, *a: (launched.append(kernel.__name__), real(kernel, *a)))
    pos, cell, shifts, receivers, senders, edge_batch = _graph(torch.float64, "cpu")
    basis, envelope = _features("cosine", 6)
    args = (pos, cell, shifts, receivers, senders, edge_batch, basis, envelope, EPS)

    monkeypatch.setattr(ef, "FUSED_EDGES", False)
    ef.edge_features(*args, backend="triton")
    monkeypatch.setattr(ef, "FUSED_EDGES", True)
    ef.edge_features(*args, backend="torch")
    assert launched == []
    ef.edge_features(*args, backend="triton")
    assert launched == ["edge_features_fwd"]

    # compiled calls take the ATen expression, traced as one graph (nothing it asks of the
    # stream or the dispatcher may break it)
    compiled = torch.compile(lambda *a: ef.edge_features(*a, backend="triton"), backend="eager", fullgraph=True)
    torch._dynamo.reset()
    out = compiled(*args)
    assert launched == ["edge_features_fwd"]
    for a, b in zip(out, ef.edge_features_reference(*args)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_switch_reads_0_or_1_and_names_the_variable_otherwise(monkeypatch):
    monkeypatch.setenv("FLASHCART_FUSED_EDGES", "1")
    assert ef.fused_edges_mode() is True
    monkeypatch.setenv("FLASHCART_FUSED_EDGES", "0")
    assert ef.fused_edges_mode() is False
    monkeypatch.delenv("FLASHCART_FUSED_EDGES")
    assert ef.fused_edges_mode() is True
    monkeypatch.setenv("FLASHCART_FUSED_EDGES", "yes")
    with pytest.raises(ValueError, match="FLASHCART_FUSED_EDGES"):
        ef.fused_edges_mode()


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_model_force_and_stress_call_with_and_without_the_kernels(device, monkeypatch):
    """A whole eager call on the Triton path (energy, forces, stress of a periodic cell) equals
    the same call through the ATen expression, float64."""
    from ase.build import bulk

    from flashcart.data import collate, structure_from_atoms
    from flashcart.model.potential import FlashCartPotential
    from flashcart.model.predictor import Predictor
    from flashcart.testing import TINY_MODEL

    torch.manual_seed(0)
    model = FlashCartPotential(["Si"], avg_neighbors=8.0, use_triton=True, **{**TINY_MODEL, "n_interactions": 1}).double()
    for m in model.modules():
        if hasattr(m, "backend"):
            m.backend = "triton"
    model.to(device)
    atoms = bulk("Si", "diamond", a=5.43)
    atoms.rattle(0.1, seed=1)
    atoms.set_cell(atoms.cell * 1.02, scale_atoms=True)
    batch = collate([structure_from_atoms(atoms, model.r_max, require_labels=False)], model.z_to_type.cpu()).to(device, torch.float64)
    monkeypatch.setattr(ef, "FUSED_EDGES", True)
    fused = Predictor(model, pad=False)(batch, forces=True, stress=True)
    monkeypatch.setattr(ef, "FUSED_EDGES", False)
    plain = Predictor(model, pad=False)(batch, forces=True, stress=True)
    for key in ("energy", "forces", "stress"):
        torch.testing.assert_close(fused[key], plain[key], rtol=1e-11, atol=1e-11)
    assert bool(plain["stress"].abs().sum() > 0)
