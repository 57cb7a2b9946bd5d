"""Exported files as one function of a structure: ``load_exported(path)(positions, numbers, cell, pbc)``.

The object FlashCart's simulation code (and tests) use to evaluate a ``.pt2`` package or a
TorchScript ``.pt`` file in FlashCart's units: positions and cell in Å, energy in eV,
forces in eV/Å.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .aoti import FORMAT as AOTI_FORMAT
from .aoti import REEXPORT_HINT, Capacity, structure_sizes
from .graphed import GraphedRunner
from .neighbors import images_needed, reciprocal_rows
from .torchscript import EV_TO_KJ_PER_MOL, NM_TO_ANGSTROM

__all__ = ["load_exported", "ExportedPotential", "md_evaluator"]


class ExportedPotential:
    """``__call__(positions [N, 3] Å, numbers [N], cell [3, 3] Å, pbc [3]) -> (energy [] eV, forces [N, 3] eV/Å)``.

    Inputs may be numpy arrays or tensors; they are converted to the file's dtype and device.
    Results are tensors in that dtype on that device. Attributes: ``path``, ``format``
    (``"aoti"`` or ``"torchscript"``), ``elements``, ``cutoff`` (Å), ``dtype``, ``device``.
    A TorchScript file evaluates only the atoms (and order) it was exported for.
    :meth:`evaluate` is the :class:`~flashcart.simulation.Evaluator` interface, so the
    simulation adapters (ASE, OpenMM, ``flashcart-md``) can run on an exported file.

    A fixed-capacity package (``capacity`` not ``None``) on CUDA runs as a CUDA graph per atom
    count (:class:`~flashcart.export.graphed.GraphedRunner`, through the package's
    single-threaded runner) unless ``cuda_graph=False``; its NaN result for a structure it
    cannot evaluate becomes a ``ValueError`` naming why. Such an object is not meant to be
    called from several threads at once.
    """

    def __init__(self, path: str | Path, device: str | None = None, cuda_graph: bool | None = None):
        self.path = Path(path)
        self.neighbor_list_builds = 0
        if not self.path.is_file():
            raise FileNotFoundError(f"exported model {self.path} does not exist")
        if cuda_graph not in (None, True, False):
            raise ValueError(f"cuda_graph must be None (automatic), True or False, got {cuda_graph!r}")
        self.capacity = None
        self._graphed = None
        if self.path.suffix == ".pt2":
            self._load_aoti(device)
            self._graphed = self._graph_runner(cuda_graph)
        elif self.path.suffix == ".pt":
            if cuda_graph:
                raise ValueError(f"{self.path}: cuda_graph=True needs a fixed-capacity .pt2 package on CUDA, not a TorchScript file")
            self._load_torchscript(device)
        else:
            raise ValueError(f"{self.path}: an exported model ends in .pt2 (AOTInductor) or .pt (TorchScript)")

    def _load_aoti(self, device: str | None) -> None:
        try:
            self._runner = torch._inductor.aoti_load_package(str(self.path))
            meta = self._runner.get_metadata()
        except Exception as err:
            raise ValueError(f"{self.path}: cannot be loaded as an AOTInductor package ({type(err).__name__}: {err})") from None
        if meta.get("flashcart_format") != AOTI_FORMAT:
            raise ValueError(f"{self.path}: not a FlashCart package (metadata flashcart_format={meta.get('flashcart_format')!r})")
        self.format = "aoti"
        self.elements = json.loads(meta["elements"])
        self.cutoff = float(meta["cutoff"])
        self.max_images = json.loads(meta["max_images"])
        self.neighbours = meta.get("neighbours", "all-pairs")  # packages before the binned search tested all pairs
        self.dtype = getattr(torch, meta["dtype"])
        self.device = torch.device(meta["device"])
        capacity = json.loads(meta.get("capacity", "null"))  # packages before fixed capacities had none
        self.capacity = Capacity(**capacity) if capacity is not None else None
        if device is not None and torch.device(device).type != self.device.type:
            raise ValueError(f"{self.path} was compiled for {self.device.type}, not {device}; re-export with --device {device}")

    def _graph_runner(self, cuda_graph: bool | None):
        """The package's runner as CUDA graphs, or ``None`` (the runner called as it is)."""
        capturable = self.capacity is not None and self.device.type == "cuda"
        if cuda_graph and not capturable:
            raise ValueError(
                f"{self.path}: cuda_graph=True needs a fixed-capacity package on CUDA (re-export with --fixed-capacity --device cuda)"
            )
        if not capturable or cuda_graph is False:
            return None
        # The default runner picks a free model instance by querying the CUDA event of its
        # previous run; once a run was captured into a graph that query fails ("The model did
        # not finish successfully. Error: invalid argument", torch 2.11 on the H200: the first
        # call after a capture, e.g. a second atom count). The single-threaded runner keeps no
        # such events (torch: "useful to avoid conflicts with CUDAGraphs"); it is not for
        # concurrent calls from several threads, which FlashCart's simulation code never makes.
        try:
            runner = torch._inductor.aoti_load_package(str(self.path), run_single_threaded=True)
        except Exception as err:
            raise ValueError(f"{self.path}: cannot be loaded for CUDA graphs ({type(err).__name__}: {err})") from None
        self._runner = runner  # the default runner is dropped: one loaded copy
        return GraphedRunner(runner, strict=bool(cuda_graph))

    def _load_torchscript(self, device: str | None) -> None:
        try:
            self._module = torch.jit.load(str(self.path))
            numbers = self._module.atomic_numbers
        except Exception as err:
            raise ValueError(f"{self.path}: cannot be loaded as a FlashCart TorchScript file ({type(err).__name__}: {err})") from None
        self.format = "torchscript"
        self.elements = list(self._module.elements)
        self.cutoff = float(self._module.cutoff)
        self.periodic = bool(self._module.periodic)
        self.numbers = numbers
        self.dtype = getattr(torch, self._module.dtype_name)
        self.device = numbers.device
        if device is not None and torch.device(device).type != self.device.type:
            raise ValueError(f"{self.path} was exported for {self.device.type}, not {device}; re-export with --device {device}")

    def check_numbers(self, numbers) -> None:
        """Raise ``ValueError`` naming the elements of ``numbers`` the exported model does not know."""
        from ase.data import chemical_symbols

        z = np.asarray(numbers).reshape(-1)
        bad = sorted({chemical_symbols[int(k)] if 0 < k < len(chemical_symbols) else str(int(k)) for k in z} - set(self.elements))
        if bad:
            raise ValueError(f"{self.path}: elements {bad} are not among the model's elements {self.elements}")
        if self.format == "torchscript" and (len(z) != len(self.numbers) or not np.array_equal(z, self.numbers.cpu().numpy())):
            raise ValueError(f"{self.path}: a TorchScript export evaluates only the atoms it was exported for (in that order)")

    def _tensor(self, x, dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).to(self.device, dtype)

    def __call__(self, positions, numbers, cell, pbc) -> tuple[torch.Tensor, torch.Tensor]:
        pos = self._tensor(positions, self.dtype)
        z = self._tensor(numbers, torch.long)
        c = self._tensor(cell, self.dtype)
        p = self._tensor(pbc, torch.bool)
        if pos.dim() != 2 or pos.shape[1] != 3 or z.shape != (pos.shape[0],) or c.shape != (3, 3) or p.shape != (3,):
            raise ValueError(
                f"{self.path}: expected positions [N, 3], numbers [N], cell [3, 3], pbc [3]; got "
                f"{list(pos.shape)}, {list(z.shape)}, {list(c.shape)}, {list(p.shape)}"
            )
        self.neighbor_list_builds += 1  # the files build their neighbour list on every call
        if self.format == "aoti" and self.capacity is not None:
            run = self._graphed if self._graphed is not None else self._runner
            energy, forces = run(pos, z, c, p)
            if bool(torch.isnan(energy)):  # the package's way of refusing (no synchronisation inside)
                self._explain_refusal(z, c, p)
                self._explain_overflow(pos, z, c, p)
                raise RuntimeError(f"{self.path}: the package returned NaN on this structure, and none of its checks explains why")
            return energy, forces
        if self.format == "aoti":
            try:
                return self._runner(pos, z, c, p)
            except RuntimeError as err:
                # torch 2.11's runner prints the package's own check message on stderr and raises
                # a generic "API call failed"; name the cause here whatever the torch version
                self._explain_refusal(z, c, p)
                raise RuntimeError(f"{self.path}: the package failed on this structure ({err})") from None
        return self._call_torchscript(pos, z, c, p)

    def _explain_refusal(self, z: torch.Tensor, c: torch.Tensor, p: torch.Tensor) -> None:
        """Raise ``ValueError`` for what a package checks: unknown elements, a singular periodic
        cell, a cell that needs more periodic images than the package enumerates."""
        self.check_numbers(z.cpu().numpy())
        if not bool(p.any()):
            return
        cell = c.detach().to("cpu", torch.float64)
        if abs(float(torch.linalg.det(cell))) < 1e-9:
            raise ValueError(f"{self.path}: periodic structure with a singular cell")
        need = [int(n) if bool(q) else 0 for n, q in zip(images_needed(reciprocal_rows(cell), self.cutoff).tolist(), p.cpu())]
        if any(n > m for n, m in zip(need, self.max_images)):
            raise ValueError(
                f"{self.path}: the cell needs {need} periodic images along its lattice vectors, more than this package "
                f"enumerates (max_images={self.max_images}, cutoff {self.cutoff} Å). {REEXPORT_HINT}"
            )

    def _explain_overflow(self, pos: torch.Tensor, z: torch.Tensor, c: torch.Tensor, p: torch.Tensor) -> None:
        """Raise ``ValueError`` when the structure needs more edge slots or bin capacity than a
        fixed-capacity package has, with the sizes it needs."""
        pairs, fullest = structure_sizes(pos, c, p, self.cutoff, tuple(self.max_images), self.neighbours)
        n, cap = pos.shape[0], self.capacity
        command = "flashcart-export CHECKPOINT --format aoti --fixed-capacity {} --structure FILE -o OUT"
        if pairs > n * cap.edges_per_atom:
            raise ValueError(
                f"{self.path}: the structure has {pairs} pairs within the cutoff on {n} atoms ({pairs / n:.1f} per atom), "
                f"more than the package's {cap.edges_per_atom} edge slots per atom. Re-export with "
                f"`{command.format('--edges-per-atom K')}`, K at least {-(-pairs // n)}."
            )
        if cap.atoms_per_bin is not None and fullest > cap.atoms_per_bin:
            raise ValueError(
                f"{self.path}: a bin of the neighbour search holds {fullest} atoms, more than the package's "
                f"{cap.atoms_per_bin} atoms per bin. Re-export with `{command.format('--atoms-per-bin W')}`, W at least {fullest}."
            )

    def evaluate(self, positions, numbers, cell=None, pbc=None, stress: bool = False):
        """The :class:`~flashcart.simulation.Evaluator` interface: an
        :class:`~flashcart.simulation.Evaluation` (energy eV, forces ``[N, 3]`` eV/Å, on the host in float64).

        ``cell=None`` is a molecule; ``pbc=None`` means periodic in all directions when a cell is
        given. Exported files compute no stress: ``stress=True`` is an error.
        """
        from ..simulation.evaluator import Evaluation

        if stress:
            raise ValueError(f"{self.path}: exported files compute energy and forces, not stress")
        cell_np = np.zeros((3, 3)) if cell is None else np.asarray(cell, dtype=np.float64).reshape(3, 3)
        pbc_np = np.full(3, cell is not None) if pbc is None else np.broadcast_to(np.asarray(pbc, dtype=bool), (3,)).copy()
        if isinstance(positions, torch.Tensor):
            positions = positions.detach()
        energy, forces = self(positions, numbers, cell_np, pbc_np)
        return Evaluation(float(energy), forces.detach().to("cpu", torch.float64).numpy())

    def _call_torchscript(self, pos, z, c, p):
        if z.shape != self.numbers.shape or not torch.equal(z, self.numbers):
            raise ValueError(f"{self.path}: a TorchScript export evaluates only the atoms it was exported for (in that order)")
        if bool(p.any()) != self.periodic or (self.periodic and not bool(p.all())):
            raise ValueError(f"{self.path}: exported {'periodic' if self.periodic else 'non-periodic'}, got pbc={p.tolist()}")
        x = (pos / NM_TO_ANGSTROM).detach().requires_grad_(True)
        with torch.enable_grad():
            energy = self._module(x, c / NM_TO_ANGSTROM if self.periodic else None)
            (grad,) = torch.autograd.grad(energy, x)
        return energy.detach() / EV_TO_KJ_PER_MOL, -grad / (EV_TO_KJ_PER_MOL * NM_TO_ANGSTROM)


