"""Tensor-product paths: enumeration, order and normalisation (spec section 3)."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import factorial

from ._components import double_factorial

__all__ = ["Path", "enumerate_paths", "path_normalization", "path_allowed"]


@dataclass(frozen=True)
class Path:
    """One product path: rank ``l1`` of input 1 times rank ``l2`` of input 2 gives rank ``l_out``."""

    l1: int
    l2: int
    l_out: int

    @property
    def n_contractions(self) -> int:
        """Number of contracted index pairs ``k = (l1 + l2 - l_out) / 2``."""
        return (self.l1 + self.l2 - self.l_out) // 2


def path_allowed(l1: int, l2: int, l_out: int) -> bool:
    """Triangle rule with natural parity: ``|l1-l2| <= L <= l1+l2`` and ``l1+l2+L`` even."""
    return abs(l1 - l2) <= l_out <= l1 + l2 and (l1 + l2 + l_out) % 2 == 0


def path_normalization(l1: int, l2: int, l_out: int) -> Fraction:
    """The exact factor ``N(l1, l2, L)`` of spec section 3."""
    if not path_allowed(l1, l2, l_out):
        raise ValueError(f"path ({l1}, {l2}) -> {l_out} is not allowed")
    k = (l1 + l2 - l_out) // 2
    j = l1 + l2 + l_out
    j1, j2, j3 = j - 2 * l1 - 1, j - 2 * l2 - 1, j - 2 * l_out - 1
    c = Fraction(
        factorial(l1) * factorial(l2) * double_factorial(2 * l_out - 1) * factorial((j1 + 1) // 2) * factorial((j2 + 1) // 2),
        factorial(l_out) * double_factorial(j1) * double_factorial(j2) * double_factorial(j3) * factorial(j // 2),
    )
    return Fraction(factorial(l_out), factorial(l1 - k) * factorial(l2 - k)) * c


def enumerate_paths(in1_l_max: int, in2_l_max: int, out_l_max: int, symmetric: bool = False) -> list[Path]:
    """All paths in weight-layout order.

    For each output rank ascending: canonical pairs ``l1 >= l2`` by increasing ``l1``
    then ``l2`` (kept if they fit the input limits), then, unless ``symmetric``, the
    swapped pairs (rank ``l2`` from input 1, ``l1`` from input 2) of each canonical pair
    with ``l1 != l2``.
    """
    if symmetric and in1_l_max != in2_l_max:
        raise ValueError(f"a symmetric product needs equal input ranks, got {in1_l_max} and {in2_l_max}")
    top = max(in1_l_max, in2_l_max)
    paths: list[Path] = []
    for l_out in range(out_l_max + 1):
        canonical = [(l1, l2) for l1 in range(top + 1) for l2 in range(l1 + 1) if path_allowed(l1, l2, l_out)]
        paths += [Path(l1, l2, l_out) for l1, l2 in canonical if l1 <= in1_l_max and l2 <= in2_l_max]
        if not symmetric:
            paths += [Path(l2, l1, l_out) for l1, l2 in canonical if l1 != l2 and l2 <= in1_l_max and l1 <= in2_l_max]
    return paths
