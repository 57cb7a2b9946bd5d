"""Where does a constant energy offset come from?  Train one configuration with one change at a
time and report the signed per-atom energy error on every split.

    python benchmarks/energy_offset.py examples/ethanol/config.yaml --variants muon-all adamw-vectors
    python benchmarks/energy_offset.py CONFIG --variants adamw-vectors no-ema KEY=VALUE ...

Variants (one change each against the shipped behaviour, ``adamw-vectors``):

* ``muon-all``: Muon also on weight matrices with one row (the readout's last layer), as
  FlashCart did before 0.2;
* ``adamw-vectors``: Muon on hidden matrices only (shipped);
* ``no-ema``: ``ema_decay=0`` (evaluates the raw weights);
* ``energy-weight-10``: the energy term of the training loss weighted 10x.

For each variant: the signed error (mean of predicted - reference, meV/atom), MAE and the
standard deviation per split, evaluated in float64 and in float32 (float32 accumulation of
site energies), and before training (the pre-fit alone).
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch

from flashcart.config import load_config
from flashcart.data import BatchLoader, read_structures
from flashcart.model.checkpoint import load_checkpoint
from flashcart.model.potential import FlashCartPotential
from flashcart.model.predictor import Predictor
from flashcart.model.prefit import prefit
from flashcart.training import optim
from flashcart.training.trainer import train

SPLITS = ("train_path", "valid_path", "test_path")


def signed_errors(model, structures, dtype) -> torch.Tensor:
    """Predicted minus reference energy per atom (eV), one entry per structure."""
    model = model.to(dtype)
    predictor = Predictor(model)
    out = []
    for batch in BatchLoader(structures, 50, model.z_to_type.cpu(), dynamic=False):
        b = batch.to("cpu", dtype)
        e = predictor(b, forces=False)["energy"]
        out.append(((e - b.energy) / b.n_atoms.to(dtype)).double())
    return torch.cat(out)


def report(label, model, data) -> list[str]:
    rows = []
    for split, structures in data.items():
        for dtype in (torch.float64, torch.float32):
            err = signed_errors(copy.deepcopy(model), structures, dtype) * 1000
            rows.append(f"| {label} | {split} | {str(dtype)[6:]} | {err.mean():+.3f} | {err.abs().mean():.3f} | {err.std():.3f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--variants", nargs="+", default=["muon-all", "adamw-vectors"])
    parser.add_argument("--out", default="runs/energy_offset")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args()
    shipped = optim.muon_eligible
    base = load_config(args.config, args.overrides)
    data = {
        k.split("_")[0]: read_structures(base[k], base["r_max"], base["energy_key"], base["forces_key"], base["stress_key"], False)
        for k in SPLITS
        if base[k]
    }
    rows = ["| variant | split | eval dtype | signed error (meV/atom) | MAE | std |", "| --- | --- | --- | --- | --- | --- |"]
    for variant in args.variants:
        cfg = dict(base, output_path=str(Path(args.out) / variant))
        optim.muon_eligible = shipped
        if variant == "muon-all":
            optim.muon_eligible = lambda name, p: p.dim() == 2 and "embedding" not in name
        elif variant == "no-ema":
            cfg["ema_decay"] = 0.0
        elif variant == "energy-weight-10":
            loss = copy.deepcopy(cfg["train_loss"])
            for term in loss.get("weighted_sum", []):
                if term["property"] == "energy":
                    term["weight"] *= 10
            cfg["train_loss"] = loss
        elif variant != "adamw-vectors":
            raise SystemExit(f"unknown variant {variant!r}")
        t0 = time.perf_counter()
        run = train(cfg, progress=False)
        minutes = (time.perf_counter() - t0) / 60
        model = load_checkpoint(run / "best")
        if variant == args.variants[0]:
            fresh = FlashCartPotential.from_config(cfg, elements=model.elements)
            prefit(fresh, data["train"], cfg["atomic_shifts"], cfg["fit_atomic_shifts"])
            rows += report("pre-fit only", fresh, data)
        rows += report(f"{variant} ({minutes:.1f} min)", model, data)
        print("\n".join(rows), flush=True)
    optim.muon_eligible = shipped


if __name__ == "__main__":
    main()
