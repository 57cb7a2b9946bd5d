"""Hardware counters of one force call and one training step, per kernel (issue 14, item 1).

Nsight Compute (``ncu``) replays every kernel of one profiled call and reads its duration, the
bytes it moved to and from DRAM, its FP32 FMA count and its SM and
memory throughput; this script makes the call and summarises the counters::

    # on the GPU machine: the call under ncu (compile mode ``default``: the kernels a
    # reduce-overhead CUDA graph replays, launched one by one), then the summary
    ncu --profile-from-start off --clock-control none --target-processes application-only \\
        --metrics "$(python benchmarks/ncu_call.py --print-metrics)" --csv --page raw \\
        --log-file /tmp/i2.csv python benchmarks/ncu_call.py --model i2c3f20l2r --phase inference
    python benchmarks/ncu_call.py --summarize /tmp/i2.csv --bandwidth 4.26e12

The call: ``kernel_profile.build`` (the published model's options on the 1000-atom diamond
cell), the compiled Predictor, ``--warmup`` untimed calls (the compile), then one call between
``cudaProfilerStart`` and ``cudaProfilerStop``. ``--lock FILE`` takes turns with other
processes on the GPU for the warm-up and profiled calls (compiles run side by side).

The summary groups kernels by name: launches, summed duration (ncu's, clocks left alone),
DRAM bytes, achieved DRAM bandwidth and its share of ``--bandwidth`` (the copy roofline the
profiler measures), FP32 FMA operations (two each) and their rate, and the
duration-weighted SM and memory throughput (% of peak). Kernel durations under ncu are each
measured alone (caches flushed between replays), so they are a little longer than in a stream.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

METRICS = {
    "gpu__time_duration.sum": "ns",
    "dram__bytes_read.sum": "bytes",
    "dram__bytes_write.sum": "bytes",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": "inst",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "%",
    "launch__registers_per_thread": "count",
}

_SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}


def _value(text: str, unit: str) -> float:
    text = text.replace(",", "").strip()
    if not text or text == "n/a":
        return 0.0
    return float(text) * _SCALE.get(unit.strip(), 1)


def summarize(path: Path, bandwidth: float, rows: int, detail: str | None = None) -> None:
    """Print the per-kernel table of one ``ncu --csv --page raw`` log; with ``detail`` (a regular
    expression) also every launch of the kernels whose names match it, in launch order: duration,
    DRAM bytes, registers per thread, grid and block (which variant of a kernel ran where)."""
    if not path.is_file():
        raise SystemExit(f"{path}: no such ncu log (ncu --csv --page raw --log-file writes it)")
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"{path}: no ncu CSV table in it (the call was not profiled, or ncu failed: see the log)")
    reader = csv.reader(lines[start:])
    header = next(reader)
    units = next(reader)
    col = {name: i for i, name in enumerate(header)}
    missing = [m for m in METRICS if m not in col]
    if missing:
        raise SystemExit(f"{path}: metrics missing from the ncu log: {', '.join(missing)}")
    name_col = col["Kernel Name"]
    groups: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    launches = []
    for row in reader:
        if len(row) != len(header):
            continue
        name = row[name_col].split("(")[0].replace("void ", "")[:60]
        g = groups[name]
        g["launches"] += 1
        values = {m: _value(row[col[m]], units[col[m]]) for m in METRICS}
        ns = values["gpu__time_duration.sum"]
        if detail is not None and re.search(detail, name):
            shape = " ".join(f"{k.split()[0].lower()} {row[col[k]]}" for k in ("Grid Size", "Block Size") if k in col)
            launches.append((name, ns, values, shape))
        g["ns"] += ns
        g["dram"] += values["dram__bytes_read.sum"] + values["dram__bytes_write.sum"]
        g["flop"] += 2 * values["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"]
        g["sm_ns"] += ns * values["sm__throughput.avg.pct_of_peak_sustained_elapsed"]
        g["mem_ns"] += ns * values["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"]
        g["regs"] = max(g["regs"], values["launch__registers_per_thread"])
    total_ns = sum(g["ns"] for g in groups.values())
    total_dram = sum(g["dram"] for g in groups.values())
    total_flop = sum(g["flop"] for g in groups.values())
    print(
        f"[ncu] {path.name}: {len(groups)} kernels, {sum(g['launches'] for g in groups.values())} launches, "
        f"{total_ns / 1e6:.3f} ms, {total_dram / 1e6:.0f} MB DRAM ({total_dram / total_ns:.0f} GB/s, "
        f"{100 * total_dram / total_ns * 1e9 / bandwidth:.0f}% of the copy roofline), {total_flop / 1e9:.2f} GFLOP FP32"
    )
    print(
        f"{'kernel':<60} {'n':>4} {'ms':>7} {'share':>6} {'DRAM MB':>8} {'GB/s':>6} {'%roof':>6} "
        f"{'GFLOP':>7} {'TFLOP/s':>7} {'SM%':>4} {'mem%':>4} {'regs':>4}"
    )
    for name, g in sorted(groups.items(), key=lambda kv: -kv[1]["ns"])[:rows]:
        ns = g["ns"]
        gbs = g["dram"] / ns
        print(
            f"{name:<60} {g['launches']:>4} {ns / 1e6:>7.3f} {100 * ns / total_ns:>5.1f}% {g['dram'] / 1e6:>8.1f} {gbs:>6.0f} "
            f"{100 * gbs * 1e9 / bandwidth:>5.1f}% {g['flop'] / 1e9:>7.3f} {g['flop'] / ns / 1e3:>7.2f} "
            f"{g['sm_ns'] / ns:>4.0f} {g['mem_ns'] / ns:>4.0f} {g['regs']:>4.0f}"
        )
    if detail is not None:
        print(f"[launches] matching {detail!r}, in launch order")
        for name, ns, v, shape in launches:
            dram = v["dram__bytes_read.sum"] + v["dram__bytes_write.sum"]
            print(f"{name:<40} {ns / 1e6:>7.3f} ms {dram / 1e6:>8.1f} MB {v['launch__registers_per_thread']:>4.0f} regs  {shape}")


def profile_call(args) -> None:
    """Compile, warm up, then one call between ``cudaProfilerStart`` and ``cudaProfilerStop``."""
    import torch

    from benchmarks.kernel_profile import _exclusive, build, calls, model_arguments  # noqa: F401

    if args.device != "cuda" or not torch.cuda.is_available():
        raise SystemExit("ncu_call.py profiles CUDA kernels: it needs --device cuda and a GPU (--summarize needs neither)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    model, batch = build(args, device)
    fn = calls(model, batch, "default")[args.phase]
    fn()  # the compile, side by side with other processes
    torch.cuda.synchronize(device)
    with _exclusive(args.lock):
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize(device)
        torch.cuda.cudart().cudaProfilerStop()
    print(
        f"[call] {args.model} {args.phase} on {args.structure}: edges={batch.receivers.shape[0]} "
        f"peak allocated {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB, torch={torch.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--print-metrics", action="store_true", help="print the metric list for ncu --metrics and exit")
    parser.add_argument("--summarize", type=Path, default=None, metavar="CSV", help="summarise an ncu --csv --page raw log")
    parser.add_argument("--bandwidth", type=float, default=4.26e12, help="copy roofline in bytes/s (the profiler's [setup] line)")
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--detail", default=None, metavar="REGEX", help="with --summarize: also each launch of the matching kernels")
    parser.add_argument("--phase", default="inference", choices=["inference", "training-in-graph"])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--lock", default=None, metavar="FILE", help="take turns with other processes on this GPU")
    if {"--print-metrics", "--summarize"}.isdisjoint(sys.argv) and not any(a.startswith("--summarize=") for a in sys.argv):
        from benchmarks.kernel_profile import model_arguments  # imports torch: not for the summary

        model_arguments(parser)
    args = parser.parse_args()
    if args.print_metrics:
        print(",".join(METRICS))
    elif args.summarize is not None:
        summarize(args.summarize, args.bandwidth, args.rows, args.detail)
    else:
        profile_call(args)


if __name__ == "__main__":
    main()
