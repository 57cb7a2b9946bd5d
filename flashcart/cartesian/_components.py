"""Stored components of irreducible Cartesian tensors (pure Python, no sympy).

A component of a rank-``l`` symmetric tensor is named by its index counts ``(a, b, c)``
(numbers of x, y and z indices, ``a + b + c = l``). Only components with ``c <= 1`` are
stored; the others follow from tracelessness (``../spec/cartesian.md`` section 1).
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import factorial

__all__ = [
    "stored_components",
    "full_components",
    "component_in_stored",
    "multinomial",
    "double_factorial",
    "dim",
]


def dim(l: int) -> int:
    """Number of stored components of rank ``l``: ``2 l + 1``."""
    return 2 * l + 1


def double_factorial(n: int) -> int:
    """``n!!`` with ``(-1)!! = 0!! = 1``."""
    if n <= 0:
        return 1
    out = 1
    while n > 1:
        out *= n
        n -= 2
    return out


def multinomial(a: int, b: int, c: int) -> int:
    """Number of index orderings of a component with counts ``(a, b, c)``."""
    return factorial(a + b + c) // (factorial(a) * factorial(b) * factorial(c))


@lru_cache(maxsize=None)
def stored_components(l: int) -> tuple[tuple[int, int, int], ...]:
    """Stored components of rank ``l`` in storage order (spec section 1)."""
    if l < 0:
        raise ValueError(f"tensor rank must be >= 0, got {l}")
    if l == 0:
        return ((0, 0, 0),)
    if l == 1:
        return ((1, 0, 0), (0, 1, 0), (0, 0, 1))
    if l == 2:
        return ((2, 0, 0), (0, 2, 0), (1, 1, 0), (1, 0, 1), (0, 1, 1))
    if l == 3:
        return ((3, 0, 0), (2, 1, 0), (2, 0, 1), (1, 2, 0), (1, 1, 1), (0, 2, 1), (0, 3, 0))
    c0 = tuple((a, l - a, 0) for a in range(l, -1, -1))
    c1 = tuple((a, l - 1 - a, 1) for a in range(l - 1, -1, -1))
    return c0 + c1


@lru_cache(maxsize=None)
def full_components(l: int) -> tuple[tuple[int, int, int], ...]:
    """All index-count triples of rank ``l`` (any order, c unrestricted)."""
    return tuple((a, b, l - a - b) for a in range(l, -1, -1) for b in range(l - a, -1, -1))


@lru_cache(maxsize=None)
def component_in_stored(a: int, b: int, c: int) -> tuple[tuple[int, Fraction], ...]:
    """Express component ``(a, b, c)`` as a linear combination of stored components.

    Returns ``((stored_index, coefficient), ...)`` using the traceless recursion
    ``T(a, b, c) = -T(a+2, b, c-2) - T(a, b+2, c-2)``.
    """
    l = a + b + c
    if c <= 1:
        return ((stored_components(l).index((a, b, c)), Fraction(1)),)
    acc: dict[int, Fraction] = {}
    for sub in (component_in_stored(a + 2, b, c - 2), component_in_stored(a, b + 2, c - 2)):
        for idx, coef in sub:
            acc[idx] = acc.get(idx, Fraction(0)) - coef
    return tuple((i, v) for i, v in sorted(acc.items()) if v != 0)
