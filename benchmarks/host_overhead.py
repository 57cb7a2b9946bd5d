"""Host work of a whole force call and training step, on the CPU, kernel launches stubbed (issue 14).

Eager evaluation on the GPU is bound by host work (the H200's i2c3f20l2r force call on the
1000-atom diamond cell: 19.9 ms eager against 3.7 ms with CUDA graphs). This script measures
that host side without a GPU: the Triton path runs on CPU tensors (``TRITON_INTERPRET=1``
lets ``backend="auto"`` models pick it, see ``_backend.resolve_backend``) with every kernel
launch replaced by a no-op that only counts it. Everything the package does around a launch
runs as on the GPU (argument checks and binding in ``KernelSignature.launch``, the grouped
matmul's tile count and launch table, allocations, autograd bookkeeping); only Triton's own
launcher (and the kernel) is left out. Kernel outputs are left uninitialised, so the numbers
the model computes are meaningless: only time and counts are reported.

For each published model (i2c3f20l2r, i3c3f64l2; float32, r_max 6 Å) and structure (a
4-atom carbon cluster, 12 edges, where CPU compute is negligible, and the 1000-atom
diamond cell, 158,000 edges, where the CPU also computes every ATen op, so its time is not
host overhead; by default i2c3f20l2r only, ``--diamond-models`` adds i3c3f64l2) it prints:

* µs per force call (energy + forces through :class:`~flashcart.model.Predictor`, eager,
  parameters frozen as in a simulation) and per training step (forces with
  ``create_graph``, energy + force loss, ``loss.backward(inputs=parameters)``), best of
  several rounds;
* ATen ops dispatched per call (a ``TorchDispatchMode`` counter, in a separate untimed call)
  and Triton launches per call, by kernel;
* a cProfile top list (own time) of the tiny structure's force call and training step.

Run: ``.venv/bin/python benchmarks/host_overhead.py`` (about a minute on two busy cores);
``--models``, ``--structures``, ``--no-profile``, ``--json PATH`` (atomic write).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before flashcart is imported: Triton path on CPU tensors
if os.environ["TRITON_INTERPRET"] in ("", "0"):
    raise SystemExit("benchmarks/host_overhead.py needs TRITON_INTERPRET=1 (or unset): it runs the Triton path on CPU tensors")

import torch  # noqa: E402
from ase import Atoms  # noqa: E402
from ase.build import bulk  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_profile import MODELS as KERNEL_PROFILE_MODELS  # noqa: E402  (this script's folder)
from kernel_profile import calls as kernel_profile_calls  # noqa: E402

from flashcart.cartesian import _frozen  # noqa: E402
from flashcart.cartesian._triton import ops, signatures  # noqa: E402
from flashcart.config import load_config  # noqa: E402
from flashcart.data.batch import collate  # noqa: E402
from flashcart.data.dataset import structure_from_atoms  # noqa: E402
from flashcart.model.potential import FlashCartPotential  # noqa: E402
from flashcart.utils.io import atomic_write_text  # noqa: E402

# The published models (kernel_profile.MODELS also has a tiny one for quick checks).
MODELS = {k: v for k, v in KERNEL_PROFILE_MODELS.items() if k != "tiny"}
R_MAX = 6.0


def structure(name: str) -> Atoms:
    """``tiny``: 4 carbon atoms (a 1.5 Å tetrahedron, no cell: 12 edges); ``diamond``: 5x5x5 cubic cells."""
    if name == "tiny":
        return Atoms("C4", positions=[[0, 0, 0], [1.5, 0, 0], [0, 1.5, 0], [0, 0, 1.5]])
    if name == "diamond":
        return bulk("C", "diamond", a=3.567, cubic=True) * (5, 5, 5)
    raise ValueError(f"unknown structure {name!r} (tiny, diamond)")


# ---------------------------------------------------------------------------------------------
# stubbed launches
# ---------------------------------------------------------------------------------------------


class _StubKernel:
    """``kernel[grid](**args)`` counts one launch of ``name`` and runs nothing."""

    __slots__ = ("name", "counts")

    def __init__(self, name: str, counts: dict[str, int]):
        self.name, self.counts = name, counts

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kwargs):
        self.counts[self.name] += 1


class LaunchCounter:
    """Stands in for the Triton kernels: one :class:`_StubKernel` per kernel name."""

    def __init__(self):
        self.counts: dict[str, int] = collections.Counter()
        self._stubs: dict[str, _StubKernel] = {}

    def stub(self, name: str) -> _StubKernel:
        stub = self._stubs.get(name)
        if stub is None:
            stub = self._stubs[name] = _StubKernel(name, self.counts)
        return stub

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@contextlib.contextmanager
def stubbed_launches(counter: LaunchCounter):
    """Inside: every generated-kernel launch (``KernelSignature.launch``: its argument check runs,
    then the kernel is replaced by a counting stub) and every grouped-matmul launch
    (``ops._launch_grouped``: its tile count runs) is a no-op."""
    real_traceable = signatures.traceable

    def traceable(kernel, probe):
        return counter.stub(getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", "kernel"))

    signatures.traceable = traceable
    ops.traceable = traceable  # _launch_grouped calls traceable(grouped_matmul, a)
    try:
        yield counter
    finally:
        signatures.traceable = real_traceable
        ops.traceable = real_traceable


class CountOps(TorchDispatchMode):
    """ATen ops dispatched, by name (views included: each costs a dispatch)."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def eager_under_dispatch_mode():
    """The Triton ops take their eager path (plain autograd Functions), and tensors derived from
    frozen parameters are cached (``flashcart.cartesian._frozen``), even while a dispatch mode is
    active: otherwise ``CountOps`` itself would switch them to the custom-op path and off the cache."""
    real, real_plain = ops._eager_ok, _frozen._plain_eager

    def eager_ok(first):
        return type(first) is torch.Tensor and not torch.compiler.is_compiling()

    ops._eager_ok = eager_ok
    _frozen._plain_eager = lambda: not torch.compiler.is_compiling()  # and tensors derived from frozen parameters are cached
    try:
        yield
    finally:
        ops._eager_ok, _frozen._plain_eager = real, real_plain


