"""Pre-bound Triton launches: the compiled kernel called directly after its first launch.

Every eager launch through ``kernel[grid](...)`` runs ``JITFunction.run``: it binds the
arguments, computes their specialisation and the cache key, looks the compiled kernel up and
builds the launch metadata. :func:`launch` does that work once per specialisation: the first launch
goes through ``kernel[grid]`` and keeps the compiled kernel's launcher; later launches whose
arguments specialise the same way call it directly.

The key mirrors Triton's specialisation (triton 3.6 and 3.9 alike): per tensor its dtype and
whether its address is 16-byte aligned; per integer whether it is 1, whether it divides by 16
and whether it fits in 32 bits; constexprs, floats, bools and ``None`` by value; the launch
options and the device. The arguments are passed in the kernel's declaration order (constexprs
included; the launcher drops them), the scratch buffers are the launcher's own.

On by default with the Triton versions whose specialisation rules the key was checked against
(:data:`CHECKED_TRITON`); off with any other, where a rule that changed would launch a kernel
compiled for other arguments. ``FLASHCART_PREBOUND_LAUNCH=0`` or ``1`` overrides (read at
import; :data:`ENABLED` may be assigned).

On the H200 (triton 3.6, 2026-12-01 night) pre-bound launches equal plain ones (1e-12, float64).
An eager i2c3f20l2r force call on the 1000-atom diamond (benchmarks/RESULTS.md, 2026-12-02):
12.28 instead of 13.40 ms and 15.18 instead of 16.28 ms interleaved in one process (two
sessions); by ``flashcart-profile``, each in its own process, 11.25 instead of 13.56 ms in one run
and medians of 18.45 instead of 20.23 ms in another. It never
applies under ``TRITON_INTERPRET=1`` (the kernels are then not compiled), while tracing
(``torch.library.wrap_triton`` launches, handled by the caller), or while a launch hook is
installed (profilers such as proton read the metadata this skips).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Callable

import torch

__all__ = ["CHECKED_TRITON", "ENABLED", "launch", "specialisation", "clear"]

# Triton releases (major, minor) whose argument specialisation :func:`specialisation` mirrors:
# 3.6 run on the H200, 3.9 read from its source and run under the interpreter's checks here.
CHECKED_TRITON = frozenset({(3, 6), (3, 9)})


def _triton_release() -> tuple[int, int] | None:
    """``(major, minor)`` of the installed Triton (``None``: not installed or unreadable)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = version("triton").split(".")[:2]
        return int(major), int(minor)
    except (PackageNotFoundError, ValueError):
        return None


def _enabled() -> bool:
    raw = os.environ.get("FLASHCART_PREBOUND_LAUNCH")
    if raw is None:
        return _triton_release() in CHECKED_TRITON
    if raw not in ("0", "1"):
        raise ValueError(f"environment variable FLASHCART_PREBOUND_LAUNCH must be 0 or 1, got {raw!r}")
    return raw == "1"


ENABLED = _enabled()

_launchers: dict[tuple, tuple[Callable, Any, Any, Any]] = {}
plain_launches: Counter = Counter()  # while enabled: launches that were not pre-bound, by reason


def clear() -> None:
    """Forget every pre-bound launcher (kernels recompiled, tests) and the plain-launch counts."""
    _launchers.clear()
    plain_launches.clear()
    _kernel_reasons.clear()


def _spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or value is None or isinstance(value, (float, str)):
        return (type(value).__name__, value)
    if isinstance(value, int):
        return ("int", value == 1, value % 16 == 0, -(2**31) <= value < 2**31, value >= 2**63)
    return ("other", value)  # dtypes and other constexpr values (hashable)


_TENSORS = (torch.Tensor, torch.nn.Parameter)


def specialisation(arg_names: list[str] | tuple[str, ...], values: dict[str, Any], constexprs: frozenset[str] = frozenset()) -> tuple:
    """The part of the launcher key that Triton's specialisation decides (see the module docs);
    ``constexprs`` by value. Runs on every eager launch: plain tensors, the common case, are
    keyed inline (as :func:`_spec` keys them) without its chain of type tests."""
    key = []
    for name in arg_names:
        value = values[name]
        if name in constexprs:
            key.append(("constexpr", value))
        elif type(value) in _TENSORS:
            key.append((value.dtype, value.data_ptr() % 16 == 0))
        else:
            key.append(_spec(value))
    return tuple(key)


