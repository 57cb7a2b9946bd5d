"""A function compiled with ``torch.compile`` that falls back to itself if compiling fails."""

from __future__ import annotations

import warnings
from typing import Callable

import torch

__all__ = ["CompiledOrEager"]


class CompiledOrEager:
    """``fn`` through ``torch.compile`` (``fullgraph``, static shapes), falling back to ``fn``
    itself for good, with a warning, if compiling or running the compiled function fails (the
    step's own work is worth a fraction of a millisecond; a simulation must not stop for it)."""

    def __init__(self, fn: Callable, what: str):
        self.fn, self.what = fn, what
        self.compiled: Callable | None = torch.compile(fn, fullgraph=True, dynamic=False)

    def __call__(self, *args, **kwargs):
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as e:
                self.compiled = None
                first = (str(e).strip().splitlines() or [""])[0][:300]  # dynamo's messages run to many lines
                warnings.warn(f"compiling {self.what} failed ({type(e).__name__}: {first}); it runs eagerly from now on", stacklevel=2)
        return self.fn(*args, **kwargs)
