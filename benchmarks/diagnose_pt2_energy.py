"""Where the CUDA ``.pt2`` with the Triton kernels loses its energy (issue 12; GPU only).

On the H200 (2026-12-01 night) the export tests' tiny model, packaged with its Triton kernels
(float32), gave the Predictor's forces (relative error 3.9e-8) but an energy off by 0.53
relative; the packages of inductor's kernels for the same model agree. This evaluates the same
structure at every stage between the model and the package and prints energy and forces
against the reference (the Predictor on the generated PyTorch backend):

1. the Predictor with the Triton kernels (eager);
2. the function that is traced (``_EnergyForces`` on the Triton copy), eager;
3. the exported program (``make_fx``, then ``torch.export``), eager;
4. that program compiled by inductor in this process (``torch.compile``, no AOT);
5. the AOTInductor package (``--package``: about two minutes to compile).

each with the model's atomic energy offsets as they are and set to zero (``--zero-offsets``
adds the second pass), so a wrong position-independent term shows up as a difference that
disappears with the offsets. (Found with it on 2026-12-01: only stage 5 was off, and
``--dump``'s wrapper showed the final per-graph ``index_add`` lowered to an unmasked atomic add;
the export now sums the site energies, see ``benchmarks/RESULTS.md``.)

    python benchmarks/diagnose_pt2_energy.py --package --zero-offsets
    python benchmarks/diagnose_pt2_energy.py --device cpu    # the script itself, on the CPU backend
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _others() -> dict:
    """Structures other than the exported one: the test's export structure and another molecule."""
    from tests.export.conftest import ethanol, other_molecule

    return {"ethanol (not moved)": ethanol(), "other molecule": other_molecule()}


def _compare(what: str, result, reference) -> None:
    (energy, forces), (ref_energy, ref_forces) = result, reference
    energy, forces = float(energy), forces.detach().double().cpu()
    de = energy - float(ref_energy)
    df = float((forces - ref_forces.double()).abs().max()) / max(1.0, float(ref_forces.abs().max()))
    print(f"  {what:<58} energy {energy:+.8f} eV (- reference {de:+.3e}), max rel dF {df:.1e}", flush=True)


def run(model, atoms, dtype, package: bool, device: torch.device, compile_stage: bool = True, dump: Path | None = None) -> None:
    from flashcart.data import collate, structure_from_atoms
    from flashcart.export.aoti import _EnergyForces, _example, build_aoti_graph, export_aoti, model_reference
    from flashcart.export.model import frozen_copy
    from flashcart.model.predictor import Predictor

    reference = model_reference(model, atoms, dtype, device)
    print(f"  {'reference: Predictor, generated PyTorch backend':<58} energy {float(reference[0]):+.8f} eV", flush=True)
    tri = frozen_copy(model, dtype, device, use_triton=True)
    s = structure_from_atoms(atoms, tri.r_max, require_labels=False, device=device)
    out = Predictor(tri)(collate([s], tri.z_to_type.to(device)).to(device, dtype))
    _compare("1. Predictor, Triton kernels (eager)", (out["energy"][0], out["forces"]), reference)
    example = _example(atoms, dtype, device)
    fn = _EnergyForces(tri, (2, 2, 2))
    with torch.enable_grad():
        _compare("2. traced function (_EnergyForces), eager", fn(*[t.clone() for t in example]), reference)
    program, _, _ = build_aoti_graph(model, atoms, dtype, device.type, max_images=2, triton=True)
    targets = sorted({str(n.target) for n in program.graph.nodes if n.op == "call_function" and "flashcart" in str(n.target)})
    print(f"     exported program's FlashCart ops: {targets}", flush=True)
    module = program.module()
    _compare("3. exported program (make_fx, torch.export), eager", module(*example), reference)
    t0 = time.perf_counter()
    if device.type == "cpu":
        torch._inductor.config.cpp.simdlen = 1  # as the exports: an inductor CPU vectoriser assertion
    if not compile_stage:
        print("  4. exported program, torch.compile: skipped (--skip-compile)", flush=True)
    else:
        try:
            result = torch.compile(module, fullgraph=False)(*example)
            _compare(f"4. exported program, torch.compile ({time.perf_counter() - t0:.0f} s)", result, reference)
        except Exception as err:  # a diagnosis goes on to the package
            print(f"  4. exported program, torch.compile: {type(err).__name__}: {str(err).splitlines()[0][:300]}", flush=True)
    if package:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m.pt2"
            t0 = time.perf_counter()
            export_aoti(model, atoms, path, dtype, device.type, max_images=2, triton=True, check_load=False)
            if dump is not None:  # the package's generated C++ (wrapper and kernels), for reading
                import zipfile

                dump.mkdir(parents=True, exist_ok=True)
                with zipfile.ZipFile(path) as z:
                    for name in z.namelist():
                        if name.endswith(".cpp"):
                            (dump / Path(name).name.split(".", 1)[1]).write_bytes(z.read(name))
            runner = torch._inductor.aoti_load_package(str(path))
            seconds = time.perf_counter() - t0
            # three calls on the same inputs (an output accumulated into memory that is not zeroed
            # differs from call to call), then the inputs of other structures
            for i in range(3):
                _compare(
                    f"5.{i + 1} AOTInductor package, Triton kernels ({seconds:.0f} s), call {i + 1}",
                    runner(*[t.clone() for t in example]),
                    reference,
                )
            for name, other in _others().items():
                ref = model_reference(model, other, dtype, device)
                _compare(f"5. package on {name}", runner(*_example(other, dtype, device)), ref)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", action="store_true", help="also compile and run the AOTInductor package")
    parser.add_argument("--zero-offsets", action="store_true", help="repeat with the atomic energy offsets set to zero")
    parser.add_argument("--skip-compile", action="store_true", help="skip stage 4 (torch.compile in this process)")
    parser.add_argument("--dump", type=Path, help="write the package's generated C++ sources into this folder")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    from tests.export.conftest import ethanol, perturbed
    from tests.export.test_gpu_export import _triton_model

    dtype = getattr(torch, args.dtype)
    atoms = perturbed(ethanol(), 1)
    model = _triton_model()
    passes = [("offsets as they are", model)]
    if args.zero_offsets:
        zeroed = _triton_model()
        with torch.no_grad():
            zeroed.atomic_shifts.zero_()
        passes.append(("offsets zero", zeroed))
    for label, m in passes:
        print(f"=== {label}: atomic_shifts {m.atomic_shifts.tolist()}, {args.dtype}", flush=True)
        run(m, atoms, dtype, args.package, torch.device(args.device), compile_stage=not args.skip_compile, dump=args.dump)


if __name__ == "__main__":
    main()
