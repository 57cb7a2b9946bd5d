"""Host-side helpers shared by the Triton launchers (dtype map, channel blocks, shapes)."""

from __future__ import annotations

import os

import torch
import triton.language as tl
from torch import Tensor

from ..._env import env_switch
from .signatures import STATIC_SHAPES
from .source import ProductSpec, product_spec

__all__ = [
    "kernel_constants",
    "DT",
    "block_f",
    "cdiv",
    "next_pow2",
    "channels",
    "tp_shapes",
    "reduce_channels",
    "kernel_op",
    "splits_mode",
    "walk_splits",
    "auto_splits",
    "AUTO_SPLITS",
    "sum_splits",
    "switch_mode",
    "INDEX_PREFETCH",
    "PREFETCH_MODES",
    "index_prefetch",
]

DT = {torch.float32: tl.float32, torch.float64: tl.float64, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def kernel_op(name: str):
    """Decorator registering a function that launches Triton kernels as the op ``name``.

    A ``torch.library.triton_op``: graphs record the op, and torch.compile and AOTInductor lower
    it to the kernels it launches (their launches go through ``signatures.traceable``), so
    compiled code and ``.pt2`` packages contain the kernels and need no Python to run them.
    Under ``TRITON_INTERPRET=1`` (the CPU test mode) the kernels are interpreted functions,
    which cannot be traced: there the op is a plain ``torch.library.custom_op``, opaque to
    tracing, as before.
    """
    from .._backend import interpreter_enabled

    register = torch.library.custom_op if interpreter_enabled() else torch.library.triton_op
    return register(name, mutates_args=())


# Plain integer helpers: triton.cdiv / triton.next_power_of_2 are constexpr functions whose
# calls from the host cost microseconds each, paid on every launch.
def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ``a`` and positive ``b``."""
    return -(-a // b)


_CONSTANTS: dict = {}


def kernel_constants(values: tuple[float, ...], like: Tensor) -> Tensor:
    """``values`` as a ``[len(values)]`` tensor of ``like``'s dtype and device, made once per
    values, dtype and device: constants a kernel reads at the features' precision (a Python float
    argument or literal reaches a Triton kernel as float32). Built by fills, no host-to-device
    copy, so a first call inside a CUDA-graph capture is allowed."""
    key = (values, like.dtype, like.device)
    t = _CONSTANTS.get(key)
    if t is None:
        t = _CONSTANTS[key] = torch.stack([torch.full((), v, dtype=like.dtype, device=like.device) for v in values])
    return t


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def block_f(F: int) -> tuple[int, int]:
    """``(BLOCK_F, num_warps)`` for ``F`` channels: at most 64 channels per program."""
    block = min(64, next_pow2(F))
    return block, max(1, block // 32)


def channels(width: int, comps: int, what: str) -> int:
    """Channels of a row of ``width`` elements holding ``comps`` components each."""
    if width % comps:
        raise ValueError(f"{what} width {width} is not a multiple of {comps}")
    return width // comps


def tp_shapes(key: str, x1: Tensor, x2: Tensor) -> tuple[ProductSpec, int, int, int]:
    """``(spec, F1, F2, F)``: the configuration, channels of each input and output channels."""
    spec = product_spec(key)
    f1 = channels(x1.shape[1], spec.in1_comps, "x1")
    f2 = channels(x2.shape[1], spec.in2_comps, "x2")
    return spec, f1, f2, max(f1, f2)


def reduce_channels(g: Tensor, comps: int, n_channels: int) -> Tensor:
    """Sum per-channel gradients ``[rows, comps * F]`` of a broadcast (1-channel) input."""
    if n_channels != 1:
        return g
    return g.view(g.shape[0], comps, -1).sum(-1)


# An on/off kernel switch from the environment (0, 1 or unset: the default; else an error naming it).
switch_mode = env_switch


PREFETCH_MODES = ("0", "1", "auto")


def _index_prefetch_mode() -> str:
    """``FLASHCART_INDEX_PREFETCH``: whether each step of the node walks loads the indices of the
    edges after it (``PREFETCH``: ``perm`` two and ``recv`` one edge ahead in the sender walks,
    ``send`` one edge ahead in the fused double backward's receiver walk), so that a step's
    operand loads do not wait on dependent index loads. ``auto`` (default): per kernel, as
    :func:`index_prefetch` says; ``1``: every walk; ``0``: none. Anything else is an error naming
    the variable."""
    raw = os.environ.get("FLASHCART_INDEX_PREFETCH", "").strip() or "auto"
    if raw not in PREFETCH_MODES:
        raise ValueError(f"environment variable FLASHCART_INDEX_PREFETCH must be one of {', '.join(PREFETCH_MODES)}, got {raw!r}")
    return raw


# Read at import; tests and benchmarks assign the module attribute.
INDEX_PREFETCH = _index_prefetch_mode()


def index_prefetch(kernel: str, block: int) -> bool:
    """``PREFETCH`` of a launch of ``kernel`` (``tp_bwd_x1_csr``, ``tp_bwd_csr``, ``tp_dbwd_x1_csr``
    or ``tp_dbwd_row``) with ``BLOCK_F = block`` under :data:`INDEX_PREFETCH`. ``auto`` follows
    the H200 (the published convolution, 1000-atom diamond, RESULTS.md 2026-12-04 evening): the
    one-pass backward ``tp_bwd_csr`` gained at 20 channels (0.630 -> 0.587 ms, one warp per
    program) and lost at 64 (1.621 -> 1.672 ms: two warps, and ptxas spills 208 instead of 128
    bytes per thread); the two-kernel backward's sender walk gained at 64 (1.773 -> 1.700 ms);
    the fused double backward lost 3 % at both, its receiver walk spilling more."""
    if INDEX_PREFETCH != "auto":
        return INDEX_PREFETCH == "1"
    if kernel == "tp_bwd_csr":
        return block <= 32
    return kernel in ("tp_bwd_x1_csr", "tp_dbwd_x1_csr")


_MAX_SPLITS = 16
# variable -> default: the forward's and backward's node walks, the fused double backward's
_SPLITS_DEFAULTS = {"FLASHCART_TP_SPLITS": "auto", "FLASHCART_DBWD_SPLITS": 4}
AUTO_SPLITS = 0  # FLASHCART_TP_SPLITS=auto: splits by the product's path count (auto_splits)


def splits_mode(variable: str = "FLASHCART_TP_SPLITS") -> int:
    """How many programs walk each node's edges in the convolution kernels (``SPLITS``), an
    integer from 1 to 16: ``FLASHCART_TP_SPLITS`` for the forward and the backward,
    ``FLASHCART_DBWD_SPLITS`` for the fused double backward (default 4). ``FLASHCART_TP_SPLITS``
    also takes ``auto``, its default (returned as :data:`AUTO_SPLITS`: :func:`auto_splits` per
    product).
    Anything else is an error naming the variable. On the H200 (i2c3f20l2r's convolution,
    1000-atom diamond, 20 channels) 4 splits took the double backward from 2.013 to 1.191 ms,
    while the forward (0.148 -> 0.177 ms) and the backward (0.464 -> 0.487 ms) were slower split
    (RESULTS.md, 2026-12-03)."""
    raw = os.environ.get(variable, "").strip() or str(_SPLITS_DEFAULTS[variable])
    if raw == "auto" and variable == "FLASHCART_TP_SPLITS":
        return AUTO_SPLITS
    if not raw.isdigit() or not 1 <= int(raw) <= _MAX_SPLITS:
        also = " or 'auto'" if variable == "FLASHCART_TP_SPLITS" else ""
        raise ValueError(f"environment variable {variable} must be an integer from 1 to {_MAX_SPLITS}{also}, got {raw!r}")
    return int(raw)


def auto_splits(n_paths: int, channels: int | None = None, static: bool | None = None) -> int:
    """Walk splits of a convolution with ``n_paths`` paths under ``FLASHCART_TP_SPLITS=auto``:
    ``16 // n_paths`` clamped to 1..4 (4 paths: 4, 8: 2, 17: 1). Few paths mean few registers per
    thread, so more programs fit than the one warp per node that an unsplit walk launches (on the
    H200, i2c3f20l2r's first convolution, 4 paths at 64 registers, ran 7.6 warps per
    multiprocessor where 32 fit, at 11 % of the copy roofline; its 17-path second convolution's
    backward is register-bound at 255: RESULTS.md, 2026-12-04). The default: on the H200 it took
    that forward from 0.089 to 0.057 ms, i2c3f20l2r's reduce-overhead force call from 2.452 to
    2.437 ms and its training step from 6.968 to 6.796 ms (RESULTS.md, 2026-12-04, later).

    With static shapes (``static``, default :data:`signatures.STATIC_SHAPES`) and ``channels`` at
    most 32 (a program is one warp), 4 for any path count: the 17-path kernels then hold 128-168
    registers instead of 255, so the split walks' programs fit, and on the H100 (i2c3f20l2r's
    second convolution, 20 channels, weight rows) 4 splits took the backward from 0.666 to
    0.544 ms and the forward from 0.173 to 0.167 ms (0.618 and 0.179 at run-time sizes unsplit;
    RESULTS.md, 2026-12-07 afternoon). At 64 channels (two warps a program) the path rule stays:
    splits were not timed there."""
    if static is None:
        static = STATIC_SHAPES
    if static and channels is not None and channels <= 32:
        return 4
    return max(1, min(4, 16 // max(n_paths, 1)))


# Read at import; tests and benchmarks flip the module attributes.
TP_SPLITS = splits_mode("FLASHCART_TP_SPLITS")
DBWD_SPLITS = splits_mode("FLASHCART_DBWD_SPLITS")


def walk_splits(conv: bool, n_paths: int, double_backward: bool = False, channels: int | None = None) -> int:
    """``SPLITS`` of a launch: :data:`TP_SPLITS` (:data:`DBWD_SPLITS` for the fused double
    backward; :func:`auto_splits` of ``n_paths`` and ``channels`` when ``TP_SPLITS`` is
    :data:`AUTO_SPLITS`) in convolution mode, 1 in dense mode (a row is one step)."""
    if not conv:
        return 1
    if double_backward:
        return DBWD_SPLITS
    return auto_splits(n_paths, channels) if TP_SPLITS == AUTO_SPLITS else TP_SPLITS


def sum_splits(t: Tensor, splits: int) -> Tensor:
    """``[splits * n, ...] -> [n, ...]``: the per-node partial sums of a split walk, added in
    split order (the same bits on every run)."""
    if splits == 1:
        return t
    return t.view(splits, t.shape[0] // splits, *t.shape[1:]).sum(0)
