"""Predictor: global state only inside its calls (dynamo flag, frozen parameters), explicit compile modes on CPU."""

import warnings

import pytest
import torch
from ase import Atoms

from flashcart.data import collate, structure_from_atoms
from flashcart.model.predictor import Predictor, frozen_parameters


class PairModel(torch.nn.Module):
    """A toy potential with the model interface the Predictor uses: ``E_g = sum_edges a * |r|^2 + b``."""

    r_max = 3.0

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(0.5, dtype=torch.float64))
        self.b = torch.nn.Parameter(torch.tensor(-1.0, dtype=torch.float64))

    def forward(self, positions, types, cell, shifts, receivers, senders, batch, edge_batch, n_graphs):
        r = positions[senders] - positions[receivers] + torch.einsum("ei,eij->ej", shifts, cell[edge_batch])
        per_edge = self.a * (r * r).sum(-1) * (r.norm(dim=-1) < self.r_max)
        energy = torch.zeros(n_graphs, dtype=positions.dtype, device=positions.device).index_add(0, edge_batch, per_edge)
        return energy + self.b


@pytest.fixture
def model():
    return PairModel()


@pytest.fixture
def batch():
    atoms = Atoms("OHH", positions=[[0.0, 0.0, 0.0], [0.96, 0.0, 0.0], [-0.24, 0.93, 0.0]])
    z_to_type = torch.zeros(9, dtype=torch.long)
    return collate([structure_from_atoms(atoms, PairModel.r_max, where="water", require_labels=False)], z_to_type).to(dtype=torch.float64)


def _record_requires_grad(model):
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(all(not p.requires_grad for p in module.parameters())))
    return seen


def test_force_only_calls_freeze_parameters_for_the_call_only(model, batch):
    frozen_inside = _record_requires_grad(model)
    p = Predictor(model)
    p(batch, forces=True)
    p(batch, forces=True, create_graph=True)
    assert frozen_inside == [True, False]
    assert all(q.requires_grad for q in model.parameters())


def test_frozen_block_freezes_once_and_restores(model, batch):
    frozen_inside = _record_requires_grad(model)
    p = Predictor(model)
    calls = []
    original = torch.nn.Parameter.requires_grad_
    with p.frozen():
        assert not any(q.requires_grad for q in model.parameters())
        torch.nn.Parameter.requires_grad_ = lambda self, flag=True: calls.append(flag) or original(self, flag)
        try:
            out = p(batch, forces=True)
        finally:
            torch.nn.Parameter.requires_grad_ = original
    assert calls == [] and frozen_inside == [True] and out["forces"].shape == (3, 3)
    assert all(q.requires_grad for q in model.parameters())


def test_frozen_parameters_restore_after_an_error(model):
    model.b.requires_grad_(False)  # stays frozen: it was before
    with pytest.raises(RuntimeError, match="boom"), frozen_parameters(model.parameters()):
        assert not model.a.requires_grad
        raise RuntimeError("boom")
    assert model.a.requires_grad and not model.b.requires_grad


class RecordingBackend:
    """Compiles with aot_eager and records the dynamo flag seen while compiling."""

    def __init__(self):
        self.flags = []

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        self.flags.append(torch._dynamo.config.trace_autograd_ops)
        return lookup_backend("aot_eager")(gm, example_inputs)


def test_trace_autograd_ops_is_set_only_inside_compiled_calls(model, batch):
    torch._dynamo.reset()
    assert torch._dynamo.config.trace_autograd_ops is False
    backend = RecordingBackend()
    p = Predictor(model, compile=True, compile_backend=backend, pad_atom_multiple=8, pad_edge_multiple=16, pad_graph_multiple=2)
    compiled = p(batch, forces=True)
    flags = list(backend.flags)
    assert flags and all(flags)  # compiled with autograd.grad (the forces) traced into the graph
    assert torch._dynamo.config.trace_autograd_ops is False
    eager = Predictor(model)(batch, forces=True)
    torch.testing.assert_close(compiled["forces"], eager["forces"], rtol=1e-12, atol=1e-12)
    assert float(eager["forces"].abs().max()) > 0.1
    p(batch, forces=True)  # same capacities: no recompilation
    assert backend.flags == flags and torch._dynamo.config.trace_autograd_ops is False


@pytest.mark.parametrize(
    "mode, device, expected, warns",
    [
        ("default", "cpu", {"options": {"cpp.simdlen": 1}}, False),
        ("reduce-overhead", "cpu", {"options": {"cpp.simdlen": 1}}, True),
        ("max-autotune", "cpu", {"options": {"max_autotune": True, "coordinate_descent_tuning": True, "cpp.simdlen": 1}}, True),
        (
            "max-autotune-no-cudagraphs",
            "cpu",
            {"options": {"max_autotune": True, "coordinate_descent_tuning": True, "cpp.simdlen": 1}},
            False,
        ),
        ("reduce-overhead", "cuda", {"mode": "reduce-overhead"}, False),
        ("default", "cuda", {"mode": None}, False),
    ],
)
def test_compile_mode_is_kept_or_explicitly_reduced_on_cpu(model, mode, device, expected, warns, monkeypatch):
    """CUDA calls keep the mode (with inductor's combined kernels off: see the next test)."""
    monkeypatch.setenv("FLASHCART_COMBO_KERNELS", "0")
    p = Predictor(model, compile=True, compile_mode=mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert p._compile_options(device) == expected
        assert p._compile_options(device) == expected
    messages = [str(w.message) for w in caught]
    assert len(messages) == int(warns), messages  # once per predictor
    if warns:
        assert f"compile_mode={mode!r}" in messages[0] and "without CUDA graphs" in messages[0]


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_combo_kernels_switch_adds_inductors_option_on_cuda(model, mode, monkeypatch):
    """``FLASHCART_COMBO_KERNELS=1`` (the default): compiled CUDA calls pass the mode's own
    inductor options plus ``combo_kernels`` (options replace the mode); CPU calls and ``0`` are
    unchanged; a value other than 0 or 1 is an error naming the variable."""
    from torch._inductor import list_mode_options

    p = Predictor(model, compile=True, compile_mode=mode)
    for on in ("1", ""):
        monkeypatch.setenv("FLASHCART_COMBO_KERNELS", on)
        assert p._compile_options("cuda") == {"options": {**list_mode_options(mode), "combo_kernels": True}}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert "combo_kernels" not in p._compile_options("cpu")["options"]
    monkeypatch.setenv("FLASHCART_COMBO_KERNELS", "0")
    assert p._compile_options("cuda") == {"mode": None if mode == "default" else mode}
    monkeypatch.setenv("FLASHCART_COMBO_KERNELS", "yes")
    with pytest.raises(ValueError, match="FLASHCART_COMBO_KERNELS must be 0 or 1, got 'yes'"):
        p._compile_options("cuda")
