"""Where an eager force call's time goes on the GPU, and A/B of host-side options in one process (issue 14).

An eager i2c3f20l2r force call on the 1000-atom diamond takes 16-18 ms on the H200 while its
kernels sum to about 3.9 ms: the host issues the work slower than the GPU runs it. This script:

1. times the eager force call (energy + forces, the profiler's protocol: float32, TF32 off,
   synchronised, median) for each variant, **interleaved in one process** (rounds of
   ``--per-round`` calls per variant, ``--rounds`` rounds), so that the 1-2 ms differences
   between processes seen on the device machine do not decide the comparison; per call
   synchronised (median, min) and as ``flashcart-profile``'s timer runs them (``--per-round``
   calls back to back, one synchronisation);
2. profiles one variant's calls with the torch profiler: host time per call spent in ATen ops
   (by op), in FlashCart's custom ops (Triton launches included) and the GPU's busy time; the
   ops named by ``--stacks`` (default ``aten::gather``, which took 49 µs a call on the H200, and
   ``aten::mul``) by the FlashCart source line that called them.

Variants (``--variants``): ``plain`` (Triton's own launcher); ``prebound`` (the default:
``FLASHCART_PREBOUND_LAUNCH``'s pre-bound Triton launches, switched on in-process); ``uncached``
(pre-bound, with the tensors derived from frozen parameters rebuilt on every call:
``flashcart.cartesian._frozen.ENABLED`` off); ``unfused`` (as ``uncached``, and the RMS norm
and the gate as ATen expressions instead of ``flashcart.cartesian._triton.rowwise``'s kernels);
``nolaunch`` (the default with every Triton launch skipped: the results are meaningless, the time
is the host cost of everything but Triton's launches, so the difference to ``prebound`` is theirs);
``atenedges`` (the default with the edge features as ATen operations instead of
``flashcart.nn.edge_kernels``' two kernels, ``FLASHCART_FUSED_EDGES=0``; the other variants keep
the variable's setting, on by default).
``--with-profiler`` then runs ``flashcart-profile``'s
inference timer for the same model and structure in this process, per variant.

    python benchmarks/eager_overhead.py --device cuda --model i2c3f20l2r --structure diamond
    python benchmarks/eager_overhead.py --device cpu --model tiny --structure ethanol --rounds 2   # smoke test
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kernel_profile import MODELS, build, model_arguments  # noqa: E402
from flashcart.cartesian import _frozen  # noqa: E402
from flashcart.cartesian._triton import launcher, ops, rowwise, signatures  # noqa: E402
from flashcart.model.predictor import Predictor  # noqa: E402
from flashcart.nn import edge_features  # noqa: E402
from flashcart.profiling import synchronize, time_per_call  # noqa: E402

_REAL_TRACEABLE = signatures.traceable
_FUSED_EDGES = edge_features.FUSED_EDGES  # as FLASHCART_FUSED_EDGES set it


def _no_launch(kernel, probe):
    """Stands in for ``signatures.traceable`` in variant ``nolaunch``: every Triton launch a no-op."""
    return _NoLaunch()


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _set_variant(name: str) -> None:
    launcher.ENABLED = name != "plain"
    _frozen.ENABLED = name not in ("uncached", "unfused")
    rowwise.ENABLED = name != "unfused"
    edge_features.FUSED_EDGES = False if name == "atenedges" else _FUSED_EDGES
    signatures.traceable = ops.traceable = _no_launch if name == "nolaunch" else _REAL_TRACEABLE


# plain: Triton's own launcher; prebound: pre-bound launches (the default); uncached: pre-bound
# launches, tensors derived from frozen parameters rebuilt on every call (flashcart.cartesian._frozen
# off); unfused: uncached and the RMS norm and gate as ATen expressions (rowwise off); nolaunch: the
# default with every Triton launch skipped (meaningless results: the host cost of everything else);
# atenedges: the default with the edge features as ATen operations (not fused)
VARIANTS = ("plain", "prebound", "uncached", "unfused", "nolaunch", "atenedges")


def timed(fn, device, calls: int) -> list[float]:
    """Seconds per call of ``calls`` synchronised calls."""
    out = []
    for _ in range(calls):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        out.append(time.perf_counter() - t0)
    return out


def issue_time(fn, device, calls: int) -> float:
    """Median host seconds to issue one call while the GPU still runs the previous ones (no
    synchronisation inside the loop; the host's own cost of the call)."""
    out = []
    synchronize(device)
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    synchronize(device)
    return statistics.median(out)


def host_breakdown(fn, device, calls: int, rows: int, stacks: list[str] | None = None) -> None:
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(device)
    # verbose: torch 2.13 records no Python stacks without it
    config = torch._C._profiler._ExperimentalConfig(verbose=True) if stacks else None
    with profile(activities=acts, with_stack=bool(stacks), experimental_config=config) as prof:
        for _ in range(calls):
            fn()
        synchronize(device)
    top = collections.Counter()
    count = collections.Counter()
    kernel_us = sum(
        e.device_time_total
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("flashcart::", "aten::"))
    )
    for e in prof.key_averages():
        if e.key.startswith(("aten::", "flashcart::", "autograd::", "Optimizer", "cuda")) or "Backward" in e.key:
            top[e.key] += e.self_cpu_time_total
            count[e.key] += e.count
    total = sum(top.values())
    per_call = f"host self time in ops {total / calls / 1e3:.2f} ms/call; GPU kernels {kernel_us / calls / 1e3:.2f} ms/call"
    print(f"[profile] {calls} calls; {per_call}")
    print(f"{'op (host self time)':<52} {'calls':>7} {'ms/call':>8} {'us each':>8}")
    for k, us in top.most_common(rows):
        print(f"{k[:52]:<52} {count[k] / calls:>7.0f} {us / calls / 1e3:>8.3f} {us / max(count[k], 1):>8.1f}")
    for op in stacks or []:
        sites = collections.Counter()
        for e in prof.events():
            if e.name == op and e.device_type == torch.autograd.DeviceType.CPU:
                frames = [f for f in e.stack if "flashcart/" in f] or ["(no FlashCart frame: autograd's backward)"]
                sites[frames[0]] += e.self_cpu_time_total
        print(f"[stacks] {op}: host self time per call by the innermost FlashCart frame")
        for where, us in sites.most_common(rows):
            print(f"  {us / calls / 1e3:>8.3f} ms  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser)
    parser.add_argument("--variants", nargs="+", default=["plain", "prebound", "uncached", "unfused"], choices=VARIANTS)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--profile-calls", type=int, default=5)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--stacks", nargs="*", default=["aten::gather", "aten::mul"], help="ops to attribute to their call sites")
    parser.add_argument("--with-profiler", action="store_true", help="also run flashcart-profile's inference timer in this process")
    parser.add_argument("--sync-debug", action="store_true", help="list the host-device synchronisations of one call and exit")
    parser.add_argument("--verbose-profiler", action="store_true", help="print the in-process profiler's own output")
    args = parser.parse_args()
    args.compile_mode = None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    model, batch = build(args, device)
    predictor = Predictor(model, compile=False, pad=False)

    def force():
        predictor(batch, forces=True)

    print(f"[setup] {args.model} on {args.structure} ({batch.positions.shape[0]} atoms, {batch.receivers.shape[0]} edges), eager, float32")
    if args.sync_debug:
        sync_report(force, device)
        return
    times = {v: [] for v in args.variants}
    loops = {v: [] for v in args.variants}
    issue = {v: [] for v in args.variants}
    for v in args.variants:  # warm-up: compile every kernel, bind every launcher
        _set_variant(v)
        timed(force, device, 3)
    for _ in range(args.rounds):
        for v in args.variants:
            _set_variant(v)
            times[v] += timed(force, device, args.per_round)
            loops[v].append(time_per_call(force, args.per_round, device, warmup=0))  # flashcart-profile's timer loop
            issue[v].append(issue_time(force, device, 3))
    print(f"{'variant':<12} {'ms/call (median)':>17} {'min':>8} {'back to back':>13} {'host issue ms':>14}")
    for v in args.variants:
        row = f"{statistics.median(times[v]) * 1e3:>17.3f} {min(times[v]) * 1e3:>8.3f} {statistics.median(loops[v]) * 1e3:>13.3f}"
        print(f"{v:<12} {row} {statistics.median(issue[v]) * 1e3:>14.3f}")
    _set_variant(args.variants[0])
    host_breakdown(force, device, args.profile_calls, args.rows, args.stacks)
    if args.with_profiler:
        profiler_in_process(args, device)


