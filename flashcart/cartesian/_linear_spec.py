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

__all__ = ["LinearSpec", "linear_spec", "linear_key", "launch_table", "n_tiles", "N_COLS", "FWD", "BWD_X", "BWD_W"]

# Table columns (the kernel reads them at these positions): 0-1 M = M_MUL * rows + M_CONST,
# 2 N, 3-4 K = K_MUL * rows + K_CONST, 5 scale fan-in, then the operand descriptors of A, B
# and C at 6, 13 and 20 (off, Di, si_hi, si_lo, Dj, sj_hi, sj_lo): element (i, j) lives at
# off + (i // Di) * si_hi + (i % Di) * si_lo + (j // Dj) * sj_hi + (j % Dj) * sj_lo.
M_MUL, M_CONST, N_SIZE = 0, 1, 2
N_COLS = 27
BIG = 1 << 62  # a divisor no index reaches


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


def _rows(off: int, comps: int, row_stride: int, comp_stride: int) -> list[int]:
    """Operand indexed by ``(row * comps + c, j)``: a rank block inside feature rows."""
    return [off, comps, row_stride, comp_stride, BIG, 0, 1]


def _plain(off: int, stride_i: int, stride_j: int) -> list[int]:
    return [off, BIG, 0, stride_i, BIG, 0, stride_j]


FWD, BWD_X, BWD_W = 0, 1, 2


def launch_table(key: str) -> torch.Tensor:
    """int64 ``[3, n_mixed, N_COLS]``: rows 0/1/2 = forward / input gradient / weight gradient."""
    return torch.tensor(launch_rows(key), dtype=torch.int64).reshape(3, linear_spec(key).n_mixed, N_COLS)


def n_tiles(key: str, kind: int, n_rows: int, bm: int, bn: int) -> int:
    """Programs of one launch (host-side, from the same rows as the table: no device access)."""
    total = 0
    for r in launch_rows(key)[kind]:
        m = r[M_MUL] * n_rows + r[M_CONST]
        total += -(-m // bm) * -(-r[N_SIZE] // bn)
    return total


@lru_cache(maxsize=None)
def launch_rows(key: str) -> tuple:
    s = linear_spec(key)
    fwd, bwd_x, bwd_w = [], [], []
    for l in range(s.n_mixed):
        d, k, fan = 2 * l + 1, s.k[l], s.f_in * s.paths[l]
        # y[row*d+c, o] = sum_k x[row*d+c, k] W[o, k]
        fwd.append(
            [
                d,
                0,
                s.f_out,
                0,
                k,
                fan,
                *_rows(s.in_off[l], d, s.in_width, k),
                *_plain(s.w_off[l], 1, k),
                *_rows(s.out_off[l], d, s.out_width, s.f_out),
            ]
        )
        # gx[row*d+c, k] = sum_o gy[row*d+c, o] W[o, k]
        bwd_x.append(
            [
                d,
                0,
                k,
                0,
                s.f_out,
                fan,
                *_rows(s.out_off[l], d, s.out_width, s.f_out),
                *_plain(s.w_off[l], k, 1),
                *_rows(s.in_off[l], d, s.in_width, k),
            ]
        )
        # gW[o, k] = sum_{row, c} gy[row*d+c, o] x[row*d+c, k]
        bwd_w.append(
            [
                0,
                s.f_out,
                k,
                d,
                0,
                fan,
                s.out_off[l],
                BIG,
                0,
                1,
                d,
                s.out_width,
                s.f_out,
                *_rows(s.in_off[l], d, s.in_width, k),
                *_plain(s.w_off[l], k, 1),
            ]
        )
    return (tuple(map(tuple, fwd)), tuple(map(tuple, bwd_x)), tuple(map(tuple, bwd_w)))
