"""Equivariant layers of the FlashCart potential: interaction, gate, product, RMS norm.

Features use the standard layout (rank blocks ``(2l+1, F)``). Shapes: nodes ``n``,
edges ``E``, channels ``F``.
"""

from __future__ import annotations

import math

import torch

from ..cartesian import EquivariantLinear, TensorProduct
from ..cartesian._layout import layout_width
from .radial import MLP

__all__ = ["Interaction", "Gate", "ProductBlock", "RMSNorm"]

_ACTIVATIONS = {"sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu, "tanh": torch.tanh}


class RMSNorm(torch.nn.Module):
    """Divide features by ``sqrt(mean_l mean_f I_lf + eps)`` with ``I_lf`` the (l,l)->0 invariants.

    The invariants are the path-resolved rank-0 output of a symmetric product of the
    features with themselves; optional learnable per-rank gains.
    """

    def __init__(self, l_max: int, n_feats: int, gains: bool = True, eps: float = 1e-6, backend: str = "auto"):
        super().__init__()
        self.l_max, self.F, self.eps = l_max, n_feats, eps
        self.invariants = TensorProduct(l_max, l_max, 0, n_feats, n_feats, symmetric=True, shared_weights=True, backend=backend)
        self.register_buffer("ones", torch.ones(self.invariants.weight_numel), persistent=False)
        self.gains = torch.nn.Parameter(torch.ones(l_max + 1)) if gains else None
        ranks = torch.cat([torch.full(((2 * l + 1) * n_feats,), l) for l in range(l_max + 1)])
        self.register_buffer("rank_of_column", ranks, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv = self.invariants(x, x, self.ones.to(x.dtype))  # [n, (l_max+1) * F]
        scale = torch.rsqrt(inv.mean(dim=1, keepdim=True).abs() + self.eps)
        y = x * scale
        if self.gains is not None:
            y = y * self.gains[self.rank_of_column]
        return y


class Interaction(torch.nn.Module):
    """Message passing: linear -> convolution product with edge attributes -> linear + skip.

    ``forward(x [n, W_in], attrs [E, (l_edge+1)^2], radial [E, n_radial], receivers, senders,
    csr, node_embed [n, F_e] | None) -> [n, W_hidden]``.
    """

    def __init__(
        self,
        l_in: int,
        l_hidden: int,
        l_edge: int,
        F: int,
        n_radial: int,
        hidden_radial: list[int],
        avg_neighbors: float,
        element_features: int | None,
        layer_norm: bool,
        backend: str = "auto",
    ):
        super().__init__()
        self.linear_in = EquivariantLinear(l_in, l_in, F, F, backend=backend)
        self.tp = TensorProduct(l_in, l_edge, l_hidden, F, 1, backend=backend)
        self.element_features = element_features
        n_in = n_radial + (2 * element_features if element_features else 0)
        self.radial = MLP(n_in, hidden_radial, self.tp.weight_numel, bias=False)
        self.linear_out = EquivariantLinear(l_hidden, l_hidden, F, F, in_paths=self.tp.n_paths_per_rank, backend=backend)
        self.skip = EquivariantLinear(l_in, l_hidden, F, F, backend=backend)
        self.register_buffer("inv_sqrt_avg_neighbors", torch.tensor(1.0 / math.sqrt(avg_neighbors)))
        self.norm = RMSNorm(l_hidden, F, backend=backend) if layer_norm else None

    def forward(self, x, attrs, radial, receivers, senders, csr, node_embed=None):
        if self.element_features:
            # radial input stays proportional to the envelope: element terms multiply it
            env = radial[:, :1]
            radial = torch.cat([radial, node_embed[senders] * env, node_embed[receivers] * env], dim=1)
        weights = self.radial(radial)
        msg = self.tp(self.linear_in(x), attrs, weights, receivers, senders, csr) * self.inv_sqrt_avg_neighbors.to(x.dtype)
        out = self.linear_out(msg) + self.skip(x)
        return self.norm(out) if self.norm is not None else out


class Gate(torch.nn.Module):
    """Gated nonlinearity with a zero-initialised output projection (identity at init).

    Gates are computed from the scalar channels (invariant under proper and improper
    rotations) and multiply every component of each rank: ``y = x + P(g(x) * x)``.
    """

    def __init__(self, l_max: int, F: int, activation: str = "sigmoid", bias: bool = True, backend: str = "auto"):
        super().__init__()
        self.l_max, self.F = l_max, F
        self.act = _ACTIVATIONS[activation]
        self.gates = torch.nn.Linear(F, (l_max + 1) * F, bias=bias)
        self.proj = EquivariantLinear(l_max, l_max, F, F, backend=backend)
        for w in self.proj.weights:
            torch.nn.init.zeros_(w)
        reps = torch.cat([torch.full(((2 * l + 1) * F,), l * F) + torch.arange(F).repeat(2 * l + 1) for l in range(l_max + 1)])
        self.register_buffer("gate_index", reps, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.act(self.gates(x[:, : self.F]))  # [n, (l_max+1) F]
        return x + self.proj(x * g[:, self.gate_index])


class ProductBlock(torch.nn.Module):
    """Raise the body order: ``P_k = TP(P_{k-1}, A)``, ``k = 1..correlation-1``, ``P_0 = A``.

    Each step has learnable per-path weights (per element unless element-agnostic). Full
    variant: every step is mixed back to ``F`` channels by its own linear and added to the
    output. Path-reduced variant: paths of each rank are summed and scaled by
    ``n_paths^-1/2``, and one final linear mixes the sum of the steps. Plus a linear skip of
    ``A`` and an optional RMS norm. ``out_l_max=0`` for the last layer.
    """

    def __init__(
        self,
        l_max: int,
        out_l_max: int,
        F: int,
        correlation: int,
        path_reduced: bool,
        n_elements: int,
        element_agnostic: bool,
        layer_norm: bool,
        backend: str = "auto",
    ):
        super().__init__()
        self.path_reduced, self.element_agnostic = path_reduced, element_agnostic
        self.steps = torch.nn.ModuleList()
        self.mix = torch.nn.ModuleList()
        self.path_weights = torch.nn.ParameterList()
        for _ in range(correlation - 1):
            tp = TensorProduct(l_max, l_max, l_max, F, F, shared_weights=element_agnostic, reduce_paths=path_reduced, backend=backend)
            self.steps.append(tp)
            rows = 1 if element_agnostic else n_elements
            self.path_weights.append(torch.nn.Parameter(torch.randn(rows, tp.weight_numel)))
            if not path_reduced:
                self.mix.append(EquivariantLinear(l_max, l_max, F, F, in_paths=tp.n_paths_per_rank, backend=backend))
        if path_reduced and self.steps:
            scales = torch.cat(
                [torch.full(((2 * l + 1) * F,), p**-0.5 if p else 0.0) for l, p in enumerate(self.steps[0].n_paths_per_rank)]
            )
            self.register_buffer("path_scale", scales, persistent=False)
            self.final = EquivariantLinear(l_max, l_max, F, F, backend=backend)
        self.skip = EquivariantLinear(l_max, out_l_max, F, F, backend=backend)
        self.out_width = layout_width(out_l_max, F)
        self.norm = RMSNorm(out_l_max, F, backend=backend) if layer_norm else None

    def forward(self, a: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        p, total = a, None
        for k, tp in enumerate(self.steps):
            w = self.path_weights[k][0] if self.element_agnostic else self.path_weights[k][types]
            p = tp(p, a, w)
            if self.path_reduced:
                p = p * self.path_scale.to(p.dtype)
            else:
                p = self.mix[k](p)
            total = p if total is None else total + p
        out = self.skip(a)
        if total is not None:
            extra = self.final(total) if self.path_reduced else total
            out = out + extra[:, : self.out_width]
        return self.norm(out) if self.norm is not None else out