def sync_report(fn, device) -> None:
    """The synchronisations of one warm call of ``fn`` (``torch.cuda.set_sync_debug_mode``): each
    stalls the host until the GPU has run everything queued, so issue time includes GPU time."""
    import warnings

    fn()
    synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    synchronize(device)
    print(f"[sync] {len(caught)} synchronising operations in one call")
    for w in caught:
        print(f"  {w.filename}:{w.lineno}: {str(w.message).splitlines()[0][:120]}")


def profiler_in_process(args, device) -> None:
    """``flashcart-profile``'s inference timer for the same model and structure in this process
    (its own model, batch and Predictor): on the H200 it measured 18.0-19.2 ms in separate
    processes where the loops above measured 13.4; the same figure here means the processes
    differ, a higher one that the profiler's path does."""
    import tempfile

    import numpy as np
    from ase.io import write

    from benchmarks.kernel_profile import structure
    from flashcart.config import load_config
    from flashcart.profiling import profile

    atoms = structure(args.structure)
    atoms.info["REF_energy"] = 0.0
    atoms.arrays["REF_forces"] = np.zeros((len(atoms), 3))
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/structure.extxyz"
        write(path, atoms, format="extxyz")
        device_key = "gpu" if device.type == "cuda" else "cpu"
        overrides = [f"train_path={path}", f"device={device_key}", f"r_max={args.r_max}", *MODELS.get(args.model, []), *args.option]
        overrides += ["profile_batch_size=1", "profile_repeat=20", "profile_warmup=3", "profile_phase=inference", "profile_row_limit=1"]
        for variant in args.variants:
            _set_variant(variant)
            seconds = profile(
                load_config(overrides=overrides), progress=False, out=print if args.verbose_profiler else (lambda line: None)
            )["inference"]
            print(f"[profiler in this process] {variant}: {seconds * 1e3:.3f} ms/run")


if __name__ == "__main__":
    main()