def load_exported(path: str | Path, device: str | None = None, cuda_graph: bool | None = None) -> ExportedPotential:
    """An :class:`ExportedPotential` for a ``.pt2`` package or a TorchScript ``.pt`` file
    (``cuda_graph``: see :class:`ExportedPotential`)."""
    return ExportedPotential(path, device, cuda_graph)


def md_evaluator(cfg: dict, out=print) -> ExportedPotential:
    """The evaluator ``flashcart-md`` runs when ``model`` is an exported ``.pt2`` (or ``.pt``) file.

    The file fixes device, dtype and compilation: ``device`` must be ``auto`` or the file's,
    ``dtype`` the file's, ``compile_mode`` unset; anything else is a ``ConfigError`` naming the
    key. ``skin`` and ``headroom`` do not apply (the file builds its neighbour list on every call) and
    ``compare_profile`` needs a checkpoint; both are reported through ``out``.
    """
    from ..config import ConfigError

    try:
        pot = load_exported(cfg["model"])
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(f"key 'model': {err}") from None
    dtype = str(pot.dtype).replace("torch.", "")
    if cfg["dtype"] != dtype:
        raise ConfigError(f"key 'dtype': {pot.path} computes in {dtype}; set dtype={dtype} (or re-export with --dtype {cfg['dtype']})")
    want = {"auto": pot.device.type, "cpu": "cpu", "gpu": "cuda"}.get(cfg["device"], cfg["device"])
    if torch.device(want).type != pot.device.type:
        raise ConfigError(f"key 'device': {pot.path} runs on {pot.device.type}, not {cfg['device']} (re-export with --device)")
    if cfg["compile_mode"] is not None:
        raise ConfigError(f"key 'compile_mode': {pot.path} is compiled already; leave compile_mode unset (~)")
    if cfg.get("radial_table"):
        raise ConfigError(
            f"key 'radial_table': {pot.path} evaluates its radial MLPs (exported files carry no tables); leave radial_table=0"
        )
    if cfg["engine_step"] != "auto":
        raise ConfigError(f"key 'engine_step': {pot.path} runs its own step (neighbour list inside); leave engine_step=auto")
    what = f"{pot.format}, {dtype}, {pot.device.type}"
    if pot.capacity is not None:
        what += f", fixed capacity: {pot.capacity.edges_per_atom} edge slots per atom"
        what += ", replayed as a CUDA graph" if pot._graphed is not None else ""
    notes = [f"[md] exported model {pot.path} ({what}): neighbour list built inside on every step, skin and headroom not used"]
    if cfg.get("compare_profile"):
        notes.append("[md] compare_profile: needs a checkpoint, skipped for an exported model")
    for line in notes:
        out(line)
    return pot
