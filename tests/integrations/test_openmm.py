"""OpenMM force provider and the openmm-ml potential: agreement with ASE and the Predictor,
energy conservation, mixed ML/MM systems, atom subsets, clear errors."""

import numpy as np
import pytest

openmm = pytest.importorskip("openmm")
pytest.importorskip("openmmml")

from openmm import app, unit  # noqa: E402

from flashcart.integrations.openmm import create_force, create_force_for_topology  # noqa: E402
from flashcart.model.checkpoint import save_checkpoint  # noqa: E402
from flashcart.simulation import Engine  # noqa: E402
from flashcart.testing import reference_evaluation  # noqa: E402

from ..simulation.systems import tiny_water_model, water_box, water_cluster  # noqa: E402
from .runners import ANGSTROM_PER_NM, EV_PER_KJ_PER_MOL, OpenMMRunner, ase_runner  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return tiny_water_model()


@pytest.fixture(scope="module")
def checkpoint(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "best"
    save_checkpoint(model, path)
    return path


def water_topology(n_waters: int, box_nm=None) -> app.Topology:
    top = app.Topology()
    chain = top.addChain()
    for _ in range(n_waters):
        res = top.addResidue("HOH", chain)
        o = top.addAtom("O", app.element.oxygen, res)
        h1 = top.addAtom("H1", app.element.hydrogen, res)
        h2 = top.addAtom("H2", app.element.hydrogen, res)
        top.addBond(o, h1)
        top.addBond(o, h2)
    if box_nm is not None:
        top.setPeriodicBoxVectors([openmm.Vec3(*row) for row in box_nm] * unit.nanometer)
    return top


@pytest.mark.parametrize("platform", ["Reference", "CPU"])
@pytest.mark.parametrize("structure", ["cluster", "box"])
def test_openmm_equals_ase_equals_predictor(model, platform, structure):
    atoms = water_cluster() if structure == "cluster" else water_box()
    e_ref, f_ref, _ = reference_evaluation(model, atoms)
    e_ase, f_ase, _ = ase_runner(model, device="cpu", dtype="float64", skin=0.5)(atoms)
    e_omm, f_omm, _ = OpenMMRunner(Engine(model, device="cpu", dtype="float64", skin=0.5), platform)(atoms, False)
    e_omm *= EV_PER_KJ_PER_MOL
    f_omm = f_omm * EV_PER_KJ_PER_MOL / ANGSTROM_PER_NM
    tol = 1e-9 if platform == "Reference" else 2e-6  # the CPU platform accumulates forces in single precision
    assert abs(e_ase - e_ref) < 1e-9 and np.abs(f_ase - f_ref).max() < 1e-9
    assert abs(e_omm - e_ref) < 1e-9 * max(1, abs(e_ref))  # energies are returned in double precision
    assert np.abs(f_omm - f_ref).max() < tol * max(1.0, np.abs(f_ref).max())


def test_nve_verlet_conserves_energy(model):
    atoms = water_cluster()
    system = openmm.System()
    for m in atoms.get_masses():
        system.addParticle(m)
    system.addForce(create_force(model, atoms.numbers, device="cpu", dtype="float64", skin=0.5))
    integrator = openmm.VerletIntegrator(0.25 * unit.femtosecond)
    ctx = openmm.Context(system, integrator, openmm.Platform.getPlatformByName("Reference"))
    ctx.setPositions(atoms.positions / ANGSTROM_PER_NM)
    ctx.setVelocitiesToTemperature(300 * unit.kelvin, 1)
    totals = []
    for _ in range(20):
        integrator.step(5)
        state = ctx.getState(getEnergy=True)
        totals.append((state.getPotentialEnergy() + state.getKineticEnergy()).value_in_unit(unit.kilojoule_per_mole))
    kinetic = state.getKineticEnergy().value_in_unit(unit.kilojoule_per_mole)
    drift = max(totals) - min(totals)
    # measured: 1.0e-4 kJ/mol peak-to-peak over 100 steps of 0.25 fs, with a kinetic energy of
    # 38 kJ/mol (float64 model, Reference platform); the bound leaves a factor 20
    assert kinetic > 10.0 and drift < 2e-3, (drift, kinetic)


def test_subset_forces_are_zero_outside_the_ml_atoms(model):
    atoms = water_cluster()
    subset = [3, 4, 5, 0]  # the second water and the first water's oxygen, in this order
    system = openmm.System()
    for m in atoms.get_masses():
        system.addParticle(m)
    system.addForce(create_force(model, atoms.numbers[subset], atoms=subset, device="cpu", dtype="float64"))
    ctx = openmm.Context(system, openmm.VerletIntegrator(0.001), openmm.Platform.getPlatformByName("Reference"))
    ctx.setPositions(atoms.positions / ANGSTROM_PER_NM)
    state = ctx.getState(getEnergy=True, getForces=True)
    forces = state.getForces(asNumpy=True).value_in_unit(unit.kilojoule_per_mole / unit.nanometer)
    outside = [i for i in range(len(atoms)) if i not in subset]
    assert np.all(forces[outside] == 0.0)
    e_ref, f_ref, _ = reference_evaluation(model, atoms[subset])
    assert abs(state.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole) * EV_PER_KJ_PER_MOL - e_ref) < 1e-9
    assert np.abs(forces[subset] * EV_PER_KJ_PER_MOL / ANGSTROM_PER_NM - f_ref).max() < 1e-9
    with pytest.raises(ValueError, match="4 atoms were selected but 9 atomic numbers"):
        create_force(model, atoms.numbers, atoms=subset)


