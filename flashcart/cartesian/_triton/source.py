"""Generated Triton modules, loaded through the shared source cache."""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType

from .._backend import KERNEL_L_MAX
from .._cache import load_generated
from .._paths import enumerate_paths
from .codegen import generate_expansion_source, generate_product_source, out_offsets
from .codegen_double import generate_double_backward_source
from .signatures import STATIC_SHAPES

__all__ = ["product_module", "double_backward_module", "expansion_module", "ProductSpec", "product_spec"]


class ProductSpec:
    """Static description of a tensor-product configuration, parsed from its key."""

    def __init__(self, key: str):
        l1, l2, lo, sym, red = (int(v) for v in key.split(","))
        self.key = key
        self.in1_l_max, self.in2_l_max, self.out_l_max = l1, l2, lo
        self.symmetric, self.reduce = bool(sym), bool(red)
        self.paths = enumerate_paths(l1, l2, lo, bool(sym))
        self.n_paths = len(self.paths)
        self.offsets, self.n_out_blocks = out_offsets(self.paths, lo, bool(red))
        self.in1_comps, self.in2_comps = (l1 + 1) ** 2, (l2 + 1) ** 2


@lru_cache(maxsize=None)
def product_spec(key: str) -> ProductSpec:
    return ProductSpec(key)


def product_key(in1_l_max: int, in2_l_max: int, out_l_max: int, symmetric: bool, reduce: bool) -> str:
    return f"{in1_l_max},{in2_l_max},{out_l_max},{int(symmetric)},{int(reduce)}"


# The kernels' parameter lists follow FLASHCART_STATIC_SHAPES (signatures.STATIC_SHAPES), so their
# cache files are named by it.
_SHAPES_SUFFIX = "_static" if STATIC_SHAPES else ""


@lru_cache(maxsize=None)
def product_module(key: str) -> ModuleType:
    """Kernels for one configuration (generated on first use, then cached on disk)."""
    spec = product_spec(key)
    name = "triton_tp_" + key.replace(",", "_") + _SHAPES_SUFFIX
    return load_generated(
        name,
        KERNEL_L_MAX,
        lambda _: generate_product_source(spec.paths, spec.in1_l_max, spec.in2_l_max, spec.out_l_max, spec.reduce),
    )


@lru_cache(maxsize=None)
def double_backward_module(key: str) -> ModuleType:
    """Fused double-backward kernels for one configuration: a module of their own, so that
    inference (forward and backward only) never generates or compiles them."""
    spec = product_spec(key)
    name = "triton_tp_dbwd_" + key.replace(",", "_") + _SHAPES_SUFFIX
    return load_generated(
        name,
        KERNEL_L_MAX,
        lambda _: generate_double_backward_source(spec.paths, spec.in1_l_max, spec.in2_l_max, spec.out_l_max, spec.reduce),
    )


@lru_cache(maxsize=None)
def expansion_module(l_max: int) -> ModuleType:
    """Expansion kernels for ranks ``0..l_max`` (only the ranks a model requests)."""
    return load_generated(f"triton_expansion{l_max}", KERNEL_L_MAX, lambda _: generate_expansion_source(l_max))


def triton_module() -> None:
    """Generate every Triton source reachable at the rank limit (benchmarks, warm caches)."""
    expansion_module(KERNEL_L_MAX)
    for lo in range(KERNEL_L_MAX + 1):
        product_module(product_key(KERNEL_L_MAX, KERNEL_L_MAX, lo, False, False))
