"""One simulation engine shared by every integration (ASE, OpenMM, ``flashcart-md``).

:class:`Engine` turns positions (+ cell, pbc) into energy, forces and stress through the
:class:`~flashcart.model.Predictor`; adapters talk to it through the small
:class:`Evaluator` interface, which other evaluators (e.g. exported model files) implement too.
"""

import inspect
import os

from .engine import COMPILE_MODES, Engine
from .evaluator import Evaluation, Evaluator

__all__ = ["COMPILE_MODES", "Engine", "Evaluation", "Evaluator", "make_evaluator"]


def make_evaluator(model, defaults: dict | None = None, **options) -> Evaluator:
    """``model`` as an :class:`Evaluator`.

    A path ending in ``.pt2`` (a package from ``flashcart-export``) becomes its
    :class:`~flashcart.export.ExportedPotential`, an evaluator with its own device and dtype.
    An object with an ``evaluate`` method is returned as it is; ``options`` that differ from
    ``defaults`` (the caller's defaults; the engine's when ``None``) are then an error, as they
    would configure an engine that is not built. Anything else (a checkpoint directory, its
    ``model.pt`` or a :class:`~flashcart.model.FlashCartPotential`) becomes an :class:`Engine`
    with ``options``.
    """
    if isinstance(model, (str, os.PathLike)) and os.fspath(model).endswith(".pt2"):
        from ..export import load_exported

        model = load_exported(model)
    if isinstance(model, Evaluator):
        if defaults is None:
            defaults = {k: v.default for k, v in inspect.signature(Engine).parameters.items()}
        changed = sorted(k for k, v in options.items() if k not in defaults or v != defaults[k])
        if changed:
            raise ValueError(
                f"options {changed} configure a new engine, but an evaluator ({type(model).__name__}) was given: pass them when building it"
            )
        return model
    return Engine(model, **options)