def test_triclinic_box_comes_from_openmm(model):
    """The force reads the (triclinic) box from the state, so changing it changes the result."""
    atoms = water_box()
    top = water_topology(len(atoms) // 3, atoms.cell.array / ANGSTROM_PER_NM)
    force = create_force_for_topology(model, top, device="cpu", dtype="float64")
    assert force.usesPeriodicBoundaryConditions()
    runner = OpenMMRunner(None, "Reference")
    system = openmm.System()
    for m in atoms.get_masses():
        system.addParticle(m)
    system.addForce(force)
    system.setDefaultPeriodicBoxVectors(*(atoms.cell.array / ANGSTROM_PER_NM))
    ctx = openmm.Context(system, openmm.VerletIntegrator(0.001), openmm.Platform.getPlatformByName("Reference"))
    runner._contexts[(tuple(atoms.numbers), True)] = (ctx, None)
    for scale in (1.0, 1.04):
        strained = atoms.copy()
        strained.set_cell(atoms.cell.array * scale, scale_atoms=True)
        e, f, _ = runner(strained, False)
        e_ref, f_ref, _ = reference_evaluation(model, strained)
        assert abs(e * EV_PER_KJ_PER_MOL - e_ref) < 1e-9 * max(1, abs(e_ref))
        assert np.abs(f * EV_PER_KJ_PER_MOL / ANGSTROM_PER_NM - f_ref).max() < 1e-9


def test_mlpotential_create_system_matches_the_model(model, checkpoint):
    from openmmml import MLPotential

    atoms = water_box()
    top = water_topology(len(atoms) // 3, atoms.cell.array / ANGSTROM_PER_NM)
    potential = MLPotential("flashcart", modelPath=str(checkpoint))
    system = potential.createSystem(top, device="cpu", precision="double")
    assert system.usesPeriodicBoundaryConditions()
    ctx = openmm.Context(system, openmm.VerletIntegrator(0.001), openmm.Platform.getPlatformByName("Reference"))
    ctx.setPositions(atoms.positions / ANGSTROM_PER_NM)
    state = ctx.getState(getEnergy=True, getForces=True)
    e_ref, f_ref, _ = reference_evaluation(model, atoms)
    assert abs(state.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole) * EV_PER_KJ_PER_MOL - e_ref) < 1e-9 * abs(e_ref)
    f = state.getForces(asNumpy=True).value_in_unit(unit.kilojoule_per_mole / unit.nanometer)
    assert np.abs(f * EV_PER_KJ_PER_MOL / ANGSTROM_PER_NM - f_ref).max() < 1e-9


def test_mlpotential_mixed_system_solute_in_water(model, checkpoint):
    """A water "solute" modelled by FlashCart inside TIP3P water: the ML force acts on the solute
    only, the MM-MM and ML-MM interactions stay with the force field, and MD runs."""
    from openmmml import MLPotential

    box = water_box(tilt=False)
    top = water_topology(len(box) // 3, box.cell.array / ANGSTROM_PER_NM)
    ff = app.ForceField("amber14/tip3p.xml")
    mm_system = ff.createSystem(top, nonbondedMethod=app.CutoffPeriodic, nonbondedCutoff=0.3 * unit.nanometer, constraints=None)
    solute = [0, 1, 2]
    potential = MLPotential("flashcart", modelPath=str(checkpoint))
    mixed = potential.createMixedSystem(top, mm_system, solute, device="cpu", precision="double")
    ml_forces = [f for f in mixed.getForces() if isinstance(f, openmm.PythonForce)]
    assert len(ml_forces) == 1
    for f in mixed.getForces():
        f.setForceGroup(1 if isinstance(f, openmm.PythonForce) else 0)
    ctx = openmm.Context(mixed, openmm.VerletIntegrator(0.0002), openmm.Platform.getPlatformByName("Reference"))
    ctx.setPositions(box.positions / ANGSTROM_PER_NM)
    ml = ctx.getState(getEnergy=True, getForces=True, groups={1})
    e_ref, f_ref, _ = reference_evaluation(model, box[solute])  # the solute alone (not periodic: far below the box size)
    assert abs(ml.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole) * EV_PER_KJ_PER_MOL - e_ref) < 1e-8 * abs(e_ref)
    f = ml.getForces(asNumpy=True).value_in_unit(unit.kilojoule_per_mole / unit.nanometer)
    assert np.abs(f[solute] * EV_PER_KJ_PER_MOL / ANGSTROM_PER_NM - f_ref).max() < 1e-9
    assert np.all(f[3:] == 0.0)
    ctx.getIntegrator().step(5)
    assert np.isfinite(ctx.getState(getEnergy=True).getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole))


