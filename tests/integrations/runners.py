"""Runners of the shared simulation battery for each integration (ASE, OpenMM)."""

from __future__ import annotations

import numpy as np

from flashcart.simulation import Engine
from flashcart.testing import Runner

# kJ/mol in eV and nm in Å, written out here from the exact SI constants (not taken from
# flashcart.units, whose conversions these runners check)
EV_PER_KJ_PER_MOL = 1000.0 / (1.602176634e-19 * 6.02214076e23)
ANGSTROM_PER_NM = 10.0


def ase_runner(model, **options) -> Runner:
    from flashcart.integrations.ase import FlashCartCalculator

    calc = FlashCartCalculator(Engine(model, **options))

    def run(atoms, stress):
        atoms = atoms.copy()
        atoms.calc = calc
        return atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress(voigt=False) if stress else None

    return Runner("ase", run)


class OpenMMRunner:
    """Evaluates ``Atoms`` in an OpenMM Context whose only force is FlashCart's PythonForce."""

    def __init__(self, evaluator, platform: str):
        self.evaluator, self.platform = evaluator, platform
        self._contexts = {}

    def context(self, atoms):
        import openmm

        from flashcart.integrations.openmm import create_force

        periodic = bool(atoms.pbc.all())
        key = (tuple(atoms.numbers), periodic)
        if key not in self._contexts:
            system = openmm.System()
            for m in atoms.get_masses():
                system.addParticle(m)
            system.addForce(create_force(self.evaluator, atoms.numbers, periodic=periodic))
            if periodic:
                system.setDefaultPeriodicBoxVectors(*(atoms.cell.array / ANGSTROM_PER_NM))
            integrator = openmm.VerletIntegrator(0.0005)
            ctx = openmm.Context(system, integrator, openmm.Platform.getPlatformByName(self.platform))
            self._contexts[key] = (ctx, integrator)
        return self._contexts[key][0]

    def __call__(self, atoms, stress):
        from openmm import unit

        ctx = self.context(atoms)
        if atoms.pbc.all():
            ctx.setPeriodicBoxVectors(*(atoms.cell.array / ANGSTROM_PER_NM))
        ctx.setPositions(atoms.positions / ANGSTROM_PER_NM)
        state = ctx.getState(getEnergy=True, getForces=True)
        energy = state.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)
        forces = state.getForces(asNumpy=True).value_in_unit(unit.kilojoule_per_mole / unit.nanometer)
        return energy, np.asarray(forces), None


def openmm_runner(platform: str):
    """A battery factory running the model inside OpenMM on ``platform`` (``Reference``, ``CPU``, ``CUDA``)."""

    def factory(model, **options) -> Runner:
        run = OpenMMRunner(Engine(model, **options), platform)
        # the CPU platform accumulates forces in single precision
        tol, fd_step, fd_tol = (1e-8, 1e-5, 1e-6) if platform == "Reference" else (2e-6, 1e-3, 1e-4)
        return Runner(
            f"openmm-{platform}",
            run,
            energy_unit=EV_PER_KJ_PER_MOL,
            length_unit=ANGSTROM_PER_NM,
            computes_stress=False,
            tol=tol,
            fd_step=fd_step,
            fd_tol=fd_tol,
        )

    return factory
