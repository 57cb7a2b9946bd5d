"""Progress bars that never break log files.

A tqdm bar redraws its line with carriage returns and, with ``leave=False``, wipes it at the
end without a newline; in a redirected log (``flashcart-profile cfg > log 2>&1``) the next
output line is then glued to the remains of the bar. :func:`progress_bar` draws a bar only
when its stream is a terminal, and otherwise returns a disabled bar (same API, writes nothing).
"""

from __future__ import annotations

import sys
from typing import Iterable, TypeVar

from tqdm import tqdm

__all__ = ["progress_bar", "is_terminal"]

T = TypeVar("T")


def is_terminal(stream) -> bool:
    """Whether ``stream`` (a file object) is an interactive terminal."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(iterable: Iterable[T], *, desc: str | None = None, disable: bool = False, leave: bool = False, **kwargs) -> tqdm:
    """``tqdm(iterable, ...)``, disabled when ``disable`` is set or its stream is not a terminal.

    Args:
        iterable: what to iterate over.
        desc: label in front of the bar.
        disable: hide the bar (``--no-progress``).
        leave: keep the finished bar on screen (default: wipe it).
        kwargs: further tqdm options; ``file`` (default ``sys.stderr``) is the stream checked.
    """
    stream = kwargs.get("file") or sys.stderr
    return tqdm(iterable, desc=desc, disable=disable or not is_terminal(stream), leave=leave, **kwargs)
