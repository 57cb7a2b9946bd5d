"""The engine's static-shape step: compaction to the pairs within r_max, capacity overflow, and
equality with the dynamic step along an MD trajectory (rebuilds, wrapped atoms)."""

import numpy as np
import pytest
import torch
from ase import units as ase_units
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
from ase.md.verlet import VelocityVerlet

from flashcart.integrations.ase import FlashCartCalculator
from flashcart.simulation import Engine
from flashcart.simulation.static_step import StaticStep, StepCapacities
from flashcart.testing import reference_evaluation

from .systems import denser_by_one_move, pairs_within, tiny_water_model, water_box, water_cluster


@pytest.fixture(scope="module")
def model():
    return tiny_water_model()


def _evaluate(engine, atoms, stress=False):
    cell = atoms.cell.array if atoms.pbc.any() else None
    return engine.evaluate(atoms.positions, atoms.numbers, cell, atoms.pbc, stress=stress)


def test_step_modes_resolve_and_bad_combinations_are_errors(model):
    assert Engine(model, device="cpu", skin=0.5).step == "dynamic"  # eager CPU: no padding
    assert Engine(model, device="cpu", skin=0.5, pad=True).step == "static"
    assert Engine(model, device="cpu", skin=0.5, compile_mode="default").step == "static"
    assert Engine(model, device="cpu", skin=0.0).step == "dynamic"
    assert Engine(model, device="cpu", skin=0.5, pad=False).step == "dynamic"
    with pytest.raises(ValueError, match="step must be one of"):
        Engine(model, device="cpu", step="fast")
    with pytest.raises(ValueError, match=r"step='graph' captures a CUDA graph and needs a CUDA device"):
        Engine(model, device="cpu", skin=0.5, step="graph")
    with pytest.raises(ValueError, match="cannot run with pad=False"):
        Engine(model, device="cpu", skin=0.5, step="static", pad=False)


@pytest.mark.parametrize("structure", ["cluster", "box"])
def test_compacted_equals_uncompacted_equals_a_fresh_list(model, structure):
    atoms = water_cluster() if structure == "cluster" else water_box()
    stress = structure == "box"
    static = Engine(model, device="cpu", dtype="float64", skin=1.0, step="static")
    dynamic = Engine(model, device="cpu", dtype="float64", skin=1.0, step="dynamic")
    moved = atoms.copy()
    moved.positions += np.random.default_rng(3).normal(scale=0.1, size=moved.positions.shape)  # < skin / 2
    for frame in (atoms, moved):
        a, b = _evaluate(static, frame, stress), _evaluate(dynamic, frame, stress)
        e, f, s = reference_evaluation(model, frame, stress)
        for r in (a, b):
            assert abs(r.energy - e) < 1e-12 * max(1.0, abs(e))
            assert np.abs(r.forces - f).max() < 1e-12
            if stress:
                assert np.abs(r.stress - s).max() < 1e-12
        # the model saw the pairs within r_max only, the dynamic step the whole r_max + skin list
        assert static.model_edges == pairs_within(frame, model.r_max)
        assert dynamic.model_edges == static.n_edges == pairs_within(atoms, model.r_max + 1.0)
    assert static.neighbor_list_builds == 1 and static.capacity_overflows == 0
    if structure == "box":
        assert static.model_edges < static.n_edges  # the compaction did drop pairs


def test_capacity_overflow_is_detected_and_rebuilt_never_silently_wrong(model):
    atoms = water_box(n_side=2, tilt=False)
    # no headroom and unit rounding: the edge capacity is exactly the pairs within r_max at the build
    engine = Engine(model, device="cpu", dtype="float64", skin=1.0, headroom=0.0, pad_edge_multiple=1, step="static")
    _evaluate(engine, atoms)
    capacity = engine._static.capacities.edges
    assert capacity == pairs_within(atoms, model.r_max)
    # move one atom 0.3 Å (< skin / 2) in the direction that brings the most new pairs within r_max
    count, moved = denser_by_one_move(atoms, model.r_max, 0.3)
    assert count > capacity
    r = _evaluate(engine, moved)
    assert engine.capacity_overflows == 1 and engine.stale_evaluations == 0 and engine.neighbor_list_builds == 2
    assert engine._static.capacities.edges >= count and engine.model_edges == count
    e, f, _ = reference_evaluation(model, moved)
    assert abs(r.energy - e) < 1e-12 * max(1.0, abs(e)) and np.abs(r.forces - f).max() < 1e-12


