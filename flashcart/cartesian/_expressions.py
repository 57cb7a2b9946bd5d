"""Backend-neutral expression tables shared by the code emitters.

The emitters (PyTorch source, Triton kernels) never derive mathematics themselves: they
format the exact tables built here from the sympy derivation in ``_symbolic``.

* A product path is a bilinear form ``out[p] = sum c * a[i] * b[j]``. Its vector-Jacobian
  products are again bilinear forms with transposed coefficients:
  ``grad_a[i] = sum c * g[p] * b[j]`` and ``grad_b[j] = sum c * g[p] * a[i]``; the double
  backward is composed of these three forms with other operands.
* An expansion component is a polynomial in ``u = (ux, uy, uz)``; its gradient and Hessian
  are derived from the exact monomial table.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

from ._symbolic import expansion_coefficients, product_coefficients

__all__ = [
    "BilinearTable",
    "product_table",
    "product_vjp_a_table",
    "product_vjp_b_table",
    "expansion_table",
    "expansion_gradient_table",
]

# One output per entry: list of (coefficient, [(i, j), ...]) groups, so that equal
# coefficients multiply a sum of products once.
BilinearTable = tuple[tuple[tuple[Fraction, tuple[tuple[int, int], ...]], ...], ...]


def _group(terms: dict[int, list[tuple[Fraction, int, int]]], n_out: int) -> BilinearTable:
    out = []
    for p in range(n_out):
        by_coef: dict[Fraction, list[tuple[int, int]]] = {}
        for coef, i, j in terms.get(p, []):
            by_coef.setdefault(coef, []).append((i, j))
        out.append(tuple((c, tuple(sorted(ij))) for c, ij in sorted(by_coef.items(), key=lambda t: -abs(t[0]))))
    return tuple(out)


@lru_cache(maxsize=None)
def product_table(l1: int, l2: int, l_out: int) -> BilinearTable:
    """Forward form: entry ``p`` lists ``(c, [(i, j)])`` meaning ``c * a[i] * b[j]``."""
    terms: dict[int, list] = {}
    for (p, i, j), c in product_coefficients(l1, l2, l_out).items():
        terms.setdefault(p, []).append((c, i, j))
    return _group(terms, 2 * l_out + 1)


@lru_cache(maxsize=None)
def product_vjp_a_table(l1: int, l2: int, l_out: int) -> BilinearTable:
    """``grad_a[i] = sum c * g[p] * b[j]``: entry ``i`` lists ``(c, [(p, j)])``."""
    terms: dict[int, list] = {}
    for (p, i, j), c in product_coefficients(l1, l2, l_out).items():
        terms.setdefault(i, []).append((c, p, j))
    return _group(terms, 2 * l1 + 1)


@lru_cache(maxsize=None)
def product_vjp_b_table(l1: int, l2: int, l_out: int) -> BilinearTable:
    """``grad_b[j] = sum c * g[p] * a[i]``: entry ``j`` lists ``(c, [(p, i)])``."""
    terms: dict[int, list] = {}
    for (p, i, j), c in product_coefficients(l1, l2, l_out).items():
        terms.setdefault(j, []).append((c, p, i))
    return _group(terms, 2 * l2 + 1)


@lru_cache(maxsize=None)
def expansion_table(l: int) -> tuple[tuple[tuple[Fraction, tuple[int, int, int]], ...], ...]:
    """Entry ``p``: ``((c, (ex, ey, ez)), ...)`` meaning ``sum c ux^ex uy^ey uz^ez``."""
    return tuple(tuple(sorted(((c, m) for m, c in comp.items()), key=lambda t: t[1], reverse=True)) for comp in expansion_coefficients(l))


@lru_cache(maxsize=None)
def expansion_gradient_table(l: int):
    """``d T_p / d u_k`` as monomial tables: entry ``[p][k]`` like :func:`expansion_table`."""
    out = []
    for comp in expansion_table(l):
        per_axis = []
        for k in range(3):
            acc: dict[tuple[int, int, int], Fraction] = {}
            for c, m in comp:
                if m[k] == 0:
                    continue
                dm = list(m)
                dm[k] -= 1
                acc[tuple(dm)] = acc.get(tuple(dm), Fraction(0)) + c * m[k]
            per_axis.append(tuple((c, m) for m, c in sorted(acc.items(), reverse=True) if c != 0))
        out.append(tuple(per_axis))
    return tuple(out)
