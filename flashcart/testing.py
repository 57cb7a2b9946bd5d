"""Testing helpers shared by FlashCart's own tests and by users' extensions.

Each helper raises ``AssertionError`` with the worst deviation it found.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .cartesian import rotate

__all__ = [
    "random_rotation",
    "assert_equivariant",
    "assert_close",
    "assert_forces_are_gradients",
    "TOLERANCES",
    "TINY_MODEL",
    "Runner",
    "SimulationBattery",
    "CountingBackend",
    "reference_evaluation",
]

# A small architecture for fast tests (all ranks and layer types present).
TINY_MODEL = dict(
    n_hidden_feats=4,
    l_max_hidden_feats=2,
    l_max_edge_attrs=2,
    n_radial=4,
    n_interactions=2,
    correlation=3,
    hidden_radial=[8],
    hidden_readout=[8],
    r_max=4.0,
)

TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-4}


def random_rotation(improper: bool = False, dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None) -> torch.Tensor:
    """A uniformly random ``[3, 3]`` rotation (``det = -1`` when ``improper``)."""
    q, r = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64, generator=generator))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    if improper:
        q = -q
    return q.to(dtype)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float | None = None, what: str = "") -> None:
    """Max-abs deviation relative to ``max(1, max|expected|)`` must be below ``tol``."""
    tol = TOLERANCES.get(expected.dtype, 1e-4) if tol is None else tol
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    err = (actual - expected).abs().max().item() / scale if expected.numel() else 0.0
    if not err <= tol:
        raise AssertionError(f"{what}: max deviation {err:.3e} exceeds {tol:.1e}")


def assert_equivariant(
    func: Callable[..., torch.Tensor],
    inputs: Sequence[tuple[torch.Tensor, int | None, list[int] | None]],
    out_l_max: int | None,
    out_paths: list[int] | None = None,
    tol: float | None = None,
    n_rotations: int = 3,
) -> None:
    """Check ``func(R x...) == R func(x...)`` for random proper and improper rotations.

    Args:
        func: callable on the inputs.
        inputs: ``(tensor, l_max, n_paths)`` per argument; ``l_max=None`` marks an
            invariant argument (weights, indices) passed unchanged; ``l_max=-1`` marks
            Cartesian vectors ``[n, 3]`` rotated as ``v R^T``.
        out_l_max: output rank limit (``None``: output invariant).
        out_paths: output paths per rank.
    """
    base = func(*[t for t, _, _ in inputs])
    for improper in (False, True):
        for _ in range(n_rotations):
            R = random_rotation(improper, dtype=base.dtype)
            args = []
            for t, l_max, paths in inputs:
                if l_max is None:
                    args.append(t)
                elif l_max == -1:
                    args.append(t @ R.T.to(t))
                else:
                    args.append(rotate(t, R, l_max, paths))
            out = func(*args)
            expected = base if out_l_max is None else rotate(base, R, out_l_max, out_paths)
            assert_close(out, expected, tol, what=f"equivariance ({'improper' if improper else 'proper'})")


def assert_forces_are_gradients(
    positions: torch.Tensor, forces: torch.Tensor, energy_fn, h: float = 1e-5, n_checks: int = 6, tol: float = 1e-6
) -> None:
    """Central finite differences of ``energy_fn(positions)`` match ``-forces`` on random entries."""
    g = torch.Generator().manual_seed(0)
    for _ in range(n_checks):
        i = int(torch.randint(0, positions.shape[0], (1,), generator=g))
        k = int(torch.randint(0, 3, (1,), generator=g))
        plus, minus = positions.clone(), positions.clone()
        plus[i, k] += h
        minus[i, k] -= h
        fd = -(float(energy_fn(plus)) - float(energy_fn(minus))) / (2 * h)
        if abs(fd - float(forces[i, k])) > tol * max(1.0, abs(fd)):
            raise AssertionError(f"force [{i}, {k}] = {float(forces[i, k]):.8g} but -dE/dx by finite differences = {fd:.8g}")


# ---------------------------------------------------------------------------------------------
# The simulation battery: one set of physics checks that every way of running a model passes
# (the simulation engine, the ASE calculator, the OpenMM force, exported model files, ...).


class Runner:
    """One way of running a model, for :class:`SimulationBattery`.

    Args:
        name: for messages.
        run: ``run(atoms, stress) -> (energy, forces [N, 3], stress [3, 3] or None)`` in the
            runner's own units, for ASE ``Atoms`` (positions and cell in Å: the runner converts
            them to its units itself).
        energy_unit: eV per unit of the returned energy (e.g. ``ase.units.kJ / ase.units.mol``).
        length_unit: Å per unit of length of the returned forces and stress (e.g. 10 for nm).
        computes_stress: whether ``run`` returns a stress for periodic cells.
        tol: relative tolerance against the reference (float64 engines: 1e-8).
        fd_step, fd_tol: finite-difference step (Å) and tolerance of the derivative checks.
    """

    def __init__(
        self,
        name: str,
        run: Callable,
        energy_unit: float = 1.0,
        length_unit: float = 1.0,
        computes_stress: bool = True,
        tol: float = 1e-8,
        fd_step: float = 1e-5,
        fd_tol: float = 1e-6,
    ):
        self.name, self.run = name, run
        self.energy_unit, self.length_unit = energy_unit, length_unit
        self.computes_stress, self.tol, self.fd_step, self.fd_tol = computes_stress, tol, fd_step, fd_tol

    def __call__(self, atoms, stress: bool = False):
        """Energy (eV), forces ``[N, 3]`` (eV/Å) and stress ``[3, 3]`` (eV/Å^3 or ``None``), float64."""
        import numpy as np

        e, f, s = self.run(atoms, stress)
        e = float(e) * self.energy_unit
        f = np.asarray(f, dtype=np.float64) * (self.energy_unit / self.length_unit)
        if s is not None:
            s = np.asarray(s, dtype=np.float64) * (self.energy_unit / self.length_unit**3)
        return e, f, s


def reference_evaluation(model: torch.nn.Module, atoms, stress: bool = False):
    """Energy (eV), forces (eV/Å) and stress (eV/Å^3 or ``None``) of ``atoms`` straight through an
    unpadded, eager :class:`~flashcart.model.Predictor` with a fresh neighbour list: the reference
    every simulation path must reproduce."""
    from .data import collate, structure_from_atoms
    from .model.predictor import Predictor

    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    structure = structure_from_atoms(atoms, model.r_max, require_labels=False, device=device)
    batch = collate([structure], model.z_to_type.to(device)).to(device, dtype)
    out = Predictor(model)(batch, forces=True, stress=stress)
    s = out["stress"][0].double().cpu().numpy() if stress else None
    return float(out["energy"][0]), out["forces"].double().cpu().numpy(), s


def _compare(what: str, actual, expected, tol: float) -> None:
    import numpy as np

    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    scale = max(1.0, float(np.abs(expected).max()))
    err = float(np.abs(actual - expected).max()) / scale
    if not err <= tol:
        raise AssertionError(f"{what}: max deviation {err:.3e} (relative to {scale:.3g}) exceeds {tol:.1e}")


class SimulationBattery:
    """Physics checks for a way of running a model, written once for all of them.

    ``factory(model, **engine_options) -> Runner`` builds the runner under test;
    ``engine_options`` are :class:`~flashcart.simulation.Engine` options (the battery varies
    ``pad``, ``compile_mode`` and ``compile_backend``). Every check raises ``AssertionError``
    naming the runner and the worst deviation.

    Args:
        model: a float64 :class:`~flashcart.model.FlashCartPotential` (not modified).
        molecule: a non-periodic ``Atoms``.
        crystal: a periodic ``Atoms`` (triclinic cells welcome).
        engine_options: base options for every runner (default: CPU, float64, skin 0.5 Å).
    """

    CHECKS = (
        "reference",
        "forces_are_gradients",
        "periodicity",
        "stress_is_strain_derivative",
        "padded_equals_unpadded",
        "compiled_equals_eager",
    )

    def __init__(self, model, molecule, crystal, engine_options: dict | None = None):
        self.model, self.molecule, self.crystal = model, molecule, crystal
        self.engine_options = {"device": "cpu", "dtype": "float64", "skin": 0.5, **(engine_options or {})}

    def runner(self, factory: Callable, **options) -> Runner:
        return factory(self.model, **{**self.engine_options, **options})

    def check(self, name: str, factory: Callable) -> None:
        """Run one check by name (one of :attr:`CHECKS`)."""
        if name not in self.CHECKS:
            raise ValueError(f"unknown check {name!r}; known: {list(self.CHECKS)}")
        getattr(self, f"check_{name}")(factory)

    def check_all(self, factory: Callable) -> None:
        for name in self.CHECKS:
            self.check(name, factory)

    def check_reference(self, factory: Callable) -> None:
        """Energy, forces (and stress where the runner has it), converted from the runner's units,
        equal the reference Predictor's, for the molecule and the periodic crystal."""
        run = self.runner(factory)
        for atoms in (self.molecule, self.crystal):
            want_stress = run.computes_stress and bool(atoms.pbc.all())
            e, f, s = run(atoms, want_stress)
            e_ref, f_ref, s_ref = reference_evaluation(self.model, atoms, want_stress)
            tag = f"{run.name} ({atoms.get_chemical_formula()})"
            _compare(f"{tag} energy", e, e_ref, run.tol)
            _compare(f"{tag} forces", f, f_ref, run.tol)
            if want_stress:
                _compare(f"{tag} stress", s, s_ref, run.tol)

    def check_forces_are_gradients(self, factory: Callable, n_checks: int = 4) -> None:
        """Forces are minus the central finite differences of the runner's own energies."""
        import numpy as np

        run = self.runner(factory)
        rng = np.random.default_rng(0)
        for atoms in (self.molecule, self.crystal):
            _, forces, _ = run(atoms)
            h = run.fd_step
            for _ in range(n_checks):
                i, k = int(rng.integers(len(atoms))), int(rng.integers(3))
                e = []
                for sign in (1, -1):
                    moved = atoms.copy()
                    moved.positions[i, k] += sign * h
                    e.append(run(moved)[0])
                fd = -(e[0] - e[1]) / (2 * h)
                if abs(fd - forces[i, k]) > run.fd_tol * max(1.0, abs(fd)):
                    raise AssertionError(f"{run.name}: force [{i}, {k}] = {forces[i, k]:.8g} eV/Å but -dE/dx = {fd:.8g}")

    def check_periodicity(self, factory: Callable) -> None:
        """Moving an atom by a lattice vector (and the whole structure by any vector) changes nothing."""
        import numpy as np

        run = self.runner(factory)
        e0, f0, _ = run(self.crystal)
        moved = self.crystal.copy()
        moved.positions[0] += moved.cell.array[0] - 2 * moved.cell.array[2]
        moved.positions[-1] -= moved.cell.array[1]
        e1, f1, _ = run(moved)
        _compare(f"{run.name}: energy after moving atoms by lattice vectors", e1, e0, run.tol)
        _compare(f"{run.name}: forces after moving atoms by lattice vectors", f1, f0, run.tol)
        for atoms in (self.molecule, self.crystal):
            e0, f0, _ = run(atoms)
            shifted = atoms.copy()
            shifted.positions += np.array([0.31, -0.17, 0.23])
            e1, f1, _ = run(shifted)
            _compare(f"{run.name}: energy after a translation", e1, e0, run.tol)
            _compare(f"{run.name}: forces after a translation", f1, f0, run.tol)

    def check_stress_is_strain_derivative(self, factory: Callable) -> None:
        """Stress is the finite-strain derivative of the energy over the volume (runners with stress)."""
        import numpy as np

        run = self.runner(factory)
        if not run.computes_stress:
            return
        atoms = self.crystal
        _, _, stress = run(atoms, True)
        h = run.fd_step
        for a, b in [(0, 0), (1, 2), (2, 0)]:
            e = []
            for sign in (1, -1):
                eps = np.eye(3)
                eps[a, b] += sign * h / 2
                eps[b, a] += sign * h / 2
                strained = atoms.copy()
                strained.set_cell(atoms.cell.array @ eps, scale_atoms=True)
                e.append(run(strained)[0])
            fd = (e[0] - e[1]) / (2 * h) / atoms.get_volume()
            if abs(fd - stress[a, b]) > run.fd_tol * max(1.0, abs(fd)):
                raise AssertionError(f"{run.name}: stress [{a}, {b}] = {stress[a, b]:.8g} but dE/de / V = {fd:.8g}")

    def _variants_agree(self, factory: Callable, label: str, base: dict, other: dict, structures: tuple) -> None:
        run_a, run_b = self.runner(factory, **base), self.runner(factory, **other)
        for atoms in structures:
            want_stress = run_a.computes_stress and bool(atoms.pbc.all())
            for step in range(2):  # second call: reused neighbour list
                moved = atoms.copy()
                moved.positions += 0.01 * step
                ea, fa, sa = run_a(moved, want_stress)
                eb, fb, sb = run_b(moved, want_stress)
                _compare(f"{run_a.name}: {label} energy", eb, ea, run_a.tol)
                _compare(f"{run_a.name}: {label} forces", fb, fa, run_a.tol)
                if want_stress:
                    _compare(f"{run_a.name}: {label} stress", sb, sa, run_a.tol)

    def check_padded_equals_unpadded(self, factory: Callable) -> None:
        self._variants_agree(
            factory,
            "padded vs unpadded",
            dict(pad=False),
            dict(pad=True, pad_atom_multiple=16, pad_edge_multiple=32),
            (self.molecule, self.crystal),
        )

    def check_compiled_equals_eager(self, factory: Callable, backend: str = "aot_eager") -> None:
        """``torch.compile`` (with ``backend``; ``aot_eager`` keeps the check fast on a CPU) equals
        eager, on the crystal (one compilation: stress included where the runner has it)."""
        counting = CountingBackend(backend)
        compiled = dict(compile_mode="default", compile_backend=counting)
        self._variants_agree(factory, "compiled vs eager", dict(), compiled, (self.crystal,))
        if counting.count == 0:
            raise AssertionError("compile_mode was given but nothing was compiled")


class CountingBackend:
    """A ``torch.compile`` backend that counts compilations and delegates to ``backend``."""

    def __init__(self, backend: str = "aot_eager"):
        self.backend, self.count = backend, 0

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        self.count += 1
        return lookup_backend(self.backend)(gm, example_inputs)
