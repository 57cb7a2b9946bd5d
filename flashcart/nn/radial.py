"""Radial basis, cutoff envelope and the radial MLP producing per-edge path weights."""

from __future__ import annotations

import math

import torch

__all__ = ["ChebyshevBasis", "PolynomialEnvelope", "MLP"]


class ChebyshevBasis(torch.nn.Module):
    """``T_0..T_{n-1}`` of a mapped distance ``t = (d - r_min) / (r_max - r_min)``.

    ``mapping="cosine"``: argument ``cos(pi t)``; ``"affine"``: ``2 t - 1``.
    ``forward(d: [E] Å) -> [E, n]``.
    """

    def __init__(self, n: int, r_max: float, r_min: float = 0.0, mapping: str = "cosine"):
        super().__init__()
        if mapping not in ("cosine", "affine"):
            raise ValueError(f"radial_mapping must be 'cosine' or 'affine', got {mapping!r}")
        self.n, self.r_max, self.r_min, self.mapping = n, r_max, r_min, mapping

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        t = ((d - self.r_min) / (self.r_max - self.r_min)).clamp(0.0, 1.0)
        if self.mapping == "cosine":
            k = torch.arange(self.n, dtype=d.dtype, device=d.device)
            # T_k(cos(pi t)) = cos(k pi t): one fused expression instead of the recursion
            return torch.cos((math.pi * t)[:, None] * k)
        x = 2 * t - 1
        out = [torch.ones_like(x), x]
        for _ in range(2, self.n):
            out.append(2 * x * out[-1] - out[-2])
        return torch.stack(out[: self.n], dim=-1)


class PolynomialEnvelope(torch.nn.Module):
    """``u(t) = 1 - (p+1)(p+2)/2 t^p + p(p+2) t^(p+1) - p(p+1)/2 t^(p+2)``, ``t = d / r_max``, 0 beyond."""

    def __init__(self, r_max: float, p: int = 6):
        super().__init__()
        self.r_max, self.p = r_max, p

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        p = self.p
        t = (d / self.r_max).clamp(max=1.0)
        # Horner form of the same polynomial: t^p (a + t (b + c t))
        a, b, c = -(p + 1) * (p + 2) / 2, p * (p + 2), -p * (p + 1) / 2
        return 1 + t**p * (a + t * (b + c * t))


class MLP(torch.nn.Module):
    """Plain MLP with SiLU; ``bias=False`` keeps ``f(0) = 0`` (radial weights vanish at the cutoff)."""

    def __init__(self, n_in: int, hidden: list[int], n_out: int, bias: bool = True):
        super().__init__()
        dims = [n_in, *hidden, n_out]
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b, bias=bias) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.nn.functional.silu(x)
        return x
