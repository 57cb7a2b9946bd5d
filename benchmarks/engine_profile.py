"""Where one simulation-engine evaluation goes, beyond the model call (issue 11).

Builds the engine on a structure of ``md_vs_profile.py``, moves the atoms a little between
calls (within the skin, so the neighbour list is reused, as in MD), and reports the wall time
per evaluation, a torch-profiler table of one batch of calls (host time per operation, CUDA
time per kernel) and a cProfile of the Python around it.

    python benchmarks/engine_profile.py --structure water --device cuda --compile-mode reduce-overhead
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.kernel_profile import MODELS  # noqa: E402
from benchmarks.md_vs_profile import structure  # noqa: E402
from flashcart.config import load_config  # noqa: E402
from flashcart.model import FlashCartPotential  # noqa: E402
from flashcart.simulation import Engine  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--structure", default="water", choices=["ethanol", "water", "diamond", "diamond512"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--compile-mode", default=None)
    p.add_argument("--step", default="dynamic", choices=["auto", "dynamic", "static", "graph"])
    p.add_argument("--skin", type=float, default=0.5)
    p.add_argument("--r-max", type=float, default=6.0)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument(
        "--jitter",
        type=float,
        default=0.005,
        help="Å: std of the random displacement from fixed positions each call (small: the list is reused)",
    )
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--model", nargs="*", default=MODELS["i2c3f20l2r"], help="KEY=VALUE model options (default: i2c3f20l2r)")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    atoms = structure(args.structure)
    cfg = load_config(overrides=[f"r_max={args.r_max}", *args.model])
    model = FlashCartPotential.from_config(cfg, sorted(set(atoms.get_chemical_symbols())))
    engine = Engine(model, device=args.device, compile_mode=args.compile_mode, skin=args.skin, step=args.step)
    cell = atoms.cell.array if atoms.pbc.any() else None
    rng = np.random.default_rng(0)
    base = atoms.positions.copy()

    def call():
        pos = base + rng.normal(scale=args.jitter, size=base.shape)
        return engine.evaluate(pos, atoms.numbers, cell, atoms.pbc)

    for _ in range(20):  # compilation, capacities, first list
        call()
    builds = engine.neighbor_list_builds
    t = time.perf_counter()
    for _ in range(args.calls):
        call()
    wall = (time.perf_counter() - t) / args.calls
    print(
        f"[engine] {args.structure} {len(atoms)} atoms, {engine.n_edges} listed edges, step={engine.step}, "
        f"compile={args.compile_mode or 'eager'}: {wall * 1e3:.3f} ms per evaluate "
        f"({engine.neighbor_list_builds - builds} list builds in {args.calls} calls)"
    )
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(20):
            call()
    ka = prof.key_averages()
    print("[torch profiler] 20 calls, by host (self CPU) time")
    print(ka.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))
    if engine.device.type == "cuda":
        print("[torch profiler] 20 calls, by CUDA time")
        print(ka.table(sort_by="self_device_time_total", row_limit=args.rows, max_name_column_width=60))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(args.calls):
        call()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(args.rows)
    print(f"[cProfile] {args.calls} calls, by own time")
    print(s.getvalue())


if __name__ == "__main__":
    main()
