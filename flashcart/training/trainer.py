"""``flashcart-train``: fit a FlashCart potential and write the run directory.

Run directory (``output_path``): ``config.yaml`` (merged), ``train.log``, ``metrics.csv``,
``best/`` (EMA weights at the best early-stopping metric) and ``log/`` (latest weights and
``training_state.pt``). Starting the same command again resumes from ``log/``: the run
continues from the last saved epoch and, on the CPU, ends with the same weights as an
uninterrupted run (shuffling is seeded per epoch; optimizer, EMA and RNG states are saved).

With ``devices x n_nodes > 1`` the same loop runs in one process per device with
DistributedDataParallel (:mod:`flashcart.training.distributed`); rank 0 writes the run directory.
"""

from __future__ import annotations

import csv
import io
import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import yaml
from ase.data import atomic_numbers

from ..config import ConfigError, dump_config, require
from ..data import BatchLoader, read_structures
from ..model.checkpoint import save_checkpoint
from ..model.potential import MODEL_KEYS, FlashCartPotential
from ..model.predictor import Predictor
from ..model.prefit import prefit, solve_shift_correction
from ..utils.device import resolve_device, resolve_dtype
from ..utils.io import atomic_write, atomic_write_text
from ..utils.progress import progress_bar
from . import distributed
from .distributed import Context
from .losses import Metrics, loss_value, masked_loss_value, required_properties
from .optim import EMA, build_optimizers, wsd_factor

__all__ = ["train", "TrainingError", "setup_logger"]


class TrainingError(RuntimeError):
    """Training cannot continue (non-finite loss, inconsistent resume)."""


def setup_logger(path: Path) -> logging.Logger:
    logger = logging.getLogger(f"flashcart.{path}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if not logger.handlers:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
        stream = logging.StreamHandler()
        stream.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(stream)
    return logger


def infer_elements(structures) -> list[str]:
    from ase.data import chemical_symbols

    zs = sorted({int(z) for s in structures for z in s.numbers.tolist()})
    return [chemical_symbols[z] for z in zs]


def _read(cfg: dict[str, Any], key: str, progress: bool):
    return read_structures(cfg[key], cfg["r_max"], cfg["energy_key"], cfg["forces_key"], cfg["stress_key"], progress)


def _evaluate(
    predictor: Predictor, loader, metrics: Metrics, props: set[str], device, dtype, ctx: Context = distributed.SINGLE
) -> dict[str, float]:
    """Metrics over the loader's batches; with several ranks, over every rank's batches."""
    for batch in loader:
        b = batch.to(device, dtype)
        pred = predictor(b, forces="forces" in props, stress="stress" in props)
        metrics.update(pred, b)
    distributed.gather_metrics(metrics, ctx)
    return metrics.compute()


@torch.no_grad()
def _refit_shifts(predictor: Predictor, loader, n_elements: int, device, dtype, ctx: Context) -> torch.Tensor:
    """Correction ``[n_el]`` (eV, float64) to the per-element shifts that removes the mean energy residual.

    Force training moves the weights along directions that change every energy by a near-constant
    amount (forces do not see it) and only the weak energy term pulls it back, so the averaged
    weights carry a drifting offset (``benchmarks/RESULTS.md``, energy offset). Least squares of the
    training residuals ``E_ref - E_pred`` on the element counts, summed over every rank's batches,
    removes it in closed form after each epoch (energies only: no forces are computed).
    """
    ata = torch.zeros(n_elements, n_elements, dtype=torch.float64)
    aty = torch.zeros(n_elements, dtype=torch.float64)
    max_count = 0.0
    for batch in loader:
        b = batch.to(device, dtype)
        energy = predictor(b, forces=False)["energy"].double().cpu()
        counts = torch.zeros(b.n_graphs, n_elements, dtype=torch.float64)
        counts.index_put_((b.batch.cpu(), b.types.cpu()), torch.ones(b.types.shape[0], dtype=torch.float64), accumulate=True)
        residual = b.energy.double().cpu() - energy
        ok = torch.isfinite(residual)
        counts, residual = counts[ok], residual[ok]
        ata += counts.T @ counts
        aty += counts.T @ residual
        max_count = max(max_count, float(counts.max()) if counts.numel() else 0.0)
    if ctx.distributed:
        parts = ctx.all_gather((ata, aty, max_count))
        ata, aty = sum(p[0] for p in parts), sum(p[1] for p in parts)
        max_count = max(p[2] for p in parts)
    if max_count == 0.0:  # no energies in the training set
        return torch.zeros(n_elements, dtype=torch.float64)
    return solve_shift_correction(ata, aty, max_count)


def _silent_logger() -> logging.Logger:
    """The logger of ranks other than 0: only rank 0 writes train.log and prints."""
    logger = logging.getLogger("flashcart.silent-rank")
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


class _MetricsFile:
    """``metrics.csv`` rewritten atomically after each epoch (rows after a resume point dropped)."""

    def __init__(self, path: Path, keep_until_epoch: int):
        self.path, self.rows = path, []
        if path.exists() and keep_until_epoch > 0:
            with path.open() as fh:
                self.rows = [r for r in csv.DictReader(fh) if int(r["epoch"]) <= keep_until_epoch]

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        buf = io.StringIO()
        fields = list(dict.fromkeys(k for r in self.rows for k in r))
        writer = csv.DictWriter(buf, fieldnames=fields)
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.path, buf.getvalue())


