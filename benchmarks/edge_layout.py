"""The neighbour list's layout once per list (``FLASHCART_EDGE_LAYOUT``) against every call, in one process.

:class:`~flashcart.model.Predictor` computes a list's :class:`~flashcart.nn.edge_layout.EdgeLayout`
(the products' CSR layout, the radial MLPs' pairs) once and passes it to every call on that list;
with the setting off each call computes it. This script builds one model and one structure,
makes two Predictors (one per setting, each with its own compiled function when compiled),
and times force calls alternating between them: ``--rounds`` rounds of ``--calls`` calls each,
CUDA synchronised, warm-up (and compilation) excluded; it prints the median and the best round
of each, and checks that both give the same forces.

Examples::

    python benchmarks/edge_layout.py --device cpu --model i2c3f20l2r --structure ethanol
    python benchmarks/edge_layout.py --device cuda --structure diamond --compile-mode reduce-overhead --radial-table 4096
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flashcart.nn.edge_layout as edge_layout  # noqa: E402
from benchmarks.kernel_profile import build, model_arguments  # noqa: E402
from flashcart.model.predictor import Predictor  # noqa: E402
from flashcart.profiling import synchronize  # noqa: E402


def profile(call, setting: bool, n: int, device: torch.device) -> None:
    """``n`` calls of ``setting`` under :mod:`torch.profiler`: the ops and kernels with the most
    host and device time, to tell where two settings' times part."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    synchronize(device)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(n):
            call(setting)
        synchronize(device)
    label = "once per list" if setting else "every call"
    events = prof.key_averages()
    for sort in ("self_cpu_time_total", "self_device_time_total" if device.type == "cuda" else None):
        if sort:
            print(f"[profile] layout {label}, {n} calls, by {sort}")
            print(events.table(sort_by=sort, row_limit=25, max_name_column_width=70))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser)
    parser.add_argument("--compile-mode", default=None, choices=["default", "reduce-overhead"], help="compiled Predictors (default: eager)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20, help="calls per round")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--first", default="once", choices=["once", "every"], help="the setting compiled and warmed up first (order effects)"
    )
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="after timing, N calls of each setting under torch.profiler: its busiest ops"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    model, batch = build(args, device)
    compiled = args.compile_mode is not None
    predictors = {v: Predictor(model, compile=compiled, compile_mode=args.compile_mode or "default", pad=False) for v in (True, False)}
    print(
        f"[setup] torch {torch.__version__}, {device}, model {args.model}, structure {args.structure} "
        f"({batch.positions.shape[0]} atoms, {batch.receivers.shape[0]} edges), compile {args.compile_mode}, "
        f"radial tables {args.radial_table or 'off'}, radial pairs {model.radial_pairs}, float32, TF32 off"
    )

    def call(setting: bool) -> torch.Tensor:
        edge_layout.EDGE_LAYOUT = setting
        return predictors[setting](batch, forces=True)["forces"]

    start = time.perf_counter()
    with predictors[True].frozen():
        forces = {}
        order = (True, False) if args.first == "once" else (False, True)
        for setting in order:  # compile and warm up
            for _ in range(3):
                forces[setting] = call(setting)
            synchronize(device)
            label = "once per list" if setting else "every call"
            print(f"[warm-up] layout {label}: compiled and warm after {time.perf_counter() - start:.0f} s")
        diff = float((forces[True] - forces[False]).abs().max())
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.rounds):
            for setting in order if r % 2 == 0 else order[::-1]:
                synchronize(device)
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    call(setting)
                synchronize(device)
                times[setting].append((time.perf_counter() - t0) / args.calls * 1e3)
        for setting in order if args.profile else ():
            profile(call, setting, args.profile, device)
    edge_layout.EDGE_LAYOUT = True
    for setting, label in ((True, "once per list (FLASHCART_EDGE_LAYOUT=1)"), (False, "every call (FLASHCART_EDGE_LAYOUT=0)")):
        t = times[setting]
        print(f"[time] layout {label:<40} median {statistics.median(t):8.3f} ms/call   best round {min(t):8.3f}")
    print(f"[check] largest force difference between the settings: {diff:.3e} eV/A")


if __name__ == "__main__":
    main()
