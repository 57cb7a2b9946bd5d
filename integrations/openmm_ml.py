"""The ``flashcart`` potential of openmm-ml (registered through the ``openmmml.potentials``
entry point, so installing FlashCart is enough):

    from openmmml import MLPotential
    potential = MLPotential("flashcart", modelPath="runs/x/best")
    system = potential.createSystem(topology, device="gpu", compileMode="reduce-overhead")
    mixed = potential.createMixedSystem(topology, mm_system, ml_atoms)

``createSystem`` and ``createMixedSystem`` take these options (openmm-ml's camelCase):
``device`` (``cpu``, ``gpu``, ``auto``), ``precision`` (``single`` or ``double``),
``compileMode`` (``None`` or a ``torch.compile`` mode), ``skin`` (Å, default 0.5),
``addAtomicOffsets`` (default true). Other keyword arguments are an error, except those that
openmm-ml's embeddings consume themselves (``mlLongRange``, ``linkAtomDistances``).
FlashCart models are local (cutoff ``r_max``): :meth:`getMLLongRange` is false.

The model runs on its own ``device`` whatever platform the ``Context`` uses. For a system from
``createSystem`` (FlashCart's force alone), integrate on ``Platform.getPlatformByName("Reference")``:
OpenMM's CUDA platform adds about 0.35 ms a step beside PyTorch on an H200 (its own CUDA context;
see :mod:`flashcart.integrations.openmm`). A mixed system whose MM forces need the GPU pays it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import openmm
import openmm.app
from openmmml.mlpotential import MLPotentialImpl, MLPotentialImplFactory

from flashcart.model.checkpoint import load_checkpoint

from .openmm import create_force, topology_numbers

__all__ = ["FlashCartPotentialImplFactory", "FlashCartPotentialImpl"]

_PRECISIONS = {"single": "float32", "double": "float64"}
_EMBEDDING_ARGS = {"mlLongRange", "linkAtomDistances"}  # consumed by openmm-ml's embeddings


class FlashCartPotentialImplFactory(MLPotentialImplFactory):
    """Creates :class:`FlashCartPotentialImpl` objects for ``MLPotential("flashcart", modelPath=...)``."""

    def createImpl(self, name: str, modelPath: str | Path | None = None, **args) -> MLPotentialImpl:
        if args:
            raise TypeError(f"MLPotential({name!r}): unknown arguments {sorted(args)} (the model is given as modelPath=...)")
        if modelPath is None:
            raise ValueError(f"MLPotential({name!r}) needs modelPath=<checkpoint directory or model.pt>")
        return FlashCartPotentialImpl(modelPath)


class FlashCartPotentialImpl(MLPotentialImpl):
    """Adds a FlashCart ``PythonForce`` (see :mod:`flashcart.integrations.openmm`) to a System.

    The checkpoint is read once, when the potential is created, so a bad ``modelPath`` is an
    error right away.
    """

    def __init__(self, modelPath: str | Path):
        self.modelPath = Path(modelPath)
        self.model = load_checkpoint(self.modelPath)

    def addForces(
        self,
        topology: openmm.app.Topology,
        system: openmm.System,
        atoms: Iterable[int] | None,
        forceGroup: int,
        device: str = "auto",
        precision: str = "single",
        compileMode: str | None = None,
        skin: float = 0.5,
        addAtomicOffsets: bool = True,
        **args,
    ) -> None:
        unknown = sorted(set(args) - _EMBEDDING_ARGS)
        if unknown:
            raise TypeError(
                f"flashcart potential: unknown arguments {unknown} (known: device, precision, compileMode, skin, addAtomicOffsets)"
            )
        if precision not in _PRECISIONS:
            raise ValueError(f"flashcart potential: precision must be 'single' or 'double', got {precision!r}")
        atoms = None if atoms is None else [int(i) for i in atoms]
        numbers = topology_numbers(topology, atoms)
        known = set(self.model.elements)
        from ase.data import chemical_symbols

        unknown_elements = sorted({chemical_symbols[int(z)] for z in numbers} - known)
        if unknown_elements:
            raise ValueError(
                f"the topology has elements {unknown_elements} that the model {self.modelPath} does not know "
                f"(its elements: {sorted(known)})"
            )
        periodic = topology.getPeriodicBoxVectors() is not None or system.usesPeriodicBoundaryConditions()
        force = create_force(
            self.model,
            numbers,
            atoms=atoms,
            periodic=periodic,
            device=device,
            dtype=_PRECISIONS[precision],
            skin=skin,
            compile_mode=compileMode,
            add_atomic_offsets=addAtomicOffsets,
        )
        force.setForceGroup(forceGroup)
        system.addForce(force)

    def getMLLongRange(self) -> bool:
        return False
