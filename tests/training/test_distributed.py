"""Data-parallel training: rank shards, the loss normalisation, launch errors, and two gloo
processes on the CPU (same weights on both ranks, equal to one process with the global batch in
float64, resume == uninterrupted, one writer, a dying rank stops everything cleanly)."""

import os
import time
from pathlib import Path

import pytest
import torch

from flashcart.config import ConfigError, load_config
from flashcart.data import BatchLoader, collate, read_structures
from flashcart.model.checkpoint import load_checkpoint
from flashcart.model.potential import FlashCartPotential
from flashcart.testing import TINY_MODEL
from flashcart.training import distributed
from flashcart.training import trainer as trainer_mod
from flashcart.training.losses import loss_value
from flashcart.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
ETHANOL = ROOT / "examples" / "ethanol" / "train.extxyz"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    lines = ETHANOL.read_text().splitlines(True)
    (tmp / "train.xyz").write_text("".join(lines[: 11 * 11]))  # 11 structures: steps of 4, 4 and 3
    (tmp / "valid.xyz").write_text("".join(lines[11 * 11 : 11 * 16]))
    return tmp


def config(data, out, **extra):
    items = {
        **TINY_MODEL,
        "train_path": data / "train.xyz",
        "valid_path": data / "valid.xyz",
        "output_path": out,
        "device": "cpu",
        "precision": "64-true",
        "eval_batch_size": 2,
        "dynamic_batching": False,
        "max_epochs": 3,
        "warmup_epochs": 1,
        "decay_epochs": 1,
        "save_every": 1,
        "grad_clip_norm": 0.02,  # active: the global gradient norms of these steps are about 0.02-0.03
        "use_triton": False,
        **extra,
    }
    return load_config(overrides=[f"{k}={v}" for k, v in items.items()])


# ----------------------------------------------------------------------------- shards


def _structures():
    return read_structures(ETHANOL, 4.0, "REF_energy", "REF_forces", "REF_stress", progress=False)[:23]


Z = FlashCartPotential(["H", "C", "O"], **TINY_MODEL).z_to_type


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("world", [2, 3])
def test_rank_shards_cover_each_structure_once_with_equal_steps(dynamic, world):
    structures = _structures()
    loaders = [BatchLoader(structures, 4, Z, dynamic, shuffle=True, seed=5, rank=r, world_size=world) for r in range(world)]
    for epoch in (0, 1):
        for ld in loaders:
            ld.set_epoch(epoch)
        shards = [ld.index_batches() for ld in loaders]
        assert len({len(s) for s in shards}) == 1  # same number of steps on every rank
        assert all(b for s in shards for b in s)  # no empty batch
        seen = sorted(i for s in shards for b in s for i in b)
        assert seen == list(range(len(structures)))  # nothing dropped, nothing twice
        assert [st[0] for st in loaders[0].steps()] == shards[0]
    loaders[0].set_epoch(0)
    first = loaders[0].index_batches()
    loaders[0].set_epoch(1)
    assert loaders[0].index_batches() != first  # reshuffled per epoch


def test_fixed_steps_are_the_batches_of_one_process_with_the_global_batch():
    structures = _structures()  # 23 structures: 2 full steps of 2 x 4, then 7 split 4 + 3
    single = BatchLoader(structures, 8, Z, shuffle=True, seed=3).index_batches()
    steps = BatchLoader(structures, 4, Z, shuffle=True, seed=3, world_size=2).steps()
    assert [a + b for a, b in steps] == single
    assert [len(b) for step in steps for b in step] == [4, 4, 4, 4, 4, 3]


def test_leftover_smaller_than_the_world_joins_the_previous_step():
    structures = _structures()[:9]  # 2 ranks x 4: one step of 8, then 1 structure
    steps = BatchLoader(structures, 4, Z, world_size=2).steps()
    assert steps == [[[0, 1, 2, 3, 8], [4, 5, 6, 7]]]
    drop = BatchLoader(structures, 4, Z, world_size=2, drop_last=True)
    assert drop.steps() == [[[0, 1, 2, 3], [4, 5, 6, 7]]] and drop.dropped == 1
    with pytest.raises(ValueError, match="cannot give each of 3 processes"):
        BatchLoader(structures[:2], 4, Z, world_size=3)


def test_evaluation_shards_deal_batches_round_robin():
    structures = _structures()[:10]
    shards = [BatchLoader(structures, 3, Z, rank=r, world_size=3, equal_steps=False).index_batches() for r in range(3)]
    assert shards == [[[0, 1, 2], [9]], [[3, 4, 5]], [[6, 7, 8]]]


def test_worker_processes_give_the_same_batches():
    structures = _structures()[:7]
    a = list(BatchLoader(structures, 3, Z, shuffle=True, seed=1))
    ld = BatchLoader(structures, 3, Z, shuffle=True, seed=1, n_workers=1)
    b = list(ld)
    assert len(a) == len(b) == 3
    for x, y in zip(a, b):
        assert torch.equal(x.positions, y.positions) and torch.equal(x.receivers, y.receivers)
    ld.set_epoch(1)
    assert not torch.equal(next(iter(ld)).positions, b[0].positions)  # the next epoch's order


