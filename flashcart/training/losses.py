"""Loss terms and metrics (``docs/model.md``: property, reduce, normalization, delta, weight)."""

from __future__ import annotations

from typing import Any

import torch

from ..config.loader import named_losses

__all__ = ["errors", "reduce_errors", "loss_value", "masked_loss_value", "Metrics"]


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


def _masked_errors(term: dict[str, Any], pred: dict[str, torch.Tensor], targets: dict[str, torch.Tensor], atom_mask, graph_mask):
    """:func:`errors` on padded tensors: ``(errors, vector, rows)`` with ``rows`` the bool mask of the
    error rows that count (real atoms or graphs; graphs with a stress label). Errors of the other
    rows are finite (padding labels are replaced), so that no NaN reaches a gradient."""
    prop, norm = term["property"], term["normalization"]
    if prop == "energy":
        e = pred["energy"] - targets["energy"].to(pred["energy"].dtype)
        n = targets["n_atoms"].to(e.dtype).clamp_min(1)
        if norm == "per_atom":
            e = e / n
        elif norm == "per_sqrt_atom":
            e = e / n.sqrt()
        return e, False, graph_mask
    if prop == "forces":
        return pred["forces"] - targets["forces"].to(pred["forces"].dtype), True, atom_mask
    ref = targets["stress"].to(pred["stress"].dtype)
    has = torch.isfinite(ref).all(dim=2).all(dim=1) & graph_mask
    ref = torch.where(has[:, None, None], ref, torch.zeros_like(ref))
    return (pred["stress"] - ref).reshape(-1, 9), True, has


def _masked_reduce(e: torch.Tensor, rows: torch.Tensor, reduce: str, vector: bool, delta: float | None) -> torch.Tensor:
    """:func:`reduce_errors` over the rows ``rows`` selects (the same value, up to the order of the
    sums; zero when no row counts, as for an empty selection there)."""
    w = rows.to(e.dtype)
    n_rows = w.sum()
    if reduce.startswith("norm"):
        v = torch.linalg.vector_norm(e.reshape(e.shape[0], -1), dim=1) if vector else e.abs()
        total = (v * w).sum()
        return total if reduce == "norm_sum" else total / n_rows.clamp_min(1)
    per_row = e[0].numel() if e.dim() > 1 else 1
    count = (n_rows * per_row).clamp_min(1)
    w = w.reshape(-1, *[1] * (e.dim() - 1))
    a = e.abs()
    if reduce == "sae":
        return (a * w).sum()
    if reduce == "mae":
        return (a * w).sum() / count
    if reduce in ("sse", "mse", "rmse"):
        sse = (e * e * w).sum()
        if reduce == "sse":
            return sse
        if reduce == "mse":
            return sse / count
        some = n_rows > 0  # sqrt(0) has no derivative: a selection without rows gives 0, as reduce_errors
        return torch.where(some, torch.sqrt(torch.where(some, sse / count, torch.ones_like(sse))), torch.zeros_like(sse))
    if reduce == "maxe":
        return torch.where(w > 0, a, torch.zeros_like(a)).max()
    h = torch.nn.functional.huber_loss(e, torch.zeros_like(e), reduction="none", delta=delta) * w
    return h.sum() if reduce == "huber_sum" else h.sum() / count


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
        v = t["weight"] * _masked_reduce(e, rows, t["reduce"], vec, t.get("delta"))
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
