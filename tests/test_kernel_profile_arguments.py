"""``benchmarks/kernel_profile.py``'s arguments: combinations the model would refuse deep inside a
call are refused when parsed, naming the options."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("phases", [["training"], ["inference", "training-in-graph"]])
def test_radial_tables_are_refused_for_training_phases(phases):
    """Radial tables are for inference: with a training phase the script exits with argparse's
    status 2 and a message naming ``--radial-table`` and the phase, before building a model."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "kernel_profile.py"), "--device", "cpu", "--radial-table", "64", "--phases", *phases],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    training = " ".join(p for p in phases if p != "inference")
    assert f"--radial-table is for inference only: drop it, or profile --phases inference (not {training})" in run.stderr
    assert "[setup]" not in run.stdout  # nothing was built
