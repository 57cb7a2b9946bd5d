"""The model on CUDA: Triton kernels == generated PyTorch, compiled == eager (run with -m gpu)."""

import pytest
import torch

from flashcart.cartesian import EquivariantLinear
from flashcart.model.potential import FlashCartPotential
from flashcart.model.predictor import Predictor
from flashcart.testing import TINY_MODEL, assert_close

from .conftest import as_batch, crystal, molecule, permuted_edges

pytestmark = pytest.mark.gpu


def _pair():
    ref = FlashCartPotential(["H", "C", "O", "Cu"], use_triton=False, **{**TINY_MODEL, "n_hidden_feats": 8}).double().cuda()
    tri = FlashCartPotential(["H", "C", "O", "Cu"], use_triton=True, **{**TINY_MODEL, "n_hidden_feats": 8}).double().cuda()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    tri.load_state_dict(ref.state_dict())
    return ref, tri


def test_triton_model_matches_torch_model_with_training_gradients():
    ref, tri = _pair()
    batch = as_batch(ref, [molecule(0), crystal()]).to("cuda")
    results = []
    for m in (ref, tri):
        m.zero_grad()
        out = Predictor(m)(batch, stress=True, create_graph=True)
        ((out["forces"] ** 2).sum() + out["energy"].sum()).backward()
        results.append((out, [p.grad for p in m.parameters()]))
    (a, ga), (b, gb) = results
    for k in a:
        assert_close(b[k].detach(), a[k].detach(), 1e-10, k)
    for x, y in zip(ga, gb):
        assert_close(y, x, 1e-9, "parameter gradient")


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_equals_eager_on_gpu(mode):
    torch._dynamo.reset()
    _, tri = _pair()
    small = as_batch(tri, [molecule(0)]).to("cuda")
    batch = as_batch(tri, [molecule(0), crystal()]).to("cuda")
    # compiled first (nothing cached by an eager call), then a larger batch grows the capacities
    compiled = Predictor(tri, compile=True, compile_mode=mode)
    outs = []
    for b in (small, small, batch, batch, batch):
        outs.append(compiled(b, stress=True))
    for b, out in ((small, outs[1]), (batch, outs[-1])):
        eager = Predictor(tri)(b, stress=True)
        for k in eager:
            assert_close(out[k], eager[k], 1e-10, k)


def _switch_on(setting: str, monkeypatch) -> None:
    """Turn on one of the compiled call's opt-in settings (off by default), or turn a default
    (inductor's combined kernels, the linear-map pairs) off."""
    if setting == "norm-forms":  # the RMS norm's invariants as quadratic forms in inductor's kernels
        import flashcart.nn.blocks as blocks

        monkeypatch.setattr(blocks, "_NORM_FORMS", True)
    elif setting == "no-combo-kernels":  # inductor's own fusion only (read when the Predictor compiles)
        monkeypatch.setenv("FLASHCART_COMBO_KERNELS", "0")
    else:  # no linear-map pairs: the message map and skip connection launched one by one
        import flashcart.cartesian._triton.ops as ops

        monkeypatch.setattr(ops, "LINEAR_PAIRS", False)


@pytest.mark.parametrize("setting", ["no-combo-kernels", "separate-maps", "norm-forms"])
def test_compiled_settings_on_gpu(monkeypatch, setting):
    """FLASHCART_NORM_FORMS=1, FLASHCART_COMBO_KERNELS=0 and FLASHCART_LINEAR_PAIRS=0, each alone:
    reduce-overhead calls == eager calls (float64, 1e-10: energy, forces, stress), and a compiled
    training step's parameter gradients == eager ones (1e-9)."""
    _switch_on(setting, monkeypatch)
    torch._dynamo.reset()
    _, tri = _pair()
    for lin in (m for m in tri.modules() if isinstance(m, EquivariantLinear)):
        lin.backend = "triton"  # as "auto" on CUDA: the maps through the grouped kernel
    batch = as_batch(tri, [molecule(0), crystal()]).to("cuda")
    compiled = Predictor(tri, compile=True, compile_mode="reduce-overhead")
    for _ in range(3):
        out = compiled(batch, stress=True)
    eager = Predictor(tri)(batch, stress=True)
    for k in eager:
        assert_close(out[k], eager[k], 1e-10, k)
    params = [p for p in tri.parameters() if p.requires_grad]

    def loss(pred, targets, atoms, graphs):
        forces = torch.where(atoms[:, None], pred["forces"], torch.zeros_like(pred["forces"]))
        return (forces**2).sum()

    batch.energy = torch.zeros(batch.n_graphs, dtype=torch.float64, device="cuda")
    batch.forces = torch.zeros_like(batch.positions)
    for _ in range(2):
        _, grads = compiled.loss_and_grads(batch, loss, params)
    pred = Predictor(tri)(batch, create_graph=True)
    reference = torch.autograd.grad((pred["forces"] ** 2).sum(), params, allow_unused=True)
    for a, b in zip(grads, reference):
        if b is not None:
            assert_close(a, b, 1e-9, "parameter gradient")


