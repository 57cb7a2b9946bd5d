"""Tensors derived from frozen parameters, built once per parameter state in eager calls.

A simulation evaluates the model with frozen parameters (``requires_grad=False``: the
:class:`~flashcart.model.Predictor` freezes them for a force call, the simulation engine for
good). The tensors the layers derive from their parameters on every call -- a linear map's
weight matrices flattened into one vector (a ``cat``), per-(rank, channel) gains broadcast
over the components of each rank (a ``cat`` and an ``index_select``), weights times fixed
scales -- are then the same on every call, yet each costs an ATen dispatch and a kernel
launch. An eager force call on the GPU is bound by that host work (benchmarks/RESULTS.md),
so :func:`frozen_derived` builds such a tensor once and returns it again while its sources
are unchanged.

A cached result is reused while every source tensor is the same tensor with the same storage
(address and device: a new dtype is a new storage) and the same version counter (in-place
updates such as an optimiser step or ``load_state_dict`` bump it), and the call is in the
same inference mode. The entry keeps its sources' storages alive, so a storage address
cannot be reused by another tensor while the entry refers to it. Writes through ``.data``
bypass the version counter (as they bypass autograd): such writes while the parameters are
frozen are not seen.

Nothing is cached when any source requires grad (training: the derived tensor is part of the
autograd graph), under ``torch.compile`` and tracing (inductor folds such expressions itself;
a graph must not capture a cached tensor), during a CUDA-graph capture (a captured eager call
derives the tensor on every replay, as without the cache: it then sees in-place parameter
updates, and no rebuilt entry can free memory the graph reads), under dispatch modes (fake
tensors) or functorch transforms. :data:`ENABLED` (a module attribute for benchmarks and tests) switches the cache
off.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch

__all__ = ["ENABLED", "frozen_derived", "parameters_of", "clear"]

# Benchmarks (benchmarks/eager_overhead.py) and tests assign it to compare with and without.
ENABLED = True

# owner module -> {(slot, inference mode): (sources (detached: same storage and version counter), key, result)}
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plain_eager() -> bool:
    """Whether this is a plain eager call: not compiled, traced, under a dispatch mode (fake
    tensors) or a functorch transform."""
    return not (
        torch.compiler.is_compiling()
        or torch._C._is_tracing()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._are_functorch_transforms_active()
    )


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def frozen_derived(owner: torch.nn.Module, slot: str, sources: Sequence[torch.Tensor], build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``build()``, or the result of an earlier ``build()`` for ``(owner, slot)`` while
    ``sources`` (the parameters and buffers ``build`` reads) are frozen and unchanged.

    ``owner`` holds the entry (weakly: the cache dies with the module); ``slot`` names the
    derived tensor among the owner's. ``build`` must read nothing but ``sources`` (and
    constants): anything else it reads is not checked. Eager calls pay a few microseconds of
    Python for the check (it runs on every call of every layer).
    """
    if not ENABLED:
        return build()
    for t in sources:
        if t.requires_grad or type(t) not in _PLAIN_TYPES:
            return build()
    if not _plain_eager() or (sources[0].is_cuda and torch.cuda.is_current_stream_capturing()):
        return build()
    key = []
    for t in sources:
        key += (id(t), t.data_ptr(), t._version, t.device)
    entries = _CACHE.get(owner)
    if entries is None:
        entries = _CACHE[owner] = {}
    slot = (slot, torch.is_inference_mode_enabled())
    entry = entries.get(slot)
    if entry is not None and entry[1] == key:
        return entry[2]
    result = build()
    entries[slot] = ([t.detach() for t in sources], key, result)
    return result


def parameters_of(plist: torch.nn.ParameterList) -> list[torch.nn.Parameter]:
    """The parameters of ``plist`` in order: read from its ``_parameters`` dict in eager mode
    (iterating a ``ParameterList`` costs a ``Module.__getattr__`` per item on every call)."""
    params = plist._parameters
    if torch.compiler.is_compiling() or len(params) != len(plist):
        return list(plist)
    return list(params.values())


def clear() -> None:
    """Drop every cached tensor (tests; never needed for correctness)."""
    _CACHE.clear()