# ---------------------------------------------------------------------------------------------
# the measured calls
# ---------------------------------------------------------------------------------------------


def build(model_name: str, structure_name: str):
    """``(model, batch)``: a fresh published model (float32, Triton path) and its one-structure batch."""
    atoms = structure(structure_name)
    cfg = load_config(overrides=[f"r_max={R_MAX}", *MODELS[model_name]])
    model = FlashCartPotential.from_config(cfg, ["C"])
    model.set_avg_neighbors(16.0)
    s = structure_from_atoms(atoms, R_MAX, require_labels=False)
    s.energy = torch.tensor(0.0, dtype=torch.float64)
    s.forces = torch.zeros(len(atoms), 3, dtype=torch.float64)
    batch = collate([s], model.z_to_type.cpu()).to("cpu", torch.float32)
    for m in model.modules():  # "auto" picks the PyTorch path on CPU tensors; the interpreter allows "triton"
        if hasattr(m, "backend"):
            m.backend = "triton"
    model.radial_pairs = False  # as eager CUDA calls ("auto" groups the radial MLPs' edges into pairs on the CPU and in compiled calls)
    return model.float(), batch


def calls(model, batch) -> dict:
    """The two measured calls, the same as ``benchmarks/kernel_profile.py`` makes them."""
    measured = kernel_profile_calls(model, batch)
    return {"force": measured["inference"], "train": measured["training"]}