def _constexpr_names(kernel: Any) -> frozenset[str]:
    return frozenset(p.name for p in kernel.params if p.is_constexpr)


# id(kernel) -> (kernel, why it cannot be pre-bound or None, its constexpr names), decided once
_kernel_reasons: dict[int, tuple[Any, str | None, frozenset[str]]] = {}


def _hook_installed(hook: Any) -> bool:
    """Whether a Triton launch hook is set: triton 3.6+ keeps an (empty) ``HookChain`` there
    when none is, older ones ``None``."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if isinstance(calls, list) else True


def _kernel_reason(kernel: Any) -> str | None:
    try:
        from triton import knobs
        from triton.runtime.jit import JITFunction
    except ImportError:  # no triton, or one without knobs: the plain launch
        return "no triton.knobs"
    if not isinstance(kernel, JITFunction):
        return f"not a JITFunction ({type(kernel).__name__})"
    if knobs.runtime.interpret:
        return "interpreter"
    return None


def _kernel_entry(kernel: Any) -> tuple[Any, str | None, frozenset[str]]:
    entry = _kernel_reasons.get(id(kernel))
    if entry is None or entry[0] is not kernel:
        reason = _kernel_reason(kernel)
        entry = _kernel_reasons[id(kernel)] = (kernel, reason, _constexpr_names(kernel) if reason is None else frozenset())
    return entry


def _plain_reason(kernel: Any) -> str | None:
    """Why ``kernel`` must be launched the plain way (``None``: it can be pre-bound): not a
    compiled ``@triton.jit`` function (the interpreter's, an autotuner; decided once per
    kernel), or a launch hook is installed (checked every launch)."""
    entry = _kernel_entry(kernel)
    if entry[1] is not None:
        return entry[1]
    from triton import knobs

    if _hook_installed(knobs.runtime.launch_enter_hook) or _hook_installed(knobs.runtime.launch_exit_hook):
        return "launch hook installed"
    return None


def _compiled_kernels_launch(kernel: Any) -> bool:
    """Whether ``kernel`` can be pre-bound (see :func:`_plain_reason`)."""
    return _plain_reason(kernel) is None


def _cuda_index(values: dict[str, Any]) -> int | None:
    """The CUDA device of the first tensor argument (``None``: no tensor, or not on CUDA)."""
    probe = next((v for v in values.values() if isinstance(v, torch.Tensor)), None)
    if probe is None or probe.device.type != "cuda":
        return None
    return probe.device.index if probe.device.index is not None else torch.cuda.current_device()


def _current_stream(device_index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device_index)


def launch(kernel: Any, grid: tuple, values: dict[str, Any], options: dict[str, Any]) -> None:
    """``kernel[grid](**values, **options)``, pre-bound after the first launch of each
    specialisation when :data:`ENABLED` (see the module docs). ``values`` names every parameter
    of the kernel; ``grid`` is a tuple of one to three ints."""
    if not ENABLED:
        kernel[grid](**values, **options)
        return
    reason = _plain_reason(kernel)
    device = _cuda_index(values) if reason is None else None
    if device is None:
        plain_launches[reason or "no CUDA tensor argument"] += 1
        kernel[grid](**values, **options)
        return
    names = kernel.arg_names
    constexprs = _kernel_reasons[id(kernel)][2] if id(kernel) in _kernel_reasons else _constexpr_names(kernel)
    key = (id(kernel), device, tuple(sorted(options.items())), specialisation(names, values, constexprs))
    entry = _launchers.get(key)
    if entry is None:
        compiled = kernel[grid](**values, **options)  # compiles (once) and launches
        run = compiled.run  # its first access loads the module and builds the launcher
        _launchers[key] = (run, compiled.function, compiled.packed_metadata, kernel)  # the kernel kept: its id stays unique
        return
    run, function, metadata, _ = entry
    g = tuple(grid) + (1,) * (3 - len(grid))
    run(g[0], g[1], g[2], _current_stream(device), function, metadata, None, None, None, *[values[n] for n in names])
