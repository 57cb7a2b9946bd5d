"""Backend selection and access to the generated PyTorch module."""

from __future__ import annotations

import os
from types import ModuleType

import torch

from ._cache import kernel_l_max, load_generated
from ._codegen_torch import generate_torch_source

__all__ = ["KERNEL_L_MAX", "check_backend", "resolve_backend", "check_rank", "torch_ops", "triton_available"]

# Read once, when flashcart.cartesian is first imported (set the variable before that).
KERNEL_L_MAX = kernel_l_max()
_BACKENDS = ("auto", "torch", "triton")
_torch_module: ModuleType | None = None


def check_backend(backend: str) -> str:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    return backend


def check_rank(l: int, what: str) -> None:
    """Reject ranks the generated modules do not include."""
    if l < 0:
        raise ValueError(f"{what} must be >= 0, got {l}")
    if l > KERNEL_L_MAX:
        raise ValueError(
            f"{what}={l} exceeds the generated rank limit {KERNEL_L_MAX}; set the environment "
            f"variable FLASHCART_KERNEL_L_MAX={l} (or higher) before importing flashcart"
        )


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(backend: str, tensor: torch.Tensor) -> str:
    """``"auto"`` -> ``"triton"`` for CUDA inputs when Triton is installed, else ``"torch"``.

    An explicit ``"triton"`` needs CUDA inputs or ``TRITON_INTERPRET=1``.
    """
    if backend == "auto":
        return "triton" if tensor.is_cuda and triton_available() else "torch"
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' needs the triton package; install it or use backend='torch'")
        if not (tensor.is_cuda or interpreter_enabled()):
            raise RuntimeError("backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1 to run the kernels on the CPU")
    return backend


def torch_ops() -> ModuleType:
    """The generated PyTorch module (generated and cached on first use)."""
    global _torch_module
    if _torch_module is None:
        _torch_module = load_generated("torch_ops", KERNEL_L_MAX, generate_torch_source)
    return _torch_module
