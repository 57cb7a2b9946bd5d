"""Kernel-level profile of one force call and one training step (issue 14, item 1).

For a named model on the 1000-atom diamond cell (or any structure of
``benchmarks/md_vs_profile.py``) this prints, for inference (energy + forces) and for a
training step (prediction with ``create_graph``, force + energy loss, parameter gradients):

* **kernels**: every GPU kernel of one call grouped by name: launches, device time per call,
  share of the call's summed kernel time. The summed kernel time is the floor of a call that
  CUDA graphs make launch-free (gaps between kernels not counted);
* **operations**: the operations that launch them (aten ops and FlashCart's custom ops) with
  their device time, the bytes each must move at least (every input read once and every
  output written once, counted by a dispatch mode in a separate, untimed call), the achieved
  bandwidth and its share of the copy roofline (measured on the device: read + write of
  2 GiB).

Protocol as the profiler's: float32, TF32 off, ``--warmup`` untimed calls, then
``--repeat`` profiled calls (times are per call: totals / repeat), eager kernels (the same
kernels a CUDA graph replays)::

    python benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r
    python benchmarks/kernel_profile.py --device cuda --model i3c3f64l2 --repeat 5
    python benchmarks/kernel_profile.py --device cpu --model tiny --structure ethanol --repeat 1   # smoke test
    python benchmarks/kernel_profile.py --device cuda --model i2c3f20l2r --compile-mode default   # inductor's kernels
    python benchmarks/kernel_profile.py --device cuda --compile-mode default --phases inference training-in-graph --lock /tmp/gpu.lock

``training-in-graph`` (compiled only) is the trainer's step with ``predict_compile``
(``Predictor.loss_and_grads``: padded, the parameter gradients inside the compiled graph);
``training`` the prediction with ``create_graph`` and an outer backward. With ``--lock FILE``
processes sharing one GPU compile side by side and take turns for the timed calls.

On the CPU the tables show CPU time instead (no kernels, no roofline). ``--gemm-shapes`` also
lists the matrix products (``aten::mm`` and friends, inductor's extern products of a compiled
call included) by operand shapes, to tell which radial-MLP or readout product a cuBLAS kernel
of the kernel table is. ``--host-profile N``
also prints a cProfile of ``N`` more eager calls by own time: where the host time of an eager
call goes on the GPU machine (Triton's launcher, FlashCart's Python, ATen dispatch), which
``host_overhead.py`` cannot see (it stubs the launches out).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import os
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.md_vs_profile import structure  # noqa: E402
from flashcart.config import load_config  # noqa: E402
from flashcart.data.batch import collate  # noqa: E402
from flashcart.data.dataset import structure_from_atoms  # noqa: E402
from flashcart.model.potential import FlashCartPotential  # noqa: E402
from flashcart.model.predictor import Predictor  # noqa: E402
from flashcart.model.prefit import prefit  # noqa: E402
from flashcart.profiling import synchronize  # noqa: E402

# The published models' options (model.md names them; r_max is set on the command line).
MODELS = {
    "i2c3f20l2r": ["n_interactions=2", "correlation=3", "n_hidden_feats=20", "l_max_hidden_feats=2", "path_reduced_product=true"],
    "i3c3f64l2": ["n_interactions=3", "correlation=3", "n_hidden_feats=64", "l_max_hidden_feats=2"],
    "tiny": ["n_interactions=1", "correlation=2", "n_hidden_feats=4", "l_max_hidden_feats=1", "l_max_edge_attrs=2"],
}


class CountBytes(TorchDispatchMode):
    """Per operation: calls and the bytes of every tensor it reads or writes (each once)."""

    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = collections.Counter()
        self.calls: dict[str, int] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket).replace(".", "::", 1)
        leaves, _ = tree_flatten((args, kwargs, out))
        if not func.is_view:  # views move nothing
            self.bytes[name] += sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))
        self.calls[name] += 1
        return out


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a device copy (read + write of 2 GiB), median of 20."""
    import triton.testing

    x = torch.empty(2**28, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=5, rep=50, return_mode="median")
    return 2 * x.numel() * 4 / (ms * 1e-3)


def model_arguments(parser) -> None:
    """The options :func:`build` reads: ``--device``, ``--model``, ``--option``, ``--structure``, ``--r-max``."""
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--model", default="i2c3f20l2r", choices=list(MODELS), help="model options (plus --option KEY=VALUE)")
    parser.add_argument("--option", nargs="*", default=[], help="extra model KEY=VALUE options")
    parser.add_argument("--structure", default="diamond")
    parser.add_argument("--r-max", type=float, default=6.0)
    parser.add_argument(
        "--radial-pairs",
        default="auto",
        choices=["auto", "on", "off"],
        help="FlashCartPotential.radial_pairs: the radial MLPs once per pair of reverse edges (auto: the CPU and compiled CUDA calls)",
    )
    parser.add_argument(
        "--radial-table",
        type=int,
        default=0,
        metavar="K",
        help="tabulate the radial MLPs on K intervals (FlashCartPotential.set_radial_tables; inference only), 0: the MLPs",
    )


