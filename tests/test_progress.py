"""Progress bars and redirected logs (``flashcart-profile cfg > log 2>&1``)."""

import subprocess
import sys
from pathlib import Path

import pytest

from flashcart.testing import TINY_MODEL
from flashcart.utils.progress import is_terminal, progress_bar

ROOT = Path(__file__).resolve().parents[1]

PROFILE = "from flashcart.cli.main import profile_main; raise SystemExit(profile_main(__import__('sys').argv[1:]))"
# The behaviour before flashcart.utils.progress (a bar whatever the stream), for a control run.
FORCED_BAR = """
import sys
import flashcart.utils.progress as progress
progress.is_terminal = lambda stream: True
from flashcart.data import read_structures
read_structures(sys.argv[1], 4.0, "REF_energy", "REF_forces", "REF_stress", progress=True)
print("[inference] data=...")
"""


def _log(tmp_path, name, script, *args):
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as f:  # stdout and stderr into one file, as `> log 2>&1`
        proc = subprocess.run([sys.executable, "-c", script, *args], stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path, timeout=300)
    text = log.read_bytes().decode()  # keep carriage returns (read_text would turn them into newlines)
    assert proc.returncode == 0, text
    return text


def test_redirected_profiler_log_has_every_result_line_at_a_line_start(tmp_path):
    lines = (ROOT / "examples" / "ethanol" / "train.extxyz").read_text().splitlines(True)
    (tmp_path / "data.xyz").write_text("".join(lines[: 11 * 4]))
    (tmp_path / "cfg.yaml").write_text(f"train_path: {tmp_path / 'data.xyz'}\ndevice: cpu\n")
    args = [str(tmp_path / "cfg.yaml"), *(f"{k}={v}" for k, v in TINY_MODEL.items())]
    args += ["profile_phase=inference", "profile_batch_size=2", "profile_n_batches=1", "profile_repeat=1", "profile_warmup=0"]
    args += ["profile_row_limit=1", "n_interactions=1", "l_max_hidden_feats=1", "l_max_edge_attrs=1", "correlation=1"]
    text = _log(tmp_path, "profile", PROFILE, *args)  # progress bars on (no --no-progress)
    tagged = [line for line in text.split("\n") if "[inference] data=" in line or "[timer] inference" in line]
    assert len(tagged) == 2, text
    assert all(line.startswith(("[inference] data=", "[timer] inference")) for line in tagged), tagged
    assert "\r" not in text and "neighbour lists" not in text
    # control: a bar drawn into the file glues the next line to it, so the check above can fail
    glued = _log(tmp_path, "forced", FORCED_BAR, str(tmp_path / "data.xyz"))
    assert "neighbour lists" in glued and not any(line.startswith("[inference]") for line in glued.split("\n")), glued


def test_progress_bar_draws_only_on_a_terminal(tmp_path):
    class Terminal:
        def __init__(self):
            self.written = []

        def isatty(self):
            return True

        def write(self, s):
            self.written.append(s)

        def flush(self):
            pass

    with open(tmp_path / "f", "w") as f:
        assert not is_terminal(f)
        assert list(progress_bar(range(3), file=f, desc="x")) == [0, 1, 2]
    assert (tmp_path / "f").read_text() == ""
    term = Terminal()
    assert list(progress_bar(range(3), file=term, desc="x")) == [0, 1, 2]
    assert any("x" in s for s in term.written)
    term = Terminal()
    bar = progress_bar(range(3), file=term, desc="x", disable=True)
    assert list(bar) == [0, 1, 2] and term.written == []
    bar.set_postfix(loss="1")  # the tqdm API works on a disabled bar


@pytest.mark.parametrize("stream", [object(), None])
def test_is_terminal_is_false_for_streams_without_isatty(stream):
    assert not is_terminal(stream)
