"""No configuration key that does nothing: every key of the packaged configs is read by the
code during a tiny train + test + profile run (the configuration dict records its reads)."""

from pathlib import Path

import pytest
import yaml

from flashcart.config import load_config
from flashcart.profiling import profile
from flashcart.testing import TINY_MODEL
from flashcart.training.evaluate import evaluate
from flashcart.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]


class RecordingConfig(dict):
    """A configuration that records which keys were looked up (``cfg[key]``, ``cfg.get``)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)


def packaged_keys() -> set[str]:
    keys = set()
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        keys |= set(yaml.safe_load(path.read_text()))
    return keys


@pytest.fixture(scope="module")
def reads(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keys")
    lines = (ROOT / "examples" / "ethanol" / "train.extxyz").read_text().splitlines(True)
    (tmp / "train.xyz").write_text("".join(lines[: 11 * 4]))
    (tmp / "valid.xyz").write_text("".join(lines[11 * 4 : 11 * 6]))
    overrides = {
        **TINY_MODEL,
        "train_path": tmp / "train.xyz",
        "valid_path": tmp / "valid.xyz",
        "test_path": tmp / "valid.xyz",
        "output_path": tmp / "run",
        "device": "cpu",
        "use_triton": False,
        "train_batch_size": 2,
        "max_epochs": 2,
        "warmup_epochs": 1,
        "decay_epochs": 1,
        "profile_batch_size": 2,
        "profile_n_batches": 1,
        "profile_repeat": 1,
        "profile_warmup": 0,
    }
    cfg = RecordingConfig(load_config(overrides=[f"{k}={v}" for k, v in overrides.items()]))
    train(cfg, progress=False)
    evaluate(cfg, progress=False)
    profile(cfg, progress=False)
    return cfg.read


def test_the_recorder_sees_reads():
    cfg = RecordingConfig(a=1, b=2)
    assert cfg["a"] == 1 and cfg.get("c") is None and cfg.read == {"a", "c"}


def test_every_packaged_key_is_read(reads):
    keys = packaged_keys()
    assert {"devices", "strategy", "n_nodes", "n_workers"} <= keys
    unread = sorted(keys - reads)
    assert not unread, f"configuration keys that no code reads: {unread}"