def build(args, device: torch.device):
    atoms = structure(args.structure)
    cfg = load_config(overrides=[f"r_max={args.r_max}", *MODELS.get(args.model, []), *args.option])
    elements = sorted(set(atoms.get_chemical_symbols()))
    model = FlashCartPotential.from_config(cfg, elements)
    s = structure_from_atoms(atoms, cfg["r_max"], require_labels=False)
    s.energy = torch.tensor(0.0, dtype=torch.float64)
    s.forces = torch.zeros(len(atoms), 3, dtype=torch.float64)
    prefit(model, [s])
    model.radial_pairs = {"auto": "auto", "on": True, "off": False}[getattr(args, "radial_pairs", "auto")]
    model.to(device)
    if getattr(args, "radial_table", 0):
        model.set_radial_tables(args.radial_table)
    batch = collate([s], model.z_to_type.cpu()).to(device, torch.float32)
    return model, batch


def masked_loss(pred, targets, atoms, graphs):
    """The profiled training loss, ``sum(E**2) + mean(F**2)``, on padded tensors (the real rows only):
    ``Predictor.loss_and_grads``' loss signature."""
    energy = torch.where(graphs, pred["energy"], torch.zeros_like(pred["energy"]))
    forces = torch.where(atoms[:, None], pred["forces"], torch.zeros_like(pred["forces"]))
    return (energy**2).sum() + (forces**2).sum() / (3 * atoms.sum())


def calls(model, batch, compile_mode: str | None = None):
    """The measured calls: inference (energy + forces) and a training step; eager kernels, or with
    ``compile_mode`` the kernels inductor writes for the compiled Predictor (``default``: the kernels
    a ``reduce-overhead`` CUDA graph replays, launched one by one). ``training`` is the prediction
    with ``create_graph`` and the outer backward; ``training-in-graph`` (compiled only) is what the
    trainer runs with ``predict_compile``: ``Predictor.loss_and_grads``, padded, the parameter
    gradients inside the compiled graph."""
    predictor = Predictor(model, compile=compile_mode is not None, compile_mode=compile_mode or "default", pad=False)
    padded = Predictor(model, compile=True, compile_mode=compile_mode or "default") if compile_mode else None
    params = [p for p in model.parameters() if p.requires_grad]

    def inference():
        predictor(batch, forces=True)

    def training():
        for p in params:
            p.grad = None
        out = predictor(batch, forces=True, create_graph=True)
        loss = (out["energy"] ** 2).sum() + (out["forces"] ** 2).mean()
        loss.backward(inputs=params)  # parameter gradients only, as the trainer and the profiler

    def training_in_graph():
        if padded is None:
            raise SystemExit("--phases training-in-graph needs --compile-mode (it is the compiled trainer's step)")
        padded.loss_and_grads(batch, masked_loss, params, forces=True)

    return {"inference": inference, "training": training, "training-in-graph": training_in_graph}


def _kernel_rows(prof, repeat: int, annotations: set[str]):
    """Launches and device time per kernel name. The device-side ranges of operator
    annotations (``flashcart::tp_fwd`` and the like, named in ``annotations``) are left out: they
    span their kernels, and counting both counted those kernels twice."""
    rows = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if (
            e.device_type == torch.autograd.DeviceType.CUDA
            and e.name not in annotations
            and not e.name.startswith(("flashcart::", "aten::"))
        ):
            r = rows[e.name]
            r[0] += 1
            r[1] += e.device_time_total
    return {k: (n / repeat, us / repeat) for k, (n, us) in rows.items()}


def report(name: str, fn, device: torch.device, args, bandwidth: float | None) -> None:
    fn()  # the first call compiles: outside the lock, so that processes sharing a GPU compile side by side
    synchronize(device)
    with _exclusive(args.lock):
        _report(name, fn, device, args, bandwidth)


