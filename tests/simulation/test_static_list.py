"""The static-shape cell list (device rebuilds of the static and graph steps): the same pairs as
ASE on the hard cases, overflow reported instead of dropped silently, and the engine's device
rebuilds equal to host builds along MD."""

import numpy as np
import pytest
import torch
from ase import units as ase_units
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
from ase.md.verlet import VelocityVerlet

from flashcart.integrations.ase import FlashCartCalculator
from flashcart.simulation import Engine
from flashcart.simulation import static_step as step_module
from flashcart.simulation.static_list import StaticCellList, plan_cell_list, supports
from flashcart.testing import reference_evaluation

from ..data.test_neighbors import CASES, ase_edges, our_edges
from .systems import tiny_water_model, water_box, water_cluster

SUPPORTED = {name: case for name, case in CASES.items() if supports(case[2])}
CPU = torch.device("cpu")


def _pairs(cell_list, positions, dtype):
    receivers, senders, shifts, valid, status = cell_list(torch.tensor(positions, dtype=dtype))
    return receivers, senders, shifts, valid, status.tolist()


def test_supported_cases_cover_periodic_and_open_structures():
    assert {"triclinic_unwrapped", "small_cell_many_images", "one_atom_fcc", "molecule", "molecule_with_cell"} <= set(SUPPORTED)
    assert not supports((True, True, False)) and supports((True,) * 3) and supports((False,) * 3)
    with pytest.raises(ValueError, match=r"pbc all True or all False, got \[True, True, False\]"):
        plan_cell_list(np.zeros((2, 3)), np.eye(3) * 5, (True, True, False), 3.0)


