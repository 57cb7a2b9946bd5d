"""Direction expansion: unit vectors to irreducible Cartesian tensors of ranks 0..l_max."""

from __future__ import annotations

import torch

from ._backend import check_backend, check_rank, resolve_backend, torch_ops

__all__ = ["DirectionExpansion"]


class DirectionExpansion(torch.nn.Module):
    """``T^l(u) = (2l-1)!!/l! * P_l(u ⊗ ... ⊗ u)`` for ``l = 0..l_max``.

    Args:
        l_max: highest rank.
        normalize: divide inputs by ``max(|r|, eps)`` first (``False``: inputs are unit vectors).
        eps: lower bound of the norm used for normalisation.
        backend: ``"torch"``, ``"triton"`` or ``"auto"``.

    ``forward(vectors: [n, 3]) -> [n, (l_max+1)^2]`` (rank blocks in increasing rank).
    """

    def __init__(self, l_max: int, normalize: bool = True, eps: float = 1e-4, backend: str = "auto"):
        super().__init__()
        check_rank(l_max, "l_max")
        self.l_max = l_max
        self.normalize = normalize
        self.eps = eps
        self.backend = check_backend(backend)
        if backend != "triton":
            torch_ops()  # generate (or load) sources now, not inside a traced forward

    def extra_repr(self) -> str:
        return f"l_max={self.l_max}, normalize={self.normalize}, backend={self.backend!r}"

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        if vectors.dim() != 2 or vectors.shape[1] != 3:
            raise ValueError(f"DirectionExpansion expects vectors of shape [n, 3], got {tuple(vectors.shape)}")
        if self.normalize:
            vectors = vectors / vectors.norm(dim=1, keepdim=True).clamp_min(self.eps)
        return self.of_unit(vectors)

    def of_unit(self, u: torch.Tensor) -> torch.Tensor:
        """The expansion of vectors ``u: [n, 3]`` taken as they are (already normalised: what
        ``forward`` computes after its normalisation) ``-> [n, (l_max+1)^2]``."""
        if resolve_backend(self.backend, u) == "triton":
            from ._triton.ops import direction_expansion

            return direction_expansion(u, self.l_max)
        with torch.profiler.record_function("flashcart::direction_expansion[torch]"):
            return expansion_torch(u, self.l_max)


def expansion_torch(u: torch.Tensor, l_max: int) -> torch.Tensor:
    """Generated-PyTorch expansion of unit vectors ``u: [n, 3] -> [n, (l_max+1)^2]``."""
    ops = torch_ops()
    ux, uy, uz = u.unbind(1)
    comps = []
    for l in range(l_max + 1):
        comps += list(getattr(ops, f"expansion_{l}")(ux, uy, uz))
    return torch.stack(comps, dim=1)