@contextlib.contextmanager
def _exclusive(path: str | None):
    """Hold an exclusive ``flock`` on ``path`` (none without a path): processes profiling on one GPU
    take turns for their warm-up and profiled calls, never timing each other's kernels."""
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _report(name: str, fn, device: torch.device, args, bandwidth: float | None) -> None:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(max(args.warmup - 1, 0)):
        fn()
    synchronize(device)
    counter = CountBytes()
    if not args.compile_mode:  # a compiled call's kernels are inductor's: no per-operation bytes
        with counter:
            fn()
        synchronize(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.repeat):
            fn()
        synchronize(device)
    how = f"compiled ({args.compile_mode})" if args.compile_mode else "eager"
    print(f"\n=== {name}: {args.model} on {args.structure}, {how}, {args.repeat} profiled calls, times per call")
    if cuda:
        kernels = _kernel_rows(prof, args.repeat, set(counter.calls))
        total = sum(us for _, us in kernels.values())
        print(
            f"[kernels] {len(kernels)} kernels, {sum(n for n, _ in kernels.values()):.0f} launches, {total / 1e3:.3f} ms summed kernel time"
        )
        print(f"{'kernel':<64} {'launches':>8} {'ms':>8} {'share':>6}")
        for k, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[: args.rows]:
            print(f"{k[:64]:<64} {n:>8.0f} {us / 1e3:>8.3f} {100 * us / total:>5.1f}%")
    if args.compile_mode:
        print(f"[memory] peak allocated {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB" if cuda else "")
        return
    events = prof.key_averages()
    key = "device_time_total" if cuda else "self_cpu_time_total"
    rows = []
    for e in events:
        if e.key not in counter.calls:
            continue
        t = getattr(e, key) / args.repeat  # µs
        b = counter.bytes[e.key]
        rows.append((e.key, counter.calls[e.key], t, b))
    rows.sort(key=lambda r: -r[2])
    what = "device" if cuda else "CPU"
    print(f"[operations] by {what} time; bytes = least traffic (inputs read once, outputs written once)")
    print(f"{'operation':<40} {'calls':>6} {'ms':>8} {'MB':>9} {'GB/s':>8} {'%roof':>6}")
    for op, n, us, b in rows[: args.rows]:
        rate = b / (us * 1e-6) if us > 0 else float("nan")
        roof = f"{100 * rate / bandwidth:>5.1f}%" if bandwidth else "     -"
        print(f"{op[:40]:<40} {n:>6d} {us / 1e3:>8.3f} {b / 1e6:>9.2f} {rate / 1e9:>8.1f} {roof}")
    if cuda:
        print(f"[memory] peak allocated {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB")
    if args.host_profile:
        host_profile(fn, device, args.host_profile, args.rows)


_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_addmm_activation")  # the leaves (linear and matmul call these)


def gemm_shapes(name: str, fn, device: torch.device, repeat: int, rows: int) -> None:
    """The matrix products of ``repeat`` calls grouped by operand shapes: calls and time per call
    (device time on CUDA, CPU time otherwise). Compiled calls record inductor's extern products too."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []), record_shapes=True) as prof:
        for _ in range(repeat):
            fn()
        synchronize(device)
    key = "device_time_total" if cuda else "cpu_time_total"
    events = [e for e in prof.key_averages(group_by_input_shape=True) if e.key in _GEMMS]
    events.sort(key=lambda e: -getattr(e, key))
    total = sum(getattr(e, key) for e in events) / repeat
    print(f"[gemms] {name}: {sum(e.count for e in events) / repeat:.0f} products, {total / 1e3:.3f} ms per call")
    print(f"{'op':<14} {'calls':>6} {'ms':>8}  input shapes")
    for e in events[:rows]:
        print(f"{e.key[6:]:<14} {e.count / repeat:>6.0f} {getattr(e, key) / repeat / 1e3:>8.3f}  {e.input_shapes}")


def host_profile(fn, device: torch.device, calls: int, rows: int) -> None:
    """cProfile of ``calls`` eager calls (after the profiled ones), top ``rows`` by own time."""
    import cProfile
    import io
    import pstats
    import time

    synchronize(device)
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    for _ in range(calls):
        fn()
    synchronize(device)
    profiler.disable()
    wall = (time.perf_counter() - t0) / calls
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(rows)
    print(f"[host] cProfile of {calls} calls, {wall * 1e3:.2f} ms per call under the profiler; own time:")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-6000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser)
    parser.add_argument("--phases", nargs="+", default=["inference", "training"], choices=["inference", "training", "training-in-graph"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument(
        "--compile-mode",
        default=None,
        choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
        help="profile the compiled Predictor's kernels (default: eager); 'default' launches the kernels a reduce-overhead graph replays",
    )
    parser.add_argument(
        "--lock", default=None, metavar="FILE", help="take turns with other processes on this GPU: profile while holding a flock on FILE"
    )
    parser.add_argument("--host-profile", type=int, default=0, metavar="N", help="also cProfile N eager calls (host time)")
    parser.add_argument("--gemm-shapes", action="store_true", help="also list the matrix products by operand shapes (device time)")
    args = parser.parse_args()
    training = sorted(set(args.phases) - {"inference"})
    if args.radial_table and training:
        # tables are for inference: the model refuses a training call (its radial MLPs would get no
        # gradient), deep inside a compiled call; say so before building anything
        parser.error(f"--radial-table is for inference only: drop it, or profile --phases inference (not {' '.join(training)})")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    model, batch = build(args, device)
    n_params = sum(p.numel() for p in model.parameters())
    with _exclusive(args.lock):
        bw = copy_bandwidth(device) if device.type == "cuda" else None
    print(
        f"[setup] model={args.model} ({n_params} parameters) structure={args.structure} atoms={batch.positions.shape[0]} "
        f"edges={batch.receivers.shape[0]} r_max={args.r_max} device={device} float32 tf32=off torch={torch.__version__} "
        f"copy bandwidth={'-' if bw is None else f'{bw / 1e12:.2f} TB/s'} "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}"
    )
    fns = calls(model, batch, args.compile_mode)
    for phase in args.phases:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        report(phase, fns[phase], device, args, bw)
        if args.gemm_shapes:
            gemm_shapes(phase, fns[phase], device, args.repeat, args.rows)


if __name__ == "__main__":
    main()
