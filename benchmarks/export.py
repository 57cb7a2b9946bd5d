"""Exported files next to the Predictor: export/compile time, file size, s/call.

For each structure: a freshly initialised model (timings do not depend on the weights) is
timed through the Predictor (eager, neighbour list built once outside the timing, and with
the list built every call as the exported files do; on CUDA also ``reduce-overhead``), then
exported as TorchScript (energy + autograd forces, as openmm-torch's TorchForce calls it)
and as an AOTInductor package (energy + forces, neighbour list inside).

    python benchmarks/export.py --device cpu --structures ethanol --config examples/ethanol/config.yaml
    python benchmarks/export.py --device cpu --structures water --neighbours cells all-pairs   # both searches
    PYTHONPATH=. ~/.cache/flashcart-openmmtorch-venv/bin/python benchmarks/export.py --formats torchscript \
        --config examples/ethanol/config.yaml --openmm-platform CPU
    python benchmarks/export.py --device cuda --structures water diamond --r-max 6 \\
        --model n_interactions=2 correlation=3 n_hidden_feats=20 l_max_hidden_feats=2 path_reduced_product=true
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.md_vs_profile import structure  # noqa: E402
from flashcart.config import load_config  # noqa: E402
from flashcart.data import collate, structure_from_atoms  # noqa: E402
from flashcart.export import export_aoti, export_torchscript, load_exported  # noqa: E402
from flashcart.export.aoti import relative_differences  # noqa: E402
from flashcart.model import MODEL_KEYS, FlashCartPotential, Predictor  # noqa: E402
from flashcart.profiling import synchronize, time_per_call  # noqa: E402


def per_call(fn, device: torch.device, repeat: int) -> float:
    return time_per_call(fn, repeat, device)


def torchforce_row(path: Path, atoms, reference: dict, tag: str, args) -> dict:
    """openmm-torch's TorchForce on the file: s per energy+forces evaluation and the deviation from the Predictor."""
    import numpy as np
    import openmm
    from openmmtorch import TorchForce

    from flashcart.units import KJ_PER_MOL_NM_PER_EV_ANGSTROM, KJ_PER_MOL_PER_EV

    system = openmm.System()
    for _ in range(len(atoms)):
        system.addParticle(1.0)
    force = TorchForce(str(path))
    periodic = bool(atoms.pbc.all())
    force.setUsesPeriodicBoundaryConditions(periodic)
    system.addForce(force)
    if periodic:
        system.setDefaultPeriodicBoxVectors(*[openmm.Vec3(*row) * 0.1 for row in atoms.cell.array])
    ctx = openmm.Context(system, openmm.VerletIntegrator(0.001), openmm.Platform.getPlatformByName(args.openmm_platform))
    ctx.setPositions(atoms.positions * 0.1)

    def call():
        return ctx.getState(getEnergy=True, getForces=True)

    state = call()
    energy = state.getPotentialEnergy().value_in_unit(openmm.unit.kilojoule_per_mole) / KJ_PER_MOL_PER_EV
    forces = np.asarray(state.getForces(asNumpy=True).value_in_unit(openmm.unit.kilojoule_per_mole / openmm.unit.nanometer))
    forces = forces / KJ_PER_MOL_NM_PER_EV_ANGSTROM
    ref_f = reference["forces"].double().cpu().numpy()
    de = abs(energy - float(reference["energy"][0]))
    df = float(np.abs(forces - ref_f).max()) / max(1.0, float(np.abs(ref_f).max()))
    return {
        "structure": tag,
        "what": f"TorchForce, OpenMM {args.openmm_platform} (|dE| {de:.1e} eV, max rel dF {df:.1e})",
        "s_per_call": per_call(call, torch.device("cpu"), args.repeat),
    }


def emit(rows: list[dict], row: dict) -> None:
    """Append ``row`` and print it at once (a run cut short at its time limit keeps its rows)."""
    rows.append(row)
    exp = f"{row['export_s']:.1f}" if "export_s" in row else ""
    size = f"{row['size_MB']:.2f}" if "size_MB" in row else ""
    print(f"| {row['structure']} | {row['what']} | {row['s_per_call']:.3e} | {exp} | {size} |", flush=True)


