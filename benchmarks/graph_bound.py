"""Is a compiled force call bound by the GPU or by the host? (issue 14)

``flashcart-profile`` times a force call as ``--calls`` calls issued back to back and one
synchronisation: with CUDA graphs (``reduce-overhead``) the host issues a call while the GPU
replays the previous one, so the figure is the larger of the two sides. When changes to the
kernels stop moving it, the host may be what is timed. This script measures the parts apart,
on the profiler's setting (an unpadded :class:`~flashcart.model.Predictor`, parameters frozen,
energy and forces, float32, TF32 off), median over ``--rounds`` rounds, warm-up excluded:

* ``pipelined``: calls back to back, one synchronisation (the profiler's s/run);
* ``serial``: each call synchronised (host and GPU one after the other);
* ``host`` and ``gpu``: :func:`flashcart.profiling.host_and_gpu_time`, the host's issue time per
  call and the GPU's time per call alone (the calls queued behind a sleep kernel, timed by CUDA
  events), which ``flashcart-profile`` prints as its ``[host-gpu]`` lines.

``--training`` times the trainer's step too (``Predictor.loss_and_grads``: energies and forces with
the gradients in the graph, the loss, the parameter gradients; radial MLPs, as training needs
them), in the same rounds, and prints its ratio to the force call (the training target's ratio).
``--pad`` times a padded Predictor instead, as the simulation engine runs one (the one
``FLASHCART_STATIC_LIST`` applies to). ``--cprofile N`` adds the host's busiest functions over N calls (cProfile, own time);
``--skip-guards`` times the calls with dynamo's guards not evaluated (what they cost the host).
``--lock FILE``: processes sharing one GPU (an A/B of settings, a process each) compile side by
side and take turns for the timed calls, holding a ``flock`` on ``FILE`` one round at a time (so the
settings' rounds interleave and drift falls on all of them). ``--barrier N`` (with ``--lock``): no
process times until all N have compiled, so no timed call shares the GPU with another process's
first call (inductor's autotuning, table builds, graph recording).

Example::

    python benchmarks/graph_bound.py --device cuda --structure diamond --radial-table 4096
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import glob
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flashcart.cartesian._triton.ops as triton_ops  # noqa: E402
import flashcart.model.static_buffers as static_buffers  # noqa: E402
import flashcart.nn.blocks as blocks  # noqa: E402
from benchmarks.kernel_profile import _exclusive, build, masked_loss, model_arguments  # noqa: E402
from flashcart.cartesian._triton import signatures  # noqa: E402
from flashcart.model.predictor import Predictor, combo_kernels  # noqa: E402
from flashcart.profiling import host_and_gpu_time  # noqa: E402


def _wait_for_all(lock: str | None, n: int, limit_s: float = 900.0) -> None:
    """Mark this process compiled (``lock.ready.PID``) and wait until ``n`` processes have."""
    if not lock or n <= 1:
        return
    Path(f"{lock}.ready.{os.getpid()}").touch()
    t0 = time.perf_counter()
    while len(glob.glob(f"{glob.escape(lock)}.ready.*")) < n:
        if time.perf_counter() - t0 > limit_s:
            print(f"[warning] barrier: fewer than {n} processes compiled within {limit_s:.0f} s; timing anyway")
            return
        time.sleep(0.5)


def _time_step(step, calls: int, device, out: dict[str, list[float]], params) -> None:
    """One round of the training step, its parameters requiring grad again inside the force
    calls' ``predictor.frozen()``: pipelined ms per step and the GPU's time alone, appended to
    ``out``."""
    for p in params:
        p.requires_grad_(True)
    try:
        step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
        out["pipelined"].append((time.perf_counter() - t0) / calls * 1e3)
        _, gpu = host_and_gpu_time(step, calls, device)
        if gpu is not None:
            out["gpu"].append(gpu * 1e3)
    finally:
        for p in params:
            p.requires_grad_(False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser)
    parser.add_argument("--compile-mode", default="reduce-overhead", choices=["default", "reduce-overhead", "eager"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20, help="calls per round")
    parser.add_argument(
        "--pad",
        action="store_true",
        help="a padded Predictor (FLASHCART_STATIC_LIST applies to these), not the profiler's unpadded one",
    )
    parser.add_argument("--cprofile", type=int, default=0, metavar="N", help="then N calls under cProfile")
    parser.add_argument(
        "--lock",
        default=None,
        metavar="FILE",
        help="processes sharing this GPU compile side by side, then time in turns: each round holds a flock on FILE",
    )
    parser.add_argument(
        "--barrier",
        type=int,
        default=0,
        metavar="N",
        help="with --lock: wait after compiling until N processes sharing FILE have compiled (FILE.ready.PID markers; "
        "remove an earlier run's markers first, as gpu_session.sh's bound_ab does)",
    )
    parser.add_argument(
        "--training",
        action="store_true",
        help="time the trainer's step too (Predictor.loss_and_grads, gradients in the graph) and its ratio to the force call",
    )
    parser.add_argument(
        "--skip-guards",
        action="store_true",
        help="after warm-up, calls under set_stance(skip_guard_eval_unsafe=True): what dynamo's guards cost the host",
    )
    args = parser.parse_args()
    if args.barrier < 0 or (args.barrier > 1 and not args.lock):
        parser.error(f"--barrier {args.barrier}: a count of processes (0 or 1: none), and it needs --lock FILE")
    if args.training and args.radial_table:
        parser.error(
            f"--training with --radial-table {args.radial_table}: the training step needs the radial MLPs (tables are for inference)"
        )
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
        f"static lists {static_buffers.STATIC_LIST}, norm forms {blocks._NORM_FORMS}, static shapes {signatures.STATIC_SHAPES}, "
        f"sender walk {triton_ops.SENDER_WALK_BACKWARD}, combo kernels {combo_kernels()}, float32, TF32 off, "
        f"fused double backward {os.environ.get('FLASHCART_FUSED_DOUBLE_BACKWARD') or '1'}, "
        f"{args.calls} calls x {args.rounds} rounds"
    )

    def call() -> None:
        predictor(batch, forces=True)

    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:  # the trainer's way (Predictor.loss_and_grads); outside predictor.frozen()
        predictor.loss_and_grads(batch, masked_loss, params, forces=True)

    times: dict[str, list[float]] = {"pipelined": [], "host": [], "serial": [], "gpu": []}
    step_times: dict[str, list[float]] = {"pipelined": [], "gpu": []}
    waits = 0
    if args.training:
        t0 = time.perf_counter()
        for _ in range(3):
            step()  # compiles: outside the lock
        torch.cuda.synchronize()
        print(f"[warm-up] training step: {time.perf_counter() - t0:.0f} s (compilation included)")
    with predictor.frozen():
        t0 = time.perf_counter()
        call()  # compiles: outside the lock
        torch.cuda.synchronize()
        _wait_for_all(args.lock, args.barrier)
        with _exclusive(args.lock):
            for _ in range(4):
                call()
            torch.cuda.synchronize()
        print(f"[warm-up] {time.perf_counter() - t0:.0f} s (compilation included)")
        stance = contextlib.nullcontext()
        if args.skip_guards:
            stance = torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
            print("[stance] skip_guard_eval_unsafe=True: guards not evaluated after warm-up")
        with stance:
            for _ in range(args.rounds):
                with _exclusive(args.lock):  # one round alone on the GPU; the settings' rounds interleave
                    call()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        call()
                    torch.cuda.synchronize()
                    times["pipelined"].append((time.perf_counter() - t0) / args.calls * 1e3)
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        call()
                        torch.cuda.synchronize()
                    times["serial"].append((time.perf_counter() - t0) / args.calls * 1e3)
                    host, gpu = host_and_gpu_time(call, args.calls, device)
                    times["host"].append(host * 1e3)
                    if gpu is None:
                        waits += 1
                    else:
                        times["gpu"].append(gpu * 1e3)
                    if args.training:
                        _time_step(step, args.calls, device, step_times, params)
            for name, t in times.items():
                if t:
                    print(f"[time] {name:<10} median {statistics.median(t):8.3f} ms/call   min {min(t):8.3f}   max {max(t):8.3f}")
            for name, t in step_times.items():
                if t:
                    ratio = statistics.median(t) / statistics.median(times[name]) if times[name] else float("nan")
                    print(
                        f"[step] {name:<10} median {statistics.median(t):8.3f} ms/step   min {min(t):8.3f}   max {max(t):8.3f}"
                        f"   {ratio:.2f}x the force call"
                    )
            if waits:
                print(f"[warning] in {waits} of {args.rounds} rounds a call waited for the GPU: no GPU-alone time")
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
