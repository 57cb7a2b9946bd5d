"""The FlashCart potential, its pre-fit, checkpoints and the inference engine."""

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .potential import MODEL_KEYS, FlashCartPotential
from .predictor import Predictor, energy_forces_stress
from .prefit import prefit

__all__ = [
    "MODEL_KEYS",
    "CheckpointError",
    "FlashCartPotential",
    "Predictor",
    "energy_forces_stress",
    "load_checkpoint",
    "prefit",
    "save_checkpoint",
]
