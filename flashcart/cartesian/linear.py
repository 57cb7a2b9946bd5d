"""Equivariant linear maps: per-rank channel (and path) mixing."""

from __future__ import annotations

import math

import torch

from ._backend import check_backend, check_rank, resolve_backend
from ._components import dim
from ._layout import layout_width, split_ranks
from ._linear_spec import launch_table, linear_key

__all__ = ["EquivariantLinear", "linear_sum"]


class EquivariantLinear(torch.nn.Module):
    """``y_l = x_l @ (W_l / sqrt(F_in * paths_l))^T`` for each rank, identical for every component.

    Args:
        in_l_max, out_l_max: rank limits; ranks above ``min(in, out)`` are dropped on input
            or zero on output.
        in_features, out_features: channels.
        in_paths: paths per input rank (``None``: one; an int: that many for every rank;
            a list: per rank), i.e. input blocks ``(2l+1, paths_l, F_in)``.
        backend: ``"torch"``, ``"triton"`` or ``"auto"``.

    Parameters ``weights[l]: [F_out, F_in * paths_l]``, initialised N(0, 1).
    Buffer ``launch_table``: int64 launch table of the Triton kernels (not saved in state dicts).
    ``forward(x: [n, in_width], scale: 0-d tensor | None = None) -> [n, out_width]``: with
    ``scale`` the output times ``scale``, folded into the weights (no pass over the rows).
    """

    def __init__(
        self,
        in_l_max: int,
        out_l_max: int,
        in_features: int,
        out_features: int,
        in_paths: int | list[int] | None = None,
        backend: str = "auto",
    ):
        super().__init__()
        check_rank(in_l_max, "in_l_max")
        check_rank(out_l_max, "out_l_max")
        if in_paths is None:
            in_paths = [1] * (in_l_max + 1)
        elif isinstance(in_paths, int):
            in_paths = [in_paths] * (in_l_max + 1)
        if len(in_paths) != in_l_max + 1:
            raise ValueError(f"in_paths needs {in_l_max + 1} entries (ranks 0..{in_l_max}), got {len(in_paths)}")
        self.in_l_max, self.out_l_max = in_l_max, out_l_max
        self.in_features, self.out_features = in_features, out_features
        self.in_paths = list(in_paths)
        self.backend = check_backend(backend)
        self.in_width = layout_width(in_l_max, in_features, self.in_paths)
        self.out_width = layout_width(out_l_max, out_features)
        n_mixed = min(in_l_max, out_l_max) + 1
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(out_features, in_features * self.in_paths[l])) for l in range(n_mixed)]
        )
        self.scales = [1.0 / math.sqrt(in_features * p) if p else 0.0 for p in self.in_paths[:n_mixed]]
        self.key = linear_key(in_l_max, out_l_max, in_features, out_features, self.in_paths)
        # launch table of the Triton kernels: built here, moved with the layer, never per call
        self.register_buffer("launch_table", launch_table(self.key), persistent=False)

    def extra_repr(self) -> str:
        return (
            f"l_max {self.in_l_max} -> {self.out_l_max}, features {self.in_features} -> {self.out_features}, "
            f"in_paths={self.in_paths}, backend={self.backend!r}"
        )

    def check_input(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> None:
        """Raise a ``ValueError`` naming the shape unless ``x`` is ``[rows, in_width]`` and ``scale``
        ``None`` or 0-d."""
        if x.dim() != 2 or x.shape[1] != self.in_width:
            raise ValueError(f"EquivariantLinear expects [rows, {self.in_width}], got {tuple(x.shape)}")
        if scale is not None and scale.dim() != 0:
            raise ValueError(f"EquivariantLinear's scale must be a 0-d tensor, got shape {tuple(scale.shape)}")

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        self.check_input(x, scale)
        if resolve_backend(self.backend, x) == "triton":
            from ._triton.ops import equivariant_linear

            return equivariant_linear(self, x, scale)
        with torch.profiler.record_function("flashcart::equivariant_linear[torch]"):
            return self._forward_torch(x, scale)

    def _forward_torch(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        blocks = split_ranks(x, self.in_l_max, self.in_features, self.in_paths)
        out = []
        for l in range(self.out_l_max + 1):
            if l < len(self.weights):
                w = self.weights[l] * self.scales[l]
                y = torch.matmul(blocks[l], (w if scale is None else w * scale.to(w.dtype)).T)
                out.append(y.reshape(x.shape[0], -1))
            else:
                out.append(x.new_zeros(x.shape[0], dim(l) * self.out_features))
        return torch.cat(out, dim=1)


def linear_sum(
    first: EquivariantLinear, x1: torch.Tensor, second: EquivariantLinear, x2: torch.Tensor, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """``first(x1, scale) + second(x2)``: two maps with the same output layout, added (a message
    map and a skip connection). On the Triton path with ``FLASHCART_LINEAR_PAIRS=1`` (the default)
    both maps run in one launch forward and one for their input gradients
    (``flashcart::lin_pair``); otherwise each map alone. ``x1: [n, first.in_width]``, ``x2: [n, second.in_width]`` ->
    ``[n, first.out_width]``."""
    if (first.out_l_max, first.out_features) != (second.out_l_max, second.out_features):
        raise ValueError(
            f"linear_sum adds maps of one output layout, got l_max {first.out_l_max} with {first.out_features} channels "
            f"and l_max {second.out_l_max} with {second.out_features}"
        )
    if resolve_backend(first.backend, x1) == "triton" and resolve_backend(second.backend, x2) == "triton":
        from ._triton import ops

        if ops.LINEAR_PAIRS:
            first.check_input(x1, scale)
            second.check_input(x2)
            return ops.equivariant_linear_sum(first, x1, second, x2, scale)
    return first(x1, scale) + second(x2)
