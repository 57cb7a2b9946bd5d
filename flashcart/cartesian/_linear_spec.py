"""Layout of an equivariant linear map and the launch table of its grouped-matmul kernel.

A linear map is named by a key ``"in_l|out_l|F_in|F_out|p0,p1,..."`` (``p_l``: paths per
input rank). Its flat weight vector holds ``W_l: [F_out, p_l * F_in]`` rank after rank.

The launch table (int64 ``[3, groups, N_COLS]``: forward, input gradient, weight gradient)
describes every rank as one matrix product whose sizes are ``mul * rows + const``, so one
table serves any row count. It is built when the layer is constructed and travels with it
as a buffer: nothing is allocated at call time, which CUDA-graph capture requires.
"""

from __future__ import annotations

from functools import lru_cache

import torch

__all__ = [
    "LinearSpec",
    "linear_spec",
    "linear_key",
    "launch_table",
    "n_tiles",
    "unit_axes",
    "unit_axes_of_rows",
    "UNIT_BITS",
    "COLUMNS",
    "COLUMN",
    "OPERAND_FIELDS",
    "N_COLS",
    "FWD",
    "BWD_X",
    "BWD_W",
]

# The table columns, named once: the kernel (``_triton/linear_kernel.py``) derives the positions
# it reads from these lists. Sizes: M = m_mul * rows + m_const, N = n_size,
# K = k_mul * rows + k_const; ``fan``: the fan-in of the 1/sqrt(fan) scale. Then one descriptor
# per operand A, B, C (``a_off``, ``a_di``, ...): element (i, j) lives at
# off + (i // di) * si_hi + (i % di) * si_lo + (j // dj) * sj_hi + (j % dj) * sj_lo.
OPERAND_FIELDS = ("off", "di", "si_hi", "si_lo", "dj", "sj_hi", "sj_lo")
COLUMNS = ("m_mul", "m_const", "n_size", "k_mul", "k_const", "fan") + tuple(f"{x}_{f}" for x in "abc" for f in OPERAND_FIELDS)
COLUMN = {name: i for i, name in enumerate(COLUMNS)}
N_COLS = len(COLUMNS)
# A divisor no index reaches. The kernel divides in 32 bits (grouped_matmul's _part), so every
# divisor must fit in int32: matrix sides (rows x components) stay below 2**30.
BIG = 1 << 30


class LinearSpec:
    """Offsets and sizes of one linear map (see the module docstring for the key)."""

    def __init__(self, key: str):
        in_l, out_l, f_in, f_out, paths = key.split("|")
        self.in_l_max, self.out_l_max = int(in_l), int(out_l)
        self.f_in, self.f_out = int(f_in), int(f_out)
        self.paths = [int(p) for p in paths.split(",")]
        self.n_mixed = min(self.in_l_max, self.out_l_max) + 1
        self.k = [p * self.f_in for p in self.paths]
        self.in_off, self.out_off, self.w_off = [], [], []
        a = b = c = 0
        for l in range(self.in_l_max + 1):
            self.in_off.append(a)
            a += (2 * l + 1) * self.k[l]
        self.in_width = a
        for l in range(self.out_l_max + 1):
            self.out_off.append(b)
            b += (2 * l + 1) * self.f_out
        self.out_width = b
        for l in range(self.n_mixed):
            self.w_off.append(c)
            c += self.f_out * self.k[l]
        self.w_numel = c


@lru_cache(maxsize=None)
def linear_spec(key: str) -> LinearSpec:
    return LinearSpec(key)


def linear_key(in_l_max: int, out_l_max: int, f_in: int, f_out: int, paths: list[int]) -> str:
    return f"{in_l_max}|{out_l_max}|{f_in}|{f_out}|{','.join(map(str, paths))}"


def _rows(off: int, comps: int, row_stride: int, comp_stride: int) -> dict[str, int]:
    """Operand indexed by ``(row * comps + c, j)``: a rank block inside feature rows."""
    return dict(off=off, di=comps, si_hi=row_stride, si_lo=comp_stride, dj=BIG, sj_hi=0, sj_lo=1)


def _cols(off: int, comps: int, row_stride: int, comp_stride: int) -> dict[str, int]:
    """Operand indexed by ``(i, row * comps + c)``: the transpose of :func:`_rows`."""
    return dict(off=off, di=BIG, si_hi=0, si_lo=1, dj=comps, sj_hi=row_stride, sj_lo=comp_stride)


def _plain(off: int, stride_i: int, stride_j: int) -> dict[str, int]:
    return dict(off=off, di=BIG, si_hi=0, si_lo=stride_i, dj=BIG, sj_hi=0, sj_lo=stride_j)


def _row(m: tuple[int, int], n: int, k: tuple[int, int], fan: int, a: dict, b: dict, c: dict) -> tuple[int, ...]:
    """One table row in :data:`COLUMNS` order; ``m``/``k``: (rows multiplier, constant)."""
    named = dict(m_mul=m[0], m_const=m[1], n_size=n, k_mul=k[0], k_const=k[1], fan=fan)
    for x, desc in (("a", a), ("b", b), ("c", c)):
        named.update({f"{x}_{f}": desc[f] for f in OPERAND_FIELDS})
    return tuple(named[name] for name in COLUMNS)


