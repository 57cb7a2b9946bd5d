"""Symbolic derivation of ICT operations with sympy.

Symmetric rank-``l`` tensors are identified with homogeneous degree-``l`` polynomials,
``p(x) = S_{i1..il} x_i1 ... x_il``; symmetric traceless tensors with harmonic ones.
Then

* symmetrisation is implicit, and component ``(a, b, c)`` is the coefficient of
  ``x^a y^b z^c`` divided by the multinomial ``l! / (a! b! c!)``;
* contracting ``k`` index pairs of two symmetric tensors is
  ``(l1-k)! (l2-k)! / (l1! l2!) * sum_M d_M A(x) d_M B(x)`` over all ``k``-tuples ``M``;
* the traceless projection is the harmonic projection
  ``H[p] = sum_j (-1)^j (2L-2j-1)!! / ((2j)!! (2L-1)!!) |x|^{2j} Laplacian^j p``.

Every derivation returns exact rational coefficients; the emitters turn them into code.
A product path is a bilinear form ``out[p] = sum_ij C[p][i][j] a[i] b[j]``; its first and
second derivatives are derived here too (by sympy differentiation) so that every
backend emits the same expressions.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import factorial

from sympy import QQ, Rational
from sympy.polys.rings import ring

from ._components import (
    component_in_stored,
    dim,
    double_factorial,
    full_components,
    multinomial,
    stored_components,
)
from ._paths import path_normalization

__all__ = ["product_coefficients", "expansion_coefficients", "Bilinear"]

# Bilinear coefficients: {(p, i, j): Fraction}, sparse.
Bilinear = dict[tuple[int, int, int], Fraction]


def _tensor_polynomial(R, xyz, comps, l: int):
    """Polynomial of the rank-``l`` ICT whose stored components are the ring elements ``comps``."""
    x, y, z = xyz
    poly = R.zero
    for a, b, c in full_components(l):
        value = R.zero
        for idx, coef in component_in_stored(a, b, c):
            value += comps[idx] * QQ(coef.numerator, coef.denominator)
        poly += value * multinomial(a, b, c) * x**a * y**b * z**c
    return poly


def _harmonic_projection(poly, xyz, degree: int):
    """Harmonic (traceless) projection of a homogeneous polynomial of ``degree``."""
    x, y, z = xyz
    r2 = x * x + y * y + z * z
    out = poly
    lap = poly
    r2j = 1
    for j in range(1, degree // 2 + 1):
        lap = lap.diff(x).diff(x) + lap.diff(y).diff(y) + lap.diff(z).diff(z)
        r2j = r2j * r2
        coef = QQ(
            (-1) ** j * double_factorial(2 * degree - 2 * j - 1),
            double_factorial(2 * j) * double_factorial(2 * degree - 1),
        )
        out = out + lap * r2j * coef
    return out


def _stored_from_polynomial(poly, xyz, l: int, gens_offset: int):
    """Stored components of a symmetric rank-``l`` polynomial, as dicts over the other gens."""
    out = []
    for a, b, c in stored_components(l):
        monom_coeffs = {}
        for monom, coef in poly.terms():
            if monom[0] == a and monom[1] == b and monom[2] == c:
                monom_coeffs[monom[gens_offset:]] = coef / multinomial(a, b, c)
        out.append(monom_coeffs)
    return out


@lru_cache(maxsize=None)
def product_coefficients(l1: int, l2: int, l_out: int) -> Bilinear:
    """Exact bilinear coefficients of path ``(l1, l2) -> l_out`` on stored components."""
    n1, n2 = dim(l1), dim(l2)
    names = ["x", "y", "z"] + [f"a{i}" for i in range(n1)] + [f"b{j}" for j in range(n2)]
    R, *gens = ring(",".join(names), QQ)
    xyz = gens[:3]
    a_syms, b_syms = gens[3 : 3 + n1], gens[3 + n1 :]
    pa = _tensor_polynomial(R, xyz, a_syms, l1)
    pb = _tensor_polynomial(R, xyz, b_syms, l2)
    k = (l1 + l2 - l_out) // 2
    x, y, z = xyz
    contracted = R.zero
    for i in range(k + 1):
        for j in range(k - i + 1):
            m = k - i - j
            da, db = pa, pb
            for var, n in ((x, i), (y, j), (z, m)):
                for _ in range(n):
                    da, db = da.diff(var), db.diff(var)
            contracted += da * db * multinomial(i, j, m)
    contracted = contracted * QQ(factorial(l1 - k) * factorial(l2 - k), factorial(l1) * factorial(l2))
    projected = _harmonic_projection(contracted, xyz, l_out)
    norm = path_normalization(l1, l2, l_out)
    norm_qq = QQ(norm.numerator, norm.denominator)
    coeffs: Bilinear = {}
    for p, monoms in enumerate(_stored_from_polynomial(projected, xyz, l_out, 3)):
        for monom, coef in monoms.items():
            i = monom[:n1].index(1)
            j = monom[n1:].index(1)
            value = coef * norm_qq
            if value != 0:
                coeffs[(p, i, j)] = Fraction(int(value.numerator), int(value.denominator))
    return coeffs


@lru_cache(maxsize=None)
def expansion_coefficients(l: int) -> tuple[dict[tuple[int, int, int], Fraction], ...]:
    """Stored components of ``T^l(u)`` as polynomials in ``u``.

    Returns one dict per stored component mapping exponent triples ``(ex, ey, ez)`` of
    ``ux^ex uy^ey uz^ez`` to exact coefficients (spec section 2).
    """
    R, x, y, z, ux, uy, uz = ring("x,y,z,ux,uy,uz", QQ)
    poly = (ux * x + uy * y + uz * z) ** l
    projected = _harmonic_projection(poly, (x, y, z), l)
    scale = QQ(double_factorial(2 * l - 1), factorial(l))
    out = []
    for monoms in _stored_from_polynomial(projected, (x, y, z), l, 3):
        out.append({tuple(m): Fraction(int((c * scale).numerator), int((c * scale).denominator)) for m, c in monoms.items() if c != 0})
    return tuple(out)


def rational(value: Fraction) -> Rational:
    """A sympy Rational from a Fraction."""
    return Rational(value.numerator, value.denominator)
