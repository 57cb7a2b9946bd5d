"""Device and dtype names of the configuration (``device``, ``precision``) as torch objects."""

from __future__ import annotations

import torch

from ..config import ConfigError

__all__ = ["resolve_device", "resolve_dtype"]


def resolve_device(name: str | torch.device) -> torch.device:
    """``gpu`` -> CUDA (an error without CUDA), ``auto`` -> CUDA if present else CPU, ``cpu``.

    ``cuda``, ``cuda:N`` and :class:`torch.device` objects are taken as they are.
    """
    if isinstance(name, torch.device):
        return name
    if name == "gpu":
        if not torch.cuda.is_available():
            raise ConfigError("device: gpu was requested but CUDA is not available (use device=cpu or device=auto)")
        return torch.device("cuda")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if isinstance(name, str) and name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device: {name} was requested but CUDA is not available")
        return torch.device(name)
    raise ConfigError(f"device must be 'cpu', 'gpu', 'auto' or 'cuda[:N]', got {name!r}")


def resolve_dtype(precision: str | torch.dtype) -> torch.dtype:
    """``64-true``/``float64`` -> float64, ``32-true``/``float32`` -> float32."""
    if isinstance(precision, torch.dtype):
        return precision
    table = {"64-true": torch.float64, "float64": torch.float64, "32-true": torch.float32, "float32": torch.float32}
    if precision not in table:
        raise ConfigError(f"precision/dtype must be one of {sorted(table)}, got {precision!r}")
    return table[precision]
