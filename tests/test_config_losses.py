"""valid_losses as a list of terms (the published package's format) or a mapping; packaged defaults parsed once."""

import pytest
import torch

from flashcart.config import ConfigError, default_config, load_config
from flashcart.config import loader as loader_mod
from flashcart.training.losses import Metrics

LIST_FORM = """valid_losses:
  - {property: energy, reduce: rmse, normalization: per_atom}
  - {property: energy, reduce: mae, normalization: per_sqrt_atom}
  - {property: energy, reduce: mae}
  - {property: forces, reduce: mae, normalization: none}
  - {property: forces, reduce: huber_mean, delta: 0.01}
  - {property: forces, reduce: huber_mean, delta: 0.1}
  - weighted_sum:
      - {property: energy, reduce: huber_sum, normalization: per_atom, delta: 0.005, weight: 1.0}
      - {property: forces, reduce: mae, weight: 0.01}
"""


def test_valid_losses_as_a_list_get_names_derived_from_each_term(tmp_path):
    path = tmp_path / "published.yaml"
    path.write_text(LIST_FORM)
    losses = load_config(path)["valid_losses"]
    assert list(losses) == [
        "energy_rmse_per_atom",
        "energy_mae_per_sqrt_atom",
        "energy_mae",
        "forces_mae",
        "forces_huber_mean_delta0.01",
        "forces_huber_mean_delta0.1",
        "weighted_sum(1*energy_huber_sum_per_atom_delta0.005+0.01*forces_mae)",
    ]
    assert losses["energy_mae"] == {"property": "energy", "reduce": "mae", "normalization": "none"}
    assert losses["forces_huber_mean_delta0.1"]["delta"] == 0.1


def test_valid_losses_as_a_mapping_keep_their_names(tmp_path):
    path = tmp_path / "mapping.yaml"
    path.write_text("valid_losses:\n  f: {property: forces, reduce: rmse}\n  e: {property: energy, reduce: mae, normalization: per_atom}\n")
    losses = load_config(path)["valid_losses"]
    assert losses == {
        "f": {"property": "forces", "reduce": "rmse", "normalization": "none"},
        "e": {"property": "energy", "reduce": "mae", "normalization": "per_atom"},
    }


@pytest.mark.parametrize(
    "text, match",
    [
        (
            "valid_losses:\n  - {property: forces, reduce: mae}\n  - {property: forces, reduce: mae, normalization: none}\n",
            r"valid_losses'\[1\]: repeats .*\[0\] \(forces_mae\)",
        ),
        (
            "valid_losses:\n  - {property: forces, reduce: huber_sum}\n  - {property: forces, reduce: huber_sum, delta: 0.01}\n",
            r"\[1\]: repeats",
        ),
        ("valid_losses:\n  - {property: force, reduce: mae}\n", r"valid_losses'\[0\]\.property: must be one of"),
        ("valid_losses: []\n", r"must map metric names to loss terms, or be a list"),
    ],
)
def test_bad_valid_losses_lists_are_named_in_the_error(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(path)


def test_metrics_accept_both_forms_with_the_same_values():
    class Batch:
        energy = torch.tensor([1.0, -2.0], dtype=torch.float64)
        n_atoms = torch.tensor([2, 4])
        forces = torch.tensor([[0.5, 0.0, -1.0], [1.0, 2.0, 0.0]], dtype=torch.float64)

    pred = {"energy": torch.tensor([1.5, -1.0], dtype=torch.float64), "forces": torch.zeros(2, 3, dtype=torch.float64)}
    terms = [
        {"property": "energy", "reduce": "mae", "normalization": "per_atom"},
        {"property": "forces", "reduce": "rmse", "normalization": "none"},
    ]
    by_list, by_name = Metrics(terms), Metrics({"a": terms[0], "b": terms[1]})
    for m in (by_list, by_name):
        m.update(pred, Batch)
    got = by_list.compute()
    assert got == {"energy_mae_per_atom": pytest.approx((0.25 + 0.25) / 2), "forces_rmse": pytest.approx((6.25 / 6) ** 0.5)}
    assert list(got.values()) == list(by_name.compute().values())


def test_packaged_defaults_are_parsed_once_and_handed_out_as_copies(monkeypatch):
    from flashcart.model.potential import FlashCartPotential
    from flashcart.testing import TINY_MODEL

    loader_mod._packaged_defaults.cache_clear()
    reads = []
    original = loader_mod._packaged
    monkeypatch.setattr(loader_mod, "_packaged", lambda name: reads.append(name) or original(name))
    first = default_config()
    first["valid_losses"]["forces_mae"]["reduce"] = "maxe"
    first["r_max"] = -1.0
    load_config()
    FlashCartPotential(["H", "O"], **TINY_MODEL)
    FlashCartPotential(["H", "O"], **TINY_MODEL)
    assert sorted(reads) == ["default.yaml", "profile.yaml"]
    again = default_config()
    assert again["r_max"] == 5.5 and again["valid_losses"]["forces_mae"]["reduce"] == "mae"
