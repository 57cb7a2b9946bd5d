"""``flashcart-test``: evaluate ``best/`` on the validation and test sets, with parity plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..config import require
from ..data import BatchLoader, read_structures
from ..model.checkpoint import load_checkpoint
from ..model.predictor import Predictor
from ..utils.device import resolve_device, resolve_dtype
from .losses import Metrics, required_properties
from .trainer import setup_logger

__all__ = ["evaluate", "parity_plot"]


def parity_plot(ref_e, pred_e, ref_f, pred_f, path: Path, title: str) -> None:
    """Energy-per-atom and force-component parity plots side by side (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    for ax, ref, pred, label in ((axes[0], ref_e, pred_e, "energy per atom (eV)"), (axes[1], ref_f, pred_f, "force component (eV/Å)")):
        ax.scatter(ref, pred, s=4, alpha=0.5)
        lo, hi = float(min(ref.min(), pred.min())), float(max(ref.max(), pred.max()))
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        mae = float((pred - ref).abs().mean())
        ax.set_xlabel(f"reference {label}")
        ax.set_ylabel(f"predicted {label}")
        ax.set_title(f"MAE {mae:.4g}")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def evaluate(cfg: dict[str, Any], progress: bool = True) -> dict[str, dict[str, float]]:
    """Metrics of the checkpoint (``checkpoint`` or ``output_path/best``) per split; writes test.log and PNGs."""
    require(cfg, ["output_path"], "flashcart-test")
    out = Path(cfg["output_path"])
    ckpt = Path(cfg["checkpoint"]) if cfg["checkpoint"] else out / "best"
    log = setup_logger(out / "test.log")
    device, dtype = resolve_device(cfg["device"]), resolve_dtype(cfg["precision"])
    model = load_checkpoint(ckpt).to(device=device, dtype=dtype)
    predictor = Predictor.from_config(model, cfg)
    splits = {name: cfg[key] for name, key in (("valid", "valid_path"), ("test", "test_path")) if cfg[key]}
    if not splits:
        raise ValueError("flashcart-test needs valid_path or test_path in the configuration")
    props = required_properties(*cfg["valid_losses"].values()) | {"energy", "forces"}
    results = {}
    for name, path in splits.items():
        structures = read_structures(path, model.r_max, cfg["energy_key"], cfg["forces_key"], cfg["stress_key"], progress)
        loader = BatchLoader(structures, cfg["eval_batch_size"], model.z_to_type.cpu(), cfg["dynamic_batching"])
        metrics = Metrics(cfg["valid_losses"])
        ref_e, pred_e, ref_f, pred_f = [], [], [], []
        for batch in loader:
            b = batch.to(device, dtype)
            pred = predictor(b, forces=True, stress="stress" in props)
            metrics.update(pred, b)
            n = b.n_atoms.to(dtype)
            ref_e.append((b.energy / n).cpu())
            pred_e.append((pred["energy"].detach() / n).cpu())
            ref_f.append(b.forces.reshape(-1).cpu())
            pred_f.append(pred["forces"].detach().reshape(-1).cpu())
        values = metrics.compute()
        results[name] = values
        log.info(f"[{name}] {path}: {len(structures)} structures, checkpoint {ckpt}")
        for k, v in values.items():
            log.info(f"[{name}] {k} = {v:.6g}")
        png = out / f"parity_{name}.png"
        parity_plot(torch.cat(ref_e), torch.cat(pred_e), torch.cat(ref_f), torch.cat(pred_f), png, f"{name}: {path}")
        log.info(f"[{name}] parity plot {png}")
    return results
