"""The fused row-wise kernels of the RMS norm and the gate (flashcart.cartesian._triton.rowwise)
equal their ATen expressions: forward and backward (the kernels), double backward and the
gains' gradient (the ATen derivative they fall back to), float64 to 1e-12; and the blocks
take them exactly in eager Triton calls. On CPU under TRITON_INTERPRET=1; on CUDA with -m gpu."""

import pytest
import torch

from flashcart.nn.blocks import Gate, RMSNorm, rank_channel_index

from .triton_devices import DEVICES, needs_triton

pytestmark = needs_triton
TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=2e-5, atol=2e-6)}


def _rowwise():
    from flashcart.cartesian._triton import rowwise

    return rowwise


def _rms_reference(norm: RMSNorm):
    """The norm as the model defines it without the kernels: the symmetric product's invariants
    (PyTorch backend), then the ATen expression."""

    def reference(x, *gains):
        inv = norm.invariants(x, x, norm.ones.to(x.dtype))
        y = x * torch.rsqrt(inv.mean(dim=1, keepdim=True).abs() + norm.eps)
        return y if not gains else y * gains[0].index_select(0, rank_channel_index(norm.l_max, norm.F).to(x.device))

    return reference


def _gate_reference(v, z, activation, l_max, F):
    act = {"sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu, "tanh": torch.tanh}[activation]
    return v * act(z).index_select(1, rank_channel_index(l_max, F).to(v.device))


def _rand(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)


def _check_grads(fused, reference, inputs, dtype):
    """Outputs, first derivatives (the kernels, no graph) and, in float64, second derivatives
    (the ATen fallback, create_graph) of ``fused`` equal ``reference``'s."""
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    out, ref = fused(*leaves), reference(*leaves)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    cot = _rand(out.shape, dtype, out.device, seed=9)
    g_out = torch.autograd.grad(out, leaves, cot)
    g_ref = torch.autograd.grad(ref, leaves, cot)
    for a, b in zip(g_out, g_ref):
        torch.testing.assert_close(a, b, **TOL[dtype])
    if dtype == torch.float64:
        g_out = torch.autograd.grad(fused(*leaves), leaves, cot, create_graph=True)
        g_ref = torch.autograd.grad(reference(*leaves), leaves, cot, create_graph=True)
        probe = [_rand(g.shape, dtype, g.device, seed=20 + k) for k, g in enumerate(g_ref)]
        gg_out = torch.autograd.grad(g_out, leaves, probe, allow_unused=True)
        gg_ref = torch.autograd.grad(g_ref, leaves, probe, allow_unused=True)
        for a, b in zip(gg_out, gg_ref):
            if b is None:
                assert a is None or not a.abs().max() > 0
            else:
                torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("l_max,F,gains", [(2, 4, True), (3, 5, False), (0, 3, True), (3, 20, True)])
def test_rms_norm_equals_the_product_and_aten_expression(device, dtype, l_max, F, gains):
    rowwise = _rowwise()
    norm = RMSNorm(l_max, F, backend="torch").to(device=device, dtype=dtype)
    x = _rand((7, (l_max + 1) ** 2 * F), dtype, device, 2)
    x[0] = x[0] * 1e-3  # a row whose scale the eps term shapes
    g = _rand(((l_max + 1) * F,), dtype, device, 3) if gains else None
    inputs = [x] + ([g] if gains else [])
    fused = lambda x, *g: rowwise.rms_norm(x, norm.forms, g[0] if g else None, norm.eps, l_max, F)  # noqa: E731
    _check_grads(fused, _rms_reference(norm), inputs, dtype)


def test_invariant_forms_reproduce_the_product(float64):
    """``x^T G_l x`` per rank and channel equals the symmetric (l, l) -> 0 product, and each form
    is symmetric and rotation invariant (the identity for ranks 0 and 1)."""
    rowwise = _rowwise()
    norm = RMSNorm(3, 2, backend="torch")
    x = _rand((9, 32), torch.float64, "cpu", 7)
    torch.testing.assert_close(rowwise.invariants(x, norm.forms, 3, 2), norm.invariants(x, x, norm.ones), rtol=1e-13, atol=1e-13)
    forms = norm.forms
    assert torch.equal(forms[:1], torch.ones(1)) and torch.equal(forms[1:10].view(3, 3), torch.eye(3))
    off = 0
    for l in range(4):
        d = 2 * l + 1
        g = forms[off : off + d * d].view(d, d)
        torch.testing.assert_close(g, g.T, rtol=0, atol=0)
        off += d * d
    norm.float().double()  # conversions take the forms from their float64 master again
    torch.testing.assert_close(norm.forms, forms, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("activation", ["sigmoid", "silu", "tanh"])
@pytest.mark.parametrize("l_max,F", [(2, 4), (3, 20)])
def test_gated_equals_the_aten_expression(device, dtype, activation, l_max, F):
    rowwise = _rowwise()
    n = 6
    v, z = _rand((n, (l_max + 1) ** 2 * F), dtype, device, 4), _rand((n, (l_max + 1) * F), dtype, device, 5)
    fused = lambda v, z: rowwise.gated(v, z, activation, l_max, F)  # noqa: E731
    reference = lambda v, z: _gate_reference(v, z, activation, l_max, F)  # noqa: E731
    _check_grads(fused, reference, [v, z], dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_blocks_take_the_kernels_in_eager_triton_calls(device, monkeypatch):
    """RMSNorm and Gate on the Triton path launch the fused kernels (and give the ATen path's
    results, gains' and weights' gradients included) in eager calls only."""
    rowwise = _rowwise()
    from flashcart.cartesian._triton import signatures

    launched = []
    real = signatures.launch_kernel

    def counting(kernel, *args, **kwargs):
        launched.append(getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", "?"))
        return real(kernel, *args, **kwargs)

    monkeypatch.setattr(rowwise, "launch_kernel", counting)
    torch.manual_seed(0)
    norm = RMSNorm(2, 3, backend="triton").double().to(device)
    gate = Gate(2, 3, activation="silu", backend="triton").double().to(device)
    with torch.no_grad():
        for p in [*norm.parameters(), *gate.parameters()]:
            p.add_(0.3 * torch.randn_like(p))
    x = _rand((5, 27), torch.float64, device, 6).requires_grad_(True)

    def run():
        y = gate(norm(x))
        params = [*norm.parameters(), *gate.parameters()]
        return [y, *torch.autograd.grad(y.square().sum(), [x, *params])]

    fused = run()
    assert launched == ["rms_norm_fwd", "gate_fwd", "gate_bwd"]  # the gains' gradient: the ATen derivative
    monkeypatch.setattr(rowwise, "ENABLED", False)
    for a, b in zip(fused, run()):
        torch.testing.assert_close(a, b, **TOL[torch.float64])
    assert launched == ["rms_norm_fwd", "gate_fwd", "gate_bwd"]
    monkeypatch.setattr(rowwise, "ENABLED", True)
    for p in [*norm.parameters(), *gate.parameters()]:
        p.requires_grad_(False)
    launched.clear()
    torch.autograd.grad(gate(norm(x)).square().sum(), [x])  # a force call: both backward kernels
    assert launched == ["rms_norm_fwd", "gate_fwd", "gate_bwd", "rms_norm_bwd"]


@pytest.mark.parametrize("device", DEVICES)
def test_model_force_call_with_and_without_the_kernels(device, monkeypatch):
    """A whole eager force call on the Triton path (fused norm and gate) equals the same call
    through the product and ATen expressions, float64."""
    rowwise = _rowwise()
    from ase import Atoms

    from flashcart.data import collate, structure_from_atoms
    from flashcart.model.potential import FlashCartPotential
    from flashcart.model.predictor import Predictor
    from flashcart.testing import TINY_MODEL

    torch.manual_seed(0)
    opts = {**TINY_MODEL, "n_interactions": 1, "path_reduced_product": True, "layer_norm": True}
    model = FlashCartPotential(["H", "C", "O"], avg_neighbors=4.0, use_triton=True, **opts).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    for m in model.modules():
        if hasattr(m, "backend"):
            m.backend = "triton"
    model.to(device)
    g = torch.Generator().manual_seed(3)
    atoms = Atoms("CCOHHH", positions=(torch.randn(6, 3, generator=g, dtype=torch.float64) * 1.2).numpy())
    batch = collate([structure_from_atoms(atoms, model.r_max, require_labels=False)], model.z_to_type.cpu())
    batch = batch.to(device, torch.float64)
    fused = Predictor(model, pad=False)(batch, forces=True)
    monkeypatch.setattr(rowwise, "ENABLED", False)
    plain = Predictor(model, pad=False)(batch, forces=True)
    for key in ("energy", "forces"):
        torch.testing.assert_close(fused[key], plain[key], rtol=1e-11, atol=1e-11)
