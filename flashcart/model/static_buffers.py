"""A neighbour list's tensors kept at fixed addresses across lists, for CUDA-graph replays.

A compiled call in a CUDA-graph mode (``reduce-overhead``) copies every input tensor that is not
static into the graph's own buffers before each replay: on the 1000-atom diamond that was 15
device-to-device copies per force call, 0.046 ms of an H100's 1.87 (benchmarks/RESULTS.md,
2026-12-05 evening). The neighbour list's tensors (receivers, senders, shifts, the graph and
type indices, the cell) and its :class:`~flashcart.nn.edge_layout.EdgeLayout` change only when
the list does. :class:`~flashcart.model.Predictor` can therefore keep them in tensors whose
addresses never change while their shapes stay the same: :func:`keep_addresses` writes a new
list's values into the previous list's tensors, and marks new tensors as static inputs
(``torch._dynamo.mark_static_address``, unguarded), which the graph then reads in place. Padded
Predictors (the simulation engine's) keep their padded list; unpadded ones (the profiler's) keep
a copy of the caller's list, so that a later list is never written into the caller's tensors.
A list of other shapes (a capacity that grows, an unpadded list of another size) gives new
tensors; the CUDA graph is then recorded again, as it is for the new shapes anyway.

``FLASHCART_STATIC_LIST`` (``1``, the default; ``0`` turns it off) applies this to compiled
CUDA-graph calls on CUDA tensors (:func:`static_list_mode`). On an H100 it took 0.035-0.038 ms
off i2c3f20l2r's 1.25 ms of GPU time per force call (benchmarks/RESULTS.md, 2026-12-07
evening), and the ASE, OpenMM and engine GPU tests pass with it (2026-12-07 late night).
"""

from __future__ import annotations

from typing import Any

import torch

from .._env import env_switch

__all__ = ["keep_addresses", "static_list_mode", "STATIC_LIST"]


def static_list_mode() -> bool:
    """``FLASHCART_STATIC_LIST``: ``1`` keeps a neighbour list's tensors at fixed addresses
    (static CUDA-graph inputs, refreshed in place when the list changes; the default); ``0``
    lets each replay copy them. Anything else is an error naming the variable."""
    return env_switch("FLASHCART_STATIC_LIST", default=True)


# Read at import; tests and benchmarks flip the attribute.
STATIC_LIST = static_list_mode()


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and a.is_contiguous() and b.is_contiguous()


def keep_addresses(previous: Any, fresh: Any, owned: bool = True) -> Any:
    """``fresh`` (a tensor, ``None``, or a tuple or named tuple of them, nested) with its values
    in ``previous``'s tensors where a tensor of the same shape, dtype and device is there
    (copied in place: the addresses stay), else ``fresh``'s own, marked as static CUDA-graph
    inputs. Non-tensor leaves are ``fresh``'s.

    ``owned=False``: ``fresh`` belongs to the caller, who may reuse or change it, so a tensor
    that is kept is a copy of it (a later list is written into the copy, never into the
    caller's tensor)."""
    if isinstance(fresh, torch.Tensor):
        if isinstance(previous, torch.Tensor) and previous is not fresh and _same_layout(previous, fresh):
            return previous.copy_(fresh)
        kept = fresh if owned else fresh.clone(memory_format=torch.contiguous_format)
        torch._dynamo.mark_static_address(kept, guard=False)
        return kept
    if isinstance(fresh, tuple):
        olds = previous if isinstance(previous, tuple) and len(previous) == len(fresh) else (None,) * len(fresh)
        items = [keep_addresses(o, f, owned) for o, f in zip(olds, fresh)]
        return type(fresh)(*items) if hasattr(fresh, "_fields") else tuple(items)
    return fresh
