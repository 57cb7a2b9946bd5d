"""What the model reads of each edge's geometry: its direction and its radial features.

For edges ``receiver <- sender`` with image shift ``S`` (integer lattice vectors of the edge's
graph's cell, rows are lattice vectors):

* ``vec = x[sender] - x[receiver] + S @ cell`` (Å), ``d = sqrt(|vec|^2 + 1e-30)``;
* ``unit = vec / max(|vec|, eps)``, what the direction expansion reads (``eps``: its
  :attr:`~flashcart.cartesian.DirectionExpansion.eps`);
* ``env = u(d)`` (:class:`~flashcart.nn.radial.PolynomialEnvelope`) and
  ``radial = basis(d) * env`` (:class:`~flashcart.nn.radial.ChebyshevBasis`), the radial MLPs'
  input.

:func:`edge_features` evaluates them as ATen operations (:func:`edge_features_reference`:
about 35 operations forward and 45 autograd nodes back), or, in plain eager calls on the Triton
path (unless :data:`FUSED_EDGES` is off), as one Triton kernel each way (:mod:`flashcart.nn.edge_kernels`), plus the
scatter of the edges' gradients to the atoms. An eager force call on the GPU is bound by such
host work per operation (benchmarks/RESULTS.md, issue 14).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._env import env_switch
from ..cartesian import _frozen
from ..cartesian._backend import resolve_backend
from .radial import ChebyshevBasis, PolynomialEnvelope

__all__ = ["EdgeFeatures", "edge_features", "edge_features_reference", "FUSED_EDGES", "fused_edges_mode"]


def fused_edges_mode() -> bool:
    """``FLASHCART_FUSED_EDGES``: ``1`` (default) eager Triton calls compute the edge features with
    :mod:`flashcart.nn.edge_kernels`; ``0`` the ATen operations. Anything else is an error naming
    the variable."""
    return env_switch("FLASHCART_FUSED_EDGES")


# Read when this module is first imported; tests and benchmarks assign the attribute.
FUSED_EDGES = fused_edges_mode()


class EdgeFeatures(NamedTuple):
    """``unit [E, 3]``: unit vectors receiver -> sender; ``radial [E, n_radial]``: basis times
    envelope; ``env [E]``: the envelope (zero beyond the cutoff; not differentiable on the fused
    path, where only its zeros are read); ``length [E]`` Å: ``d``, from the ATen expression only
    (``None`` from the fused kernels; what tabulated radial MLPs read)."""

    unit: torch.Tensor
    radial: torch.Tensor
    env: torch.Tensor
    length: torch.Tensor | None = None


def edge_vectors(positions, cell, shifts, receivers, senders, edge_batch) -> torch.Tensor:
    """``[E, 3]`` Å: ``x[sender] - x[receiver] + S @ cell[graph]`` as ATen operations."""
    # index_select: its backward is an index_add (no sort), unlike advanced indexing
    image = (shifts.to(positions.dtype)[:, :, None] * cell.index_select(0, edge_batch)).sum(1)
    return positions.index_select(0, senders) - positions.index_select(0, receivers) + image


def edge_features_reference(
    positions: torch.Tensor,
    cell: torch.Tensor,
    shifts: torch.Tensor,
    receivers: torch.Tensor,
    senders: torch.Tensor,
    edge_batch: torch.Tensor,
    basis: ChebyshevBasis,
    envelope: PolynomialEnvelope,
    eps: float,
) -> EdgeFeatures:
    """:class:`EdgeFeatures` as ATen operations (differentiable to any order).

    Args: positions ``[N, 3]`` Å; cell ``[G, 3, 3]`` Å; shifts ``[E, 3]`` integer image offsets;
    receivers, senders, edge_batch ``[E]``; ``eps``: the expansion's lower bound of ``|vec|``.
    """
    vec = edge_vectors(positions, cell, shifts, receivers, senders, edge_batch)
    d = torch.sqrt((vec * vec).sum(-1) + 1e-30)
    unit = vec / vec.norm(dim=1, keepdim=True).clamp_min(eps)
    env = envelope(d)
    return EdgeFeatures(unit, basis(d) * env[:, None], env, d)


def _use_fused(positions: torch.Tensor, backend: str) -> bool:
    """Whether this call takes the fused kernels: not switched off, the Triton path, a plain eager call
    that is not being captured into a CUDA graph (a replay pays no host work per operation, which
    is all the kernels save)."""
    # plain eager first: under torch.compile the stream query below is a graph break
    if not FUSED_EDGES or type(positions) is not torch.Tensor or not _frozen._plain_eager():
        return False
    if positions.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return resolve_backend(backend, positions) == "triton"


def edge_features(
    positions: torch.Tensor,
    cell: torch.Tensor,
    shifts: torch.Tensor,
    receivers: torch.Tensor,
    senders: torch.Tensor,
    edge_batch: torch.Tensor,
    basis: ChebyshevBasis,
    envelope: PolynomialEnvelope,
    eps: float,
    backend: str = "auto",
    need_length: bool = False,
) -> EdgeFeatures:
    """:class:`EdgeFeatures` of the edges (arguments as :func:`edge_features_reference`), by the
    fused kernels in plain eager calls on the Triton path (``backend`` resolved against
    ``positions``) when :data:`FUSED_EDGES` and not ``need_length``, else by the ATen operations."""
    if receivers.shape[0] and not need_length and _use_fused(positions, backend):
        from . import edge_kernels

        return EdgeFeatures(*edge_kernels.edge_features(positions, cell, shifts, receivers, senders, edge_batch, basis, envelope, eps))
    return edge_features_reference(positions, cell, shifts, receivers, senders, edge_batch, basis, envelope, eps)
