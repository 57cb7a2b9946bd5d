"""Training: parameters move, resume == uninterrupted, interrupted saves are harmless, CLI errors."""

from pathlib import Path

import pytest
import torch

from flashcart.cli.main import plot_main, train_main
from flashcart.cli.main import test_main as evaluate_main
from flashcart.config import load_config
from flashcart.model.checkpoint import load_checkpoint, save_checkpoint
from flashcart.testing import TINY_MODEL
from flashcart.training import trainer as trainer_mod
from flashcart.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
ETHANOL = ROOT / "examples" / "ethanol"


@pytest.fixture
def data(tmp_path):
    lines = (ETHANOL / "train.extxyz").read_text().splitlines(True)
    (tmp_path / "train.xyz").write_text("".join(lines[: 11 * 8]))
    (tmp_path / "valid.xyz").write_text("".join(lines[11 * 8 : 11 * 12]))
    return tmp_path


def config(data, out, **extra):
    opts = {**TINY_MODEL, "r_max": 4.0}
    items = (
        [f"{k}={v}" for k, v in opts.items()]
        + [
            f"train_path={data / 'train.xyz'}",
            f"valid_path={data / 'valid.xyz'}",
            f"test_path={data / 'valid.xyz'}",
            f"output_path={out}",
            "device=cpu",
            "train_batch_size=3",
            "eval_batch_size=4",
            "dynamic_batching=false",
            "max_epochs=4",
            "warmup_epochs=1",
            "decay_epochs=1",
            "save_every=2",
            "use_triton=false",
        ]
        + [f"{k}={v}" for k, v in extra.items()]
    )
    return load_config(overrides=items)


def test_training_steps_change_parameters_and_write_outputs(data, monkeypatch):
    out = data / "run"
    cfg = config(data, out, max_epochs=1)
    before = {}
    prefit = trainer_mod.prefit

    def prefit_then_snapshot(model, *args, **kw):
        # Snapshot the trainable parameters after the pre-fit (which rewrites buffers only),
        # i.e. right before the first optimizer step.
        fitted = prefit(model, *args, **kw)
        before.update({k: p.detach().clone() for k, p in model.named_parameters()})
        return fitted

    monkeypatch.setattr(trainer_mod, "prefit", prefit_then_snapshot)
    train(cfg, progress=False)
    after = {k: p.detach() for k, p in load_checkpoint(out / "log").named_parameters()}
    assert before and after.keys() == before.keys()
    assert all(bool(torch.isfinite(p).all()) for p in after.values())
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    names = list(before)
    # Both ends of the network moved, and most parameter tensors did (a few may get no gradient,
    # e.g. higher-rank mixing weights of the last layer whose output only feeds the scalar readout).
    assert names[0] in changed and names[-1] in changed, changed
    assert len(changed) >= 0.8 * len(names), sorted(set(names) - set(changed))
    for name in ("config.yaml", "train.log", "metrics.csv", "best/model.pt", "log/model.pt", "log/training_state.pt"):
        assert (out / name).exists(), name


def _weights(path):
    return torch.load(path / "log" / "training_state.pt", weights_only=False)["model"]