@pytest.mark.parametrize("kernel", [True, False], ids=["table in kernels", "weights and slopes"])
def test_radial_tables_on_gpu_compiled_and_eager(monkeypatch, kernel):
    """Tabulated radial MLPs on CUDA (flashcart.nn.radial_table): eager Triton calls with
    tables (the ATen edge features, which give the lengths) == the MLPs' results to the table's
    accuracy, a reduce-overhead compiled call with tables == the eager one, and the slopes
    contracted in the products' backward kernels (FLASHCART_TABLE_SLOPES, the default) == autograd
    through the table (float64); the products evaluate the table in their kernels
    (FLASHCART_TABLE_KERNEL, the default) or read the weights and slopes evaluated before."""
    import flashcart.nn.blocks as blocks

    monkeypatch.setattr(blocks, "_TABLE_KERNEL", kernel)

    torch._dynamo.reset()
    _, tri = _pair()
    batch = as_batch(tri, [molecule(0), crystal()]).to("cuda")
    exact = Predictor(tri)(batch, stress=True)
    tri.set_radial_tables(4096)
    assert tri.interactions[0].radial_table.is_cuda
    monkeypatch.setattr(blocks, "_TABLE_SLOPES", True)
    eager = Predictor(tri)(batch, stress=True)
    compiled = Predictor(tri, compile=True, compile_mode="reduce-overhead")
    for _ in range(3):
        out = compiled(batch, stress=True)
    monkeypatch.setattr(blocks, "_TABLE_SLOPES", False)
    through_autograd = Predictor(tri)(batch, stress=True)
    for k in exact:
        assert_close(eager[k], exact[k], 1e-8, f"tables against MLPs: {k}")
        assert_close(out[k], eager[k], 1e-10, f"compiled against eager: {k}")
        assert_close(eager[k], through_autograd[k], 1e-12, f"slopes in the kernels against autograd: {k}")


@pytest.mark.parametrize("pad", [True, False], ids=["padded", "unpadded"])
def test_static_lists_in_reduce_overhead_calls(monkeypatch, pad):
    """FLASHCART_STATIC_LIST=1 (the default, flashcart.model.static_buffers): a reduce-overhead Predictor keeps
    each list (padded: the padded list; unpadded: a copy of the caller's) and its layout at fixed
    addresses, the CUDA graph reads them in place, and lists that change (A, A, B, A, B; the same
    capacities, or for unpadded calls B is A's edges in another order) give the eager results
    (float64, 1e-10)."""
    import flashcart.model.static_buffers as static_buffers

    torch._dynamo.reset()
    monkeypatch.setattr(static_buffers, "STATIC_LIST", True)
    _, tri = _pair()
    a = as_batch(tri, [molecule(1), crystal()]).to("cuda")
    b = as_batch(tri, [molecule(2), molecule(3)]).to("cuda") if pad else permuted_edges(a, 0)
    batches = {"A": a, "B": b}
    compiled = Predictor(tri, compile=True, compile_mode="reduce-overhead", pad=pad, pad_atom_multiple=32, pad_edge_multiple=256)
    eager = {k: Predictor(tri)(b, stress=True) for k, b in batches.items()}
    addresses = set()
    for name in "AABAB":
        out = compiled(batches[name], stress=True)
        for k in out:
            assert_close(out[k], eager[name][k], 1e-10, f"list {name}: {k}")
        kept, layout = compiled._prepared(batches[name])
        assert compiled._static_list(kept) and (pad or kept.receivers is not batches[name].receivers)
        addresses.add((kept.receivers.data_ptr(), kept.shifts.data_ptr(), layout.perm.data_ptr()))
    assert len(addresses) == 1
