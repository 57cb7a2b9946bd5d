"""Data: extxyz reading, neighbour lists, batches and batching."""

from .batch import Batch, Structure, collate
from .dataset import DataError, read_structures, structure_from_atoms
from .loader import BatchLoader, budgets_for
from .neighbors import neighbor_list

__all__ = [
    "Batch",
    "BatchLoader",
    "DataError",
    "Structure",
    "budgets_for",
    "collate",
    "neighbor_list",
    "read_structures",
    "structure_from_atoms",
]
