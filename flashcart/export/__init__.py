"""Exported model files for programs that do not run FlashCart's Python.

* :func:`export_torchscript`: a TorchScript ``.pt`` with openmm-torch's ``TorchForce``
  contract (positions nm -> energy kJ/mol, for the atoms of one structure).
* :func:`export_aoti`: an AOTInductor ``.pt2`` package, ``(positions Å, atomic numbers,
  cell Å, pbc) -> (energy eV, forces eV/Å)`` for any structure of the model's elements.
* :func:`load_exported`: either file as a function of one structure in FlashCart's units.

Both compute the neighbour list inside and equal the Predictor's energies and forces.
The command line is ``flashcart-export`` (:mod:`flashcart.cli.export`).
"""

from .aoti import export_aoti
from .loader import ExportedPotential, load_exported
from .structure import read_structure
from .torchscript import build_torchscript, export_torchscript

__all__ = ["ExportedPotential", "build_torchscript", "export_aoti", "export_torchscript", "load_exported", "read_structure"]
