"""A fusion barrier for compiled graphs: a small tensor computed once, not once per use.

Inductor inlines a pointwise value into each kernel that reads it when it judges the value
cheap. A value that is cheap per element but read by a much larger consumer is then
recomputed for every element of that consumer. The case that matters here: a compiled force
call with radial tables (:mod:`flashcart.nn.radial_table`) and the neighbour list's layout
passed in (:mod:`flashcart.nn.edge_layout`). Each pair's length ``[P]`` is a gather of both
atoms' positions, a shift through the cell and a norm. Inductor recomputed it for each of the
``[P, W]`` weights the tables give (``W`` up to 340), in the forward and the backward kernels.
On an H100 (i2c3f20l2r, 1000-atom diamond, 2026-12-05) the table kernels then took 0.83 ms per
call instead of 0.19 ms, and the peak memory rose from 342 to 1110 MiB. When the layout is
computed inside the call, its sort consumes the lengths, so they are stored, and the tables read
them.

:func:`realized` returns its input through an opaque custom op when :func:`torch.compile`
traces it, so inductor must store the value once. That is one copy of ``[n]`` elements, a few
microseconds. Elsewhere it returns the input itself. Its gradient is the incoming gradient,
to any order.
"""

from __future__ import annotations

import torch

__all__ = ["realized"]


@torch.library.custom_op("flashcart::realized", mutates_args=())
def _realized(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_realized.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _backward(ctx, grad: torch.Tensor) -> torch.Tensor:
    return grad


_realized.register_autograd(_backward)


def realized(x: torch.Tensor) -> torch.Tensor:
    """``x``, stored once in compiled graphs: inductor may not recompute it inside the kernels that
    read it (see the module docstring). The same tensor in eager calls and TorchScript tracing.
    Not gated on ``torch.compiler.is_exporting()``, which torch 2.11 also reports while dynamo traces
    a CUDA call for torch.compile (``FlashCartPotential._edge_pairs``); an exported graph records the op."""
    if torch.compiler.is_compiling():
        return _realized(x)
    return x
