"""Loss terms and metrics (``docs/model.md``: property, reduce, normalization, delta, weight)."""

from __future__ import annotations

from typing import Any

import torch

from ..config.loader import named_losses

__all__ = ["errors", "reduce_errors", "loss_value", "masked_loss_value", "Metrics"]


def _per_atoms(e: torch.Tensor, n_atoms: torch.Tensor, norm: str) -> torch.Tensor:
    """Energy errors divided by ``n`` or ``sqrt(n)`` (per_atom / per_sqrt_atom), or as they are."""
    n = n_atoms.to(e.dtype)
    if norm == "per_atom":
        return e / n
    if norm == "per_sqrt_atom":
        return e / n.sqrt()
    return e


def errors(term: dict[str, Any], pred: dict[str, torch.Tensor], batch) -> tuple[torch.Tensor, bool]:
    """Per-item errors ``pred - ref`` for a term, and whether items are vectors (forces rows).

    Energies: ``[G]`` (divided by ``n`` or ``sqrt(n)`` for per_atom / per_sqrt_atom); forces:
    ``[N, 3]``; stress: ``[G', 9]`` over graphs that carry a stress label.
    """
    prop = term["property"]
    if prop == "energy":
        return _per_atoms(pred["energy"] - batch.energy.to(pred["energy"].dtype), batch.n_atoms, term["normalization"]), False
    if prop == "forces":
        return pred["forces"] - batch.forces.to(pred["forces"].dtype), True
    ref = batch.stress.to(pred["stress"].dtype)
    has = torch.isfinite(ref).all(dim=(1, 2))
    return (pred["stress"] - ref)[has].reshape(-1, 9), True


def reduce_errors(e: torch.Tensor, reduce: str, vector: bool, delta: float | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce errors to a scalar (``norm_*`` reduce per-row vector norms).

    ``rows`` (bool ``[len(e)]``, padded tensors of a compiled training step): only the rows it
    selects count; the same value as those rows alone, up to the order of the sums, and zero
    (with a zero gradient) when it selects none, as for no errors.
    """
    if rows is None and e.numel() == 0:
        return e.new_zeros(())
    w = None if rows is None else rows.to(e.dtype)

    def total(x):
        return x.sum() if w is None else (x * w.reshape(-1, *[1] * (x.dim() - 1))).sum()

    def mean(x):
        if w is None:
            return x.mean()
        return total(x) / (w.sum() * (x[0].numel() if x.dim() > 1 else 1)).clamp_min(1)

    if reduce.startswith("norm"):
        v = torch.linalg.vector_norm(e.reshape(e.shape[0], -1), dim=1) if vector else e.abs()
        return total(v) if reduce == "norm_sum" else mean(v)
    a = e.abs()
    if reduce == "sae":
        return total(a)
    if reduce == "mae":
        return mean(a)
    if reduce == "sse":
        return total(e * e)
    if reduce == "mse":
        return mean(e * e)
    if reduce == "rmse":
        if w is None:
            return torch.sqrt(mean(e * e))
        some = w.sum() > 0  # sqrt(0) has no derivative: no selected row gives 0, as no errors
        ms = mean(e * e)
        return torch.where(some, torch.sqrt(torch.where(some, ms, torch.ones_like(ms))), torch.zeros_like(ms))
    if reduce == "maxe":
        return a.max() if w is None else torch.where(w.reshape(-1, *[1] * (a.dim() - 1)) > 0, a, torch.zeros_like(a)).max()
    h = torch.nn.functional.huber_loss(e, torch.zeros_like(e), reduction="none", delta=delta)
    return total(h) if reduce == "huber_sum" else mean(h)


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


def _masked_errors(term: dict[str, Any], pred: dict[str, torch.Tensor], targets: dict[str, torch.Tensor], atom_mask, graph_mask):
    """:func:`errors` on padded tensors: ``(errors, vector, rows)`` with ``rows`` the bool mask of the
    error rows that count (real atoms or graphs; graphs with a stress label). Errors of the other
    rows are finite (padding labels are replaced), so that no NaN reaches a gradient."""
    prop = term["property"]
    if prop == "energy":
        e = pred["energy"] - targets["energy"].to(pred["energy"].dtype)
        return _per_atoms(e, targets["n_atoms"].clamp_min(1), term["normalization"]), False, graph_mask
    if prop == "forces":
        return pred["forces"] - targets["forces"].to(pred["forces"].dtype), True, atom_mask
    ref = targets["stress"].to(pred["stress"].dtype)
    has = torch.isfinite(ref).all(dim=2).all(dim=1) & graph_mask
    ref = torch.where(has[:, None, None], ref, torch.zeros_like(ref))
    return (pred["stress"] - ref).reshape(-1, 9), True, has


def masked_loss_value(
    loss: dict[str, Any], pred: dict[str, torch.Tensor], targets: dict[str, torch.Tensor], atom_mask: torch.Tensor, graph_mask: torch.Tensor
) -> torch.Tensor:
    """:func:`loss_value` of predictions and labels padded to fixed capacities (static shapes: it
    runs inside a compiled training step, see :meth:`flashcart.model.Predictor.loss_and_grads`).

    ``pred``: ``energy [G']``, ``forces [N', 3]``, ``stress [G', 3, 3]`` (those the loss needs);
    ``targets``: the labels padded alike, plus ``n_atoms [G']``; ``atom_mask [N']`` and
    ``graph_mask [G']`` (bool): the real atoms and graphs.
    """
    total = None
    for t in _terms(loss):
        e, vec, rows = _masked_errors(t, pred, targets, atom_mask, graph_mask)
        v = t["weight"] * reduce_errors(e, t["reduce"], vec, t.get("delta"), rows)
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
