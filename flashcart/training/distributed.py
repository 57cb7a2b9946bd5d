"""Data-parallel training on ``torch.distributed``: launching, process groups and rank-aware helpers.

``strategy: ddp`` with ``devices: N`` (and ``n_nodes: M``) trains one process per device with
:class:`torch.nn.parallel.DistributedDataParallel`: NCCL between GPUs, gloo between CPU
processes (``device=cpu strategy=ddp devices=2`` runs two gloo processes on the CPU).

Processes are started either by ``flashcart-train`` itself (one node: it spawns ``devices``
processes) or by ``torchrun`` (any number of nodes; ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` come from its environment, and ``WORLD_SIZE`` must equal
``devices x n_nodes``).

``train_batch_size`` is per device: a step of N processes sees ``N x train_batch_size``
structures and equals one step of a single process with that batch size (see
:func:`global_loss` for how the loss is normalised so that DDP's gradient average is that
process's gradient).

A process that fails makes the launcher stop the others and raise :class:`DistributedError`
naming the rank and its error; collectives time out after ``FLASHCART_DDP_TIMEOUT`` seconds
(default 1800), so no process waits for ever on a peer that is gone.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..config import ConfigError
from ..utils.device import resolve_device
from .losses import _terms, errors

__all__ = [
    "Context",
    "SINGLE",
    "DistributedError",
    "world_size",
    "under_torchrun",
    "init_from_env",
    "shutdown",
    "spawn",
    "DataParallelPotential",
    "global_loss",
    "step_counts",
    "epoch_loss",
    "gather_metrics",
]

_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class DistributedError(RuntimeError):
    """A training process failed (the message names the rank) or the launch is inconsistent."""


@dataclass(frozen=True)
class Context:
    """Where this process sits: ``rank`` of ``world_size`` processes, ``local_rank`` on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        """``obj`` of rank 0 on every rank (pickled)."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self._comm_device)
        return box[0]

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Copy rank 0's parameters and buffers into ``module`` on every rank."""
        if not self.distributed:
            return
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                buf = t.detach().to(self._comm_device)
                dist.broadcast(buf, src=0)
                t.copy_(buf)

    def earliest(self, index: torch.Tensor) -> int:
        """The smallest non-negative value of the 0-d integer ``index`` over all ranks (-1 where
        every rank has -1): for example the first step at which some rank saw a non-finite loss."""
        if not self.distributed:
            return int(index)
        # -1 (none) maps to the smallest possible key, so MAX picks the earliest real index
        key = torch.where(index >= 0, -index, torch.iinfo(torch.long).min).to(self._comm_device)
        dist.all_reduce(key, op=dist.ReduceOp.MAX)
        value = int(key)
        return -1 if value == torch.iinfo(torch.long).min else -value

    def all_gather(self, obj: Any) -> list[Any]:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (pickled)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    @property
    def _comm_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")


SINGLE = Context()


def under_torchrun() -> bool:
    """True inside a process started by ``torchrun`` (its environment variables are set)."""
    return all(k in os.environ for k in _TORCHRUN_ENV)


def world_size(cfg: dict[str, Any]) -> int:
    """Processes the configuration asks for (``devices x n_nodes``); checks the request.

    ``strategy: auto`` trains in this process for one device and with DDP for more;
    ``strategy: ddp`` needs more than one process. ``devices`` may not exceed the GPUs (or
    CPU cores, for ``device: cpu``) of this node.
    """
    strategy, devices, n_nodes = cfg["strategy"], cfg["devices"], cfg["n_nodes"]
    world = devices * n_nodes
    if strategy == "ddp" and world == 1:
        raise ConfigError(
            "strategy: ddp with devices=1 and n_nodes=1 is one process; set devices (GPUs or CPU processes per node) "
            "above 1, or use strategy=auto for single-device training"
        )
    if under_torchrun() and int(os.environ["WORLD_SIZE"]) != world:
        raise ConfigError(
            f"torchrun started {os.environ['WORLD_SIZE']} processes but the configuration asks for devices={devices} x "
            f"n_nodes={n_nodes} = {world}; make --nproc-per-node equal devices and --nnodes equal n_nodes"
        )
    if world == 1:
        return 1
    if cfg["predict_compile"] and cfg["predict_compile_fullgraph"]:
        raise ConfigError(
            "predict_compile with predict_compile_fullgraph: true cannot trace DistributedDataParallel's forward "
            "(it breaks the graph); with strategy=ddp set predict_compile_fullgraph=false or predict_compile=false"
        )
    kind = resolve_device(cfg["device"]).type
    if kind == "cuda":
        available = torch.cuda.device_count()
        if devices > available:
            raise ConfigError(f"devices={devices} but this node has {available} visible GPU(s) (CUDA_VISIBLE_DEVICES, nvidia-smi)")
    else:
        available = os.cpu_count() or 1
        if devices > available:
            raise ConfigError(f"devices={devices} CPU processes but this node has {available} CPU core(s)")
    if under_torchrun():
        local = int(os.environ.get("LOCAL_WORLD_SIZE", devices))
        if local != devices:
            raise ConfigError(f"torchrun started {local} processes on this node but devices={devices}; make --nproc-per-node equal devices")
    elif n_nodes > 1:
        raise ConfigError(
            f"n_nodes={n_nodes}: start flashcart-train on every node with torchrun, e.g. torchrun --nnodes {n_nodes} "
            f"--nproc-per-node {devices} --rdzv-backend c10d --rdzv-endpoint HOST:29500 --no-python flashcart-train CONFIG ..."
        )
    return world