FWD, BWD_X, BWD_W = 0, 1, 2


def launch_table(key: str) -> torch.Tensor:
    """int64 ``[3, n_mixed, N_COLS]``: rows 0/1/2 = forward / input gradient / weight gradient."""
    return torch.tensor(launch_rows(key), dtype=torch.int64).reshape(3, linear_spec(key).n_mixed, N_COLS)


def n_tiles(key: str, kind: int, n_rows: int, bm: int, bn: int) -> int:
    """Programs of one launch (host-side, from the same rows as the table: no device access)."""
    total = 0
    for r in launch_rows(key)[kind]:
        m = r[COLUMN["m_mul"]] * n_rows + r[COLUMN["m_const"]]
        total += -(-m // bm) * -(-r[COLUMN["n_size"]] // bn)
    return total


@lru_cache(maxsize=None)
def launch_rows(key: str) -> tuple:
    s = linear_spec(key)
    fwd, bwd_x, bwd_w = [], [], []
    for l in range(s.n_mixed):
        d, k, fan = 2 * l + 1, s.k[l], s.f_in * s.paths[l]
        # y[row*d+c, o] = sum_k x[row*d+c, k] W[o, k]
        fwd.append(
            _row(
                m=(d, 0),
                n=s.f_out,
                k=(0, k),
                fan=fan,
                a=_rows(s.in_off[l], d, s.in_width, k),
                b=_plain(s.w_off[l], 1, k),
                c=_rows(s.out_off[l], d, s.out_width, s.f_out),
            )
        )
        # gx[row*d+c, k] = sum_o gy[row*d+c, o] W[o, k]
        bwd_x.append(
            _row(
                m=(d, 0),
                n=k,
                k=(0, s.f_out),
                fan=fan,
                a=_rows(s.out_off[l], d, s.out_width, s.f_out),
                b=_plain(s.w_off[l], k, 1),
                c=_rows(s.in_off[l], d, s.in_width, k),
            )
        )
        # gW[o, k] = sum_{row, c} gy[row*d+c, o] x[row*d+c, k]
        bwd_w.append(
            _row(
                m=(0, s.f_out),
                n=k,
                k=(d, 0),
                fan=fan,
                a=_cols(s.out_off[l], d, s.out_width, s.f_out),
                b=_rows(s.in_off[l], d, s.in_width, k),
                c=_plain(s.w_off[l], k, 1),
            )
        )
    return (tuple(fwd), tuple(bwd_x), tuple(bwd_w))


# grouped_matmul's UNIT bits (linear_kernel.A_I ...): operand, axis.
UNIT_BITS = {("a", "i"): 1, ("a", "j"): 2, ("b", "i"): 4, ("b", "j"): 8, ("c", "i"): 16, ("c", "j"): 32}


@lru_cache(maxsize=None)
def unit_axes(key: str, kind: int) -> tuple[int, int]:
    """``(UNIT, ALIGN)`` of launch ``kind`` of map ``key`` for the grouped matmul.

    ``UNIT``: the :data:`UNIT_BITS` of the operand axes whose offset is the index itself in every
    group (the axis's divisor is :data:`BIG`, its high stride 0 and its low stride 1: contiguous,
    no division). ``ALIGN`` (1, 2 or 4): the largest that divides every operand's base offset and
    strides and, along the unit axes, the sizes (``mul * rows + const`` with both multiples), so
    that contiguous runs start aligned and masks do not change inside a run of ``ALIGN``.
    """
    return unit_axes_of_rows(launch_rows(key)[kind])


def unit_axes_of_rows(rows: tuple) -> tuple[int, int]:
    """:func:`unit_axes` of launch-table ``rows`` (one launch's groups: a map's, or a pair's)."""
    unit = 0
    for (x, axis), bit in UNIT_BITS.items():
        d, hi, lo = (f"{x}_d{axis}", f"{x}_s{axis}_hi", f"{x}_s{axis}_lo")
        if all(r[COLUMN[d]] == BIG and r[COLUMN[hi]] == 0 and r[COLUMN[lo]] == 1 for r in rows):
            unit |= bit
    values = [r[COLUMN[f"{x}_off"]] for r in rows for x in "abc"]
    values += [
        r[COLUMN[f"{x}_s{axis}_{part}"]] for r in rows for (x, axis), bit in UNIT_BITS.items() if not unit & bit for part in ("hi", "lo")
    ]
    sizes = {"i": ("m_mul", "m_const"), "j": ("n_size",), "k": ("k_mul", "k_const")}
    along = set()
    if unit & (UNIT_BITS["a", "i"] | UNIT_BITS["c", "i"]):
        along.add("i")
    if unit & (UNIT_BITS["b", "j"] | UNIT_BITS["c", "j"]):
        along.add("j")
    if unit & (UNIT_BITS["a", "j"] | UNIT_BITS["b", "i"]):
        along.add("k")
    values += [r[COLUMN[c]] for r in rows for a in along for c in sizes[a]]
    align = 4
    while align > 1 and any(v % align for v in values):
        align //= 2
    return unit, align
