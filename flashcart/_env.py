"""Settings read from the environment."""

from __future__ import annotations

import os

__all__ = ["env_switch"]


def env_switch(variable: str, default: bool = True) -> bool:
    """An on/off switch from the environment: ``0``, ``1`` or unset or empty (``default``);
    anything else is an error naming the variable."""
    raw = os.environ.get(variable, "").strip() or ("1" if default else "0")
    if raw not in ("0", "1"):
        raise ValueError(f"environment variable {variable} must be 0 or 1, got {raw!r}")
    return raw == "1"
