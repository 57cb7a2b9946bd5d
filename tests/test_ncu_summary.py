"""``benchmarks/ncu_call.py --summarize``: an ``ncu --csv --page raw`` log grouped per kernel."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.ncu_call import METRICS, summarize  # noqa: E402


def _log(path: Path, rows: list[tuple[str, dict[str, str]]], units: dict[str, str]) -> None:
    head = ["ID", "Process ID", "Process Name", "Kernel Name", "Block Size", "Grid Size", *METRICS]
    lines = ["==PROF== Connected to process 1 (python3)", ",".join(f'"{h}"' for h in head)]
    lines.append(",".join(f'"{units.get(h, "")}"' for h in head))
    for i, (name, values) in enumerate(rows):
        lines.append(
            ",".join(f'"{v}"' for v in [i, 1, "python3", name, "(32, 1, 1)", f"({1000 + i}, 1, 1)", *(values[m] for m in METRICS)])
        )
    path.write_text("\n".join(lines) + "\n")


def _values(ns, read, write, ffma, sm, mem, regs):
    keys = list(METRICS)
    return dict(zip(keys, map(str, [ns, read, write, ffma, sm, mem, regs])))


def test_summary_groups_kernels_and_scales_units(tmp_path, capsys):
    units = {
        "gpu__time_duration.sum": "usecond",
        "dram__bytes_read.sum": "Mbyte",
        "dram__bytes_write.sum": "Kbyte",
        "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": "inst",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": "%",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "%",
        "launch__registers_per_thread": "register/thread",
    }
    rows = [
        ("tp_bwd_csr(float*, float*)", _values(100, 300, 100000, "1,000,000,000", 40, 30, 255)),
        ("tp_bwd_csr(float*, float*)", _values(300, 100, 100000, "2,000,000,000", 60, 50, 200)),
        ("void at::native::elementwise", _values(100, 1, 0, 0, 10, 90, 16)),
    ]
    log = tmp_path / "ncu.csv"
    _log(log, rows, units)
    summarize(log, bandwidth=4e12, rows=10)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[ncu] ncu.csv: 2 kernels, 3 launches, 0.500 ms, 601 MB DRAM")
    bwd = next(line for line in out if line.startswith("tp_bwd_csr"))
    f = bwd.split()
    # 2 launches, 0.4 ms; 400 MB + 200 MB DRAM -> 600 MB, 1500 GB/s, 37.5 % of 4 TB/s; 3e9 FMAs = 6 GFLOP, 15 TFLOP/s;
    # SM and memory throughput weighted by duration: (100*40 + 300*60) / 400 = 55, (100*30 + 300*50) / 400 = 45
    assert f[1:] == ["2", "0.400", "80.0%", "600.0", "1500", "37.5%", "6.000", "15.00", "55", "45", "255"]
    assert next(line for line in out if line.startswith("at::native::elementwise")).split()[1] == "1"


def test_summary_lists_the_launches_asked_for(tmp_path, capsys):
    units = {"gpu__time_duration.sum": "nsecond", "dram__bytes_read.sum": "byte", "dram__bytes_write.sum": "byte"}
    rows = [
        ("tp_fwd(float*)", _values(1000, 2e6, 0, 0, 1, 1, 168)),
        ("gemm", _values(1000, 0, 0, 0, 1, 1, 80)),
        ("tp_fwd(float*)", _values(3000, 0, 1e6, 0, 1, 1, 254)),
    ]
    log = tmp_path / "ncu.csv"
    _log(log, rows, units)
    summarize(log, bandwidth=4e12, rows=10, detail="^tp_")
    out = capsys.readouterr().out.splitlines()
    i = out.index("[launches] matching '^tp_', in launch order")
    assert [line.split() for line in out[i + 1 :]] == [
        ["tp_fwd", "0.001", "ms", "2.0", "MB", "168", "regs", "grid", "(1000,", "1,", "1)", "block", "(32,", "1,", "1)"],
        ["tp_fwd", "0.003", "ms", "1.0", "MB", "254", "regs", "grid", "(1002,", "1,", "1)", "block", "(32,", "1,", "1)"],
    ]


def test_summary_of_a_missing_log_names_it(tmp_path):
    with pytest.raises(SystemExit, match="gone.csv: no such ncu log"):
        summarize(tmp_path / "gone.csv", bandwidth=4e12, rows=10)


def test_summary_of_a_log_without_a_table_names_the_file(tmp_path):
    log = tmp_path / "empty.csv"
    log.write_text("==PROF== Connected to process 1\n==ERROR== something\n")
    with pytest.raises(SystemExit, match="empty.csv: no ncu CSV table"):
        summarize(log, bandwidth=4e12, rows=10)


def test_print_metrics_needs_no_torch():
    """The device script asks for the metric list before the call; it must not import torch or the model."""
    code = (
        "import sys, runpy; sys.argv = ['ncu_call.py', '--print-metrics']; "
        "runpy.run_path('benchmarks/ncu_call.py', run_name='__main__'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert out == [",".join(METRICS), "False"]