# ----------------------------------------------------------------------------- loss


ALL_REDUCTIONS = ["sae", "mae", "sse", "mse", "rmse", "maxe", "huber_sum", "huber_mean", "norm_sum", "norm_mean"]


@pytest.mark.parametrize("reduce", ALL_REDUCTIONS)
def test_mean_of_rank_gradients_is_the_global_batch_gradient(reduce, monkeypatch):
    """Two simulated ranks: the mean of their surrogate gradients (what DDP applies) equals
    the gradient of the loss of the union batch, and the logged value equals its value."""
    torch.manual_seed(0)
    structures = _structures()[:5]
    for k, s in enumerate(structures[:2]):  # stress labels on some structures only
        s.stress = torch.full((3, 3), 0.01 * (k + 1), dtype=torch.float64)
    delta = {"delta": 0.05} if reduce.startswith("huber") else {}
    loss = {
        "weighted_sum": [
            {"property": "energy", "reduce": reduce, "normalization": "per_atom", "weight": 1.0, **delta},
            {"property": "forces", "reduce": reduce, "normalization": "none", "weight": 0.3, **delta},
            {"property": "stress", "reduce": reduce, "normalization": "none", "weight": 2.0, **delta},
        ]
    }
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)

    def predict(batch):  # a differentiable stand-in for the model
        n = batch.n_atoms.double()
        energy = (
            batch.energy
            + w[0] * n
            + w[1] * torch.zeros(batch.n_graphs, dtype=torch.float64).index_add(0, batch.batch, batch.positions[:, 0])
        )
        return {"energy": energy, "forces": batch.forces + w[2] * batch.positions**2, "stress": batch.stress + w[1] * w[2]}

    full = collate(structures, Z)
    expected = loss_value(loss, predict(full), full)
    (g_full,) = torch.autograd.grad(expected, w)
    parts = [structures[:3], structures[3:]]  # rank 0 holds the stress labels, rank 1 none
    counts = distributed.step_counts(structures)
    ctx = distributed.Context(rank=0, world_size=2)
    # the collectives of rmse/maxe: combine the two ranks' statistics as all_reduce would
    stats, calls = [], {"n": 0}

    def fake_all_reduce(t, op=None):
        if len(stats) < 2:  # first pass: only the local statistics are wanted
            return
        i = calls["n"] % 3
        calls["n"] += 1
        values = torch.stack([s[i] for s in stats])
        t.copy_(values.max() if op == torch.distributed.ReduceOp.MAX else values.sum())

    monkeypatch.setattr(distributed.dist, "all_reduce", fake_all_reduce)
    for p in parts:
        b = collate(p, Z)
        stats.append(distributed.global_loss(loss, predict(b), b, counts, ctx)[1])
    grads = []
    for p in parts:
        calls["n"] = 0
        b = collate(p, Z)
        surrogate, _ = distributed.global_loss(loss, predict(b), b, counts, ctx)
        grads.append(torch.autograd.grad(surrogate, w)[0])
    torch.testing.assert_close((grads[0] + grads[1]) / 2, g_full, rtol=1e-12, atol=1e-12)
    monkeypatch.undo()
    summed = torch.stack(stats)
    combined = torch.where(torch.tensor([reduce == "maxe"] * 3), summed.max(0).values, summed.sum(0))
    logged = distributed.epoch_loss(loss, [combined], [counts], distributed.SINGLE)
    assert logged == pytest.approx(float(expected), rel=1e-12)


# ----------------------------------------------------------------------------- launch errors


def test_launch_errors_are_clear(data, monkeypatch):
    out = data / "errors"
    with pytest.raises(ConfigError, match="strategy: ddp with devices=1"):
        train(config(data, out, strategy="ddp"), progress=False)
    with pytest.raises(ConfigError, match=f"devices={os.cpu_count() + 1} CPU processes but this node has {os.cpu_count()}"):
        train(config(data, out, strategy="ddp", devices=os.cpu_count() + 1), progress=False)
    with pytest.raises(ConfigError, match="n_nodes=2: start flashcart-train on every node with torchrun"):
        train(config(data, out, strategy="ddp", n_nodes=2), progress=False)
    with pytest.raises(ConfigError, match="predict_compile_fullgraph"):
        train(config(data, out, devices=2, predict_compile=True), progress=False)
    for k, v in {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match="torchrun started 4 processes"):
        train(config(data, out, strategy="ddp", devices=2), progress=False)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match="devices=2 but this node has 1 visible GPU"):
        distributed.world_size(config(data, out, device="gpu", devices=2))
    assert not out.exists()  # nothing was started


# ----------------------------------------------------------------------------- two gloo processes


