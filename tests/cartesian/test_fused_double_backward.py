"""Fused double backward of the Triton tensor product (``flashcart::tp_dbwd``).

It must equal the composed double backward (``tp_fwd``/``tp_bwd`` launches with substituted
operands, ``FUSED_DOUBLE_BACKWARD`` off) and the generated PyTorch backend, for every pattern
of present cotangents and needed results, in convolution and dense mode, with broadcast
(one-channel) inputs and shared weights. On CPU the kernels run under TRITON_INTERPRET=1;
the ``gpu`` tests repeat the parity on CUDA.
"""

import itertools
import os

import pytest
import torch

import flashcart.cartesian._triton.ops as ops
from flashcart.cartesian import TensorProduct, edge_csr
from flashcart.cartesian._backend import triton_available
from flashcart.cartesian._triton import double_backward, signatures
from flashcart.cartesian._triton.codegen_double import generate_double_backward_source
from flashcart.cartesian._triton.source import product_key, product_spec
from flashcart.testing import assert_close

from .triton_devices import needs_triton

F64 = torch.float64

# name: l1, l2, lout, F1, F2, shared weights, reduce paths, convolution
CASES = {
    "conv-bcast-x2": (1, 2, 1, 2, 1, False, False, True),  # the model's interaction layout
    "conv-bcast-x1-shared": (1, 1, 1, 1, 2, True, True, True),
    "conv-two-blocks": (1, 1, 1, 65, 1, False, True, True),  # 65 channels: two channel blocks
    "dense": (1, 1, 2, 2, 2, False, False, False),
    "dense-bcast-x1-shared": (1, 1, 1, 1, 3, True, False, False),
}


@pytest.fixture
def fused(monkeypatch):
    """Set ``FUSED_DOUBLE_BACKWARD`` for one test; count the fused op's calls."""
    calls = []
    real = ops.tp_dbwd

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(ops, "tp_dbwd", spy)

    def set_mode(on: bool):
        monkeypatch.setattr(ops, "FUSED_DOUBLE_BACKWARD", on)
        return calls

    return set_mode


def _problem(case, device="cpu", n_nodes=3, n_edges=5, seed=0):
    l1, l2, lo, f1, f2, shared, red, conv = case
    g = torch.Generator().manual_seed(seed)
    tp = TensorProduct(l1, l2, lo, f1, f2, shared_weights=shared, reduce_paths=red, backend="triton")
    rows = n_edges if conv else n_nodes
    graph = None
    if conv:
        receivers = torch.sort(torch.randint(0, n_nodes, (n_edges,), generator=g)).values
        receivers[0] = 0
        receivers[-1] = n_nodes - 2  # the last node receives nothing
        receivers = torch.sort(receivers).values
        senders = torch.randint(0, n_nodes, (n_edges,), generator=g)
        senders[-1] = senders[0] = 0  # node 0 sends twice, some node may send nothing
        graph = (receivers.to(device), senders.to(device))

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=F64).to(device)

    x1 = rand(n_nodes, tp.in1_width)
    x2 = rand(rows, tp.in2_width)
    w = rand(*(() if shared else (rows,)), tp.weight_numel)
    return tp, graph, (x1, x2, w), rand


def _first_order(tp, graph, xs, go):
    """``(g1, g2, gw)`` of ``<go, tp(x1, x2, w)>`` with their graph."""
    out = tp(*xs, *(graph or ()))
    return torch.autograd.grad(out, xs, go, create_graph=True)


def _second_order(tp, graph, inputs, cots, present):
    """Derivatives of ``sum_k <cot_k, g_k>`` over the present ``k`` w.r.t. ``go, x1, x2, w``."""
    go, *xs = inputs
    grads = _first_order(tp, graph, xs, go)
    s = sum((grads[k] * cots[k]).sum() for k in range(3) if present[k])
    return torch.autograd.grad(s, inputs, allow_unused=True, materialize_grads=True)