@pytest.mark.parametrize("blocks", ["one block", "small blocks"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", sorted(SUPPORTED))
def test_equals_ase_in_receiver_order_with_spare_slots_empty(case, dtype, blocks):
    pos, cell, pbc, cutoff = SUPPORTED[case]
    reference = ase_edges(pos, cell, pbc, cutoff)
    plan = plan_cell_list(pos, cell, pbc, cutoff)
    per_atom = plan.offsets * plan.slots
    block_candidates = 10**9 if blocks == "one block" else 3 * per_atom - 1  # two atoms a block, the last alone
    cell_list = StaticCellList(plan, len(pos), cutoff, len(reference) + 13, dtype, CPU, block_candidates=block_candidates)
    assert cell_list.block == (len(pos) if blocks == "one block" else min(2, len(pos)))
    receivers, senders, shifts, valid, status = _pairs(cell_list, pos, dtype)
    assert status[0] == len(reference) and int(valid.sum()) == len(reference) and bool(valid[: len(reference)].all())
    assert our_edges(receivers[valid], senders[valid], shifts[valid]) == reference
    assert bool((receivers[valid][1:] >= receivers[valid][:-1]).all())  # grouped by receiver
    assert not receivers[~valid].any() and not senders[~valid].any() and not shifts[~valid].any()
    assert shifts.dtype == dtype


def test_open_structure_atoms_leaving_the_planned_box_are_still_exact():
    pos, cell, pbc, cutoff = SUPPORTED["molecule"]
    plan = plan_cell_list(pos, cell, pbc, cutoff)
    moved = pos.copy()
    moved[:6] += [4.0 * cutoff, -3.0 * cutoff, 0.5]  # far outside the box the bins were planned for
    moved[6:8] = moved[0] + [[0.5, 0.0, 0.0], [0.0, 0.7, 0.0]]  # with partners out there
    reference = ase_edges(moved, cell, pbc, cutoff)
    cell_list = StaticCellList(plan, len(pos), cutoff, len(reference) + 50, torch.float64, CPU)
    receivers, senders, shifts, valid, status = _pairs(cell_list, moved, torch.float64)
    assert status[1] <= cell_list.m  # the outermost bins took them
    assert our_edges(receivers[valid], senders[valid], shifts[valid]) == reference


def test_overflows_are_reported_with_the_true_counts():
    pos, cell, pbc, cutoff = SUPPORTED["triclinic_many_bins"]
    reference = ase_edges(pos, cell, pbc, cutoff)
    plan = plan_cell_list(pos, cell, pbc, cutoff)
    for block_candidates in (10**9, 7 * plan.offsets * plan.slots):  # one block, blocks of seven atoms
        few = StaticCellList(plan, len(pos), cutoff, 100, torch.float64, CPU, block_candidates=block_candidates)
        receivers, senders, shifts, valid, status = _pairs(few, pos, torch.float64)
        assert status[0] == len(reference) > 100 and bool(valid.all())  # every slot used; the count says how many more
        ours = our_edges(receivers, senders, shifts)
        assert set(ours) <= set(reference) and [e[0] for e in ours] == [e[0] for e in reference[:100]]  # the first, by receiver
    tight = plan_cell_list(pos, cell, pbc, cutoff, headroom=0.0)
    narrow = StaticCellList(type(tight)(**{**tight.__dict__, "slots": 1}), len(pos), cutoff, len(reference), torch.float64, CPU)
    *_, status = _pairs(narrow, pos, torch.float64)
    assert status[1] == tight.slots - 2 > 1  # the fullest bin's atoms, beyond the one slot


@pytest.fixture(scope="module")
def model():
    return tiny_water_model()


def _md_frames(model, atoms, steps: int):
    """MD driven by the dynamic engine (``atoms.calc``), atoms wrapped into the cell after every
    step as OpenMM does: yields each frame's ``evaluate`` arguments."""
    atoms.calc = FlashCartCalculator(Engine(model, device="cpu", dtype="float64", skin=0.3, step="dynamic"))
    MaxwellBoltzmannDistribution(atoms, temperature_K=3000, rng=np.random.default_rng(0))
    dyn = VelocityVerlet(atoms, timestep=1.0 * ase_units.fs)
    for _ in range(steps):
        dyn.run(1)
        atoms.wrap()
        yield atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc


@pytest.mark.parametrize("tilt", [True, False])
def test_device_rebuilds_equal_host_builds_along_md(model, tilt):
    """MD driven by the dynamic engine; the static step with device rebuilds (the bins and
    slots planned once) and the one with host builds evaluate every frame alike."""
    atoms = water_box(n_side=2, tilt=tilt)
    device = Engine(model, device="cpu", dtype="float64", skin=0.3, step="static")
    device.device_rebuild = True
    host = Engine(model, device="cpu", dtype="float64", skin=0.3, step="static")
    assert not host.device_rebuild  # the default on the CPU
    for args in _md_frames(model, atoms, 30):
        r, h = device.evaluate(*args), host.evaluate(*args)
        assert abs(r.energy - atoms.get_potential_energy()) < 1e-10 and abs(h.energy - r.energy) < 1e-10
        assert np.abs(r.forces - atoms.get_forces()).max() < 1e-10
    assert device.device_rebuilds >= 2 and device.neighbor_list_builds == device.device_rebuilds + 1
    assert host.device_rebuilds == 0 and device.capacity_overflows == 0


def test_compiled_step_work_and_device_rebuilds_equal_eager_along_md(model):
    """The step's own work and the device rebuilds compiled by inductor (``compile_step``, on by
    default on CUDA with a compile mode; here on the CPU) evaluate every frame as the eager ones:
    the same pair counts, lists and results."""
    atoms = water_box(n_side=2, tilt=True)
    engines = {}
    for compiled in (False, True):
        engine = engines[compiled] = Engine(model, device="cpu", dtype="float64", skin=0.3, step="static")
        engine.device_rebuild, engine.compile_step = True, compiled
    for args in _md_frames(model, atoms, 20):
        eager, compiled = engines[False].evaluate(*args), engines[True].evaluate(*args)
        assert abs(compiled.energy - eager.energy) < 1e-10 and np.abs(compiled.forces - eager.forces).max() < 1e-10
        assert engines[True].model_edges == engines[False].model_edges
        for engine in engines.values():
            assert abs(engine.evaluate(*args).energy - atoms.get_potential_energy()) < 1e-10
    step = engines[True]._static
    assert step.compiled and step._prepare is not step_module.prepare_step and engines[True]._cell_list.compiled
    assert step._prepare.compiled is not None and engines[True]._cell_list._search.compiled is not None  # no eager fallback
    assert engines[True].device_rebuilds == engines[False].device_rebuilds >= 2
    assert engines[True].capacity_overflows == engines[False].capacity_overflows == 0


def test_a_function_that_does_not_compile_runs_eagerly_with_a_warning():
    from flashcart.simulation._compiled import CompiledOrEager

    def fn(x):
        torch._dynamo.graph_break()  # fullgraph=True: compiling fails
        return x + 1

    f = CompiledOrEager(fn, "a test function")
    with pytest.warns(UserWarning, match=r"compiling a test function failed \(.*\); it runs eagerly from now on"):
        assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))
    assert f.compiled is None and torch.equal(f(torch.zeros(1)), torch.ones(1))  # no second warning, eager


