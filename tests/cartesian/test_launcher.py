"""Pre-bound Triton launches (launcher.py): the compiled kernel's launcher is kept per
specialisation and called with the arguments in declaration order; anything that would
specialise differently compiles and launches through the kernel again. Triton's own kernels do
not compile here (TRITON_INTERPRET=1), so a stand-in kernel records what it is asked to do."""

import pytest
import torch

import flashcart.cartesian._triton.launcher as launcher


class _Compiled:
    def __init__(self, log, spec):
        self.log, self.spec = log, spec
        self.function, self.packed_metadata = f"fn{spec}", ("warps", 4)

    @property
    def run(self):
        def run(gx, gy, gz, stream, function, metadata, launch_metadata, enter, exit_, *args):
            self.log.append(("run", (gx, gy, gz), stream, function, metadata, args))

        return run


class _Kernel:
    """Stands in for a ``@triton.jit`` function with parameters ``x_ptr, n, BLOCK``."""

    arg_names = ["x_ptr", "n", "BLOCK"]

    class _Param:
        def __init__(self, name, is_constexpr):
            self.name, self.is_constexpr = name, is_constexpr

    params = [_Param("x_ptr", False), _Param("n", False), _Param("BLOCK", True)]

    def __init__(self):
        self.log, self.compiles = [], 0

    def __getitem__(self, grid):
        def launch(**kwargs):
            assert list(kwargs)[:3] == ["x_ptr", "n", "BLOCK"] or set(kwargs) >= set(self.arg_names)
            self.compiles += 1
            self.log.append(("jit", grid, kwargs))
            return _Compiled(self.log, self.compiles)

        return launch


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(launcher, "ENABLED", True)
    monkeypatch.setattr(launcher, "_plain_reason", lambda k: None if isinstance(k, _Kernel) else "not the stand-in")
    monkeypatch.setattr(launcher, "_cuda_index", lambda values: 0)
    monkeypatch.setattr(launcher, "_current_stream", lambda device: 1234)
    launcher.clear()
    yield _Kernel()
    launcher.clear()


def test_the_second_launch_of_a_specialisation_calls_the_compiled_launcher(kernel):
    x = torch.zeros(64)
    launcher.launch(kernel, (5,), {"n": 96, "x_ptr": x, "BLOCK": 32}, {"num_warps": 4})
    launcher.launch(kernel, (7, 2), {"x_ptr": x, "n": 112, "BLOCK": 32}, {"num_warps": 4})  # same specialisation
    assert [entry[0] for entry in kernel.log] == ["jit", "run"]
    _, grid, stream, function, metadata, args = kernel.log[1]
    assert grid == (7, 2, 1) and stream == 1234 and function == "fn1" and metadata == ("warps", 4)
    assert args[0] is x and args[1:] == (112, 32)  # declaration order, constexprs included


@pytest.mark.parametrize(
    "change",
    [
        {"n": 1},  # Triton makes an int of 1 a constant
        {"n": 97},  # not divisible by 16
        {"n": 2**40},  # 64-bit
        {"BLOCK": 64},  # another constexpr value (the same as an int argument would specialise alike)
        {"x_ptr": torch.zeros(64, dtype=torch.float64)},  # another dtype
        {"x_ptr": torch.zeros(65)[1:]},  # an address that is not 16-byte aligned
    ],
)
def test_another_specialisation_compiles_through_the_kernel(kernel, change):
    values = {"x_ptr": torch.zeros(64), "n": 96, "BLOCK": 32}
    launcher.launch(kernel, (1,), values, {})
    launcher.launch(kernel, (1,), {**values, **change}, {})
    assert [entry[0] for entry in kernel.log] == ["jit", "jit"]
    launcher.launch(kernel, (1,), {**values, **change}, {})
    assert [entry[0] for entry in kernel.log] == ["jit", "jit", "run"]


def test_other_launch_options_and_the_disabled_path(kernel, monkeypatch):
    values = {"x_ptr": torch.zeros(64), "n": 96, "BLOCK": 32}
    launcher.launch(kernel, (1,), values, {"num_warps": 4})
    launcher.launch(kernel, (1,), values, {"num_warps": 8})
    assert [entry[0] for entry in kernel.log] == ["jit", "jit"]
    monkeypatch.setattr(launcher, "ENABLED", False)
    launcher.launch(kernel, (1,), values, {"num_warps": 4})
    assert [entry[0] for entry in kernel.log] == ["jit", "jit", "jit"]  # off: always the kernel's own launch
    monkeypatch.setattr(launcher, "ENABLED", True)
    monkeypatch.setattr(launcher, "_cuda_index", lambda values: None)
    launcher.launch(kernel, (1,), values, {"num_warps": 4})
    assert kernel.log[-1][0] == "jit"  # CPU tensors: the kernel's own launch


def test_interpreted_kernels_are_never_pre_bound():
    import triton

    @triton.jit
    def k(x_ptr):
        pass

    assert not launcher._compiled_kernels_launch(k)  # TRITON_INTERPRET=1 here: an interpreted function


