"""Load a YAML configuration, apply ``KEY=VALUE`` overrides and validate every key.

Precedence: packaged ``default.yaml`` and ``profile.yaml`` < the user's YAML < overrides.
Errors name the file and key, and suggest the closest known key for typos.
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from .schema import LOSS_NORMALIZATIONS, LOSS_PROPERTIES, LOSS_REDUCTIONS, SCHEMA

__all__ = [
    "read_user_yaml",
    "ConfigError",
    "load_config",
    "default_config",
    "parse_value",
    "parse_overrides",
    "require",
    "dump_config",
    "loss_name",
    "named_losses",
]


class ConfigError(ValueError):
    """A configuration problem; the message names the source and the key."""


def _packaged(name: str) -> dict[str, Any]:
    text = resources.files("flashcart.configs").joinpath(name).read_text()
    return yaml.safe_load(text) or {}


@functools.lru_cache(maxsize=None)
def _packaged_defaults() -> dict[str, Any]:
    """Both packaged YAML files, parsed once per process (callers get deep copies)."""
    cfg = _packaged("default.yaml")
    cfg.update(_packaged("profile.yaml"))
    return cfg


def default_config() -> dict[str, Any]:
    """Every key with its packaged default (a fresh copy: callers may modify it)."""
    return copy.deepcopy(_packaged_defaults())


def parse_value(text: str) -> Any:
    """Parse an override value: int, float, bool, null (``~``, ``null``, ``none``) or YAML."""
    if text.strip().lower() in ("~", "null", "none", ""):
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return _maybe_float(value)


def _maybe_float(value: Any) -> Any:
    """YAML 1.1 reads ``5e-3`` as a string; read it as the float a user means."""
    if isinstance(value, str):
        try:
            return float(value) if any(c.isdigit() for c in value) else value
        except ValueError:
            return value
    return value


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form KEY=VALUE")
        out[key.strip()] = parse_value(value)
    return out


def _unknown(key: str, where: str) -> ConfigError:
    close = difflib.get_close_matches(key, SCHEMA, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"{where}: unknown key {key!r}{hint}")


def _check_loss_term(term: Any, where: str, weighted: bool) -> dict[str, Any]:
    if not isinstance(term, dict):
        raise ConfigError(f"{where}: a loss term must be a mapping with property/reduce/normalization, got {term!r}")
    allowed = {"property", "reduce", "normalization", "delta"} | ({"weight"} if weighted else set())
    for k in term:
        if k not in allowed:
            raise ConfigError(f"{where}: unknown loss field {k!r} (allowed: {sorted(allowed)})")
    out = {"normalization": "none", **term}
    for field, choices in (("property", LOSS_PROPERTIES), ("reduce", LOSS_REDUCTIONS), ("normalization", LOSS_NORMALIZATIONS)):
        if out.get(field) not in choices:
            raise ConfigError(f"{where}.{field}: must be one of {list(choices)}, got {out.get(field)!r}")
    if out["reduce"].startswith("huber"):
        out["delta"] = _number(out.get("delta", 0.01), f"{where}.delta", positive=True)
    elif "delta" in out:
        raise ConfigError(f"{where}.delta: only huber reductions take a delta")
    if weighted:
        out["weight"] = _number(out.get("weight", 1.0), f"{where}.weight", positive=False)
    return out


def _check_loss(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, dict) and set(value) == {"weighted_sum"}:
        terms = value["weighted_sum"]
        if not isinstance(terms, list) or not terms:
            raise ConfigError(f"{where}.weighted_sum: must be a non-empty list of loss terms")
        return {"weighted_sum": [_check_loss_term(t, f"{where}.weighted_sum[{i}]", True) for i, t in enumerate(terms)]}
    return _check_loss_term(value, where, False)


def loss_name(loss: dict[str, Any]) -> str:
    """Metric name of a validated loss: ``{property}_{reduce}``, then ``_per_atom`` or
    ``_per_sqrt_atom`` for a normalised term (``forces_mae``, ``energy_rmse_per_atom``);
    a weighted sum joins its weighted terms (with Huber deltas),
    ``weighted_sum(1*energy_huber_sum_per_atom_delta0.005+0.01*forces_mae)``. A single term's
    delta is not part of its name (see :func:`named_losses` for duplicates)."""
    if "weighted_sum" in loss:
        return "weighted_sum(" + "+".join(f"{t['weight']:g}*{_term_name(t, with_delta=True)}" for t in loss["weighted_sum"]) + ")"
    return _term_name(loss, with_delta=False)


def _term_name(term: dict[str, Any], with_delta: bool) -> str:
    norm = term.get("normalization", "none")
    name = f"{term['property']}_{term['reduce']}" + ("" if norm == "none" else f"_{norm}")
    return f"{name}_delta{term['delta']:g}" if with_delta and "delta" in term else name


def named_losses(losses: list[dict[str, Any]], where: str = "valid_losses") -> dict[str, dict[str, Any]]:
    """Name a list of validated losses (the published package's ``valid_losses`` format).

    Names come from :func:`loss_name`; Huber terms that share a name get their delta appended
    (``forces_huber_mean_delta0.01``). A loss listed twice is an error (its metric would be
    reported once under one name).
    """
    base = [loss_name(loss) for loss in losses]
    out: dict[str, dict[str, Any]] = {}
    for i, (name, loss) in enumerate(zip(base, losses)):
        if base.count(name) > 1 and "delta" in loss:
            name = f"{name}_delta{loss['delta']:g}"
        if name in out:
            first = list(out).index(name)  # entries are added in list order, one per item
            raise ConfigError(f"{where}[{i}]: repeats the loss of {where}[{first}] ({name}); list every metric once")
        out[name] = loss
    return out


def _number(value: Any, where: str, positive: bool) -> float:
    value = _maybe_float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"{where}: must be > 0, got {value!r}")
    return float(value)


def _check(key: str, value: Any, where: str) -> Any:
    kind = SCHEMA[key]
    label = f"{where}: key {key!r}"
    if isinstance(kind, tuple):
        if value not in kind:
            raise ConfigError(f"{label} must be one of {list(kind)}, got {value!r}")
        return value
    optional = kind.endswith("?")
    kind = kind.rstrip("?")
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{label} must not be null")
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{label} must be true or false, got {value!r}")
        return value
    if kind.endswith("int") and not kind.endswith("_list"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{label} must be an integer, got {value!r}")
        if kind == "pos_int" and value < 1 or kind == "nonneg_int" and value < 0:
            raise ConfigError(f"{label} must be {'>= 1' if kind == 'pos_int' else '>= 0'}, got {value}")
        return value
    if kind.endswith("float"):
        number = _number(value, label, positive=kind == "pos_float")
        if kind == "nonneg_float" and number < 0:
            raise ConfigError(f"{label} must be >= 0, got {value!r}")
        return number
    if kind == "str":
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{label} must be a string, got {value!r}")
        return str(value)
    if kind == "str_list":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{label} must be a list of strings like [H, O], got {value!r}")
        return value
    if kind == "int_list":
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
            raise ConfigError(f"{label} must be a list of positive integers like [64, 64], got {value!r}")
        return value
    if kind == "shifts":
        if not isinstance(value, dict):
            raise ConfigError(f"{label} must map element symbols to energies, e.g. {{H: -13.6}}, got {value!r}")
        return {str(k): _number(v, f"{label}[{k}]", positive=False) for k, v in value.items()}
    if kind == "loss":
        return _check_loss(value, label)
    if kind == "losses":
        if isinstance(value, list) and value:
            return named_losses([_check_loss(term, f"{label}[{i}]") for i, term in enumerate(value)], label)
        if not isinstance(value, dict) or not value:
            raise ConfigError(f"{label} must map metric names to loss terms, or be a list of loss terms, got {value!r}")
        return {str(name): _check_loss(term, f"{label}[{name}]") for name, term in value.items()}
    raise AssertionError(f"unhandled schema kind {kind}")


def _merge(cfg: dict[str, Any], updates: dict[str, Any], where: str) -> None:
    for key, value in updates.items():
        if key not in SCHEMA:
            raise _unknown(key, where)
        cfg[key] = _check(key, value, where)


def read_user_yaml(path: str | Path) -> dict[str, Any]:
    """A user's configuration file as a mapping; errors name the file and what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"configuration file {path} does not exist")
    try:
        user = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(user, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values, got {type(user).__name__}")
    return user


def load_config(path: str | Path | None = None, overrides: Sequence[str] | dict[str, Any] = ()) -> dict[str, Any]:
    """The merged, validated configuration.

    Args:
        path: user YAML file (``None``: defaults only).
        overrides: ``["KEY=VALUE", ...]`` or a mapping, applied last.
    """
    cfg = {}
    _merge(cfg, default_config(), "packaged defaults")
    if path is not None:
        _merge(cfg, read_user_yaml(path), str(path))
    items = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    _merge(cfg, items, "command line")
    if cfg["r_min"] >= cfg["r_max"]:
        raise ConfigError(f"r_min ({cfg['r_min']}) must be smaller than r_max ({cfg['r_max']})")
    return cfg


def require(cfg: dict[str, Any], keys: Iterable[str], command: str) -> None:
    """Raise if a key the command needs is null."""
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise ConfigError(f"{command} needs {', '.join(repr(k) for k in missing)} in the configuration (currently null)")


def dump_config(cfg: dict[str, Any], path: str | Path) -> None:
    """Write the merged configuration as YAML (atomically)."""
    from ..utils.io import atomic_write_text

    atomic_write_text(Path(path), yaml.safe_dump(cfg, sort_keys=False))