def _recording_worker(cfg, progress, fail_at=None):
    """The trainer's DDP worker; afterwards each rank saves its final weights as rank<R>.pt.

    ``fail_at``: rank 1 raises in its ``fail_at``-th loss evaluation (a process that dies).
    """
    rank = int(os.environ["RANK"])
    captured = {}
    build = trainer_mod.build_optimizers

    def capture(model, c):
        captured["model"] = model
        return build(model, c)

    trainer_mod.build_optimizers = capture
    if fail_at is not None and rank == 1:
        original, calls = distributed.global_loss, {"n": 0}

        def dying(*args, **kw):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise RuntimeError("injected failure")
            return original(*args, **kw)

        distributed.global_loss = dying
    trainer_mod._ddp_worker(cfg, progress)
    state = {k: v.detach().cpu() for k, v in captured["model"].state_dict().items()}
    torch.save(state, Path(cfg["output_path"]) / f"rank{rank}.pt")


def _state(out):
    return torch.load(out / "log" / "training_state.pt", weights_only=False)


def _assert_states_close(a, b, tol):
    for key in ("model", "ema"):
        for k, v in a[key].items():
            if v.is_floating_point():
                torch.testing.assert_close(b[key][k], v, rtol=tol, atol=tol, msg=f"{key}.{k}")
            else:
                assert torch.equal(b[key][k], v), k


@pytest.fixture(scope="module")
def ddp_run(data):
    out = data / "ddp"
    distributed.spawn(_recording_worker, 2, config(data, out, strategy="ddp", devices=2, train_batch_size=2), False)
    return out


def test_two_processes_equal_one_process_with_the_global_batch(data, ddp_run):
    single = data / "single"
    train(config(data, single, train_batch_size=4), progress=False)
    r0, r1 = torch.load(ddp_run / "rank0.pt"), torch.load(ddp_run / "rank1.pt")
    assert all(torch.equal(r0[k], r1[k]) for k in r0)  # the same weights on both ranks
    a, b = _state(single), _state(ddp_run)
    _assert_states_close(a, b, 1e-10)
    assert b["epoch"] == 3
    ra, rb = [(p / "metrics.csv").read_text().splitlines() for p in (single, ddp_run)]
    assert ra[0] == rb[0] and len(ra) == len(rb) == 4
    for x, y in zip(ra[1:], rb[1:]):
        xs, ys = x.split(","), y.split(",")
        for name, u, v in zip(ra[0].split(","), xs, ys):
            if name not in ("epoch", "time"):
                assert float(v) == pytest.approx(float(u), rel=1e-9), name  # train loss and reduced validation metrics
    best_a, best_b = load_checkpoint(single / "best").state_dict(), load_checkpoint(ddp_run / "best").state_dict()
    for k, v in best_a.items():
        torch.testing.assert_close(best_b[k], v, rtol=1e-10, atol=1e-10)
    # a control: one process with the per-device batch trains to different weights
    train(config(data, data / "single_small", train_batch_size=2), progress=False)
    c = _state(data / "single_small")
    assert max(float((c["model"][k] - b["model"][k]).abs().max()) for k in c["model"] if c["model"][k].is_floating_point()) > 1e-6


def test_one_writer(ddp_run):
    log = (ddp_run / "train.log").read_text()
    assert log.count("processes 2") == 1 and log.count("epoch=3 ") == 1 and log.count("pre-fit:") == 1
    assert sorted(p.name for p in ddp_run.iterdir()) == ["best", "config.yaml", "log", "metrics.csv", "rank0.pt", "rank1.pt", "train.log"]
    assert not list(ddp_run.rglob("*.tmp"))


def test_dying_rank_stops_all_and_resume_equals_uninterrupted(data, ddp_run):
    out = data / "ddp_killed"
    cfg = config(data, out, strategy="ddp", devices=2, train_batch_size=2)
    t0 = time.perf_counter()
    with pytest.raises(distributed.DistributedError, match="rank 1 failed: RuntimeError: injected failure"):
        distributed.spawn(_recording_worker, 2, cfg, False, 3 + 2)  # epoch 2, step 2 (3 steps per epoch)
    assert time.perf_counter() - t0 < 120  # no process waits for its dead peer
    assert _state(out)["epoch"] == 1 and load_checkpoint(out / "log") is not None
    assert not list(out.rglob("*.tmp"))
    train(cfg, progress=False)  # the same command resumes from log/
    _assert_states_close(_state(ddp_run), _state(out), 0.0)
    rows = (out / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3"]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_nccl_equal_one_gpu_with_the_global_batch(data):
    """NCCL and the Triton kernels: 2 GPUs x 2 structures == 1 GPU x 4 structures (float64)."""
    gpu = {"device": "gpu", "use_triton": True}
    ddp, single = data / "gpu_ddp", data / "gpu_single"
    distributed.spawn(_recording_worker, 2, config(data, ddp, strategy="ddp", devices=2, train_batch_size=2, **gpu), False)
    train(config(data, single, train_batch_size=4, **gpu), progress=False)
    r0, r1 = torch.load(ddp / "rank0.pt"), torch.load(ddp / "rank1.pt")
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    _assert_states_close(_state(single), _state(ddp), 1e-8)  # GPU scatter sums differ in the last bits
