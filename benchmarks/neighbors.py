"""Neighbour-list build time against system size: the all-pairs search, the torch cell list,
vesin-torch and (CPU) ASE, for periodic water-density or diamond cells.

Water-density cells: ``n`` atoms on a jittered cubic grid at 0.1003 atoms/Å^3 (liquid water's
atom density, about 90 neighbours within 6 Å). Diamond: a = 3.567 Å cubic cells repeated
``k^3`` times (8 k^3 atoms nearest to ``n``). Each time is the median of ``--repeats`` builds after
one warm-up build (CUDA: synchronised before and after). A method whose predicted time at the
next size (quadratic growth for the all-pairs search, linear otherwise) exceeds ``--budget``
seconds per build is skipped there. Every method's edge set is checked against the first one's.

    python benchmarks/neighbors.py --device cpu
    python benchmarks/neighbors.py --device cuda --system diamond --json nl_cuda.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from flashcart.data.neighbors import neighbor_list, vesin_available
from flashcart.utils.io import atomic_write_text

WATER_ATOM_DENSITY = 0.1003  # atoms / Å^3


def water_like(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` atoms at water's atom density in a cubic box (jittered grid, no overlaps)."""
    length = (n / WATER_ATOM_DENSITY) ** (1 / 3)
    m = int(np.ceil(n ** (1 / 3)))
    grid = np.stack(np.meshgrid(*[np.arange(m)] * 3, indexing="ij"), -1).reshape(-1, 3)[:n]
    rng = np.random.default_rng(seed)
    pos = (grid + 0.5 + rng.uniform(-0.3, 0.3, grid.shape)) * (length / m)
    return pos, np.eye(3) * length


def diamond(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Cubic diamond (a = 3.567 Å) repeated ``k^3`` times, ``8 k^3`` atoms nearest to ``n``."""
    a = 3.567
    k = max(1, round((n / 8) ** (1 / 3)))
    basis = np.array(
        [
            [0, 0, 0],
            [0, 0.5, 0.5],
            [0.5, 0, 0.5],
            [0.5, 0.5, 0],
            [0.25, 0.25, 0.25],
            [0.25, 0.75, 0.75],
            [0.75, 0.25, 0.75],
            [0.75, 0.75, 0.25],
        ]
    )
    cells = np.stack(np.meshgrid(*[np.arange(k)] * 3, indexing="ij"), -1).reshape(-1, 3)
    return ((cells[:, None, :] + basis[None]) * a).reshape(-1, 3), np.eye(3) * k * a


def ase_list(pos: torch.Tensor, cell: torch.Tensor, cutoff: float):
    from ase.neighborlist import primitive_neighbor_list

    i, j, s = primitive_neighbor_list("ijS", (True, True, True), cell.double().numpy(), pos.double().numpy(), cutoff)
    return torch.from_numpy(i).long(), torch.from_numpy(j).long(), torch.from_numpy(s)


def edge_keys(i: torch.Tensor, j: torch.Tensor, s: torch.Tensor, n: int) -> torch.Tensor:
    """Sorted int64 keys of ``(i, j, S)`` for comparing edge sets."""
    s = s.long().cpu() + 64
    key = (i.cpu() * n + j.cpu()) * 2**21 + s[:, 0] * 2**14 + s[:, 1] * 2**7 + s[:, 2]
    return torch.sort(key).values


def timed(fn, device: torch.device, repeats: int) -> tuple[list[float], tuple]:
    out = fn()  # warm-up (and the result that is checked)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--system", choices=["water", "diamond"], default="water")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000, 100000])
    parser.add_argument("--cutoff", type=float, default=6.0, help="Å")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--methods", nargs="+", default=["all_pairs", "cell_list", "vesin", "ase"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=float, default=30.0, help="skip a method whose predicted build time exceeds this (s)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device is available")
    dtype = getattr(torch, args.dtype)
    methods = [m for m in args.methods if not (m == "ase" and device.type != "cpu")]
    unknown = set(methods) - {"all_pairs", "cell_list", "vesin", "auto", "ase"}
    if unknown:
        sys.exit(f"--methods: unknown {sorted(unknown)}")
    if "vesin" in methods and not vesin_available():
        print("vesin-torch is not installed or does not load here: skipping it", file=sys.stderr)
        methods.remove("vesin")
    env = {
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "vesin_torch": _version("vesin-torch"),
        "ase": _version("ase"),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    print(json.dumps(env))
    print(f"{args.system}, cutoff {args.cutoff} Å, {args.dtype}, median of {args.repeats} builds (s)")
    last: dict[str, tuple[int, float]] = {}
    rows = []
    combos = [(n, m) for n in args.sizes for m in methods]
    reference: dict[int, torch.Tensor] = {}
    for n_req, method in tqdm(combos, desc="neighbour lists", file=sys.stderr):
        pos_np, cell_np = water_like(n_req) if args.system == "water" else diamond(n_req)
        n = pos_np.shape[0]
        pos = torch.tensor(pos_np, dtype=dtype, device=device)
        cell = torch.tensor(cell_np, dtype=dtype, device=device)
        if method in last:
            n0, t0 = last[method]
            predicted = t0 * (n / n0) ** (2 if method == "all_pairs" else 1)
            if predicted > args.budget:
                rows.append({"n": n, "method": method, "skipped": f"predicted {predicted:.0f} s"})
                tqdm.write(f"{n:>7d} {method:>10s}  skipped (predicted {predicted:.0f} s per build)")
                continue
        if method == "ase":
            fn = lambda: ase_list(pos, cell, args.cutoff)
        else:
            fn = lambda: neighbor_list(pos, args.cutoff, cell, (True, True, True), backend=method)
        times, (i, j, s) = timed(fn, device, args.repeats)
        med = statistics.median(times)
        last[method] = (n, med)
        keys = edge_keys(i, j, s, n)
        if n not in reference:
            reference[n] = keys
        same = bool(torch.equal(keys, reference[n]))
        rows.append({"n": n, "method": method, "median_s": med, "times_s": times, "edges": int(i.shape[0]), "same_edges": same})
        tqdm.write(f"{n:>7d} {method:>10s}  {med:10.5f} s  {i.shape[0]:>10d} edges  {'same edges' if same else 'EDGES DIFFER'}")
    if args.json is not None:
        atomic_write_text(args.json, json.dumps({"env": env, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    if not all(r.get("same_edges", True) for r in rows):
        sys.exit("edge sets differ between methods")


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