def bench(name: str, args) -> list[dict]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    atoms = structure(name)
    options = {}
    if args.config:
        cfg = load_config(args.config)
        options = {k: cfg[k] for k in MODEL_KEYS}
    options.update({k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.model)})
    if args.r_max:
        options["r_max"] = args.r_max
    elements = sorted(set(atoms.get_chemical_symbols()))
    model = FlashCartPotential(elements, avg_neighbors=20.0, **options).to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    rows = []
    s = structure_from_atoms(atoms, model.r_max, require_labels=False, device=device)
    batch = collate([s], model.z_to_type.cpu()).to(device, dtype)
    tag = f"{name} ({len(atoms)} atoms, {s.n_edges} edges), {args.dtype}"

    eager = Predictor(model)
    emit(
        rows, {"structure": tag, "what": "Predictor eager (list reused)", "s_per_call": per_call(lambda: eager(batch), device, args.repeat)}
    )
    pos = torch.tensor(atoms.positions, dtype=dtype, device=device)
    cell = torch.tensor(atoms.cell.array, dtype=dtype, device=device)
    pbc = torch.tensor(atoms.pbc, device=device)

    def with_list():  # the list built every call, as the exported files do
        fresh = structure_from_atoms(atoms, model.r_max, require_labels=False, device=device)
        return eager(collate([fresh], model.z_to_type.cpu()).to(device, dtype))

    emit(rows, {"structure": tag, "what": "Predictor eager + neighbour list", "s_per_call": per_call(with_list, device, args.repeat)})
    if device.type == "cuda":
        graphs = Predictor(model, compile=True, compile_mode="reduce-overhead")
        t0 = time.perf_counter()
        graphs(batch)
        synchronize(device)
        compile_s = time.perf_counter() - t0
        emit(
            rows,
            {
                "structure": tag,
                "what": "Predictor reduce-overhead (list reused)",
                "s_per_call": per_call(lambda: graphs(batch), device, args.repeat),
                "export_s": compile_s,
            },
        )

    with tempfile.TemporaryDirectory() as tmp:
        kinds = [("torchscript", ".pt", "dynamic")] + [("aoti", ".pt2", c) for c in args.capacity]
        for (fmt, suffix, capacity), search in itertools.product(kinds, args.neighbours):
            if fmt not in args.formats:
                continue
            path = Path(tmp) / f"{name}-{search}-{capacity}{suffix}"
            t0 = time.perf_counter()
            if fmt == "torchscript":
                export_torchscript(model, atoms, path, dtype, str(device), neighbours=search)
            else:
                fixed = capacity == "fixed"
                export_aoti(
                    model, atoms, path, dtype, str(device), triton=args.triton, check_load=False, neighbours=search, fixed_capacity=fixed
                )
            export_s = time.perf_counter() - t0  # tracing and compiling (the CLI also load-checks the package)
            pot = load_exported(path, cuda_graph=False)
            numbers = torch.tensor(atoms.numbers, device=device)
            if fmt == "torchscript":
                module = pot._module
                x_nm = (pos / 10.0).requires_grad_(True)
                box = cell / 10.0 if atoms.pbc.any() else None

                def call():  # what TorchForce does: energy, then its gradient
                    e = module(x_nm, box)
                    return torch.autograd.grad(e, x_nm)

            else:

                def call():
                    return pot._runner(pos, numbers, cell, pbc)

            if fmt == "torchscript" and args.openmm_platform:
                emit(rows, torchforce_row(path, atoms, eager(batch), tag, args))
            agreement, kernels = "", (", Triton kernels" if args.triton and fmt == "aoti" else "")
            if fmt == "aoti":  # the package against the Predictor, as in the tests
                ref = eager(batch)
                de, df = relative_differences(pot._runner(pos, numbers, cell, pbc), (ref["energy"][0], ref["forces"]))
                agreement = f", rel dE {de:.1e}, max rel dF {df:.1e} against the Predictor"
                if capacity == "fixed":
                    kernels += f", fixed capacity {pot.capacity}"
            emit(
                rows,
                {
                    "structure": tag,
                    "what": f"{fmt} ({suffix}, {search} neighbour search inside{kernels}{agreement})",
                    "s_per_call": per_call(call, device, args.repeat),
                    "export_s": export_s,
                    "size_MB": path.stat().st_size / 1e6,
                },
            )
            if fmt == "aoti" and capacity == "fixed" and device.type == "cuda":
                graphed = load_exported(path, cuda_graph=True)
                try:
                    de, df = relative_differences(graphed(pos, numbers, cell, pbc), (ref["energy"][0], ref["forces"]))
                except RuntimeError as err:
                    print(f"| {tag} | the same .pt2 in a CUDA graph: capture failed ({err}) | | | |", flush=True)
                    # which operations of a plain call synchronise (ATen's sync debug mode warns for each)
                    torch.cuda.synchronize()
                    torch.cuda.set_sync_debug_mode("warn")
                    pot._runner(pos, numbers, cell, pbc)
                    torch.cuda.set_sync_debug_mode("default")
                    continue
                emit(
                    rows,
                    {
                        "structure": tag,
                        "what": f"the same .pt2 through load_exported, one CUDA graph (rel dE {de:.1e}, max rel dF {df:.1e})",
                        "s_per_call": per_call(lambda: graphed(pos, numbers, cell, pbc), device, args.repeat),
                    },
                )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--structures", nargs="+", default=["ethanol"], help="ethanol, water (768 atoms), diamond (1000 atoms)")
    p.add_argument("--formats", nargs="+", default=["torchscript", "aoti"])
    p.add_argument("--config", default=None, help="take the model options from this configuration (default: configs/default.yaml)")
    p.add_argument("--model", nargs="*", default=[], help="model options KEY=VALUE (configs/default.yaml keys), over --config")
    p.add_argument("--r-max", type=float, default=None)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument(
        "--neighbours",
        nargs="+",
        default=["cells", "all-pairs"],
        choices=["cells", "all-pairs"],
        help="the exported files' neighbour searches to time (each format once per search)",
    )
    p.add_argument(
        "--capacity",
        nargs="+",
        default=["dynamic"],
        choices=["dynamic", "fixed"],
        help="AOTInductor: packages sized by the structure (dynamic) and/or fixed-capacity ones (on CUDA also timed as a CUDA graph)",
    )
    p.add_argument(
        "--triton",
        action="store_true",
        help="AOTInductor on CUDA: compile the Triton kernels in, not inductor's kernels for the PyTorch backend",
    )
    p.add_argument(
        "--openmm-platform", default=None, help="also run the TorchScript file in openmm-torch's TorchForce (Reference, CPU, CUDA)"
    )
    args = p.parse_args()
    print(f"torch {torch.__version__}, device {args.device}" + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    print("| structure | evaluation | s/call | export/compile s | file MB |")
    print("| --- | --- | ---: | ---: | ---: |", flush=True)
    rows = []
    for name in args.structures:
        rows += bench(name, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