def test_mlpotential_errors_are_clear(model, checkpoint, tmp_path):
    from openmmml import MLPotential

    top = water_topology(1)
    chain = top.addChain()
    res = top.addResidue("NA", chain)
    top.addAtom("NA", app.element.sodium, res)
    potential = MLPotential("flashcart", modelPath=str(checkpoint))
    with pytest.raises(ValueError, match=r"elements \['Na'\] that the model .* does not know"):
        potential.createSystem(top, device="cpu")
    with pytest.raises(TypeError, match=r"unknown arguments \['compile_mode'\]"):
        potential.createSystem(water_topology(1), compile_mode="default")
    with pytest.raises(ValueError, match="precision must be"):
        potential.createSystem(water_topology(1), precision="half")
    with pytest.raises(ValueError, match="needs modelPath"):
        MLPotential("flashcart")
    with pytest.raises(Exception, match="no checkpoint at"):
        MLPotential("flashcart", modelPath=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"elements \['Na'\] are not among the model's elements"):
        create_force(model, [11, 8], device="cpu")


def test_mlpotential_interpolating_mixed_system(model, checkpoint):
    """interpolate=True: lambda_interpolate = 1 gives the mixed ML/MM energy, 0 the force field's."""
    from openmmml import MLPotential

    box = water_box(tilt=False)
    top = water_topology(len(box) // 3, box.cell.array / ANGSTROM_PER_NM)
    mm_system = app.ForceField("amber14/tip3p.xml").createSystem(
        top, nonbondedMethod=app.CutoffPeriodic, nonbondedCutoff=0.3 * unit.nanometer, constraints=None
    )
    potential = MLPotential("flashcart", modelPath=str(checkpoint))

    def energy(system, **parameters):
        ctx = openmm.Context(system, openmm.VerletIntegrator(0.0002), openmm.Platform.getPlatformByName("Reference"))
        ctx.setPositions(box.positions / ANGSTROM_PER_NM)
        for k, v in parameters.items():
            ctx.setParameter(k, v)
        return ctx.getState(getEnergy=True).getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)

    interpolating = potential.createMixedSystem(top, mm_system, [0, 1, 2], interpolate=True, device="cpu", precision="double")
    mixed = potential.createMixedSystem(top, mm_system, [0, 1, 2], device="cpu", precision="double")
    assert energy(interpolating, lambda_interpolate=1.0) == pytest.approx(energy(mixed), rel=1e-9)
    assert energy(interpolating, lambda_interpolate=0.0) == pytest.approx(energy(mm_system), rel=1e-9)