@pytest.mark.gpu
def test_pre_bound_launches_compute_what_the_kernels_launches_compute(monkeypatch):
    """On the GPU: a float64 Triton model's energy, forces and stress with pre-bound launches
    equal those of the plain launches (to 1e-12: PyTorch's scatters between the kernels add in
    no fixed order, so two plain calls differ in the last bits too), and the launches were
    pre-bound."""
    from flashcart.model.potential import FlashCartPotential
    from flashcart.testing import TINY_MODEL, reference_evaluation

    from ..simulation.systems import water_box

    torch.manual_seed(0)
    model = FlashCartPotential(["H", "O"], use_triton=True, avg_neighbors=8.0, **{**TINY_MODEL, "n_hidden_feats": 8}).cuda().double()
    atoms = water_box(n_side=2)
    monkeypatch.setattr(launcher, "ENABLED", False)
    plain = reference_evaluation(model, atoms, stress=True)
    monkeypatch.setattr(launcher, "ENABLED", True)
    launcher.clear()
    first = reference_evaluation(model, atoms, stress=True)  # compiles, keeps the launchers
    assert launcher._launchers, f"no launch was pre-bound; plain launches by reason: {dict(launcher.plain_launches)}"
    plain_before = sum(launcher.plain_launches.values())
    again = reference_evaluation(model, atoms, stress=True)  # pre-bound
    assert sum(launcher.plain_launches.values()) == plain_before, dict(launcher.plain_launches)  # none fell back
    for a, b, c in zip(plain, first, again):
        a, b, c = (torch.as_tensor(v, dtype=torch.float64) for v in (a, b, c))
        scale = max(1.0, float(a.abs().max()))
        assert float((a - b).abs().max()) <= 1e-12 * scale and float((a - c).abs().max()) <= 1e-12 * scale
    launcher.clear()


@pytest.mark.parametrize("raw, enabled", [("0", False), ("1", True)])
def test_the_environment_variable_is_0_or_1(monkeypatch, raw, enabled):
    monkeypatch.setenv("FLASHCART_PREBOUND_LAUNCH", raw)
    assert launcher._enabled() is enabled
    monkeypatch.setenv("FLASHCART_PREBOUND_LAUNCH", "yes")
    with pytest.raises(ValueError, match="FLASHCART_PREBOUND_LAUNCH must be 0 or 1, got 'yes'"):
        launcher._enabled()


def test_on_by_default_only_with_a_checked_triton(monkeypatch):
    monkeypatch.delenv("FLASHCART_PREBOUND_LAUNCH", raising=False)
    monkeypatch.setattr(launcher, "_triton_release", lambda: (3, 6))
    assert launcher._enabled() is True
    for other in [(3, 7), (4, 0), None]:  # unchecked specialisation rules, or no readable Triton
        monkeypatch.setattr(launcher, "_triton_release", lambda other=other: other)
        assert launcher._enabled() is False
    monkeypatch.setenv("FLASHCART_PREBOUND_LAUNCH", "1")  # the variable overrides
    assert launcher._enabled() is True


def test_the_installed_triton_release_is_read():
    release = launcher._triton_release()
    import triton

    assert release == tuple(int(p) for p in triton.__version__.split(".")[:2])


def test_an_empty_hook_chain_is_no_hook():
    """triton 3.6+ keeps an empty ``HookChain`` in ``knobs.runtime.launch_enter_hook`` when no
    hook is set (on the H200 every launch was refused as hooked before this was checked)."""

    class Chain:
        def __init__(self, calls):
            self.calls = calls

    assert not launcher._hook_installed(None) and not launcher._hook_installed(Chain([]))
    assert launcher._hook_installed(Chain([print])) and launcher._hook_installed(print)
    knobs = pytest.importorskip("triton.knobs")
    assert not launcher._hook_installed(knobs.runtime.launch_enter_hook)  # nothing installed here


def test_the_inline_key_equals_the_key_of_each_value():
    """``specialisation`` keys plain tensors and parameters inline; every key equals the one the
    per-value rule (``_spec``) gives, for every kind of argument, so the inline path selects the
    same pre-bound launcher as before (on any device: the key reads only dtype and address)."""

    class Sub(torch.Tensor):
        pass

    base = torch.zeros(64, dtype=torch.float32)
    values = {
        "aligned": base,
        "offset": base[1:],  # 4 bytes past a 16-byte boundary
        "int64": torch.zeros(3, dtype=torch.int64),
        "param": torch.nn.Parameter(torch.zeros(4, dtype=torch.float64)),
        "sub": base.as_subclass(Sub),
        "one": 1,
        "sixteen": 32,
        "big": 2**40,
        "flag": True,
        "none": None,
        "scale": 0.5,
        "dtype": torch.float16,
        "BLOCK": 64,
    }
    names = list(values)
    constexprs = frozenset({"BLOCK"})
    expected = tuple(("constexpr", values[n]) if n in constexprs else launcher._spec(values[n]) for n in names)
    assert launcher.specialisation(names, values, constexprs) == expected
    assert expected[0] != expected[1]  # the address's alignment is part of the key
