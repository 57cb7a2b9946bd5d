"""Atomic file writes: a temporary file in the target's directory, then ``os.replace``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable

__all__ = ["atomic_write_text", "atomic_write"]


def atomic_write(path: Path, write: Callable[[Any], None], binary: bool = False) -> None:
    """Call ``write(handle)`` on a temporary file, then move it onto ``path``.

    A crash at any point leaves either the old file or the new one, never a partial file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda h: h.write(text))