def best_us(fn, rounds: int, per_round: int, warmup: int) -> float:
    """Best over ``rounds`` of the mean µs per call of ``per_round`` calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(per_round):
            fn()
        best = min(best, (time.perf_counter() - t0) / per_round * 1e6)
    return best


def counts(fn) -> tuple[int, dict[str, int], int, dict[str, int]]:
    """ATen ops and Triton launches of one call of ``fn`` (untimed), after one uncounted call
    (which builds what later calls reuse: tensors derived from frozen parameters)."""
    with stubbed_launches(LaunchCounter()), eager_under_dispatch_mode():
        fn()
    counter = LaunchCounter()
    with stubbed_launches(counter), eager_under_dispatch_mode(), CountOps() as mode:
        fn()
    return sum(mode.calls.values()), dict(mode.calls), counter.total, dict(counter.counts)


def profile_top(fn, n_calls: int, rows: int) -> str:
    """cProfile of ``n_calls`` calls: the top ``rows`` functions by own time, per call."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n_calls):
        fn()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(rows)
    return buf.getvalue()


PLAN = {  # structure -> (rounds, calls per round, warm-up calls after the untimed counting call)
    "tiny": (7, 20, 5),
    "diamond": (1, 1, 0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--structures", nargs="+", default=list(PLAN), choices=list(PLAN))
    parser.add_argument("--phases", nargs="+", default=["force", "train"], choices=["force", "train"])
    parser.add_argument(
        "--diamond-models",
        nargs="*",
        default=["i2c3f20l2r"],
        choices=list(MODELS),
        help="models also run on the diamond cell (i3c3f64l2 adds about 40 s of CPU compute per call pair)",
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile top lists")
    parser.add_argument("--profile-rows", type=int, default=25)
    parser.add_argument("--ops", action="store_true", help="list the ATen ops of each call by count")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: no thread start-up or spinning per op)")
    parser.add_argument("--json", default=None, help="write the results here (atomically)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"[setup] torch={torch.__version__} threads={torch.get_num_threads()} TRITON_INTERPRET={os.environ['TRITON_INTERPRET']} "
        "float32, r_max 6, eager Predictor, Triton launches stubbed (host work only)"
    )
    results = []
    for model_name in args.models:
        for sname in args.structures:
            if sname == "diamond" and model_name not in args.diamond_models:
                continue
            model, batch = build(model_name, sname)
            fns = calls(model, batch)
            rounds, per_round, warmup = PLAN[sname]
            for phase in args.phases:
                fn = fns[phase]
                counter = LaunchCounter()
                with stubbed_launches(counter):
                    n_ops, ops_by_name, n_launch, launches = counts(fn)  # also the first (warm-up) call
                    us = best_us(fn, rounds, per_round, warmup)
                row = dict(
                    model=model_name,
                    structure=sname,
                    atoms=batch.positions.shape[0],
                    edges=batch.receivers.shape[0],
                    phase=phase,
                    us_per_call=us,
                    aten_ops=n_ops,
                    launches=n_launch,
                    launches_by_kernel=launches,
                    aten_ops_by_name=ops_by_name,
                )
                results.append(row)
                print(
                    f"[host] {model_name:<11} {sname:<8} ({row['atoms']} atoms, {row['edges']} edges) {phase:<5} "
                    f"{us:10.0f} us/call  {n_ops:5d} ATen ops  {n_launch:3d} Triton launches"
                )
                print("       launches: " + ", ".join(f"{k} {v}" for k, v in sorted(launches.items(), key=lambda kv: -kv[1])))
                if args.ops:
                    top = sorted(ops_by_name.items(), key=lambda kv: -kv[1])
                    print("       ATen ops: " + ", ".join(f"{k} {v}" for k, v in top))
                if not args.no_profile and sname == "tiny":
                    n_prof = 10
                    with stubbed_launches(LaunchCounter()):
                        text = profile_top(fn, n_prof, args.profile_rows)
                    print(f"[cProfile] {model_name} {sname} {phase}: {n_prof} calls, top {args.profile_rows} by own time")
                    print(text)
    if args.json:
        atomic_write_text(args.json, json.dumps(results, indent=1))
        print(f"[json] wrote {args.json}")


if __name__ == "__main__":
    main()