def test_the_step_reports_pairs_beyond_its_capacity(model):
    """The step itself: with fewer edge slots than pairs within r_max it reports the true count
    (the caller's signal to discard the result)."""
    atoms = water_cluster()
    n, pos = len(atoms), torch.tensor(atoms.positions)
    i, j = np.nonzero(np.linalg.norm(atoms.positions[:, None] - atoms.positions[None], axis=-1) < model.r_max + 0.5)
    keep = i != j
    receivers, senders = torch.tensor(i[keep]), torch.tensor(j[keep])
    within = int((torch.linalg.norm(pos[senders] - pos[receivers], dim=1) < model.r_max).sum())
    caps = StepCapacities(atoms=n + 3, pairs=len(receivers), edges=within - 5)

    def model_call(positions, strain, types, cell, shifts, recv, send, batch, edge_batch, n_graphs):
        assert recv.shape == (caps.edges,) and positions.shape == (caps.atoms, 3)  # static shapes
        energy = (positions[:, 0] * 0).sum().reshape(1).repeat(2)
        return energy, torch.zeros_like(positions), None

    step = StaticStep(model_call, n, np.zeros(3, bool), model.r_max, caps, torch.float64, torch.device("cpu"))
    step.load(
        pos, torch.zeros(n, dtype=torch.long), torch.zeros(3, 3), torch.zeros(3, 3), receivers, senders, torch.zeros(len(receivers), 3)
    )
    packed = step(stress=False)
    assert packed.shape == (5 + 3 * n,) and int(packed[2]) == within > caps.edges and float(packed[1]) == 0.0
    assert packed[3:5].tolist() == [len(receivers), 0]  # a host list: its pairs, no bins


def test_padding_edges_spread_over_enough_padding_atoms(model):
    """The free edge slots go evenly to the padding atoms, sorted by receiver, and there are
    enough of them that none takes more edges than a real atom has on average (a receiver's
    edges run in one kernel program: all free slots on one padding atom made the H200's
    captured diamond step 7.6x slower)."""
    atoms = water_box()
    # atoms rounded to no multiple: the padding atoms are the ones the edge capacity asks for
    engine = Engine(model, device="cpu", dtype="float64", skin=1.0, headroom=0.3, pad_atom_multiple=1, step="static")
    _evaluate(engine, atoms)
    step, n = engine._static, len(atoms)
    pos, _ = step.unwrapped()
    receivers, senders, _, edge_batch, count = step.compact(pos)
    count = int(count)
    assert bool((receivers[1:] >= receivers[:-1]).all())  # still grouped by receiver
    real_degree = count / n
    assert step.capacities.edges - count > 2 * real_degree  # there is padding to spread
    for index in (receivers, senders):
        pad = index[count:]
        assert bool((pad >= n).all()) and bool((edge_batch[count:] == 1).all()) and bool((edge_batch[:count] == 0).all())
        per_atom = torch.bincount(pad - n, minlength=step.capacities.atoms - n)
        assert int(per_atom.max()) <= np.ceil(real_degree) + 1, (int(per_atom.max()), real_degree)
    assert bool((receivers[count:] != senders[count:]).all())  # no self-pairs among the padding


