"""Irreducible Cartesian tensor algebra (see ``spec/cartesian.md`` conventions).

Public API: :class:`DirectionExpansion`, :class:`TensorProduct`, :class:`EquivariantLinear`,
:func:`linear_sum`, :func:`to_full`, :func:`from_full`, :func:`rotate`, :func:`enumerate_paths`.
"""

from ._backend import KERNEL_L_MAX
from ._components import stored_components
from ._full import from_full, rotate, rotation_matrix_stored, to_full
from ._paths import Path, enumerate_paths, path_normalization
from .expansion import DirectionExpansion
from .linear import EquivariantLinear, linear_sum
from .tensor_product import TensorProduct, WeightRows, WeightSlopes, WeightTable, edge_csr

__all__ = [
    "KERNEL_L_MAX",
    "DirectionExpansion",
    "EquivariantLinear",
    "Path",
    "TensorProduct",
    "WeightRows",
    "WeightSlopes",
    "WeightTable",
    "edge_csr",
    "enumerate_paths",
    "from_full",
    "linear_sum",
    "path_normalization",
    "rotate",
    "rotation_matrix_stored",
    "stored_components",
    "to_full",
]