def train(cfg: dict[str, Any], progress: bool = True) -> Path:
    """Train according to a merged configuration; returns the run directory.

    With ``devices x n_nodes`` above one (``strategy: ddp``, or ``auto`` with several
    devices) training is data-parallel (:mod:`flashcart.training.distributed`): this call
    spawns one process per device, or, inside ``torchrun``, is one of its processes.
    ``train_batch_size`` is per process; N processes equal one process with N times the batch.
    """
    require(cfg, ["train_path", "output_path"], "flashcart-train")
    world = distributed.world_size(cfg)
    if world == 1:
        return _train(cfg, progress, distributed.SINGLE)
    if distributed.under_torchrun():
        return _ddp_worker(cfg, progress)
    distributed.spawn(_ddp_worker, world, cfg, progress)
    return Path(cfg["output_path"])


def _ddp_worker(cfg: dict[str, Any], progress: bool) -> Path:
    """One data-parallel process: join the group, train, leave the group."""
    ctx = distributed.init_from_env(cfg)
    try:
        return _train(cfg, progress and ctx.is_main, ctx)
    finally:
        distributed.shutdown()


def _train(cfg: dict[str, Any], progress: bool, ctx: Context) -> Path:
    out = Path(cfg["output_path"])
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
    log = setup_logger(out / "train.log") if ctx.is_main else _silent_logger()
    device = ctx.device if ctx.distributed else resolve_device(cfg["device"])
    dtype = resolve_dtype(cfg["precision"])
    torch.manual_seed(cfg["model_seed"])
    state_file = out / "log" / "training_state.pt"
    resuming = ctx.broadcast(state_file.exists())

    train_set = _read(cfg, "train_path", progress)
    elements = cfg["elements"] or infer_elements(train_set)
    for sym in elements:
        if sym not in atomic_numbers:
            raise ConfigError(f"elements: unknown chemical symbol {sym!r}")
    record = {**cfg, "elements": elements}  # what config.yaml and the checkpoints record
    valid_set = _read(cfg, "valid_path", progress) if cfg["valid_path"] else None

    state = None
    if resuming and ctx.is_main:
        saved = yaml.safe_load((out / "config.yaml").read_text())
        changed = [k for k in (*MODEL_KEYS, "elements") if saved.get(k) != record.get(k)]
        if changed:
            raise TrainingError(f"{out} holds a run with different model settings {changed}; use a new output_path")
        try:
            state = torch.load(state_file, weights_only=False)
        except Exception as err:
            raise TrainingError(f"{state_file}: cannot be read ({err}); remove {out / 'log'} to start over") from None
    if resuming:
        state = ctx.broadcast(state)
        model = FlashCartPotential.from_config(cfg, elements=elements)
        model.to(dtype=dtype)  # before loading: float64 weights must not pass through float32
        try:
            model.load_state_dict(state["model"])
        except RuntimeError:
            raise TrainingError(
                f"{state_file}: its weights do not fit this version's architecture (a run of an older FlashCart "
                f"architecture?); use a new output_path or remove {out / 'log'} to start over"
            ) from None
        log.info(f"resuming from {out / 'log'} after epoch {state['epoch']}")
    else:
        model = FlashCartPotential.from_config(cfg, elements=elements)
        if ctx.is_main:  # the pre-fit runs once; the other ranks take its values below
            fitted = prefit(model, train_set, cfg["atomic_shifts"], cfg["fit_atomic_shifts"])
            log.info(f"pre-fit: {fitted}")
            dump_config(record, out / "config.yaml")
        ctx.broadcast_module(model)
    model.to(device=device, dtype=dtype)
    n_params = sum(p.numel() for p in model.parameters())
    log.info(f"model: {n_params} parameters, elements {model.elements}, device {device}, dtype {dtype}, processes {ctx.world_size}")

    opts = build_optimizers(model, cfg)
    trainable = [p for p in model.parameters() if p.requires_grad]
    ema = EMA(model, cfg["ema_decay"])
    eval_model = _twin(model)
    net = distributed.wrap(model, ctx)  # averages gradients over ranks
    predictor, eval_predictor = Predictor.from_config(net, cfg), Predictor.from_config(eval_model, cfg)
    train_props = required_properties(cfg["train_loss"])
    eval_props = required_properties(cfg["early_stopping_loss"], *cfg["valid_losses"].values())
    loader = BatchLoader(
        train_set,
        cfg["train_batch_size"],
        model.z_to_type.cpu(),
        cfg["dynamic_batching"],
        shuffle=True,
        seed=cfg["data_seed"],
        drop_last=cfg["drop_last"],
        rank=ctx.rank,
        world_size=ctx.world_size,
        n_workers=cfg["n_workers"],
        pin_memory=device.type == "cuda",
    )

    def eval_loader(structures):  # this rank's share, in file order
        return BatchLoader(
            structures,
            cfg["eval_batch_size"],
            model.z_to_type.cpu(),
            cfg["dynamic_batching"],
            rank=ctx.rank,
            world_size=ctx.world_size,
            equal_steps=False,
            n_workers=cfg["n_workers"],
        )

    valid_loader = eval_loader(valid_set) if valid_set else None
    shift_loader = eval_loader(train_set)  # for the per-epoch refit of the energy shifts
    start_epoch, best = 0, float("inf")
    if state is not None:
        for opt, s in zip(opts, state["optimizers"]):
            opt.load_state_dict(s)
        ema.load_state_dict(state["ema"])
        start_epoch, best = state["epoch"], state["best"]
        torch.set_rng_state(state["rng"])
    metrics_file = _MetricsFile(out / "metrics.csv", start_epoch) if ctx.is_main else None
    base_lrs = [[g["lr"] for g in o.param_groups] for o in opts]
    if state is not None:
        base_lrs = state["base_lrs"]

    # A compiled prediction computes the loss and the parameter gradients in one compiled function
    # (Predictor.loss_and_grads): its backward would otherwise also compute the loss's derivative
    # with respect to the positions and drop it (on the H200: 11.5 instead of 22.6 ms with compile
    # mode default, 7.77 instead of 8.58 ms with reduce-overhead). With
    # several processes DistributedDataParallel averages the gradients in backward hooks, so the
    # loss is backpropagated outside as before.
    in_graph = predictor.compile and not ctx.distributed
    step_loss = partial(masked_loss_value, cfg["train_loss"])  # one object: the compiled step is cached per loss function
    for epoch in range(start_epoch, cfg["max_epochs"]):
        factor = wsd_factor(epoch, cfg)
        for opt, lrs in zip(opts, base_lrs):
            for g, lr in zip(opt.param_groups, lrs):
                g["lr"] = lr * factor
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        model.train()
        # No host synchronisation per step: the loss sum and the first non-finite step stay on
        # the device and are read once after the epoch (before anything is saved), so the host
        # queues the next batch while the device still works on this one.
        total, count, stats = torch.zeros((), dtype=torch.float64, device=device), 0, []
        first_bad = torch.full((), -1, dtype=torch.long, device=device)
        # item counts of each step's global batch (all ranks), for the loss normalisation
        steps = loader.steps()  # this epoch's batches of every rank (also sets loader.dropped)
        counts = [distributed.step_counts([train_set[i] for b in step for i in b]) for step in steps] if ctx.distributed else []
        if loader.dropped:
            log.info(f"epoch {epoch + 1}: drop_last leaves out {loader.dropped} structures")
        bar = progress_bar(loader, desc=f"epoch {epoch + 1}/{cfg['max_epochs']}", disable=not progress, leave=False)
        for k, batch in enumerate(bar):
            b = batch.to(device, dtype)
            forces, stress = "forces" in train_props, "stress" in train_props
            if in_graph:
                value, grads = predictor.loss_and_grads(b, step_loss, trainable, forces=forces, stress=stress)
            else:
                pred = predictor(b, forces=forces, stress=stress, create_graph=True)
                if ctx.distributed:
                    loss, step_stats = distributed.global_loss(cfg["train_loss"], pred, b, counts[k], ctx)
                    stats.append(step_stats)
                else:
                    loss = loss_value(cfg["train_loss"], pred, b)
                value = loss.detach()
            first_bad = torch.where((first_bad < 0) & ~torch.isfinite(value), k, first_bad)
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            if in_graph:
                for p, g in zip(trainable, grads):
                    p.grad = g
            else:
                # only the parameters: the positions (a leaf of the force graph) get no gradient,
                # so the eager double backward skips every term that only leads to them
                loss.backward(inputs=trainable)
            if cfg["grad_clip_norm"] is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip_norm"])
            for opt in opts:
                opt.step()
            ema.update(model)
            total += value / ctx.world_size  # this rank's share (progress bar only)
            count += 1
            if progress and count % 10 == 1:  # the bar reads the loss (a synchronisation) every 10 steps
                bar.set_postfix(loss=f"{float(total) / count:.4g}")
        bad = ctx.earliest(first_bad)  # the same on every rank: all of them stop together
        if bad >= 0:
            raise TrainingError(
                f"non-finite training loss at epoch {epoch + 1}, batch {bad + 1}; "
                "lower lr, set grad_clip_norm, or check the data (nothing of this epoch was saved)"
            )
        total = float(total)
        row: dict[str, Any] = {
            "epoch": epoch + 1,
            "time": round(time.perf_counter() - t0, 3),
            "lr": cfg["lr"] * factor,
            "train_loss": distributed.epoch_loss(cfg["train_loss"], stats, counts, ctx) if ctx.distributed else total / max(count, 1),
        }
        last = epoch + 1 == cfg["max_epochs"]
        if cfg["fit_atomic_shifts"]:
            eval_model.load_state_dict(ema.state_dict())
            delta = _refit_shifts(eval_predictor, shift_loader, len(model.elements), device, dtype, ctx)
            with torch.no_grad():  # the same correction for the live weights and their average
                model.atomic_shifts.add_(delta.to(model.atomic_shifts))
                ema.shadow["atomic_shifts"].add_(delta.to(ema.shadow["atomic_shifts"]))
            row["shift_refit"] = float(delta.abs().max())
        if valid_loader is not None and ((epoch + 1) % cfg["validate_every"] == 0 or last):
            eval_model.load_state_dict(ema.state_dict())
            losses = {**cfg["valid_losses"], "early_stopping": cfg["early_stopping_loss"]}
            values = _evaluate(eval_predictor, valid_loader, Metrics(losses), eval_props, device, dtype, ctx)
            row.update({f"valid_{k}": v for k, v in values.items()})
            if values["early_stopping"] < best:
                best = values["early_stopping"]
                if ctx.is_main:
                    save_checkpoint(model, out / "best", ema.state_dict(), record)
        elif valid_loader is None and ctx.is_main:
            save_checkpoint(model, out / "best", ema.state_dict(), record)
        if ctx.is_main:  # one writer: rank 0
            metrics_file.append(row)
            log.info(" ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
            if (epoch + 1) % cfg["save_every"] == 0 or last:
                _save_state(model, opts, ema, epoch + 1, best, base_lrs, out, record)
    log.info(f"done: best/ early-stopping metric {best:.6g}")
    return out


def _twin(model: FlashCartPotential) -> FlashCartPotential:
    """A second model with the same architecture, device and dtype (holds EMA weights)."""
    twin = FlashCartPotential(model.elements, **{k: model.options[k] for k in MODEL_KEYS})
    p = next(model.parameters())
    return twin.to(device=p.device, dtype=p.dtype)


def _save_state(model, opts, ema, epoch, best, base_lrs, out: Path, cfg) -> None:
    """Save log/: the weights as a checkpoint, and the resume point as one atomic file."""
    save_checkpoint(model, out / "log", config=cfg)
    state = {
        "epoch": epoch,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "best": best,
        "optimizers": [o.state_dict() for o in opts],
        "ema": ema.state_dict(),
        "rng": torch.get_rng_state(),
        "base_lrs": base_lrs,
    }
    atomic_write(out / "log" / "training_state.pt", lambda h: torch.save(state, h), binary=True)
