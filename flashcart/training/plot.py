"""``flashcart-plot RUN_DIR``: learning curves from ``metrics.csv``."""

from __future__ import annotations

import csv
from pathlib import Path

__all__ = ["plot_learning_curves"]


def plot_learning_curves(run_dir: str | Path) -> Path:
    """Write ``learning_curves.png`` beside ``metrics.csv``; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    path = run_dir / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (is {run_dir} a flashcart-train output_path?)")
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ValueError(f"{path} holds no epochs yet")
    keys = [k for k in rows[0] if k.startswith(("train_", "valid_"))]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    epochs = [int(r["epoch"]) for r in rows]
    for k in keys:
        pts = [(e, float(r[k])) for e, r in zip(epochs, rows) if r.get(k) not in (None, "")]
        if pts:
            axes[0].plot(*zip(*pts), label=k)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("epoch")
    axes[0].legend(fontsize=7)
    axes[1].plot(epochs, [float(r["lr"]) for r in rows])
    axes[1].set_xlabel("epoch")
    axes[1].set_ylabel("learning rate")
    fig.tight_layout()
    out = run_dir / "learning_curves.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
