"""Is a compiled force call bound by the GPU or by the host? (issue 14)

``flashcart-profile`` times a force call as ``--calls`` calls issued back to back and one
synchronisation: with CUDA graphs (``reduce-overhead``) the host issues a call while the GPU
replays the previous one, so the figure is the larger of the two sides. When changes to the
kernels stop moving it, the host may be what is timed. This script measures the parts apart,
on the profiler's setting (an unpadded :class:`~flashcart.model.Predictor`, parameters frozen,
energy and forces, float32, TF32 off), median over ``--rounds`` rounds, warm-up excluded:

* ``pipelined``: calls back to back, one synchronisation (the profiler's s/run);
* ``host``: the same loop's time up to its last call's return, before the synchronisation
  (the host's issue time per call, where nothing in a call waits on the GPU);
* ``serial``: each call synchronised (host and GPU one after the other);
* ``gpu``: the GPU's time per call alone: a long ``torch.cuda._sleep`` first holds the GPU
  while the host issues the calls behind it, then CUDA events around the calls time them
  back to back, without waiting on the host (``--sleep-ms`` must exceed the host's issue time
  of the calls, which the script checks).

``--pad`` times a padded Predictor instead, as the simulation engine runs one (the one
``FLASHCART_STATIC_LIST`` applies to). ``--cprofile N`` adds the host's busiest functions over N calls (cProfile, own time).

Example::

    python benchmarks/graph_bound.py --device cuda --structure diamond --radial-table 4096
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flashcart.model.static_buffers as static_buffers  # noqa: E402
from benchmarks.kernel_profile import build, model_arguments  # noqa: E402
from flashcart.model.predictor import Predictor  # noqa: E402

_CYCLES_PER_MS: list[float] = []


def _cycles_per_ms() -> float:
    """The sleep kernel's cycles per millisecond, measured once (a 10**7-cycle sleep timed by events)."""
    if not _CYCLES_PER_MS:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        torch.cuda._sleep(10**7)
        end.record()
        torch.cuda.synchronize()
        _CYCLES_PER_MS.append(10**7 / start.elapsed_time(end))
    return _CYCLES_PER_MS[0]


def gpu_ms_per_call(call, calls: int, sleep_ms: float) -> tuple[float, float]:
    """``(GPU ms per call, host ms to issue the calls)`` with the GPU held by a sleep kernel
    while the host issues ``calls`` calls, timed by CUDA events between the calls' first and
    last kernels."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(sleep_ms * _cycles_per_ms()))
    t0 = time.perf_counter()
    start.record()
    for _ in range(calls):
        call()
    end.record()
    issued = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls, issued


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser)
    parser.add_argument("--compile-mode", default="reduce-overhead", choices=["default", "reduce-overhead", "eager"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20, help="calls per round")
    parser.add_argument("--sleep-ms", type=float, default=100.0, help="the GPU's hold before the gpu rounds (ms)")
    parser.add_argument(
        "--pad",
        action="store_true",
        help="a padded Predictor (FLASHCART_STATIC_LIST applies to these), not the profiler's unpadded one",
    )
    parser.add_argument("--cprofile", type=int, default=0, metavar="N", help="then N calls under cProfile")
    args = parser.parse_args()
    if args.device != "cuda":
        parser.error("graph_bound.py measures CUDA calls: --device cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    model, batch = build(args, device)
    compiled = args.compile_mode != "eager"
    predictor = Predictor(model, compile=compiled, compile_mode=args.compile_mode if compiled else "default", pad=args.pad)
    print(
        f"[setup] torch {torch.__version__}, {torch.cuda.get_device_name()}, model {args.model}, structure {args.structure} "
        f"({batch.positions.shape[0]} atoms, {batch.receivers.shape[0]} edges), compile {args.compile_mode}, "
        f"radial tables {args.radial_table or 'off'}, {'padded' if args.pad else 'unpadded'}, "
        f"static lists {static_buffers.STATIC_LIST}, float32, TF32 off, {args.calls} calls x {args.rounds} rounds"
    )

    def call() -> None:
        predictor(batch, forces=True)

    times: dict[str, list[float]] = {"pipelined": [], "host": [], "serial": [], "gpu": [], "gpu rounds' issue": []}
    with predictor.frozen():
        t0 = time.perf_counter()
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        print(f"[warm-up] {time.perf_counter() - t0:.0f} s (compilation included)")
        for _ in range(args.rounds):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                call()
            issued = time.perf_counter()
            torch.cuda.synchronize()
            done = time.perf_counter()
            times["pipelined"].append((done - t0) / args.calls * 1e3)
            times["host"].append((issued - t0) / args.calls * 1e3)
            t0 = time.perf_counter()
            for _ in range(args.calls):
                call()
                torch.cuda.synchronize()
            times["serial"].append((time.perf_counter() - t0) / args.calls * 1e3)
            gpu, issue = gpu_ms_per_call(call, args.calls, args.sleep_ms)
            times["gpu"].append(gpu)
            times["gpu rounds' issue"].append(issue)
        for name, t in times.items():
            unit = "ms (all calls)" if name == "gpu rounds' issue" else "ms/call"
            print(f"[time] {name:<18} median {statistics.median(t):8.3f} {unit}   min {min(t):8.3f}   max {max(t):8.3f}")
        if max(times["gpu rounds' issue"]) >= args.sleep_ms:
            print(f"[warning] issuing a gpu round took longer than the {args.sleep_ms} ms sleep: its gpu time includes host waits")
        if args.cprofile:
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            for _ in range(args.cprofile):
                call()
            prof.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
            print(f"[cprofile] {args.cprofile} calls, by own time")
            print(text.getvalue())


if __name__ == "__main__":
    main()
