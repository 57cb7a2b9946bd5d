"""``benchmarks/graph_bound.py``: with ``--barrier N`` a process that has compiled marks itself
(``LOCK.ready.PID``) and waits until N processes have, so that no setting of an A/B times its
calls beside another process's first call; ``--training`` times the trainer's step in each round
with the parameters thawed for it."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

graph_bound = pytest.importorskip("benchmarks.graph_bound")


def test_waits_until_every_process_has_compiled(tmp_path):
    """With N = 2 the call returns only once a second marker exists, and leaves its own."""
    lock = str(tmp_path / "bound.lock")
    other = Path(f"{lock}.ready.999999999")
    timer = threading.Timer(1.0, other.touch)
    t0 = time.perf_counter()
    timer.start()
    graph_bound._wait_for_all(lock, 2, limit_s=60)
    waited = time.perf_counter() - t0
    timer.join()
    assert waited >= 0.9
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([other.name, f"bound.lock.ready.{graph_bound.os.getpid()}"])


def test_returns_at_once_when_the_others_are_ready(tmp_path):
    lock = str(tmp_path / "bound.lock")
    for pid in (999999991, 999999992):
        Path(f"{lock}.ready.{pid}").touch()
    t0 = time.perf_counter()
    graph_bound._wait_for_all(lock, 3, limit_s=60)
    assert time.perf_counter() - t0 < 0.5


def test_gives_up_with_a_warning_after_its_limit(tmp_path, capsys):
    lock = str(tmp_path / "bound.lock")
    t0 = time.perf_counter()
    graph_bound._wait_for_all(lock, 2, limit_s=0.6)
    assert 0.6 <= time.perf_counter() - t0 < 5
    assert "[warning] barrier: fewer than 2 processes compiled within 1 s; timing anyway" in capsys.readouterr().out


@pytest.mark.parametrize("lock, n", [(None, 4), ("bound.lock", 1), ("bound.lock", 0)])
def test_no_barrier_without_a_lock_or_other_processes(tmp_path, monkeypatch, lock, n):
    monkeypatch.chdir(tmp_path)
    graph_bound._wait_for_all(lock, n)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("options", [["--barrier", "3"], ["--barrier", "-1", "--lock", "x.lock"]])
def test_a_barrier_without_a_lock_or_below_zero_is_refused(options):
    """``--barrier`` is read only with ``--lock``: without one (or with a negative count) the script
    exits with argparse's status 2 naming the option, before building anything."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "graph_bound.py"), "--device", "cuda", *options],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"--barrier {options[1]}: a count of processes (0 or 1: none), and it needs --lock FILE" in run.stderr


def test_training_with_radial_tables_is_refused():
    """``--training`` times the trainer's step, which needs the radial MLPs: with ``--radial-table``
    the script exits with argparse's status 2 naming both options, before building anything."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "graph_bound.py"), "--device", "cuda", "--training", "--radial-table", "4096"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "--training with --radial-table 4096" in run.stderr


def test_a_training_round_thaws_the_parameters_and_freezes_them_again(monkeypatch):
    """``_time_step`` runs the step with the parameters requiring grad (inside the force calls'
    frozen block), records a pipelined and a GPU-alone time, and leaves them frozen again, also
    when the step raises."""
    import torch

    params = [torch.nn.Parameter(torch.zeros(2), requires_grad=False) for _ in range(2)]
    seen = []

    def step():
        seen.append(all(p.requires_grad for p in params))

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(graph_bound, "host_and_gpu_time", lambda fn, n, device: (0.001, 0.0025))
    out = {"pipelined": [], "gpu": []}
    graph_bound._time_step(step, 3, None, out, params)
    assert seen == [True] * 4 and len(out["pipelined"]) == 1 and out["gpu"] == [2.5]
    assert not any(p.requires_grad for p in params)

    def failing():
        raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        graph_bound._time_step(failing, 3, None, out, params)
    assert not any(p.requires_grad for p in params)