def test_static_step_equals_dynamic_step_along_md_with_rebuilds_and_wrapping(model):
    """MD driven by the dynamic engine (atoms wrapped into the cell after every step, as OpenMM
    does); the static engine evaluates the same positions step after step."""
    atoms = water_box(n_side=2)
    atoms.calc = FlashCartCalculator(Engine(model, device="cpu", dtype="float64", skin=0.3, step="dynamic"))
    static = Engine(model, device="cpu", dtype="float64", skin=0.3, step="static")
    MaxwellBoltzmannDistribution(atoms, temperature_K=3000, rng=np.random.default_rng(0))
    dyn = VelocityVerlet(atoms, timestep=1.0 * ase_units.fs)
    reference = atoms.get_scaled_positions(wrap=False)
    wrapped = 0
    for _ in range(30):
        dyn.run(1)
        atoms.wrap()
        r = static.evaluate(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
        assert abs(r.energy - atoms.get_potential_energy()) < 1e-10
        assert np.abs(r.forces - atoms.get_forces()).max() < 1e-10
        wrapped += int((np.abs(atoms.get_scaled_positions(wrap=False) - reference) > 0.5).any())
    assert static.neighbor_list_builds >= 3 and atoms.calc.engine.neighbor_list_builds >= 3 and wrapped > 0


class _EagerCapture:
    """Stands in for CapturedStep on the CPU: the same host-in -> step -> host-out contract,
    run eagerly, so the engine's graph-mode bookkeeping (captures, reuse, growth) is tested here."""

    made = 0

    def __init__(self, step, stress):
        _EagerCapture.made += 1
        self.step, self.stress = step, stress
        self.host_in = torch.empty(step.n, 3, dtype=step.dtype)

    def __call__(self, positions, rebuild=None):
        self.host_in.numpy()[...] = positions
        if rebuild is not None:
            rebuild.replay()
        self.step.positions.copy_(self.host_in)
        return self.step(self.stress).numpy()


class _EagerRebuild:
    """Stands in for CapturedRebuild: the device rebuild from the captured step's input."""

    def __init__(self, captured, cell_list):
        self.captured, self.cell_list = captured, cell_list

    def replay(self):
        self.captured.step.positions.copy_(self.captured.host_in)
        self.captured.step.rebuild(self.cell_list)


@pytest.mark.parametrize("device_rebuild", [False, True])
def test_graph_mode_bookkeeping_with_an_eager_stand_in_for_the_capture(model, monkeypatch, device_rebuild):
    import flashcart.simulation.engine as engine_module

    monkeypatch.setattr(engine_module, "CapturedStep", _EagerCapture)
    monkeypatch.setattr(engine_module, "CapturedRebuild", _EagerRebuild)
    atoms = water_box(n_side=2, tilt=False)
    engine = Engine(model, device="cpu", dtype="float64", skin=1.0, headroom=0.0, pad_edge_multiple=1, step="static")
    engine.step = "graph"  # the CUDA-only mode, with the capture replaced
    engine.device_rebuild = device_rebuild
    rng = np.random.default_rng(0)
    for k in range(4):
        moved = atoms.copy()
        moved.positions += rng.normal(scale=1e-3 * k, size=moved.positions.shape)  # no pair crosses r_max
        r = _evaluate(engine, moved, stress=k == 3)
        e, f, s = reference_evaluation(model, moved, k == 3)
        assert abs(r.energy - e) < 1e-12 * max(1.0, abs(e)) and np.abs(r.forces - f).max() < 1e-12
    assert np.abs(r.stress - s).max() < 1e-12
    # one step capture per stress flag (with device rebuilds also one rebuild capture each), list reused
    k = 2 if device_rebuild else 1
    assert engine.graph_captures == 2 * k and engine.neighbor_list_builds == 1
    count, denser = denser_by_one_move(atoms, model.r_max, 0.3)
    r = _evaluate(engine, denser)
    assert engine.capacity_overflows == 1 and engine.neighbor_list_builds == 2 and engine.graph_captures == 3 * k  # grown: captured again
    e, f, _ = reference_evaluation(model, denser)
    assert abs(r.energy - e) < 1e-12 * max(1.0, abs(e)) and np.abs(r.forces - f).max() < 1e-12
    r = _evaluate(engine, atoms)  # the atom back (0.3 Å < skin / 2): the list and the capture are reused
    assert engine.neighbor_list_builds == 2 and engine.graph_captures == 3 * k
    assert abs(r.energy - reference_evaluation(model, atoms)[0]) < 1e-12 * max(1.0, abs(r.energy))
    far = atoms.copy()
    far.positions[0] += [0.6, 0.0, 0.0]  # beyond skin / 2: a new list into the same buffers, no new step capture
    r = _evaluate(engine, far)
    assert engine.stale_evaluations + engine.early_rebuilds == 1 and engine.neighbor_list_builds == 3
    # on the device: the rebuild captured with the step is replayed; either way nothing new is captured
    assert engine.device_rebuilds == int(device_rebuild) and engine.graph_captures == 3 * k
    assert abs(r.energy - reference_evaluation(model, far)[0]) < 1e-12 * max(1.0, abs(r.energy))
    back = far.copy()
    back.positions[0] -= [0.6, 0.0, 0.0]
    r = _evaluate(engine, back)
    assert engine.neighbor_list_builds == 4 and engine.device_rebuilds == 2 * int(device_rebuild)
    assert engine.graph_captures == 3 * k
    assert abs(r.energy - reference_evaluation(model, back)[0]) < 1e-12 * max(1.0, abs(r.energy))


def test_structures_without_pairs_within_the_cutoff(model):
    """Isolated atoms (no pair in the list, or listed pairs all beyond r_max) evaluate to the
    atoms' own energies, as the padded dynamic step with a fresh list says (the unpadded
    reference cannot run a graph without edges)."""
    from ase import Atoms

    engine = Engine(model, device="cpu", dtype="float64", skin=0.5, step="static")
    fresh = Engine(model, device="cpu", dtype="float64", skin=0.0, step="dynamic", pad=True)
    shifts = dict(zip(model.elements, model.atomic_shifts.tolist()))
    for atoms in (Atoms("O", positions=[[0.0, 0.0, 0.0]]), Atoms("OH", positions=[[0, 0, 0], [model.r_max + 0.2, 0, 0]])):
        r, ref = _evaluate(engine, atoms), _evaluate(fresh, atoms)
        assert abs(r.energy - ref.energy) < 1e-12 * max(1.0, abs(ref.energy)) and np.abs(r.forces).max() == 0.0
        assert abs(r.energy - sum(shifts[s] for s in atoms.get_chemical_symbols())) > 1e-6  # not just the offsets
        assert engine.model_edges == 0
    assert engine.n_edges == 2  # the OH pair is listed (within r_max + skin) and compacted away


def test_a_failed_capture_falls_back_to_the_eager_step_only_when_the_engine_chose_the_graph(model, monkeypatch):
    import flashcart.simulation.engine as engine_module

    def failing(step, stress):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(engine_module, "CapturedStep", failing)
    atoms = water_box()
    chosen = Engine(model, device="cpu", dtype="float64", skin=0.5, step="static")
    chosen.step, chosen._graph_fallback = "graph", True  # as step "auto" with AUTO_GRAPH_STEP on CUDA (the graph on a CPU engine)
    with pytest.warns(UserWarning, match="capturing the simulation step as a CUDA graph failed .*continuing with step='static'"):
        r = _evaluate(chosen, atoms)
    assert chosen.step == "static" and "not permitted" in chosen.graph_capture_error and chosen.graph_captures == 0
    assert abs(r.energy - reference_evaluation(model, atoms)[0]) < 1e-12 * max(1.0, abs(r.energy))
    explicit = Engine(model, device="cpu", dtype="float64", skin=0.5, step="static")
    explicit.step, explicit._graph_fallback = "graph", False  # as step="graph"
    with pytest.raises(RuntimeError, match="not permitted"):
        _evaluate(explicit, atoms)


def test_capacities_grow_with_headroom_except_the_fixed_atom_count():
    caps = StepCapacities(0, 0, 0).grown(768, 40_000, 30_000, 0.1, 128, 128)
    # 768 atoms + 78 padding atoms (3,024 free slots at 39 edges an atom) -> 896; 44,000 -> 44,032; 33,000 -> 33,024
    assert caps == StepCapacities(atoms=896, pairs=44_032, edges=33_024)
    # 4,608 edge slots for 3,000 edges of 100 atoms: 1,608 free at 30 an atom = 54 padding atoms, 154 -> 160
    assert StepCapacities(0, 0, 0).grown(100, 4_000, 3_000, 0.5, 8, 128).atoms == 160
    assert caps.grown(768, 44_032, 30_500, 0.1, 128, 128) == caps  # what fits keeps its capacity
    assert caps.grown(768, 40_000, 33_025, 0.1, 128, 128).edges == 36_352  # 33,025 x 1.1 = 36,327.5 -> 36,352


class _FailingRebuild:
    def __init__(self, captured, cell_list):
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_rebuild_capture_falls_back_to_host_builds(model, monkeypatch):
    import flashcart.simulation.engine as engine_module

    monkeypatch.setattr(engine_module, "CapturedStep", _EagerCapture)
    monkeypatch.setattr(engine_module, "CapturedRebuild", _FailingRebuild)
    atoms = water_box(n_side=2, tilt=False)
    engine = Engine(model, device="cpu", dtype="float64", skin=1.0, step="static")
    engine.step, engine.device_rebuild = "graph", True
    with pytest.warns(UserWarning, match="capturing the device rebuild of the neighbour list failed .*built on the host"):
        _evaluate(engine, atoms)  # captured with the step, at the first call
    far = atoms.copy()
    far.positions[0] += [0.6, 0.0, 0.0]
    r = _evaluate(engine, far)
    assert not engine.device_rebuild and engine._cell_list is None and engine.device_rebuilds == 0
    assert engine.neighbor_list_builds == 2 and engine.capacity_overflows == 0
    assert abs(r.energy - reference_evaluation(model, far)[0]) < 1e-12 * max(1.0, abs(r.energy))
