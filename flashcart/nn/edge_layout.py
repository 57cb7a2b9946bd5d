"""What a call derives from the neighbour list alone, computed once per list instead of every call.

A force call needs two orderings of the edges besides the list itself:

* the CSR layout of the tensor products (:func:`~flashcart.cartesian._layout.edge_csr`): the
  receivers' row pointers, the edges sorted by sender and the senders' row pointers;
* the grouping of reverse edges into pairs for the radial MLPs (:mod:`flashcart.nn.edge_pairs`),
  where the model uses it.

Both are functions of ``receivers``, ``senders`` and ``shifts``, not of the positions. Inside a
compiled call they cost two radix sorts, a scan, three binary searches and a dozen index kernels
every call; a simulation or the profiler evaluates one list many times.
:class:`~flashcart.model.Predictor` therefore computes an :class:`EdgeLayout` once per list it is
given (outside the compiled function) and passes it in as an input.

The pairs of a precomputed layout treat every real edge as live, and only the padding edges as
dead (the grouping inside a call also treats as dead the real edges beyond the cutoff now). The
model is the same function either way: an edge beyond the cutoff has a zero radial input with
zero derivatives of every order, so its pair's MLP row is zero and no gradient reaches it, whether
it shares the dead edges' row or has one of its own.

``FLASHCART_EDGE_LAYOUT=0`` turns the precomputation off (each call computes the layout itself, as
a model called directly does): for A/B measurements.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._env import env_switch
from .edge_pairs import EdgePairs

__all__ = ["EdgeLayout", "edge_layout_mode", "EDGE_LAYOUT"]


class EdgeLayout(NamedTuple):
    """``rowptr [N + 1]``: the receivers' CSR row pointers (edges grouped by receiver);
    ``perm [E]``: the edges sorted by sender (stable); ``srowptr [N + 1]``: the senders' row
    pointers into ``perm``; ``pairs``: the reverse-edge grouping of the radial MLPs, or ``None``
    (one MLP row per edge)."""

    rowptr: torch.Tensor
    perm: torch.Tensor
    srowptr: torch.Tensor
    pairs: EdgePairs | None


def edge_layout_mode() -> bool:
    """``FLASHCART_EDGE_LAYOUT``: ``1`` (default) the Predictor computes each neighbour list's
    :class:`EdgeLayout` once; ``0`` every call computes it."""
    return env_switch("FLASHCART_EDGE_LAYOUT")


EDGE_LAYOUT = edge_layout_mode()
