"""The RMS norm's invariants as ATen operations: a quadratic form per rank and channel.

``I_lf = x_lf^T G_l x_lf`` for features in the standard layout (rank ``l``'s block ``(2l+1, F)``
at column ``l^2 F``), with ``G_l`` the symmetric ``(l, l) -> 0`` product's form of rank ``l``
(``flashcart.nn.blocks.invariant_forms``). While compiling, ``G_l x_lf`` is written as a
broadcast product and sum, which inductor fuses with the norm's mean, root and scaling into a
few row-wise kernels (``einsum`` would become matrix-product launches); eager calls use one
``einsum`` per rank instead (the broadcast would materialise ``[n, 2l+1, 2l+1, F]``).
Differentiable to any order; no Triton needed.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["quadratic_invariants"]


def quadratic_invariants(x: Tensor, forms: Tensor, l_max: int, F: int) -> Tensor:
    """``[n, (l_max+1) F]``: ``I_lf = x_lf^T G_l x_lf`` per rank and channel, ranks ascending.

    ``x: [n, (l_max+1)^2 F]``; ``forms: [sum_l (2l+1)^2]``, the row-major ``G_l`` rank after rank.
    """
    out, off = [], 0
    for l in range(l_max + 1):
        d = 2 * l + 1
        x_l = x[:, l * l * F : (l + 1) ** 2 * F].reshape(-1, d, F)
        g = forms[off : off + d * d].view(d, d)
        if torch.compiler.is_compiling():
            gx = (g[None, :, :, None] * x_l[:, None, :, :]).sum(2)  # [n, d, F]: G_l x_lf
        else:
            gx = torch.einsum("ij,njf->nif", g, x_l)
        out.append((x_l * gx).sum(1))
        off += d * d
    return torch.cat(out, dim=1)
