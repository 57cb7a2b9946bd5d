"""Grouped matrix product for equivariant linear maps: every rank in one launch.

Group ``g`` (one tensor rank) computes ``C_g = A_g @ B_g / sqrt(fan_g)`` with
``A_g: [M_g, K_g]``, ``B_g: [K_g, N_g]``. The launch table (``flashcart.cartesian._linear_spec``,
whose column names give the positions read here) gives each size as ``mul * n_rows + const``
and each operand element ``(i, j)`` at
``off + (i // Di) * si_hi + (i % Di) * si_lo + (j // Dj) * sj_hi + (j % Dj) * sj_lo``, which
covers rank blocks ``[rows, 2l+1, channels]`` inside feature rows (``i = row * (2l+1) + c``)
as well as plain weight matrices and their transposes. Programs find their group from tile
counts computed in-kernel from ``n_rows``, so one table serves every row count and nothing
is allocated per call. With ``N_FIRST < N_GROUPS`` one launch runs two maps (a pair): groups
from ``N_FIRST`` on read the second table (``table2_ptr``) and operands (``a2_ptr``, ``b2_ptr``,
``c2_ptr``); single maps pass ``N_FIRST = N_GROUPS`` (the second pointers then unread).
With ``SPLIT > 1`` the reduction is split over a second grid axis
into ``SPLIT`` partial results (``c_split_stride`` apart) that the caller sums: weight
gradients reduce over all rows; the forward and the input gradient may split their reduction
over paths x channels (``ops.RowMapSplit``, off by default).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import triton
import triton.language as tl

from .._linear_spec import COLUMN, OPERAND_FIELDS, UNIT_BITS, unit_axes, unit_axes_of_rows

_TILES_ENV = "FLASHCART_LINEAR_TILES"


class LinearTiles(NamedTuple):
    """Tile shape and launch options of :func:`grouped_matmul`: ``bm x bn`` outputs per
    program, ``bk`` of the reduction per step, ``warps`` warps, ``stages`` software-pipeline
    stages (``None``: Triton's default), and the ``tl.dot`` precision of float32 operands
    (``ieee``: FP32 arithmetic, the default; ``tf32x3``: three TF32 tensor-core products whose
    sum keeps about FP32 accuracy)."""

    bm: int = 32
    bn: int = 32
    bk: int = 32
    warps: int = 4
    stages: int | None = None
    precision: str = "ieee"


_PRECISIONS = ("ieee", "tf32x3")

# Without FLASHCART_LINEAR_TILES the tile follows the layer's channels. On the H200
# (2026-12-01, benchmarks/linear_tiles.py, float32, CUDA-graph replays, forward + input
# gradient at the 1000-atom diamond's rows) the wide tile took i3c3f64l2's 27 maps from
# 4.49 ms (32x32x32, 4 warps) to 3.47 ms, and the narrow one i2c3f20l2r's 14 maps (20
# channels) from 0.372 ms to 0.338 ms.
NARROW_TILES = LinearTiles(32, 32, 16, 4, 2)
WIDE_TILES = LinearTiles(64, 64, 16, 4, 2)
WIDE_FROM_CHANNELS = 64


def default_tiles(f_in: int, f_out: int, use_dot: bool = True) -> LinearTiles:
    """The tiles of a linear map from ``f_in`` to ``f_out`` channels when none are set: wide
    from :data:`WIDE_FROM_CHANNELS` channels on both sides, narrow below, and narrow without
    ``tl.dot`` (float64 on CUDA: the broadcast product of a wide tile spills registers)."""
    return WIDE_TILES if use_dot and min(f_in, f_out) >= WIDE_FROM_CHANNELS else NARROW_TILES


def linear_tiles(raw: str | None = None) -> LinearTiles | None:
    """The tiles of ``FLASHCART_LINEAR_TILES`` (``BMxBNxBK[xWARPS[xSTAGES]][:PRECISION]``),
    or ``None`` where it is unset or empty (each layer then takes :func:`default_tiles`);
    sizes are powers of two of at least 16 (``tl.dot``'s smallest); ``PRECISION`` is ``ieee``
    or ``tf32x3``."""
    raw = os.environ.get(_TILES_ENV, "") if raw is None else raw
    if not raw:
        return None
    shape, _, precision = raw.lower().partition(":")
    precision = precision or "ieee"
    try:
        values = [int(v) for v in shape.split("x")]
    except ValueError:
        values = []
    if precision not in _PRECISIONS:
        values = []
    ok = 3 <= len(values) <= 5 and all(v >= 16 and v & (v - 1) == 0 for v in values[:3])
    ok = ok and all(v >= 1 for v in values[3:]) and (len(values) < 4 or values[3] & (values[3] - 1) == 0)
    if not ok:
        raise ValueError(
            f"environment variable {_TILES_ENV} must be BMxBNxBK[xWARPS[xSTAGES]][:PRECISION] with BM, BN, BK powers "
            f"of two >= 16, WARPS a power of two and PRECISION one of {', '.join(_PRECISIONS)}, got {raw!r}"
        )
    return LinearTiles(*values, precision=precision)


# Without ``tl.dot`` (float64 on CUDA: the broadcast product) contiguous B operands make the
# compiler convert layouts in registers: compiled for sm_90 the 32 x 32 x 16 tile then spills
# 184-312 bytes, against none with the A and C axes alone.
_NO_DOT_UNIT_MASK = UNIT_BITS["a", "i"] | UNIT_BITS["a", "j"] | UNIT_BITS["c", "i"] | UNIT_BITS["c", "j"]


def kernel_unit_axes(key: str, kind: int, use_dot: bool) -> tuple[int, int]:
    """``(UNIT, ALIGN)`` for :func:`grouped_matmul` running launch ``kind`` of linear map ``key``:
    :func:`~flashcart.cartesian._linear_spec.unit_axes`, without B's axes when the product is
    not a ``tl.dot``."""
    unit, align = unit_axes(key, kind)
    return (unit if use_dot else unit & _NO_DOT_UNIT_MASK), align


def kernel_unit_axes_of_rows(rows: tuple, use_dot: bool) -> tuple[int, int]:
    """:func:`kernel_unit_axes` of the launch-table ``rows`` of one launch (a pair of maps: both
    maps' rows, so the axes and alignment hold in every group of either)."""
    unit, align = unit_axes_of_rows(tuple(rows))
    return (unit if use_dot else unit & _NO_DOT_UNIT_MASK), align


# Column positions, derived from the column names of the table builder (``_linear_spec``).
_M_MUL = tl.constexpr(COLUMN["m_mul"])
_M_CONST = tl.constexpr(COLUMN["m_const"])
_N_SIZE = tl.constexpr(COLUMN["n_size"])
_K_MUL = tl.constexpr(COLUMN["k_mul"])
_K_CONST = tl.constexpr(COLUMN["k_const"])
_FAN = tl.constexpr(COLUMN["fan"])
_A = tl.constexpr(COLUMN["a_off"])  # first column of each operand descriptor
_B = tl.constexpr(COLUMN["b_off"])
_C = tl.constexpr(COLUMN["c_off"])
# positions inside a descriptor (relative to its ``off`` column)
_OFF = tl.constexpr(OPERAND_FIELDS.index("off"))
_DI = tl.constexpr(OPERAND_FIELDS.index("di"))
_SI_HI = tl.constexpr(OPERAND_FIELDS.index("si_hi"))
_SI_LO = tl.constexpr(OPERAND_FIELDS.index("si_lo"))
_DJ = tl.constexpr(OPERAND_FIELDS.index("dj"))
_SJ_HI = tl.constexpr(OPERAND_FIELDS.index("sj_hi"))
_SJ_LO = tl.constexpr(OPERAND_FIELDS.index("sj_lo"))
if any(COLUMN[f"{x}_{f}"] != COLUMN[f"{x}_off"] + i for x in "abc" for i, f in enumerate(OPERAND_FIELDS)):
    raise AssertionError("_linear_spec.COLUMNS must list each operand's fields together, in OPERAND_FIELDS order")


@triton.jit
def _part(idx, d, s_hi, s_lo):
    """The offset of index ``idx`` along one matrix axis: ``(idx // d) * s_hi + (idx % d) * s_lo``.

    The division runs in 32 bits (indices are below 2**31: a matrix side is at most rows x 7
    components), the offset in 64 bits; 64-bit division is a long software sequence on GPUs."""
    i32 = idx.to(tl.int32)
    d32 = d.to(tl.int32)
    q = i32 // d32
    return q.to(tl.int64) * s_hi + (i32 - q * d32).to(tl.int64) * s_lo


@triton.jit
def _axis(idx, d, s_hi, s_lo, unit: tl.constexpr, align: tl.constexpr):
    """The offset part of one axis: ``idx`` itself on a unit axis (``d`` no index reaches,
    ``s_hi = 0``, ``s_lo = 1``), else :func:`_part`, whose values are multiples of ``align``
    (both strides are)."""
    if unit:
        return idx.to(tl.int64)
    part = _part(idx, d, s_hi, s_lo)
    if align > 1:
        part = tl.multiple_of(part, align)
    return part


# Bits of grouped_matmul's UNIT: the axes (i: rows, j: columns) of operands A, B and C whose
# offset is the index itself in every group (``_linear_spec.unit_axes``).
A_I = tl.constexpr(UNIT_BITS["a", "i"])
A_J = tl.constexpr(UNIT_BITS["a", "j"])
B_I = tl.constexpr(UNIT_BITS["b", "i"])
B_J = tl.constexpr(UNIT_BITS["b", "j"])
C_I = tl.constexpr(UNIT_BITS["c", "i"])
C_J = tl.constexpr(UNIT_BITS["c", "j"])


@triton.jit(do_not_specialize=["n_rows"])
def grouped_matmul(
    a_ptr,
    b_ptr,
    c_ptr,
    table_ptr,
    n_rows,
    c_split_stride,
    a2_ptr,
    b2_ptr,
    c2_ptr,
    table2_ptr,
    N_GROUPS: tl.constexpr,
    N_FIRST: tl.constexpr,
    NCOL: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    USE_DOT: tl.constexpr,
    SPLIT: tl.constexpr,
    UNIT: tl.constexpr,
    ALIGN: tl.constexpr,
    PRECISION: tl.constexpr = "ieee",
):
    pid = tl.cast(tl.program_id(0), tl.int64)
    split = tl.cast(tl.program_id(1), tl.int64)
    rows = tl.cast(n_rows, tl.int64)
    # which group this tile belongs to (groups with no tiles are skipped by the later ones)
    g = tl.cast(0, tl.int64)
    g_start = tl.cast(0, tl.int64)
    start = tl.cast(0, tl.int64)
    for i in tl.static_range(N_GROUPS):
        # groups from N_FIRST on are the second map's (a pair of maps in one launch), in its table
        if i < N_FIRST:
            t_i = table_ptr + i * NCOL
        else:
            t_i = table2_ptr + (i - N_FIRST) * NCOL
        m_i = tl.load(t_i + _M_MUL) * rows + tl.load(t_i + _M_CONST)
        n_i = tl.load(t_i + _N_SIZE)
        sel = pid >= start
        g = tl.where(sel, i, g)
        g_start = tl.where(sel, start, g_start)
        start += ((m_i + BM - 1) // BM) * ((n_i + BN - 1) // BN)
    if N_FIRST < N_GROUPS:  # a pair: the tile's map picks the operands (one select per pointer)
        second = g >= N_FIRST
        tab = tl.where(second, table2_ptr + (g - N_FIRST) * NCOL, table_ptr + g * NCOL)
        a_base = tl.where(second, a2_ptr, a_ptr)
        b_base = tl.where(second, b2_ptr, b_ptr)
        c_base = tl.where(second, c2_ptr, c_ptr)
    else:
        tab = table_ptr + g * NCOL
        a_base = a_ptr
        b_base = b_ptr
        c_base = c_ptr
    m_size = tl.load(tab + _M_MUL) * rows + tl.load(tab + _M_CONST)
    n_size = tl.load(tab + _N_SIZE)
    k_size = tl.load(tab + _K_MUL) * rows + tl.load(tab + _K_CONST)
    fan = tl.load(tab + _FAN)
    tile = pid - g_start
    tiles_n = (n_size + BN - 1) // BN
    tm = tile // tiles_n
    tn = tile % tiles_n
    rm = tm * BM + tl.arange(0, BM)
    rn = tn * BN + tl.arange(0, BN)
    m_mask = rm < m_size
    n_mask = rn < n_size
    acc = tl.zeros([BM, BN], dtype=c_ptr.dtype.element_ty)
    k_chunk = ((k_size + SPLIT - 1) // SPLIT + BK - 1) // BK * BK
    k_lo = split * k_chunk
    k_hi = tl.minimum(k_lo + k_chunk, k_size)
    # the operand descriptors and the row (A) / column (B) parts of the addresses do not change
    # along K: computed once, not per K step. The descriptor loads stay in this function, not in
    # a jit helper: inductor's access analysis treats a helper's arguments that feed a store
    # address as written, so a helper taking ``tab`` made it clone and copy back the launch table
    # around every inlined launch (and corrupt it, an illegal address on the H200).
    a_off0 = tl.load(tab + _A + _OFF)
    b_off0 = tl.load(tab + _B + _OFF)
    if ALIGN > 1:
        a_off0 = tl.multiple_of(a_off0, ALIGN)
        b_off0 = tl.multiple_of(b_off0, ALIGN)
    a_di = tl.load(tab + _A + _DI)
    a_si_hi = tl.load(tab + _A + _SI_HI)
    a_si_lo = tl.load(tab + _A + _SI_LO)
    a_dj = tl.load(tab + _A + _DJ)
    a_sj_hi = tl.load(tab + _A + _SJ_HI)
    a_sj_lo = tl.load(tab + _A + _SJ_LO)
    b_di = tl.load(tab + _B + _DI)
    b_si_hi = tl.load(tab + _B + _SI_HI)
    b_si_lo = tl.load(tab + _B + _SI_LO)
    b_dj = tl.load(tab + _B + _DJ)
    b_sj_hi = tl.load(tab + _B + _SJ_HI)
    b_sj_lo = tl.load(tab + _B + _SJ_LO)
    # UNIT (bits A_I, A_J, B_I, B_J, C_I, C_J): axes whose offset is the index itself in every
    # group of the table (no division, contiguous: vector loads and stores); ALIGN: the base
    # offsets, the other axes' strides and the sizes along unit axes are multiples of it (the
    # host checked: _linear_spec.unit_axes), which lets the compiler prove the vectors' alignment.
    a_rows = a_off0 + _axis(rm, a_di, a_si_hi, a_si_lo, A_I & UNIT, ALIGN)  # [BM]
    b_cols = b_off0 + _axis(rn, b_dj, b_sj_hi, b_sj_lo, B_J & UNIT, ALIGN)  # [BN]
    if ALIGN > 1:
        if (A_J | B_I) & UNIT:
            k_hi = tl.multiple_of(k_hi, ALIGN)
        if (A_I | C_I) & UNIT:
            m_mask = rm < tl.multiple_of(m_size, ALIGN)
        if (B_J | C_J) & UNIT:
            n_mask = rn < tl.multiple_of(n_size, ALIGN)
    for k0 in range(k_lo, k_hi, BK):
        rk = tl.multiple_of(k0, BK) + tl.arange(0, BK)
        k_mask = rk < k_hi
        a_off = a_rows[:, None] + _axis(rk, a_dj, a_sj_hi, a_sj_lo, A_J & UNIT, ALIGN)[None, :]
        b_off = _axis(rk, b_di, b_si_hi, b_si_lo, B_I & UNIT, ALIGN)[:, None] + b_cols[None, :]
        a = tl.load(a_base + a_off, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_base + b_off, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if USE_DOT:
            acc += tl.dot(a, b, input_precision=PRECISION)
        else:
            acc += tl.sum(a[:, :, None] * b[None, :, :], axis=1)
    # 1 / sqrt(fan), correctly rounded (0 for a rank without paths)
    fan1 = tl.maximum(fan, 1)
    if c_ptr.dtype.element_ty == tl.float64:
        scale = 1.0 / tl.sqrt(tl.cast(fan1, tl.float64))
    else:
        s32 = tl.div_rn(tl.full([], 1.0, tl.float32), tl.sqrt_rn(tl.cast(fan1, tl.float32)))
        scale = tl.cast(s32, c_ptr.dtype.element_ty)
    scale = tl.where(fan > 0, scale, tl.zeros_like(scale))
    c_off0 = tl.load(tab + _C + _OFF)
    if ALIGN > 1:
        c_off0 = tl.multiple_of(c_off0, ALIGN)
    c_di = tl.load(tab + _C + _DI)
    c_si_hi = tl.load(tab + _C + _SI_HI)
    c_si_lo = tl.load(tab + _C + _SI_LO)
    c_dj = tl.load(tab + _C + _DJ)
    c_sj_hi = tl.load(tab + _C + _SJ_HI)
    c_sj_lo = tl.load(tab + _C + _SJ_LO)
    c_off = (
        c_off0
        + _axis(rm, c_di, c_si_hi, c_si_lo, C_I & UNIT, ALIGN)[:, None]
        + _axis(rn, c_dj, c_sj_hi, c_sj_lo, C_J & UNIT, ALIGN)[None, :]
    )
    tl.store(c_base + split * c_split_stride + c_off, acc * scale, mask=m_mask[:, None] & n_mask[None, :])
