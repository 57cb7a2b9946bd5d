"""AOTInductor package (``.pt2``): energy and forces, compiled ahead of time.

Load it with ``torch._inductor.aoti_load_package(path)`` (Python) or
``torch::inductor::AOTIModelPackageLoader`` (C++); FlashCart is not needed at run time::

    runner = torch._inductor.aoti_load_package("model.pt2")
    energy, forces = runner(positions, atomic_numbers, cell, pbc)

* ``positions [N, 3]`` Å, ``atomic_numbers [N]`` int64, ``cell [3, 3]`` Å (rows are lattice
  vectors; zeros for a molecule), ``pbc [3]`` bool, on the package's device; floating inputs
  in the package's dtype. ``N`` and the elements (any of the model's) may differ from the
  structure the package was exported with.
* Returns ``energy []`` eV and ``forces [N, 3]`` eV/Å (``-d energy / d positions``), the
  Predictor's values.
* The neighbour list is computed inside (positions are wrapped into the cell along periodic
  directions first). Periodic images are enumerated up to ``max_images`` lattice vectors
  along each direction, fixed at export (default: what the export structure needs). A cell
  that needs more (a smaller or more skewed cell), elements the model does not know and a
  singular periodic cell raise a ``RuntimeError`` that says so and how to re-export; there is
  no other capacity (atoms and edges are dynamic).
* A fixed-capacity package (``fixed_capacity=True``, :class:`Capacity`) has ``N *
  edges_per_atom`` edge slots and, with the binned search, bins of ``atoms_per_bin`` atoms. None
  of its sizes depend on the data, and it never synchronises with the host, so a CUDA graph can
  capture a call (:class:`~flashcart.export.graphed.GraphedRunner`). It returns NaN energy and
  forces where the other packages raise, and also for more pairs or fuller bins than it holds;
  :func:`~flashcart.export.load_exported` names the cause.
* ``runner.get_metadata()`` holds ``flashcart_format``, ``elements``, ``cutoff``, ``dtype``,
  ``device``, ``max_images``, ``neighbours``, ``capacity`` (JSON ``null`` or the :class:`Capacity`),
  ``on_failure`` (``raise`` or ``nan``) and ``units``.

Built by tracing energy and its gradient with ``make_fx`` (``torch.export`` cannot trace
``torch.autograd.grad`` itself), exporting that graph with a dynamic atom count and compiling
it with ``torch._inductor.aoti_compile_and_package``. On CUDA the package runs inductor's own
kernels for the generated PyTorch backend (default), or with ``triton=True`` the model's Triton
kernels (``torch.library.triton_op``), compiled in. The C++ wrapper is compiled with a compiler
that links ``libstdc++.so`` (:mod:`flashcart.export.compiler`: one that links the C++ runtime
statically makes packages that crash torch's loader). Every package is loaded once in a fresh
process and run there on the export structure before it is written: one that does not load,
or whose energy or forces differ from the model's by more than :data:`CHECK_TOLERANCE`, fails
the export and leaves ``path`` untouched.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..model.potential import FlashCartPotential
from .compiler import configured_compiler, package_compiler
from .model import frozen_copy, structure_energy
from .neighbors import (
    binned_pair_list,
    check_search,
    fixed_pair_list,
    fullest_bin,
    image_table,
    images_needed,
    pair_list,
    reciprocal_rows,
    wrap_positions,
)

__all__ = [
    "build_aoti_graph",
    "Capacity",
    "plan_capacity",
    "structure_sizes",
    "EDGE_HEADROOM",
    "BIN_HEADROOM",
    "check_package_loads",
    "export_aoti",
    "model_reference",
    "relative_differences",
    "DEFAULT_NEIGHBOURS",
    "CHECK_TOLERANCE",
    "FORMAT",
    "required_images",
]

FORMAT = "flashcart-aoti-1"

REEXPORT_HINT = (
    "Re-export with `flashcart-export CHECKPOINT --format aoti --structure FILE --max-images K -o OUT`, "
    "K at least what your smallest cell needs."
)
"""What a package (and :func:`~flashcart.export.load_exported`) says when a cell needs more images."""


def required_images(atoms, cutoff: float) -> tuple[int, int, int]:
    """Images needed along each lattice vector of ``atoms`` (0 along non-periodic ones)."""
    if not atoms.pbc.any():
        return (0, 0, 0)
    cell = torch.tensor(atoms.cell.array, dtype=torch.float64)
    need = images_needed(reciprocal_rows(cell), cutoff)
    return tuple(int(n) if p else 0 for n, p in zip(need.tolist(), atoms.pbc))


@dataclass(frozen=True)
class Capacity:
    """A fixed-capacity package's sizes: ``edges_per_atom`` edge slots per atom (``N *
    edges_per_atom`` in all) and, with the binned search, ``atoms_per_bin`` atoms a bin holds
    (``None`` with all pairs)."""

    edges_per_atom: int
    atoms_per_bin: int | None

    def to_json(self) -> str:
        return json.dumps({"edges_per_atom": self.edges_per_atom, "atoms_per_bin": self.atoms_per_bin})


EDGE_HEADROOM = 0.1
"""Default edge slots of a fixed-capacity package: the export structure's pairs per atom times
``1 + EDGE_HEADROOM``, rounded up (every slot costs the model an edge's work)."""
BIN_HEADROOM = 0.5
"""Default bin capacity: the export structure's fullest bin times ``1 + BIN_HEADROOM``, plus two
(bins only bound the candidates each atom tests; their occupancy fluctuates more)."""


class _EnergyForces:
    """The traced function: ``(positions, atomic_numbers, cell, pbc) -> (energy, forces)``.

    ``capacity=None``: the neighbour list has as many pairs as there are, and the input checks
    raise (two host synchronisations on a GPU). A :class:`Capacity`: the pairs go into fixed
    slots (:func:`~flashcart.export.neighbors.fixed_pair_list`) and a structure the package
    cannot evaluate (the checks, or pairs beyond the capacity) gets NaN energy and forces, so
    nothing synchronises and a CUDA graph can capture the call.
    """

    def __init__(self, model: FlashCartPotential, max_images: tuple[int, int, int], neighbours: str = "all-pairs", capacity=None):
        self.neighbours = check_search(neighbours)
        self.model = model
        self.cutoff = float(model.r_max)
        self.max_images = max_images
        self.elements = list(model.elements)
        self.capacity = capacity

    def __call__(self, positions, numbers, cell, pbc):
        model, dtype, dev = self.model, positions.dtype, positions.device
        z_to_type = model.z_to_type
        # ---- input checks
        z_ok = (numbers >= 0) & (numbers < z_to_type.shape[0])
        types = z_to_type.index_select(0, numbers.clamp(0, z_to_type.shape[0] - 1))
        unknown = (~z_ok | (types < 0)).any()
        periodic = pbc.to(dtype)
        any_pbc = pbc.any()
        eye = torch.eye(3, dtype=dtype, device=dev)
        volume = (cell[0] * torch.linalg.cross(cell[1], cell[2])).sum()
        singular = any_pbc & (volume.abs() < 1e-9)
        safe_cell = torch.where(any_pbc & ~singular, cell, eye)  # molecules: no wrapping
        recip = reciprocal_rows(safe_cell)
        need = images_needed(recip, self.cutoff) * periodic
        limit = torch.tensor(self.max_images, dtype=dtype, device=dev)
        too_few_images = (need > limit).any() & ~singular
        if self.capacity is None:
            self._refuse(torch.stack([unknown, singular, too_few_images]).cpu())  # one synchronisation on a GPU
        # ---- neighbour list and energy
        positions.requires_grad_(True)
        pos = wrap_positions(positions, safe_cell, recip, periodic)
        table = image_table(*self.max_images, dtype, dev)
        free = None
        if self.capacity is not None:
            cap = self.capacity
            bins = cap.atoms_per_bin if self.neighbours == "cells" else None
            receivers, senders, image, real, overflow = fixed_pair_list(
                pos, cell, recip, pbc, self.max_images, self.cutoff, cap.edges_per_atom, bins
            )
            free = ~real
        elif self.neighbours == "cells":
            receivers, senders, image = binned_pair_list(pos, cell, recip, pbc, self.max_images, self.cutoff)
        else:
            allowed = ((table == 0) | pbc[None, :]).all(dim=1)
            receivers, senders, image = pair_list(pos, table @ cell, allowed, self.cutoff)
        shifts = table.index_select(0, image)
        energy = structure_energy(model, pos, types.clamp_min(0), cell[None], shifts, receivers, senders, free)
        (grad,) = torch.autograd.grad(energy, positions)
        energy, forces = energy.detach(), -grad
        if self.capacity is not None:
            bad = unknown | singular | too_few_images | overflow
            nan = torch.full((), float("nan"), dtype=dtype, device=dev)
            energy, forces = torch.where(bad, nan, energy), torch.where(bad, nan, forces)
        return energy, forces

    def _refuse(self, flags) -> None:
        """The dynamic package's checks: ``flags`` (host bool ``[3]``: unknown elements, singular
        cell, too few images) raise with what to do."""
        torch._assert_async(
            ~flags[0],
            f"flashcart package: atomic numbers outside the model's elements {self.elements} "
            "(re-export a package from a model trained on them)",
        )
        torch._assert_async(~flags[1], "flashcart package: periodic structure with a singular cell")
        torch._assert_async(
            ~flags[2],
            f"flashcart package: the cell needs more periodic images than this package enumerates "
            f"(max_images={list(self.max_images)} along its lattice vectors, cutoff {self.cutoff} Å; a cell needs "
            f"ceil(cutoff / distance between opposite faces) along each). {REEXPORT_HINT}",
        )


def _example(atoms, dtype: torch.dtype, device: torch.device):
    return (
        torch.tensor(atoms.positions, dtype=dtype, device=device),
        torch.tensor(atoms.numbers, dtype=torch.long, device=device),
        torch.tensor(atoms.cell.array, dtype=dtype, device=device),
        torch.tensor(atoms.pbc, dtype=torch.bool, device=device),
    )


DEFAULT_NEIGHBOURS = "cells"
"""The package's neighbour search when none is named, on every device: a package takes any N, and
the binned search's time and memory grow with N, the dense test's with N² x images. (CUDA packages
of both kinds, inductor's kernels and FlashCart's Triton kernels, passed their GPU tests with it on
the H200, torch 2.11, 2026-12-01.)"""


def _images(atoms, cutoff: float, max_images: int | None) -> tuple[int, int, int]:
    """The images a package enumerates along each lattice vector: ``max_images`` along each, or
    what ``atoms`` needs; a ``ValueError`` for a negative value or one below that need."""
    need = required_images(atoms, cutoff)
    if max_images is None:
        return need
    if max_images < 0:
        raise ValueError(f"max_images must be >= 0, got {max_images}")
    if max_images < max(need):
        raise ValueError(f"max_images={max_images} is below what the export structure itself needs ({max(need)})")
    return (max_images,) * 3


def structure_sizes(
    positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor, cutoff: float, max_images: tuple[int, int, int], neighbours: str
) -> tuple[int, int | None]:
    """``(pairs, fullest bin)`` of a structure (positions ``[N, 3]`` Å, cell ``[3, 3]`` Å, pbc
    ``[3]``) as a package's search finds them (fullest bin ``None`` with all pairs), computed
    on the CPU in float64."""
    positions = positions.detach().to("cpu", torch.float64)
    cell, pbc = cell.detach().to("cpu", torch.float64), pbc.to("cpu", torch.bool)
    any_pbc = bool(pbc.any())
    safe = cell if any_pbc else torch.eye(3, dtype=torch.float64)
    recip = reciprocal_rows(safe)
    pos = wrap_positions(positions, safe, recip, pbc.to(torch.float64))
    receivers, _, _ = binned_pair_list(pos, cell, recip, pbc, max_images, cutoff)
    fullest = fullest_bin(pos, cell, recip, pbc, max_images, cutoff) if neighbours == "cells" else None
    return int(receivers.shape[0]), fullest


def plan_capacity(
    atoms,
    cutoff: float,
    max_images: tuple[int, int, int],
    neighbours: str,
    edges_per_atom: int | None = None,
    atoms_per_bin: int | None = None,
) -> Capacity:
    """A fixed-capacity package's :class:`Capacity`: the given sizes, or from the export structure
    (:data:`EDGE_HEADROOM`, :data:`BIN_HEADROOM`); ``atoms_per_bin`` applies to the binned search only."""
    for name, value in (("edges_per_atom", edges_per_atom), ("atoms_per_bin", atoms_per_bin)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if atoms_per_bin is not None and neighbours != "cells":
        raise ValueError(f"atoms_per_bin applies to the binned search (neighbours='cells'), not {neighbours!r}")
    positions, _, cell, pbc = _example(atoms, torch.float64, torch.device("cpu"))
    pairs, fullest = structure_sizes(positions, cell, pbc, cutoff, max_images, neighbours)
    if edges_per_atom is None:
        edges_per_atom = max(1, math.ceil(pairs / len(atoms) * (1.0 + EDGE_HEADROOM)))
    elif edges_per_atom * len(atoms) < pairs:
        raise ValueError(
            f"edges_per_atom={edges_per_atom} is below what the export structure itself needs "
            f"({pairs} pairs on {len(atoms)} atoms: at least {math.ceil(pairs / len(atoms))})"
        )
    if neighbours == "cells":
        if atoms_per_bin is None:
            atoms_per_bin = math.ceil(fullest * (1.0 + BIN_HEADROOM)) + 2
        elif atoms_per_bin < fullest:
            raise ValueError(f"atoms_per_bin={atoms_per_bin} is below the export structure's fullest bin ({fullest} atoms)")
    return Capacity(edges_per_atom, atoms_per_bin)


def build_aoti_graph(
    model: FlashCartPotential,
    atoms,
    dtype: torch.dtype,
    device: str,
    max_images: int | None = None,
    triton: bool = False,
    neighbours: str | None = None,
    capacity: Capacity | None = None,
):
    """``(exported program, example inputs, metadata)`` for :func:`export_aoti`.

    ``triton=False`` traces the generated PyTorch backend on CUDA too (inductor then writes
    its own kernels for it); ``triton=True`` traces a ``use_triton`` model's Triton kernels.
    ``neighbours``: ``cells`` (bins a cutoff wide, time linear in the atoms,
    :func:`~flashcart.export.neighbors.binned_pair_list`) or ``all-pairs`` (the dense test,
    N² x images); ``None``: :data:`DEFAULT_NEIGHBOURS`. ``capacity``: ``None`` (sizes as the
    structure needs them) or a fixed-capacity package's :class:`Capacity` (:func:`plan_capacity`).
    """
    device = torch.device(device)
    neighbours = DEFAULT_NEIGHBOURS if neighbours is None else check_search(neighbours)
    cutoff = float(model.r_max)
    images = _images(atoms, cutoff, max_images)
    use_triton = triton and bool(model.options.get("use_triton")) and device.type == "cuda"
    frozen = frozen_copy(model, dtype, device, use_triton=use_triton)
    if capacity is not None and (capacity.atoms_per_bin is None) != (neighbours != "cells"):
        raise ValueError(f"capacity {capacity} does not fit the {neighbours} search (atoms_per_bin is for cells only)")
    fn = _EnergyForces(frozen, images, neighbours, capacity)
    example = _example(atoms, dtype, device)
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.enable_grad():
        graph = make_fx(fn, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*example)
    n_atoms = torch.export.Dim("n_atoms", min=1, max=10_000_000)
    program = torch.export.export(graph, example, dynamic_shapes=({0: n_atoms}, {0: n_atoms}, None, None), strict=False)
    metadata = {
        "flashcart_format": FORMAT,
        "elements": json.dumps(list(model.elements)),
        "cutoff": repr(cutoff),
        "dtype": str(dtype).replace("torch.", ""),
        "device": device.type,
        "max_images": json.dumps(list(images)),
        "neighbours": neighbours,
        "capacity": capacity.to_json() if capacity is not None else "null",
        "on_failure": "nan" if capacity is not None else "raise",
        "units": "positions and cell in Angstrom, energy in eV, forces in eV/Angstrom",
    }
    return program, example, metadata


def export_aoti(
    model: FlashCartPotential,
    atoms,
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    max_images: int | None = None,
    inductor_configs: dict | None = None,
    triton: bool = False,
    check_load: bool = True,
    neighbours: str | None = None,
    fixed_capacity: bool = False,
    edges_per_atom: int | None = None,
    atoms_per_bin: int | None = None,
) -> Path:
    """Compile the package for ``model`` (example structure ``atoms``) and write it to ``path`` atomically.

    ``fixed_capacity``: a package without data-dependent sizes (``edges_per_atom`` edge slots
    per atom and, with the binned search, ``atoms_per_bin`` atoms a bin holds; defaults from
    ``atoms``, see :func:`plan_capacity`). It never synchronises with the host, so a CUDA graph
    can capture it (:func:`~flashcart.export.load_exported` does on CUDA); a structure it cannot
    evaluate gets NaN energy and forces instead of an error. ``edges_per_atom`` and
    ``atoms_per_bin`` without it are an error.

    ``check_load``: load the compiled package in a fresh Python process first, run it there on
    ``atoms``, and raise a ``RuntimeError`` (writing nothing) if that fails or crashes, or if its
    energy or forces differ from the model's (the Predictor on the generated PyTorch backend, same
    dtype and device) by more than :data:`CHECK_TOLERANCE` (relative).
    """
    if not fixed_capacity and (edges_per_atom is not None or atoms_per_bin is not None):
        raise ValueError("edges_per_atom and atoms_per_bin apply to fixed-capacity packages only (fixed_capacity=True)")
    search = DEFAULT_NEIGHBOURS if neighbours is None else check_search(neighbours)
    capacity = None
    if fixed_capacity:
        images = _images(atoms, float(model.r_max), max_images)
        capacity = plan_capacity(atoms, float(model.r_max), images, search, edges_per_atom, atoms_per_bin)
    program, _, metadata = build_aoti_graph(model, atoms, dtype, device, max_images, triton, search, capacity)
    # Inductor re-derives the bound of the pair count (the neighbour list's nonzero) from the
    # export structure's sizes, not the symbolic ones, and asserts it at run time: a package
    # exported on 24 atoms refused 648 ("Expected u0 <= 15552"). The graph's own checks on the
    # inputs are tensor assertions (torch._assert_async), which this setting keeps. (Torch 2.13
    # also has ``do_not_emit_runtime_assertions``; 2.11 has only ``scalar_asserts``, which both
    # read when they generate a scalar assertion.)
    configs = {"aot_inductor.metadata": metadata, "scalar_asserts": False}
    if torch.device(device).type == "cpu":
        configs["cpp.simdlen"] = 1  # as the Predictor: works around an inductor CPU vectoriser assertion
    configs.update(inductor_configs or {})
    if "cpp.cxx" not in configs:  # a compiler that links libstdc++.so (see flashcart.export.compiler)
        compiler, why = package_compiler()
        if why is not None:
            warnings.warn(why, stacklevel=2)
            configs["cpp.cxx"] = (None, compiler)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".pt2", dir=path.parent)
    os.close(fd)
    try:
        torch._inductor.aoti_compile_and_package(program, package_path=tmp, inductor_configs=configs)
        if check_load:
            cxx = configs["cpp.cxx"][-1] if "cpp.cxx" in configs else None
            check_package_loads(
                tmp,
                triton_kernels=triton and torch.device(device).type == "cuda",
                written=False,
                compiler=cxx,
                example=_example(atoms, dtype, torch.device(device)),
                reference=model_reference(model, atoms, dtype, device),
            )
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# the fresh process: load the package; with an inputs file and an outputs file, run it on the
# inputs and save (energy, forces) on the CPU
_LOAD_CHECK = """
import sys, torch
runner = torch._inductor.aoti_load_package(sys.argv[1])
if len(sys.argv) > 3:
    energy, forces = runner(*torch.load(sys.argv[2]))
    torch.save((energy.detach().cpu(), forces.detach().cpu()), sys.argv[3])
"""

# largest relative difference (energy to max(1 eV, |E|), forces to max(1 eV/Å, max |F|)) between a
# package's results on its export structure and the model's, per dtype
CHECK_TOLERANCE = {torch.float64: 1e-8, torch.float32: 1e-4}


def model_reference(model: FlashCartPotential, atoms, dtype: torch.dtype, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Energy ``[]`` (eV) and forces ``[N, 3]`` (eV/Å) of ``atoms`` from the model through the
    Predictor, on the generated PyTorch backend in ``dtype`` on ``device`` (on the CPU)."""
    from ..data import collate, structure_from_atoms
    from ..model.predictor import Predictor

    device = torch.device(device)
    frozen = frozen_copy(model, dtype, device, use_triton=False)
    structure = structure_from_atoms(atoms, frozen.r_max, require_labels=False, device=device)
    out = Predictor(frozen)(collate([structure], frozen.z_to_type.to(device)).to(device, dtype))
    return out["energy"][0].detach().cpu(), out["forces"].detach().cpu()


def relative_differences(result, reference) -> tuple[float, float]:
    """``(energy, forces)`` against ``reference`` (both ``(energy [], forces [N, 3])``): the
    relative differences of energy and forces (see :data:`CHECK_TOLERANCE`)."""
    (energy, forces), (ref_energy, ref_forces) = result, reference
    de = abs(float(energy) - float(ref_energy)) / max(1.0, abs(float(ref_energy)))
    scale = max(1.0, float(ref_forces.abs().max())) if ref_forces.numel() else 1.0
    df = float((forces.double() - ref_forces.double()).abs().max()) / scale if ref_forces.numel() else 0.0
    return de, df


def check_package_loads(
    path: str | Path,
    timeout: float = 600.0,
    triton_kernels: bool = False,
    written: bool = True,
    compiler: str | None = None,
    example: tuple | None = None,
    reference: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Load the package at ``path`` in a fresh Python process (which need not import FlashCart);
    a ``RuntimeError`` naming the file, the exit status and the end of its error output if that
    fails, crashes or takes longer than ``timeout`` seconds. ``written=False`` (the export's
    check of its temporary file) says in the error that nothing was written.

    With ``example`` (the package's inputs) and ``reference`` (``(energy, forces)`` it must
    give), the process also runs the package, and results that differ by more than
    :data:`CHECK_TOLERANCE` are a ``RuntimeError`` naming both."""
    outcome = "" if written else "; nothing was written"
    with tempfile.TemporaryDirectory() as scratch:
        io = []
        if example is not None:
            io = [Path(scratch) / "inputs.pt", Path(scratch) / "outputs.pt"]
            torch.save(tuple(example), io[0])
        cmd = [sys.executable, "-X", "faulthandler", "-c", _LOAD_CHECK, str(path), *map(str, io)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"loading the compiled package {path} took longer than {timeout:.0f} s in a fresh process{outcome}"
            ) from None
        if proc.returncode == 0:
            if example is not None and reference is not None:
                _check_results(path, torch.load(io[1]), reference, example[0].dtype, triton_kernels, outcome)
            return
    how = f"crashed (signal {-proc.returncode})" if proc.returncode < 0 else f"failed (exit status {proc.returncode})"
    hint = ""
    if triton_kernels:
        hint = (
            f" The package's C++ wrapper was compiled with {compiler or configured_compiler()}. A wrapper that links "
            "the C++ runtime statically (a compiler that does not find libstdc++.so, such as the H200 image's "
            "CXX=/opt/gcc/bin/g++) crashes in torch's package loader (std::regex in AOTInductorModel's constructor; "
            "benchmarks/RESULTS.md, 2026-12-01 evening): set CXX to a compiler that links libstdc++.so (for example "
            "CXX=/usr/bin/g++), or export without --triton (inductor's kernels for the generated PyTorch backend)."
        )
    tail = "\n".join(proc.stderr.strip().splitlines()[-12:])
    raise RuntimeError(f"the compiled package {path} {how} when loaded in a fresh process{outcome}.{hint}\n{tail}")


def _check_results(path, result, reference, dtype: torch.dtype, triton_kernels: bool, outcome: str) -> None:
    de, df = relative_differences(result, reference)
    tol = CHECK_TOLERANCE.get(dtype, 1e-4)
    if de <= tol and df <= tol:
        return
    hint = " Export without --triton (inductor's kernels for the generated PyTorch backend)." if triton_kernels else ""
    raise RuntimeError(
        f"the compiled package {path} does not compute what the model computes on the export structure: energy "
        f"{float(result[0]):.8g} eV against {float(reference[0]):.8g} eV (relative difference {de:.1e}), forces' largest "
        f"relative difference {df:.1e} (allowed {tol:.0e}){outcome}.{hint}"
    )
