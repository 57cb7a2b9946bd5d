"""No configuration key that does nothing: every key of the packaged configs is read by the
code of its command during tiny runs (train + test + profile for default.yaml and profile.yaml,
MD through ASE and OpenMM for md.yaml); the configuration dict records its reads."""

from pathlib import Path

import pytest
import yaml
from yaml.representer import SafeRepresenter

from flashcart.config import load_config
from flashcart.profiling import profile
from flashcart.simulation.md import load_md_config, run_md
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


yaml.SafeDumper.add_representer(RecordingConfig, SafeRepresenter.represent_dict)  # flashcart-md writes its config


@pytest.fixture(scope="module")
def reads(tmp_path_factory):
    """Keys each packaged file's command read: {file name: keys}."""
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
    profile(cfg, progress=False, out=lambda line: None)

    md = {"model": tmp / "run" / "best", "structure": tmp / "valid.xyz", "device": "cpu", "steps": 4, "log_interval": 2}
    md_reads: set[str] = set()
    runs = [{"engine": "ase", "ensemble": "nvt", "profile_repeat": 1}]
    try:
        import openmm  # noqa: F401

        runs.append({"engine": "openmm", "openmm_platform": "Reference", "trajectory": "t.dcd", "compare_profile": False})
    except ImportError:
        md_reads.add("openmm_platform")  # read only by the OpenMM engine, which is not installed here
    for k, run in enumerate(runs):
        opts = {**md, "output_path": tmp / f"md{k}", "trajectory_interval": 2, **run}
        md_cfg = RecordingConfig(load_md_config(overrides=[f"{key}={v}" for key, v in opts.items()]))
        run_md(md_cfg, progress=False, out=lambda line: None)
        md_reads |= md_cfg.read
    return {"default.yaml": cfg.read, "profile.yaml": cfg.read, "md.yaml": md_reads}


def test_the_recorder_sees_reads():
    cfg = RecordingConfig(a=1, b=2)
    assert cfg["a"] == 1 and cfg.get("c") is None and cfg.read == {"a", "c"}
    assert yaml.safe_dump(cfg) == "a: 1\nb: 2\n" and cfg.read == {"a", "c"}  # writing the config is no read


def test_every_packaged_key_is_read(reads):
    files = sorted((ROOT / "configs").glob("*.yaml"))
    assert {f.name for f in files} == set(reads), "a packaged config without a run in this test: add one"
    keys = {f.name: set(yaml.safe_load(f.read_text())) for f in files}
    assert {"devices", "strategy", "n_nodes", "n_workers"} <= keys["default.yaml"]
    unread = {name: sorted(k - reads[name]) for name, k in keys.items() if k - reads[name]}
    assert not unread, f"configuration keys that no code reads: {unread}"