def test_resume_after_a_kill_mid_epoch_equals_uninterrupted_run(data, monkeypatch):
    train(config(data, data / "straight"), progress=False)
    calls = {"n": 0}
    original = trainer_mod.loss_value

    def dying_loss(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 3 * 3 + 2:  # epoch 4, batch 2 (3 batches per epoch)
            raise KeyboardInterrupt
        return original(*args, **kw)

    monkeypatch.setattr(trainer_mod, "loss_value", dying_loss)
    with pytest.raises(KeyboardInterrupt):
        train(config(data, data / "resumed"), progress=False)
    monkeypatch.setattr(trainer_mod, "loss_value", original)
    train(config(data, data / "resumed"), progress=False)
    a, b = _weights(data / "straight"), _weights(data / "resumed")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows = (data / "resumed" / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3", "4"]


def test_non_finite_loss_stops_the_epoch_naming_the_first_bad_batch(data, monkeypatch):
    """The check runs on the device (no synchronisation per step) and is read after the epoch:
    the error names the first bad batch and nothing of that epoch is written."""
    out = data / "nan"
    cfg = config(data, out, max_epochs=2)
    real, calls = trainer_mod.loss_value, []

    def nan_from_second_epoch_batch_2(loss, pred, batch):
        calls.append(1)
        value = real(loss, pred, batch)
        n_batches = 3  # 8 structures, 3 per batch
        return value * float("nan") if len(calls) >= n_batches + 2 else value

    monkeypatch.setattr(trainer_mod, "loss_value", nan_from_second_epoch_batch_2)
    with pytest.raises(trainer_mod.TrainingError, match=r"non-finite training loss at epoch 2, batch 2;"):
        train(cfg, progress=False)
    rows = (out / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1"]  # epoch 1 was logged, epoch 2 was not
    best = load_checkpoint(out / "best").state_dict()  # epoch 1's weights, not epoch 2's
    assert all(bool(torch.isfinite(v).all()) for v in best.values() if v.is_floating_point())


def test_crash_during_checkpoint_save_keeps_previous_checkpoint(data, monkeypatch):
    model = trainer_mod.FlashCartPotential(["H", "C", "O"], **TINY_MODEL)
    save_checkpoint(model, data / "ckpt")
    before = load_checkpoint(data / "ckpt").state_dict()

    def broken_save(obj, handle):
        handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with torch.no_grad():
        model.readout.layers[0].weight.add_(1.0)
    with pytest.raises(OSError):
        save_checkpoint(model, data / "ckpt")
    monkeypatch.undo()
    after = load_checkpoint(data / "ckpt").state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not list((data / "ckpt").glob("*.tmp"))


def test_cli_train_test_plot(data, capsys):
    out = data / "cli"
    overrides = [f"{k}={v}" for k, v in {**TINY_MODEL, "r_max": 4.0}.items()] + [
        f"train_path={data / 'train.xyz'}",
        f"valid_path={data / 'valid.xyz'}",
        f"test_path={data / 'valid.xyz'}",
        f"output_path={out}",
        "device=cpu",
        "max_epochs=1",
        "train_batch_size=4",
        "use_triton=false",
    ]
    cfg_file = data / "cfg.yaml"
    cfg_file.write_text("dynamic_batching: false\n")
    assert train_main([str(cfg_file), *overrides, "--no-progress"]) == 0
    assert evaluate_main([str(cfg_file), *overrides, "--no-progress"]) == 0
    assert (out / "test.log").exists() and (out / "parity_test.png").exists() and (out / "parity_valid.png").exists()
    assert "forces_mae" in (out / "test.log").read_text()
    assert plot_main([str(out)]) == 0
    assert (out / "learning_curves.png").exists()


def test_cli_reports_config_errors_without_traceback(data, capsys):
    cfg_file = data / "cfg.yaml"
    cfg_file.write_text("max_epoch: 3\n")
    assert train_main([str(cfg_file)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'max_epoch'; did you mean 'max_epochs'" in err and "Traceback" not in err
    cfg_file.write_text("max_epochs: 3\n")
    assert train_main([str(cfg_file)]) == 2
    assert "flashcart-train needs 'train_path'" in capsys.readouterr().err


def test_compiled_training_takes_the_gradients_in_the_graph(data, monkeypatch):
    """With ``predict_compile`` each step's loss and parameter gradients come from
    ``Predictor.loss_and_grads`` (one compiled function on padded tensors): the same training as
    the eager prediction's outer backward (float64, 4 epochs, energy and force terms). The compile
    backend is ``aot_eager`` here (dynamo and AOTAutograd as with inductor, without its slow CPU
    code generation)."""
    from flashcart.model.predictor import Predictor

    steps = []

    class AotEager(Predictor):
        def __init__(self, *args, **kw):
            super().__init__(*args, **{**kw, "compile_backend": "aot_eager"})

        def loss_and_grads(self, *args, **kw):
            steps.append(1)
            return super().loss_and_grads(*args, **kw)

    train(config(data, data / "eager", precision="64-true"), progress=False)
    assert not steps
    monkeypatch.setattr(trainer_mod, "Predictor", AotEager)
    train(config(data, data / "compiled", precision="64-true", predict_compile=True, predict_compile_mode="default"), progress=False)
    assert len(steps) == 4 * 3  # 4 epochs of 3 batches
    a, b = _weights(data / "eager"), _weights(data / "compiled")
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-7, atol=1e-9), k