def test_a_device_rebuild_that_overflows_falls_back_to_a_host_build(model):
    atoms = water_cluster()
    engine = Engine(model, device="cpu", dtype="float64", skin=0.4, step="static")
    engine.device_rebuild = True
    engine.evaluate(atoms.positions, atoms.numbers)
    assert engine._cell_list is not None and not engine._cell_list.plan.periodic
    plan = engine._cell_list.plan
    engine._cell_list = StaticCellList(
        type(plan)(**{**plan.__dict__, "slots": 1}),
        len(atoms),
        engine.r_max + engine.skin,
        engine._static.capacities.pairs,
        torch.float64,
        CPU,
    )
    moved = atoms.positions.copy()
    moved[4] += [0.25, 0.0, 0.0]  # stale: a rebuild, on the device first, whose bins overflow
    r = engine.evaluate(moved, atoms.numbers)
    assert engine.stale_evaluations == 1 and engine.capacity_overflows == 1 and engine.device_rebuilds == 0
    assert engine.neighbor_list_builds == 2 and engine._cell_list.m > 1  # the host build planned it again
    fresh = atoms.copy()
    fresh.positions = moved
    e_ref, f_ref, _ = reference_evaluation(model, fresh)
    assert abs(r.energy - e_ref) < 1e-9 and np.abs(r.forces - f_ref).max() < 1e-9


def test_structures_periodic_in_some_directions_use_host_builds(model):
    atoms = water_box(n_side=2, tilt=False)
    atoms.pbc = (True, True, False)
    engine = Engine(model, device="cpu", dtype="float64", skin=0.4, step="static")
    engine.device_rebuild = True
    engine.evaluate(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc)
    assert engine._cell_list is None


@pytest.mark.gpu
def test_cuda_cell_list_captured_in_a_graph_equals_ase():
    pos, cell, pbc, cutoff = SUPPORTED["triclinic_many_bins"]
    reference = ase_edges(pos, cell, pbc, cutoff)
    cuda = torch.device("cuda")
    cell_list = StaticCellList(plan_cell_list(pos, cell, pbc, cutoff), len(pos), cutoff, len(reference) + 13, torch.float32, cuda)
    x = torch.tensor(pos, dtype=torch.float32, device=cuda)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        cell_list(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cell_list(x)
    x.copy_(torch.tensor(pos[::-1].copy(), dtype=torch.float32))  # other positions into the captured input
    graph.replay()
    torch.cuda.synchronize()
    receivers, senders, shifts, valid, status = (t.cpu() for t in out)
    flipped = ase_edges(pos[::-1].copy(), cell, pbc, cutoff)
    assert int(status[0]) == len(flipped) and our_edges(receivers[valid], senders[valid], shifts[valid]) == flipped
