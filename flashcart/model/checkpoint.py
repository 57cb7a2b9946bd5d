"""Checkpoint directories: ``model.pt`` (weights, elements, architecture) + ``config.yaml``.

Writes are atomic (temporary file + rename) so an interrupted save leaves the previous
checkpoint loadable. Loading errors name the directory and what is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import flashcart

from ..utils.io import atomic_write
from .potential import MODEL_KEYS, FlashCartPotential

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointError", "CHECKPOINT_FORMAT"]

# Format 2: the published architecture (parameters.md). Format 1 held the earlier layer
# internals, whose tensors do not map onto these: such checkpoints are refused by name.
CHECKPOINT_FORMAT = "flashcart-checkpoint-2"
_OLD_FORMATS = ("flashcart-checkpoint-1",)


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the path."""


def save_checkpoint(
    model: FlashCartPotential,
    directory: str | Path,
    state_dict: dict[str, torch.Tensor] | None = None,
    config: dict[str, Any] | None = None,
) -> None:
    """Write ``directory/model.pt`` (and ``config.yaml`` when given), atomically."""
    directory = Path(directory)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": flashcart.__version__,
        "elements": model.elements,
        "model_options": {k: model.options[k] for k in MODEL_KEYS},
        "state_dict": {k: v.detach().cpu() for k, v in (state_dict or model.state_dict()).items()},
    }
    atomic_write(directory / "model.pt", lambda h: torch.save(payload, h), binary=True)
    if config is not None:
        from ..config import dump_config

        dump_config(config, directory / "config.yaml")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> FlashCartPotential:
    """A model from a checkpoint directory (or its ``model.pt``)."""
    path = Path(path)
    file = path / "model.pt" if path.is_dir() else path
    if not file.is_file():
        raise CheckpointError(f"no checkpoint at {path} (expected a directory with model.pt)")
    try:
        payload = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{file}: cannot be read as a FlashCart checkpoint ({type(err).__name__}: {err})") from None
    if isinstance(payload, dict) and payload.get("format") in _OLD_FORMATS:
        raise CheckpointError(
            f"{file}: written by an older FlashCart architecture (format {payload['format']!r}, FlashCart "
            f"{payload.get('version', '?')}), whose layers differ from the published architecture this version "
            "implements; its weights cannot be used. Retrain with this version (the same configuration works)."
        )
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{file}: not a FlashCart checkpoint (missing format tag)")
    model = FlashCartPotential(payload["elements"], **payload["model_options"])
    stored = [v.dtype for k, v in payload["state_dict"].items() if v.is_floating_point() and k.endswith("weight")]
    if stored:
        model.to(stored[0])  # keep the precision the weights were saved in
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as err:
        raise CheckpointError(f"{file}: weights do not match the stored architecture ({err})") from None
    return model
