"""The fused row-wise kernels of the RMS norm and the gate (flashcart.cartesian._triton.rowwise)
equal their ATen expressions: forward and backward (the kernels), double backward and the
gains' gradient (the ATen derivative they fall back to), float64 to 1e-12; and the blocks
take them exactly in eager Triton calls. On CPU under TRITON_INTERPRET=1; on CUDA with -m gpu."""

import os

import pytest
import torch

from flashcart.cartesian._backend import triton_available
from flashcart.nn.blocks import Gate, RMSNorm, rank_channel_index

pytestmark = pytest.mark.skipif(
    not triton_available() or not (os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()),
    reason="Triton kernels need CUDA or TRITON_INTERPRET=1",
)

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter off")),
    pytest.param("cuda", marks=pytest.mark.gpu),
]
TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=2e-5, atol=2e-6)}


def _rowwise():
    from flashcart.cartesian._triton import rowwise

    return rowwise


def _rms_reference(inv, x, gains, eps, l_max, F):
    y = x * torch.rsqrt(inv.mean(dim=1, keepdim=True).abs() + eps)
    return y if gains is None else y * gains.index_select(0, rank_channel_index(l_max, F).to(x.device))


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
@pytest.mark.parametrize("l_max,F,gains", [(2, 4, True), (3, 5, False), (0, 3, True), (2, 20, True)])
def test_rms_scale_equals_the_aten_expression(device, dtype, l_max, F, gains):
    rowwise = _rowwise()
    n, W, K = 7, (l_max + 1) ** 2 * F, (l_max + 1) * F
    inv, x = _rand((n, K), dtype, device, 1), _rand((n, W), dtype, device, 2)
    inv[0] = -inv[0]  # rows with a negative mean (the norm takes its absolute value)
    g = _rand((K,), dtype, device, 3) if gains else None
    eps = 1e-6
    inputs = [inv, x] + ([g] if gains else [])
    fused = lambda inv, x, *g: rowwise.rms_scale(inv, x, g[0] if g else None, eps, l_max, F)  # noqa: E731
    reference = lambda inv, x, *g: _rms_reference(inv, x, g[0] if g else None, eps, l_max, F)  # noqa: E731
    _check_grads(fused, reference, inputs, dtype)


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
    assert launched == ["rms_scale_fwd", "gate_fwd", "gate_bwd"]  # the gains' gradient: the ATen derivative
    monkeypatch.setattr(rowwise, "ENABLED", False)
    for a, b in zip(fused, run()):
        torch.testing.assert_close(a, b, **TOL[torch.float64])
    assert launched == ["rms_scale_fwd", "gate_fwd", "gate_bwd"]
    monkeypatch.setattr(rowwise, "ENABLED", True)
    for p in [*norm.parameters(), *gate.parameters()]:
        p.requires_grad_(False)
    launched.clear()
    torch.autograd.grad(gate(norm(x)).square().sum(), [x])  # a force call: both backward kernels
    assert launched == ["rms_scale_fwd", "gate_fwd", "gate_bwd", "rms_scale_bwd"]
