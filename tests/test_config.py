"""Configuration loading, overrides and validation."""

import re
from importlib import resources

import pytest

from flashcart.config import SCHEMA, ConfigError, default_config, load_config, parse_value, require


def test_packaged_defaults_cover_exactly_the_schema_and_comment_every_key():
    assert set(default_config()) == set(SCHEMA)
    for name in ("default.yaml", "profile.yaml"):
        text = resources.files("flashcart.configs").joinpath(name).read_text()
        for line in text.splitlines():
            m = re.match(r"^([a-z_0-9]+):", line)
            if m:
                assert "#" in line, f"{name}: key {m.group(1)} has no comment"


def test_defaults_match_the_spec():
    cfg = load_config()
    assert cfg["r_max"] == 5.5 and cfg["n_hidden_feats"] == 128 and cfg["lr"] == 5e-3
    assert cfg["train_batch_size"] == 192 and cfg["dynamic_batching"] is True
    assert cfg["predict_pad_atom_multiple"] == 128 and cfg["predict_compile_mode"] == "reduce-overhead"
    assert cfg["profile_batch_size"] == 64 and cfg["profile_row_limit"] == 40


@pytest.mark.parametrize(
    "text, value",
    [
        ("3", 3),
        ("2.5", 2.5),
        ("5e-3", 5e-3),
        ("true", True),
        ("~", None),
        ("null", None),
        ("none", None),
        ("[H, O]", ["H", "O"]),
        ("cpu", "cpu"),
    ],
)
def test_override_values_parse(text, value):
    assert parse_value(text) == value


def test_user_file_and_overrides_take_precedence(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("r_max: 4.0\nmax_epochs: 7\nlr: 1e-3\n")
    cfg = load_config(path, ["max_epochs=5", "device=cpu"])
    assert cfg["r_max"] == 4.0 and cfg["max_epochs"] == 5 and cfg["device"] == "cpu" and cfg["lr"] == 1e-3


def test_unknown_key_names_the_closest_known_key(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("n_hiden_feats: 32\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: unknown key 'n_hiden_feats'; did you mean 'n_hidden_feats'"):
        load_config(path)


@pytest.mark.parametrize(
    "override, message",
    [
        ("max_epochs=2.5", "'max_epochs' must be an integer"),
        ("max_epochs=0", "'max_epochs' must be >= 1"),
        ("device=tpu", "'device' must be one of"),
        ("dynamic_batching=yes please", "'dynamic_batching' must be true or false"),
        ("hidden_radial=[64, -1]", "'hidden_radial' must be a list of positive integers"),
        ("r_max=-1", "'r_max': must be > 0"),
        ("energy_key=~", "'energy_key' must not be null"),
        ("train_loss={property: energy, reduce: median}", "train_loss'.reduce: must be one of"),
        ("r_min=6", "r_min .* must be smaller than r_max"),
        ("notanoption", "not of the form KEY=VALUE"),
    ],
)
def test_bad_values_are_errors_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


def test_missing_file_and_bad_yaml_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("r_max: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad)


def test_required_keys_are_named():
    with pytest.raises(ConfigError, match="flashcart-train needs 'train_path'"):
        require(load_config(), ["train_path"], "flashcart-train")
