"""Loss terms and metrics (``docs/model.md``: property, reduce, normalization, delta, weight)."""

from __future__ import annotations

from typing import Any

import torch

from ..config.loader import named_losses

__all__ = ["errors", "reduce_errors", "loss_value", "Metrics"]


def errors(term: dict[str, Any], pred: dict[str, torch.Tensor], batch) -> tuple[torch.Tensor, bool]:
    """Per-item errors ``pred - ref`` for a term, and whether items are vectors (forces rows).

    Energies: ``[G]`` (divided by ``n`` or ``sqrt(n)`` for per_atom / per_sqrt_atom); forces:
    ``[N, 3]``; stress: ``[G', 9]`` over graphs that carry a stress label.
    """
    prop, norm = term["property"], term["normalization"]
    if prop == "energy":
        e = pred["energy"] - batch.energy.to(pred["energy"].dtype)
        n = batch.n_atoms.to(e.dtype)
        if norm == "per_atom":
            e = e / n
        elif norm == "per_sqrt_atom":
            e = e / n.sqrt()
        return e, False
    if prop == "forces":
        return pred["forces"] - batch.forces.to(pred["forces"].dtype), True
    ref = batch.stress.to(pred["stress"].dtype)
    has = torch.isfinite(ref).all(dim=(1, 2))
    return (pred["stress"] - ref)[has].reshape(-1, 9), True


def reduce_errors(e: torch.Tensor, reduce: str, vector: bool, delta: float | None = None) -> torch.Tensor:
    """Reduce errors to a scalar (``norm_*`` reduce per-row vector norms)."""
    if e.numel() == 0:
        return e.new_zeros(())
    if reduce.startswith("norm"):
        v = torch.linalg.vector_norm(e.reshape(e.shape[0], -1), dim=1) if vector else e.abs()
        return v.sum() if reduce == "norm_sum" else v.mean()
    a = e.abs()
    if reduce == "sae":
        return a.sum()
    if reduce == "mae":
        return a.mean()
    if reduce == "sse":
        return (e * e).sum()
    if reduce == "mse":
        return (e * e).mean()
    if reduce == "rmse":
        return torch.sqrt((e * e).mean())
    if reduce == "maxe":
        return a.max()
    h = torch.nn.functional.huber_loss(e, torch.zeros_like(e), reduction="none", delta=delta)
    return h.sum() if reduce == "huber_sum" else h.mean()


def _terms(loss: dict[str, Any]) -> list[dict[str, Any]]:
    return loss["weighted_sum"] if "weighted_sum" in loss else [{**loss, "weight": 1.0}]


def required_properties(*losses: dict[str, Any]) -> set[str]:
    """Properties (energy, forces, stress) the given losses need."""
    return {t["property"] for loss in losses for t in _terms(loss)}


def loss_value(loss: dict[str, Any], pred: dict[str, torch.Tensor], batch) -> torch.Tensor:
    """Value of a (weighted-sum) loss on one batch."""
    total = None
    for t in _terms(loss):
        e, vec = errors(t, pred, batch)
        v = t["weight"] * reduce_errors(e, t["reduce"], vec, t.get("delta"))
        total = v if total is None else total + v
    return total


class Metrics:
    """Accumulate errors over batches; evaluate named losses over the whole split.

    ``losses``: a mapping of metric names to validated losses, or a list of validated losses
    (named by :func:`flashcart.config.loader.named_losses`, e.g. ``forces_mae``).
    """

    def __init__(self, losses: dict[str, dict[str, Any]] | list[dict[str, Any]]):
        if isinstance(losses, list):
            losses = named_losses(losses)
        self.losses = losses
        self.keys = {(t["property"], t["normalization"]) for loss in losses.values() for t in _terms(loss)}
        self.store: dict[tuple[str, str], list[torch.Tensor]] = {k: [] for k in self.keys}

    def update(self, pred: dict[str, torch.Tensor], batch) -> None:
        detached = {k: v.detach() for k, v in pred.items()}
        for prop, norm in self.keys:
            e, _ = errors({"property": prop, "normalization": norm}, detached, batch)
            self.store[(prop, norm)].append(e.double().cpu())

    def compute(self) -> dict[str, float]:
        out = {}
        for name, loss in self.losses.items():
            total = 0.0
            for t in _terms(loss):
                chunks = self.store[(t["property"], t["normalization"])]
                e = torch.cat(chunks) if chunks else torch.zeros(0)
                total += t["weight"] * float(reduce_errors(e, t["reduce"], t["property"] != "energy", t.get("delta")))
            out[name] = total
        return out
