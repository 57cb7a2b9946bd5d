"""Atomic writes: the old file survives a failed write, and new files get the usual permissions."""

import os

import pytest

from flashcart.utils.io import atomic_write, atomic_write_text


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "model.pt"
    atomic_write_text(target, "old")

    def broken(handle):
        handle.write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, broken)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_written_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.yaml", "x: 1\n")
    finally:
        os.umask(old)
    assert (tmp_path / "a.yaml").stat().st_mode & 0o777 == 0o644