def _timeout() -> timedelta:
    return timedelta(seconds=float(os.environ.get("FLASHCART_DDP_TIMEOUT", "1800")))


def init_from_env(cfg: dict[str, Any]) -> Context:
    """Join the process group described by the ``torchrun``-style environment; pick this rank's device."""
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    kind = resolve_device(cfg["device"]).type
    if kind == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    else:
        device, backend = torch.device("cpu"), "gloo"
    # Intra-op threads (unless OMP_NUM_THREADS says otherwise): the node's cores shared by its
    # processes, and at most 4 per GPU process, whose host work (collation, launches) is serial;
    # otherwise every process starts one thread per core and their idle threads compete with
    # the launching threads of the others.
    if "OMP_NUM_THREADS" not in os.environ:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        share = max(1, (os.cpu_count() or 1) // local_world)
        torch.set_num_threads(share if kind != "cuda" else min(share, 4))
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=_timeout())
    return Context(rank=rank, world_size=world, local_rank=local, device=device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(index: int, worker: Callable, world: int, port: int, errors_q, args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(index),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(index),
        LOCAL_WORLD_SIZE=str(world),
    )
    try:
        worker(*args)
    except BaseException as err:
        errors_q.put((time.time(), index, f"{type(err).__name__}: {err}"))
        raise


def spawn(worker: Callable, world: int, *args: Any) -> None:
    """Run ``worker(*args)`` in ``world`` new processes of this node (ranks 0..world-1).

    The environment of each process is the one ``torchrun`` would set. If a process fails,
    the others are stopped and :class:`DistributedError` names the rank that failed first.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    errors_q = ctx.SimpleQueue()
    procs = mp.start_processes(_entry, args=(worker, world, _free_port(), errors_q, args), nprocs=world, join=False, start_method="spawn")
    try:
        while not procs.join():
            pass
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
        reports = []
        while not errors_q.empty():
            reports.append(errors_q.get())
        if reports:
            _, rank, message = min(reports)
            raise DistributedError(f"training process of rank {rank} failed: {message} (the other processes were stopped)") from None
        rank = getattr(err, "error_index", "?")
        raise DistributedError(f"training process of rank {rank} died: {err} (the other processes were stopped)") from None
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.kill()
                p.join()


class DataParallelPotential(DistributedDataParallel):
    """:class:`DistributedDataParallel` that also answers the wrapped potential's attributes
    (``r_max``, ``elements``, ...), so a :class:`~flashcart.model.predictor.Predictor` can drive it."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def wrap(model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
    """``model`` wrapped for gradient averaging over ranks (unchanged in one process)."""
    if not ctx.distributed:
        return model
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    # Buffers (shifts, scale, neighbour normalisation) are fixed after the pre-fit and were
    # broadcast once: no buffer synchronisation before each forward.
    import inspect

    sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters else {}
    # 1-row weight matrices get gradients with strides that differ from DDP's bucket views;
    # harmless (copied once per step), and the warning would repeat in every process.
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    if sync:
        return DataParallelPotential(model, device_ids=ids, **sync)
    return DataParallelPotential(model, device_ids=ids, broadcast_buffers=False)  # torch before forward_sync_buffers


# ---------------------------------------------------------------------------- losses

_SUMS = ("sae", "sse", "huber_sum", "norm_sum")
_MEANS = ("mae", "mse", "huber_mean", "norm_mean")


def step_counts(structures) -> dict[str, int]:
    """Item counts of one global step (all ranks' structures): graphs, atoms, graphs with stress."""
    return {
        "graphs": len(structures),
        "atoms": sum(s.n_atoms for s in structures),
        "stress": sum(int(bool(torch.isfinite(s.stress).all())) for s in structures),
    }


def _count(term: dict[str, Any], counts: dict[str, int]) -> int:
    """Number of items ``reduce_errors`` averages over for this term in the global batch."""
    prop, red = term["property"], term["reduce"]
    rows = {"energy": counts["graphs"], "forces": counts["atoms"], "stress": counts["stress"]}[prop]
    width = {"energy": 1, "forces": 3, "stress": 9}[prop]
    return rows if red.startswith("norm") else rows * width


def _statistic(e: torch.Tensor, term: dict[str, Any], vector: bool) -> torch.Tensor:
    """The additive (or, for maxe, max-combined) statistic of this rank's errors."""
    red = term["reduce"]
    if e.numel() == 0:
        return e.new_zeros(())
    if red.startswith("norm"):
        v = torch.linalg.vector_norm(e.reshape(e.shape[0], -1), dim=1) if vector else e.abs()
        return v.sum()
    if red in ("sae", "mae"):
        return e.abs().sum()
    if red in ("sse", "mse", "rmse"):
        return (e * e).sum()
    if red == "maxe":
        return e.abs().max()
    h = torch.nn.functional.huber_loss(e, torch.zeros_like(e), reduction="none", delta=term["delta"])
    return h.sum()


def _finish(term: dict[str, Any], s: torch.Tensor, m: int) -> torch.Tensor:
    """The loss term from the global statistic ``s`` over ``m`` items."""
    red = term["reduce"]
    if red in _SUMS or red == "maxe":
        return s
    if m == 0:
        return s * 0
    if red in _MEANS:
        return s / m
    return torch.sqrt(s / m)  # rmse


def global_loss(loss: dict[str, Any], pred: dict[str, torch.Tensor], batch, counts: dict[str, int], ctx: Context):
    """This rank's share of a loss over the global batch (all ranks' structures of the step).

    Returns ``(surrogate, stats)``. DDP averages gradients over ranks, so ``surrogate`` is
    ``world_size x`` a function whose gradient is this rank's part of the gradient of the
    loss of the whole global batch: sums over items add up over ranks; means divide by the
    global item count (from ``counts``, no communication); ``rmse`` and ``maxe`` need the
    global statistic, which is all-reduced first (the gradient of ``maxe`` goes to the rank
    holding the largest error). ``stats`` (detached, one value per term) are combined over
    ranks by :func:`epoch_loss` to report the loss one process would have reported.
    """
    terms = _terms(loss)
    local, vectors = [], []
    for t in terms:
        e, vec = errors(t, pred, batch)
        local.append(_statistic(e, t, vec))
        vectors.append(vec)
    glob: list[torch.Tensor | None] = [None] * len(terms)
    needs = [i for i, t in enumerate(terms) if t["reduce"] in ("rmse", "maxe")]
    for i in needs:
        g = local[i].detach().clone()
        dist.all_reduce(g, op=dist.ReduceOp.MAX if terms[i]["reduce"] == "maxe" else dist.ReduceOp.SUM)
        glob[i] = g
    total = pred["energy"].sum() * 0  # keeps every parameter in the graph when a term has no items here
    for i, t in enumerate(terms):
        s = local[i]
        if t["reduce"] == "maxe":
            # only the rank(s) holding the global maximum pass its gradient on
            s = torch.where(s.detach() == glob[i], s, s.detach()) + (glob[i] - s.detach())
        elif glob[i] is not None:
            s = s + (glob[i] - s.detach())
        total = total + t["weight"] * _finish(t, s, _count(t, counts))
    stats = torch.stack([s.detach() for s in local])
    return ctx.world_size * total, stats


def epoch_loss(loss: dict[str, Any], stats: list[torch.Tensor], counts: list[dict[str, int]], ctx: Context) -> float:
    """Mean over the epoch's steps of the global-batch loss (what one process would log)."""
    if not stats:
        return float("nan")
    terms = _terms(loss)
    s = torch.stack(stats).double()  # [steps, terms]
    if ctx.distributed:
        is_max = torch.tensor([t["reduce"] == "maxe" for t in terms], device=s.device)
        summed, maxed = s.clone(), s.clone()
        dist.all_reduce(summed)
        dist.all_reduce(maxed, op=dist.ReduceOp.MAX)
        s = torch.where(is_max, maxed, summed)
    s = s.cpu()
    values = [sum(t["weight"] * float(_finish(t, s[k, i], _count(t, c))) for i, t in enumerate(terms)) for k, c in enumerate(counts)]
    return sum(values) / len(values)


def gather_metrics(metrics, ctx: Context) -> None:
    """Give ``metrics`` (a :class:`~flashcart.training.losses.Metrics`) the errors of every rank."""
    if not ctx.distributed:
        return
    stores = ctx.all_gather({k: torch.cat(v) if v else None for k, v in metrics.store.items()})
    for key in metrics.store:
        metrics.store[key] = [s[key] for s in stores if s[key] is not None]
