"""Physics of the potential: symmetries, batching, forces and stress as derivatives, checkpoints."""

import torch

from flashcart.model.checkpoint import load_checkpoint, save_checkpoint
from flashcart.testing import assert_close, assert_forces_are_gradients, random_rotation

from .conftest import crystal, molecule


def test_energy_invariant_and_forces_equivariant_under_rotations_translations(model, make_batch):
    atoms = molecule()
    ref = model.predict(make_batch(model, [atoms]))
    for improper in (False, True):
        R = random_rotation(improper).numpy()
        moved = atoms.copy()
        moved.positions = atoms.positions @ R.T + [1.0, -2.0, 0.5]
        out = model.predict(make_batch(model, [moved]))
        assert_close(out["energy"], ref["energy"], 1e-10, "energy")
        assert_close(out["forces"], ref["forces"] @ torch.tensor(R).T, 1e-10, "forces")


def test_periodic_energy_invariant_under_rotation_of_atoms_and_cell(model, make_batch):
    atoms = crystal()
    ref = model.predict(make_batch(model, [atoms]), stress=True)
    R = random_rotation(improper=True).numpy()
    moved = atoms.copy()
    moved.set_cell(atoms.cell.array @ R.T, scale_atoms=False)
    moved.positions = atoms.positions @ R.T
    out = model.predict(make_batch(model, [moved]), stress=True)
    assert_close(out["energy"], ref["energy"], 1e-10, "energy")
    Rt = torch.tensor(R)
    assert_close(out["stress"][0], Rt @ ref["stress"][0] @ Rt.T, 1e-10, "stress")


def test_permutation_of_atoms_permutes_forces(model, make_batch):
    atoms = molecule()
    perm = [3, 0, 5, 1, 4, 2]
    ref = model.predict(make_batch(model, [atoms]))
    out = model.predict(make_batch(model, [atoms[perm]]))
    assert_close(out["energy"], ref["energy"], 1e-10, "energy")
    assert_close(out["forces"], ref["forces"][perm], 1e-10, "forces")


def test_batched_equals_per_structure(model, make_batch):
    items = [molecule(0), crystal(), molecule(3)]
    together = model.predict(make_batch(model, items), stress=True)
    forces = []
    for k, atoms in enumerate(items):
        alone = model.predict(make_batch(model, [atoms]), stress=True)
        assert_close(together["energy"][k : k + 1], alone["energy"], 1e-10, "energy")
        assert_close(together["stress"][k], alone["stress"][0], 1e-10, "stress")
        forces.append(alone["forces"])
    assert_close(together["forces"], torch.cat(forces), 1e-10, "forces")


def test_forces_equal_finite_differences(model, make_batch):
    for atoms in (molecule(), crystal()):
        batch = make_batch(model, [atoms])
        out = model.predict(batch)

        def energy(pos):
            b = make_batch(model, [atoms])
            b.positions = pos
            return model(b.positions, b.types, b.cell, b.shifts, b.receivers, b.senders, b.batch, b.edge_batch, 1)

        assert_forces_are_gradients(batch.positions, out["forces"], energy)


def test_stress_equals_finite_strain_derivative(model, make_batch):
    atoms = crystal()
    out = model.predict(make_batch(model, [atoms]), stress=True)
    h = 1e-5
    volume = atoms.get_volume()
    for a, b in [(0, 0), (1, 2), (0, 1)]:
        energies = []
        for sign in (1, -1):
            eps = torch.zeros(3, 3, dtype=torch.float64)
            eps[a, b] += sign * h / 2
            eps[b, a] += sign * h / 2
            strained = atoms.copy()
            m = torch.eye(3, dtype=torch.float64) + eps
            strained.set_cell(torch.tensor(atoms.cell.array) @ m, scale_atoms=False)
            strained.positions = torch.tensor(atoms.positions) @ m
            energies.append(float(model.predict(make_batch(model, [strained]), forces=False)["energy"]))
        fd = (energies[0] - energies[1]) / (2 * h) / volume
        assert abs(fd - float(out["stress"][0, a, b])) < 1e-6


def test_gradcheck_positions_and_parameters(model, make_batch):
    batch = make_batch(model, [molecule()])
    param = model.readout.layers[0].weight

    def energy(pos, w):
        original = param.data.clone()
        try:
            return torch.func.functional_call(
                model,
                {"readout.layers.0.weight": w},
                (pos, batch.types, batch.cell, batch.shifts, batch.receivers, batch.senders, batch.batch, batch.edge_batch, 1),
            )
        finally:
            param.data.copy_(original)

    pos = batch.positions.clone().requires_grad_()
    w = param.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(energy, (pos, w))


def test_checkpoint_round_trip_is_exact(model, make_batch, tmp_path):
    save_checkpoint(model, tmp_path / "ckpt")
    loaded = load_checkpoint(tmp_path / "ckpt")
    batch = make_batch(model, [crystal()])
    a, b = model.predict(batch, stress=True), loaded.predict(batch, stress=True)
    for key in a:
        assert torch.equal(a[key], b[key])
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2.to(v1.dtype))


def test_bad_checkpoints_give_clear_errors(tmp_path):
    import pytest

    from flashcart.model.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot be read as a FlashCart checkpoint"):
        load_checkpoint(tmp_path / "bad")