def _leaves(tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


@needs_triton
@pytest.mark.parametrize("name", list(CASES))
def test_fused_equals_composed_and_torch_for_every_cotangent_pattern(name, fused):
    case = CASES[name]
    tp, graph, xs, rand = _problem(case)
    ref = TensorProduct(*case[:5], shared_weights=case[5], reduce_paths=case[6], backend="torch")
    go = rand(*tp(*xs, *(graph or ())).shape)
    cots = [rand(*t.shape) for t in xs]
    for present in itertools.product([False, True], repeat=3):
        if not any(present):
            continue
        expected = _second_order(ref, graph, _leaves([go, *xs]), cots, present)
        calls = fused(True)
        n_before = len(calls)
        got = _second_order(tp, graph, _leaves([go, *xs]), cots, present)
        assert len(calls) == n_before + 1, "the fused double backward did not run"
        fused(False)
        composed = _second_order(tp, graph, _leaves([go, *xs]), cots, present)
        for what, a, b, c in zip(("d go", "d x1", "d x2", "d w"), got, composed, expected):
            assert_close(a, c, 1e-12, f"{name} {present} {what} fused vs torch")
            assert_close(b, c, 1e-12, f"{name} {present} {what} composed vs torch")
            assert_close(a, b, 1e-12, f"{name} {present} {what} fused vs composed")


@needs_triton
@pytest.mark.parametrize("name", ["conv-bcast-x2", "dense-bcast-x1-shared"])
def test_every_need_pattern_gives_the_full_results_it_asks_for(name):
    """The op computes exactly the needed results with a term; the rest are empty."""
    case = CASES[name]
    tp, graph, (x1, x2, w), rand = _problem(case)
    key = product_key(*case[:3], False, case[6])
    csr = (None,) * 7
    if graph is not None:
        csr = (*graph, *edge_csr(*graph, x1.shape[0]), None, None)
    go = rand(*tp(x1, x2, w, *(graph or ())).shape)
    gg = (rand(*x1.shape), rand(*x2.shape), rand(*w.shape))
    full = ops.tp_dbwd(go, x1, x2, w, *gg, *csr, key, True, True, True, True)
    assert [t.shape for t in full] == [go.shape, x1.shape, x2.shape, w.shape]
    patterns = [(need, (True, True, True)) for need in itertools.product([False, True], repeat=4)]
    patterns += [
        ((True,) * 4, present) for present in [(True, False, False), (False, True, False), (False, False, True), (False, True, True)]
    ]
    for need, present in patterns:
        ggs = [t if p else None for t, p in zip(gg, present)]
        outs = ops.tp_dbwd(go, x1, x2, w, *ggs, *csr, key, *need)
        flags = double_backward.fused_outputs(*present, need)
        if present == (True, True, True):
            assert flags == need
        for k, (out, on) in enumerate(zip(outs, flags)):
            if not on:
                assert out.numel() == 0, (need, present, k)
            elif present == (True, True, True):
                assert torch.equal(out, full[k]), (need, k)
            else:
                assert out.shape == full[k].shape and torch.isfinite(out).all()
    # a result without terms is not computed: d x1 needs gg2 or ggw, d x2 gg1 or ggw, d w gg1 or gg2
    assert double_backward.fused_outputs(True, False, False, (True,) * 4) == (True, False, True, True)
    assert double_backward.fused_outputs(False, True, False, (True,) * 4) == (True, True, False, True)
    assert double_backward.fused_outputs(False, False, True, (True,) * 4) == (True, True, True, False)


@needs_triton
def test_gradgradcheck_through_the_fused_triton_path(fused):
    calls = fused(True)
    tp = TensorProduct(1, 2, 1, 2, 1, backend="triton")
    _, graph, xs, _ = _problem((1, 2, 1, 2, 1, False, False, True))
    xs = _leaves(xs)
    fn = lambda a, b, c: tp(a, b, c, *graph)  # noqa: E731
    assert torch.autograd.gradgradcheck(fn, xs, fast_mode=True)
    assert calls, "gradgradcheck did not reach the fused double backward"


@needs_triton
def test_a_recorded_double_backward_is_composed_and_third_derivatives_agree(fused):
    """With create_graph on the second derivative the composed (differentiable) path runs."""
    case = CASES["conv-bcast-x2"]
    tp, graph, xs, rand = _problem(case)
    ref = TensorProduct(*case[:5], backend="torch")
    go = rand(*ref(*xs, *graph).shape)
    results = []
    for m in (ref, tp):
        calls = fused(True)
        n = len(calls)
        leaves = _leaves(xs)
        g = _first_order(m, graph, leaves, go)
        s = sum((t * t).sum() for t in g)
        second = torch.autograd.grad(s, leaves, create_graph=True)
        assert len(calls) == n  # never fused while recording
        # (the third derivative differentiates the composed launches: their double backwards fuse)
        third = torch.autograd.grad(sum((t**2).sum() for t in second), leaves)
        results.append(third)
    for a, b in zip(*results):
        assert_close(b, a, 1e-12, "third derivative")


def test_switch_reads_its_modes_and_names_a_bad_value(monkeypatch):
    for raw, mode in [
        ("0", (False, False, False, False)),
        ("", (True, False, False, True)),
        ("1", (True, False, False, True)),
        ("sender", (True, False, False, False)),
        ("split", (True, True, False, False)),
        ("grouped", (True, False, True, False)),
    ]:
        monkeypatch.setenv("FLASHCART_FUSED_DOUBLE_BACKWARD", raw)
        assert double_backward.env_mode() == mode
    monkeypatch.setenv("FLASHCART_FUSED_DOUBLE_BACKWARD", "yes")
    with pytest.raises(ValueError, match="FLASHCART_FUSED_DOUBLE_BACKWARD must be one of 1, 0, sender, split, grouped, got 'yes'"):
        double_backward.env_mode()


def test_cotangent_of_the_wrong_shape_is_refused():
    x1, x2, w = torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(5, 2)
    with pytest.raises(ValueError, match=r"gg2 has shape \(5, 3\), expected \(5, 4\)"):
        double_backward.tp_dbwd._init_fn(
            torch.zeros(5, 6), x1, x2, w, None, torch.zeros(5, 3), None, *(None,) * 7, "1,1,1,0,0", True, True, True, True
        )


def test_generated_kernels_take_exactly_the_shared_argument_names():
    import ast

    s = product_spec("2,3,2,0,1")
    source = generate_double_backward_source(s.paths, s.in1_l_max, s.in2_l_max, s.out_l_max, s.reduce)
    kernels = {f.name: [a.arg for a in f.args.args] for f in ast.parse(source).body if isinstance(f, ast.FunctionDef)}
    sigs = (signatures.TP_DBWD_ROW, signatures.TP_DBWD_X1_CSR)
    assert sorted(kernels) == sorted(sig.name for sig in sigs)
    for sig in sigs:
        assert kernels[sig.name] == [*sig.args, *sig.constexprs], sig.name


@pytest.mark.skipif(not triton_available(), reason="needs triton")
def test_fused_kernels_compile_for_sm90():
    """The interpreter does not check what Triton's compiler accepts (constexpr branches,
    loop-carried values): compile the fused kernels for sm_90 with the bundled ptxas (no GPU
    needed), in a process without TRITON_INTERPRET."""
    from .test_triton_parity import run_compile_check

    lines = run_compile_check("--key", "1,2,1,0,0", "--dtype", "fp64", "--block-f", "32", "--dbwd-only")
    assert len(lines) == 14 and all("REG:" in line for line in lines), lines


# ---------------------------------------------------------------------------------------
# the model: a force-training step's parameter gradients
# ---------------------------------------------------------------------------------------


@needs_triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter off")
def test_training_step_parameter_gradients_unchanged(fused, monkeypatch):
    """create_graph forces + force loss: fused == composed == the generated PyTorch backend, and
    the fused double backward with d x1 added by atomics (``X1_ATOMIC``, default) == the sender
    pass."""
    from flashcart.model.potential import FlashCartPotential
    from flashcart.model.predictor import Predictor
    from flashcart.testing import TINY_MODEL

    from ..model.conftest import as_batch, molecule

    options = {**TINY_MODEL, "n_hidden_feats": 2, "n_interactions": 1, "correlation": 2}
    torch.manual_seed(0)
    model = FlashCartPotential(["H", "C", "O"], avg_neighbors=3.0, use_triton=False, **options).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    batch = as_batch(model, [molecule(0)])
    products = [m for m in model.modules() if isinstance(m, TensorProduct) and m.in2_features == 1 and m.in1_features > 1]
    assert products, "no convolution product in the model"

    def step():
        model.zero_grad()
        out = Predictor(model)(batch, create_graph=True)
        ((out["forces"] ** 2).sum() + out["energy"].sum()).backward()
        return [p.grad.clone() for p in model.parameters()]

    reference = step()
    for m in products:
        m.backend = "triton"
    calls = fused(True)
    got = step()
    assert calls, "the fused double backward did not run in the training step"
    monkeypatch.setattr(double_backward, "X1_ATOMIC", not double_backward.X1_ATOMIC)
    other = step()  # d x1 by the sender pass under the default, by atomics under =sender
    fused(False)
    composed = step()
    for a, b, c, d in zip(got, composed, reference, other):
        assert_close(a, c, 1e-11, "fused vs torch parameter gradient")
        assert_close(a, b, 1e-12, "fused vs composed parameter gradient")
        assert_close(d, a, 1e-12, "d x1 by atomics vs the sender pass: parameter gradient")


# ---------------------------------------------------------------------------------------
# GPU (run on the H200 with -m gpu)
# ---------------------------------------------------------------------------------------

GPU_CASES = {
    "conv-f20": (2, 3, 2, 20, 1, False, False, True),
    "conv-f64-reduce": (2, 3, 2, 64, 1, False, True, True),
    "conv-f80-bcast-x1-shared": (2, 2, 2, 1, 80, True, False, True),
    "dense-f16": (2, 2, 2, 16, 16, False, True, False),
    "conv-l3": (3, 3, 3, 8, 8, False, False, True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_fused_double_backward_parity_on_gpu(name, fused):
    """float64 on CUDA: forward/backward 1e-12 and fused double backward 1e-10 against the
    generated PyTorch backend, and fused == composed."""
    case = GPU_CASES[name]
    tp, graph, xs, rand = _problem(case, "cuda", n_nodes=60, n_edges=700)
    ref = TensorProduct(*case[:5], shared_weights=case[5], reduce_paths=case[6], backend="torch")
    out_t, out_r = tp(*xs, *(graph or ())), ref(*xs, *(graph or ()))
    assert_close(out_t, out_r, 1e-12, "forward")
    go = rand(*out_r.shape)
    for a, b in zip(_first_order(tp, graph, _leaves(xs), go), _first_order(ref, graph, _leaves(xs), go)):
        assert_close(a, b, 1e-12, "backward")
    cots = [rand(*t.shape) for t in xs]
    for present in [(True, True, True), (True, False, True), (False, True, False)]:
        expected = _second_order(ref, graph, _leaves([go, *xs]), cots, present)
        calls = fused(True)
        n = len(calls)
        got = _second_order(tp, graph, _leaves([go, *xs]), cots, present)
        assert len(calls) == n + 1
        fused(False)
        composed = _second_order(tp, graph, _leaves([go, *xs]), cots, present)
        for what, a, b, c in zip(("d go", "d x1", "d x2", "d w"), got, composed, expected):
            assert_close(a, c, 1e-10, f"{name} {present} {what} fused vs torch")
            assert_close(a, b, 1e-10, f"{name} {present} {what} fused vs composed")
    # the other receiver-pass layouts (compiled for the device here, not only interpreted)
    fused(True)
    expected = _second_order(ref, graph, _leaves([go, *xs]), cots, (True, True, True))
    # (the sender pass for d x1 is the other way of X1_ATOMIC, and the way of the other two)
    for layout, value in (("SPLIT_ROW_PASS", True), ("ROW_GROUPS", True), ("X1_ATOMIC", not double_backward.X1_ATOMIC)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(double_backward, layout, value)
            got = _second_order(tp, graph, _leaves([go, *xs]), cots, (True, True, True))
        for what, a, c in zip(("d go", "d x1", "d x2", "d w"), got, expected):
            assert_close(a, c, 1e-10, f"{name} {layout} {what} vs torch")


@needs_triton
def test_results_the_backward_pass_does_not_reach_are_not_computed(fused):
    """Need flags follow the engine: differentiating for w alone asks the fused op for d w only
    (non-leaf inputs: the engine answers for their nodes), with unchanged values."""
    calls = fused(True)
    case = CASES["conv-bcast-x2"]
    tp, graph, xs, rand = _problem(case)
    go = rand(*tp(*xs, *graph).shape)
    cots = [rand(*t.shape) for t in xs]
    leaves = _leaves([go, *xs])
    inputs = [t * 1.0 for t in leaves]  # nodes the engine can skip
    grads = _first_order(tp, graph, inputs[1:], inputs[0])
    s = sum((g * c).sum() for g, c in zip(grads, cots))
    (d_w,) = torch.autograd.grad(s, [leaves[3]], retain_graph=True)
    assert calls[-1][-4:] == (False, False, False, True)
    full = torch.autograd.grad(s, leaves)
    assert calls[-1][-4:] == (True, True, True, True)
    assert torch.equal(d_w, full[3])


@needs_triton
def test_compiled_training_step_asks_for_what_the_eager_one_does(fused, monkeypatch):
    """A training step inside torch.compile (aot_eager, autograd.grad traced): forces by
    ``autograd.grad(E, pos, create_graph=True)``, then the loss's parameter gradients. Traced,
    the engine answers as in eager mode: the force pass's backward skips d x1 (x1 depends on
    parameters only), the parameter pass's double backward skips d x2 (positions only), and the
    op's absent outputs alias nothing (the custom op checks it when traced); the gradients equal
    the eager ones."""
    import torch._dynamo.config as dynamo_config

    dbwd_calls = fused(True)
    bwd_calls = []
    real_bwd = ops.tp_bwd

    def spy(*args):
        bwd_calls.append(args[-3:])
        return real_bwd(*args)

    spy.op = real_bwd.op
    monkeypatch.setattr(ops, "tp_bwd", spy)
    case = CASES["conv-bcast-x2"]
    tp, graph, (x1, x2, w), rand = _problem(case)
    csr = edge_csr(*graph, x1.shape[0])
    target = rand(*x2.shape)

    def step(p1, pos, p2):
        out = tp(p1 * 1.5, pos * pos, p2 * pos[:, :1], *graph, csr)  # w as a radial MLP's: both
        (forces,) = torch.autograd.grad(-out.sum(), [pos], create_graph=True)
        loss = out.sum() ** 2 + ((forces - target) ** 2).sum()
        return loss.detach(), torch.autograd.grad(loss, [p1, p2])

    torch._dynamo.reset()
    results, flags = [], []
    for compiled in (False, True):
        bwd_calls.clear()
        n = len(dbwd_calls)
        leaves = _leaves([x1, x2, w])
        if compiled:
            with dynamo_config.patch(trace_autograd_ops=True):
                results.append(torch.compile(step, backend="aot_eager", fullgraph=True)(*leaves))
        else:
            results.append(step(*leaves))
        flags.append((sorted(set(bwd_calls)), sorted({c[-4:] for c in dbwd_calls[n:]})))
    torch._dynamo.reset()
    assert flags[1] == flags[0], "compiled and eager steps ask the kernels for different results"
    # force pass: d x2 and d w only; parameter pass: the energy term's d x1 and d w, the force
    # term's double backward d x1 and d w (go carries no parameter)
    assert flags[0] == ([(False, True, True), (True, False, True)], [(False, True, False, True)])
    assert_close(results[1][0], results[0][0], 1e-12, "loss")
    for a, b in zip(results[0][1], results[1][1]):
        assert_close(b, a, 1e-12, "compiled vs eager parameter gradients")


def _op_problem(name, **sizes):
    """A convolution case's operands for calling ``ops.tp_dbwd`` directly: ``(key, (x1, x2, w),
    graph tensors, go, (gg1, gg2, ggw))``."""
    case = CASES[name]
    tp, graph, (x1, x2, w), rand = _problem(case, **sizes)
    key = product_key(*case[:3], False, case[6])
    csr = (*graph, *edge_csr(*graph, x1.shape[0]), None, None)
    go = rand(*tp(x1, x2, w, *graph).shape)
    return key, (x1, x2, w), csr, go, (rand(*x1.shape), rand(*x2.shape), rand(*w.shape))


@needs_triton
@pytest.mark.parametrize("name", ["conv-bcast-x2", "conv-bcast-x1-shared", "conv-two-blocks"])
def test_split_and_grouped_row_passes_give_the_same_results(name, monkeypatch):
    """SPLIT_ROW_PASS (d go in a receiver pass of its own) and ROW_GROUPS (paths split by
    output rank over grid axis 2) only change the launches."""
    key, (x1, x2, w), csr, go, gg = _op_problem(name)
    launches = []

    class Spy:
        def launch(self, module, grid, **kw):
            launches.append((grid[2], kw["NEED_GO"], kw["NEED_X2"], kw["NEED_W"], kw["ROW_GROUPS"]))
            return signatures.TP_DBWD_ROW.launch(module, grid, **kw)

    monkeypatch.setattr(double_backward, "TP_DBWD_ROW", Spy())
    merged = ops.tp_dbwd(go, x1, x2, w, *gg, *csr, key, True, True, True, True)
    monkeypatch.setattr(double_backward, "SPLIT_ROW_PASS", True)
    split = ops.tp_dbwd(go, x1, x2, w, *gg, *csr, key, True, True, True, True)
    monkeypatch.setattr(double_backward, "SPLIT_ROW_PASS", False)
    monkeypatch.setattr(double_backward, "ROW_GROUPS", True)
    grouped = ops.tp_dbwd(go, x1, x2, w, *gg, *csr, key, True, True, True, True)
    n_groups = len({p.l_out for p in product_spec(key).paths})
    assert n_groups > 1
    assert launches == [
        (1, True, True, True, False),
        (1, True, False, False, False),
        (1, False, True, True, False),
        (n_groups, True, True, True, True),
    ]
    for a, b, c in zip(merged, split, grouped):
        assert torch.equal(a, b)
        assert_close(c, a, 1e-13, "grouped vs merged")


@needs_triton
@pytest.mark.parametrize("name", ["conv-bcast-x2", "dense-bcast-x1-shared"])
def test_custom_op_schema_and_fake_implementation(name):
    """torch.library.opcheck: schema, fake tensor shapes and dispatch of flashcart::tp_dbwd."""
    case = CASES[name]
    tp, graph, (x1, x2, w), rand = _problem(case)
    key = product_key(*case[:3], False, case[6])
    csr = (None,) * 7 if graph is None else (*graph, *edge_csr(*graph, x1.shape[0]), None, None)
    go = rand(*tp(x1, x2, w, *(graph or ())).shape)
    args = (go, x1, x2, w, None, rand(*x2.shape), rand(*w.shape), *csr, key, True, True, False, True)
    torch.library.opcheck(ops.tp_dbwd.op, args, test_utils=("test_schema", "test_faketensor"))


@needs_triton
def test_compiled_force_training_uses_the_fused_custom_op(fused):
    """torch.compile (aot_eager, autograd.grad traced): the loss backward's graph holds
    flashcart::tp_dbwd (traced through the formula) and gives the eager gradients."""
    import torch._dynamo.config as dynamo_config

    calls = fused(True)
    case = CASES["conv-bcast-x2"]
    tp, graph, xs, _ = _problem(case)
    csr = edge_csr(*graph, xs[0].shape[0])

    def step(x1, x2, w):
        out = tp(x1, x2, w, *graph, csr)
        g = torch.autograd.grad((out**2).sum(), [x1, x2, w], create_graph=True)
        return sum((t**2).sum() for t in g)

    torch._dynamo.reset()
    results = []
    for compiled in (False, True):
        leaves = _leaves(xs)
        if compiled:
            n = len(calls)
            with dynamo_config.patch(trace_autograd_ops=True):
                loss = torch.compile(step, backend="aot_eager", fullgraph=True)(*leaves)
            assert len(calls) > n, "the compiled graph's backward was not traced through the fused op"
        else:
            loss = step(*leaves)
        loss.backward()
        results.append([t.grad for t in leaves])
    torch._dynamo.reset()
    for a, b in zip(*results):
        assert_close(b, a, 1e-12, "compiled vs eager")


@needs_triton
@pytest.mark.parametrize("name", ["conv-bcast-x2", "conv-bcast-x1-shared", "conv-two-blocks"])
@pytest.mark.parametrize("splits", [1, 3])
def test_d_x1_by_atomics_equals_the_sender_pass(name, splits, monkeypatch):
    """``X1_ATOMIC`` (the default; ``FLASHCART_FUSED_DOUBLE_BACKWARD=sender`` turns it off): the receiver pass adds each
    edge's d x1 term into its sender's row and ``tp_dbwd_x1_csr`` is not launched; the results
    equal the sender pass's for every cotangent pattern that has a d x1 term, with split walks
    and broadcast inputs. With deterministic algorithms on, the sender pass runs instead."""
    from flashcart.cartesian._triton import common

    monkeypatch.setattr(common, "DBWD_SPLITS", splits)
    key, (x1, x2, w), csr, go, gg = _op_problem(name, n_nodes=4, n_edges=9)
    launched = []

    class Spy:
        def __init__(self, sig):
            self.sig = sig

        def launch(self, module, grid, **kw):
            launched.append((self.sig.name, kw.get("X1_ATOMIC"), kw.get("NEED_X1")))
            return self.sig.launch(module, grid, **kw)

    monkeypatch.setattr(double_backward, "TP_DBWD_ROW", Spy(signatures.TP_DBWD_ROW))
    monkeypatch.setattr(double_backward, "TP_DBWD_X1_CSR", Spy(signatures.TP_DBWD_X1_CSR))
    for present in [(True, True, True), (False, True, False), (False, False, True), (True, False, True)]:
        ggs = [t if p else None for t, p in zip(gg, present)]
        for need in [(True, True, True, True), (True, True, False, True), (False, True, False, False)]:
            monkeypatch.setattr(double_backward, "X1_ATOMIC", False)
            launched.clear()
            two_pass = ops.tp_dbwd(go, x1, x2, w, *ggs, *csr, key, *need)
            assert ("tp_dbwd_x1_csr", None, None) in launched
            monkeypatch.setattr(double_backward, "X1_ATOMIC", True)
            launched.clear()
            one_pass = ops.tp_dbwd(go, x1, x2, w, *ggs, *csr, key, *need)
            assert [n for n, *_ in launched] == ["tp_dbwd_row"]
            assert launched[0][1:] == (True, True)
            assert one_pass[1].abs().max() > 0
            for what, a, b in zip(("d go", "d x1", "d x2", "d w"), one_pass, two_pass):
                assert_close(a, b, 1e-12, f"{name} {present} {need} {what} atomic vs sender pass")
            launched.clear()
            with torch_deterministic():
                again = ops.tp_dbwd(go, x1, x2, w, *ggs, *csr, key, *need)
            assert ("tp_dbwd_x1_csr", None, None) in launched
            for a, b in zip(again, two_pass):
                assert torch.equal(a, b)


class torch_deterministic:
    """``torch.use_deterministic_algorithms(True)`` inside the block, the previous state after."""

    def __enter__(self):
        self.saved = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.saved)
