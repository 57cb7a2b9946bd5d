"""Optimizers (Muon for 2-D weights + AdamW for the rest, or AdamW) and the WSD schedule."""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["build_optimizers", "muon_eligible", "wsd_factor", "EMA"]


def muon_eligible(name: str, param: torch.Tensor) -> bool:
    """A hidden weight matrix: 2-D, both sides longer than one, not an embedding."""
    return param.dim() == 2 and min(param.shape) > 1 and "embedding" not in name


def build_optimizers(model: torch.nn.Module, cfg: dict[str, Any]) -> list[torch.optim.Optimizer]:
    """``optimizer: muon`` -> Muon on 2-D hidden weights, AdamW on the rest.

    Muon orthogonalises each update, which suits weight matrices mixing several outputs.
    Embeddings and matrices with a single row or column (the readout's last layer) are
    vectors in disguise: orthogonalising their update normalises it, so its size no longer
    follows the gradient and the mean energy settles only as the learning rate decays
    (measured in ``benchmarks/RESULTS.md``, energy offset). They go to AdamW.
    """
    lr, wd = cfg["lr"], cfg["weight_decay"]
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if cfg["optimizer"] == "muon":
        matrices = [p for n, p in named if muon_eligible(n, p)]
        ids = {id(p) for p in matrices}
        rest = [p for _, p in named if id(p) not in ids]
        opts: list[torch.optim.Optimizer] = []
        if matrices:
            # match_rms_adamw scales the orthogonalised update to an element RMS of 0.2 * lr;
            # dividing by 0.2 gives matrices the same per-element step size as AdamW's.
            opts.append(torch.optim.Muon(matrices, lr=lr / 0.2, weight_decay=wd, adjust_lr_fn="match_rms_adamw"))
        if rest:
            opts.append(torch.optim.AdamW(rest, lr=lr, weight_decay=wd))
        return opts
    return [torch.optim.AdamW([p for _, p in named], lr=lr, weight_decay=wd)]


def wsd_factor(epoch: int, cfg: dict[str, Any]) -> float:
    """Warmup-stable-decay learning-rate factor for a 0-based epoch."""
    warm, decay, total = cfg["warmup_epochs"], cfg["decay_epochs"], cfg["max_epochs"]
    start, end = cfg["start_factor"], cfg["end_factor"]
    if warm and epoch < warm:
        t = epoch / warm
        if cfg["warmup_shape"] == "cosine":
            t = 0.5 * (1 - math.cos(math.pi * t))
        return start + (1 - start) * t
    decay_start = max(total - decay, warm)
    if decay and epoch >= decay_start:
        t = min(1.0, (epoch - decay_start + 1) / max(total - decay_start, 1))
        if cfg["decay_shape"] == "sqrt":
            t = math.sqrt(t)
        elif cfg["decay_shape"] == "cosine":
            t = 0.5 * (1 - math.cos(math.pi * t))
        return 1 + (end - 1) * t
    return 1.0


class EMA:
    """Exponential moving average of parameters and buffers (``decay`` per optimizer step)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        for k, v in model.state_dict().items():
            if v.is_floating_point() and self.decay > 0:
                self.shadow[k].lerp_(v.detach(), 1 - self.decay)
            else:
                self.shadow[k].copy_(v)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.shadow

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for k, v in state.items():
            self.shadow[k].copy_(v)