def test_system_with_the_force_survives_xml_serialization(model):
    atoms = water_cluster()
    system = openmm.System()
    for m in atoms.get_masses():
        system.addParticle(m)
    system.addForce(create_force(model, atoms.numbers, device="cpu", dtype="float64"))
    copy = openmm.XmlSerializer.deserialize(openmm.XmlSerializer.serialize(system))
    energies = []
    for s in (system, copy):
        ctx = openmm.Context(s, openmm.VerletIntegrator(0.001), openmm.Platform.getPlatformByName("Reference"))
        ctx.setPositions(atoms.positions / ANGSTROM_PER_NM)
        energies.append(ctx.getState(getEnergy=True).getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole))
    assert energies[0] == pytest.approx(energies[1], rel=1e-12)


def test_callback_reads_positions_as_the_public_api_does_and_falls_back_to_it(model):
    """The callback's fast positions read (OpenMM's copy into a reused buffer) equals
    ``getPositions(asNumpy=True)`` (in nm), and a State without that method still works."""
    from flashcart.integrations.openmm import FlashCartForce

    atoms = water_box()
    seen = []

    class Recorder:
        def evaluate(self, positions, numbers, cell=None, pbc=None, stress=False):
            from flashcart.simulation import Evaluation

            seen.append((positions.copy(), cell.copy()))
            return Evaluation(energy=0.0, forces=np.zeros((len(numbers), 3)))

    force = FlashCartForce(Recorder(), atoms.numbers, periodic=True)
    public = []

    def callback(state):
        public.append(state.getPositions(asNumpy=True).value_in_unit(unit.nanometer).copy())

        class Public:  # the same state without OpenMM's internal copy method
            def __getattr__(self, name):
                if name == "_getVectorAsNumpy":
                    raise AttributeError(name)
                return getattr(state, name)

        force(state)
        force(Public())
        return 0.0, np.zeros((len(atoms), 3))

    system = openmm.System()
    for m in atoms.get_masses():
        system.addParticle(m)
    f = openmm.PythonForce(callback)
    f.setUsesPeriodicBoundaryConditions(True)
    system.addForce(f)
    system.setDefaultPeriodicBoxVectors(*(atoms.cell.array / ANGSTROM_PER_NM))
    integrator = openmm.VerletIntegrator(0.0005)
    ctx = openmm.Context(system, integrator, openmm.Platform.getPlatformByName("Reference"))
    ctx.setPositions(atoms.positions / ANGSTROM_PER_NM)
    ctx.setVelocitiesToTemperature(300)
    integrator.step(3)
    assert len(seen) == 2 * len(public) >= 6
    for k, expected in enumerate(public):
        for positions, cell in seen[2 * k : 2 * k + 2]:
            assert np.array_equal(positions, expected * ANGSTROM_PER_NM)
            assert np.allclose(cell, atoms.cell.array, rtol=0, atol=1e-12)
    assert not np.array_equal(public[0], public[-1])  # the atoms moved: each step was read afresh


def test_a_particle_count_that_does_not_match_the_numbers_is_a_clear_error(model):
    atoms = water_cluster()
    system = openmm.System()
    for m in atoms.get_masses():
        system.addParticle(m)
    system.addForce(create_force(model, atoms.numbers[:-3], device="cpu", dtype="float64"))  # one molecule short
    ctx = openmm.Context(system, openmm.VerletIntegrator(0.001), openmm.Platform.getPlatformByName("Reference"))
    ctx.setPositions(atoms.positions / ANGSTROM_PER_NM)
    with pytest.raises(Exception, match="OpenMM passed 9 particles to the FlashCart force, which was built for 6 atomic numbers"):
        ctx.getState(getEnergy=True)


def test_create_force_passes_headroom_to_the_engine(model, monkeypatch):
    import flashcart.integrations.openmm as omm

    seen = {}
    real = omm.make_evaluator

    def spy(model, **options):
        seen.update(options)
        return real(model, **options)

    monkeypatch.setattr(omm, "make_evaluator", spy)
    create_force(model, [8, 1, 1], device="cpu", headroom=0.03)
    assert seen["headroom"] == 0.03
    with pytest.raises(ValueError, match=r"options \['headroom'\] configure a new engine"):
        create_force(Engine(model, device="cpu"), [8, 1, 1], headroom=0.3)
