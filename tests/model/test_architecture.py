"""The published architecture, tensor for tensor, and the counts of all five published names."""

import re
from collections import Counter

import pytest
import torch

from flashcart.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from flashcart.model.potential import FlashCartPotential

from .published_parameters import PUBLISHED

# name -> (constructor options, elements)
MODELS = {
    "i2c3f20l2r": (dict(n_interactions=2, correlation=3, n_hidden_feats=20, path_reduced_product=True), ["C"]),
    "i3c3f64l2": (dict(n_interactions=3, correlation=3, n_hidden_feats=64), ["C"]),
    "ethanol_i2c3f32l2": (dict(n_interactions=2, correlation=3, n_hidden_feats=32, r_max=5.0), ["C", "H", "O"]),
}

# our parameter names -> the published block descriptions
_RULES = [
    (r"embedding\.weight", "element embedding"),
    (r"interactions\.(\d+)\.radial\.layers\.\d+\.weight", "interaction {0}: radial MLP layer (no bias)"),
    (r"interactions\.(\d+)\.linear_in\.weights\.(\d+)", "interaction {0}: linear on node features before the product, rank {1}"),
    (r"interactions\.(\d+)\.linear_out\.weights\.(\d+)", "interaction {0}: linear after the product (paths x F -> F), rank {1}"),
    (r"interactions\.(0)\.skip\.weights\.0", "interaction {0}: residual projection, scalars only (dense)"),
    (r"interactions\.(\d+)\.skip\.weights\.(\d+)", "interaction {0}: residual projection, rank {1}"),
    (r"interactions\.(\d+)\.norm\.gains\.(\d+)", "interaction {0}: RMS-norm gains, rank {1}"),
    (r"products\.(\d+)\.skip\.weights\.(\d+)", "product {0}: skip projection of A, output rank {1}"),
    (r"products\.(\d+)\.norm\.gains\.(\d+)", "product {0}: RMS-norm gains, output rank {1}"),
    (r"products\.(\d+)\.final\.weights\.(\d+)", "product {0}: final linear of the summed steps, rank {1}"),
    (r"products\.(\d+)\.first_weights", "product {0}: step 0 per-(path, channel) weights"),
    (r"products\.(\d+)\.path_weights\.(\d+)", "product {0}: step {1+} per-(path, channel) weights"),
    (r"products\.(\d+)\.mix\.(\d+)\.weights\.(\d+)", "product {0}: step {1} linear (paths x F -> F), rank {2}"),
    (r"gates\.(\d+)\.value\.weights\.(\d+)", "gate {0}: value linear, rank {1}"),
    (r"gates\.(\d+)\.gates\.weight", "gate {0}: gate linear on scalars (weight)"),
    (r"gates\.(\d+)\.gates\.bias", "gate {0}: gate linear on scalars (bias)"),
    (r"gates\.(\d+)\.proj\.weights\.(\d+)", "gate {0}: output linear (zero-initialised), rank {1}"),
    (r"readout\.layers\.\d+\.weight", "readout MLP layer (no bias)"),
]


def describe(name: str) -> str:
    for pattern, template in _RULES:
        m = re.fullmatch(pattern, name)
        if m:
            groups = list(m.groups())
            text = template.replace("{1+}", str(int(groups[1]) + 1) if len(groups) > 1 else "")
            return text.format(*groups)
    raise AssertionError(f"parameter {name} belongs to no published block")


def block_of(description: str) -> str:
    """``interaction 1: RMS-norm gains, rank 2`` -> ``interaction 1``."""
    return description.split(":")[0]


def build(name: str) -> FlashCartPotential:
    options, elements = MODELS[name]
    return FlashCartPotential(elements, use_triton=False, **options)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tensors_match_the_published_model(name):
    model = build(name)
    ours = Counter()
    for pname, p in model.named_parameters():
        shape = tuple(p.shape)
        ours[(describe(pname), shape)] += 1
    published = Counter()
    for desc, shape in PUBLISHED[name]["tensors"]:
        # stored shapes may be transposed: match ours where the transpose is what we hold
        if (desc, shape) not in ours and (desc, shape[::-1]) in ours:
            shape = shape[::-1]
        published[(desc, shape)] += 1
    # block by block first (a clearer message), then tensor for tensor
    ours_blocks, pub_blocks = Counter(), Counter()
    for (desc, shape), n in ours.items():
        ours_blocks[block_of(desc)] += n * torch.Size(shape).numel()
    for (desc, shape), n in published.items():
        pub_blocks[block_of(desc)] += n * torch.Size(shape).numel()
    assert ours_blocks == pub_blocks
    assert ours == published, (ours - published, published - ours)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]["total"]


@pytest.mark.parametrize(
    "name, options, expected",
    [
        # c = 5 models: the published page gives rounded counts; ours round to the same figures
        ("i3c5f32l2", dict(n_interactions=3, correlation=5, n_hidden_feats=32), 0.5e6),
        ("i3c5f88l2", dict(n_interactions=3, correlation=5, n_hidden_feats=88), 3.0e6),
        ("i4c5f104l2", dict(n_interactions=4, correlation=5, n_hidden_feats=104), 5.6e6),
    ],
)
def test_correlation_five_models_round_to_the_published_counts(name, options, expected):
    model = FlashCartPotential(["C"], use_triton=False, **options)
    count = sum(p.numel() for p in model.parameters())
    digits = 1 if expected < 1e6 else 2  # "0.5M", "3.0M", "5.6M"
    assert float(f"{count / 1e6:.{digits}g}") == expected / 1e6, count


def test_gate_output_projection_starts_at_zero_and_only_the_gate_has_a_bias():
    model = build("i2c3f20l2r")
    for gate in model.gates:
        assert all(float(w.abs().max()) == 0.0 for w in gate.proj.weights)
    biases = [n for n, _ in model.named_parameters() if n.endswith("bias")]
    assert biases and all(re.fullmatch(r"gates\.\d+\.gates\.bias", n) for n in biases)


def test_checkpoint_of_the_old_architecture_is_refused(tmp_path):
    model = build("i2c3f20l2r")
    save_checkpoint(model, tmp_path / "new")
    assert sum(p.numel() for p in load_checkpoint(tmp_path / "new").parameters()) == 69136
    payload = torch.load(tmp_path / "new" / "model.pt", weights_only=True)
    payload["format"] = "flashcart-checkpoint-1"  # what every earlier release wrote
    payload.pop("architecture", None)
    torch.save(payload, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="older FlashCart architecture"):
        load_checkpoint(tmp_path / "old.pt")
