"""Where a fixed-capacity CUDA package fails in one process and runs in another (GPU, diagnosis).

On the H200 (torch 2.11, 2026-12-02) the export tests' fixed-capacity package ran correctly
when loaded and called directly (in a fresh process, with or without flashcart imported, with
or without CUDA initialised first), but ``load_exported(..., cuda_graph=True)`` failed on its
first call: "The model did not finish successfully. Error: invalid argument", the text AOTI's
runner gives when the event of its previous run cannot be queried.

``python benchmarks/diagnose_fixed.py DIR`` exports that package (the test's tiny model,
float32, Triton kernels, ``cells``, 64 edge slots per atom, 12 atoms per bin) into ``DIR``
with the test's inputs, unless ``DIR/m.pt2`` exists, then runs each variant in its own
process and prints, per call, ``ok E=...`` or the error:

* ``default``: three calls on the default stream;
* ``side``: three calls inside ``torch.cuda.stream(side)``;
* ``default-then-side``: one call on the default stream, then two on a side stream;
* ``side-synced``: as ``side`` with ``torch.cuda.synchronize()`` after each call;
* ``graphed-runner``: ``GraphedRunner`` around the plain runner;
* ``loader``: ``load_exported(..., cuda_graph=False)``;
* ``loader-graphed``: ``load_exported(..., cuda_graph=True)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PREPARE = """
import sys, torch
sys.path.insert(0, sys.argv[2])
from tests.export.conftest import crystal, ethanol, other_molecule, package_inputs, perturbed
from tests.export.test_gpu_export import _EXPORT
small = crystal()
small.set_cell(small.cell.array * 0.72, scale_atoms=True)
cases = [perturbed(ethanol(), 1), other_molecule(), perturbed(crystal(), 2, strain=0.03), small, perturbed(ethanol(), 5)]
torch.save(package_inputs({str(k): a for k, a in enumerate(cases)}, torch.float32, "cuda"), sys.argv[1] + "/inputs.pt")
print(_EXPORT)
"""

_RUN = """
import sys, torch
variant, package, inputs = sys.argv[1:4]
cases = list(torch.load(inputs).values())
if variant.startswith("loader"):
    from flashcart.export import load_exported
    pot = load_exported(package, cuda_graph=variant == "loader-graphed")
    run = lambda p, z, c, b: pot(p.cpu().numpy(), z.cpu().numpy(), c.cpu().numpy(), b.cpu().numpy())
else:
    run = torch._inductor.aoti_load_package(package)
    if variant == "graphed-runner":
        from flashcart.export.graphed import GraphedRunner
        run = GraphedRunner(run, strict=True)
side = torch.cuda.Stream()
plan = {
    "default": ["default"] * 3,
    "side": ["side"] * 3,
    "default-then-side": ["default", "side", "side"],
    "side-synced": ["side-sync"] * 3,
}.get(variant, ["default"] * 3)
for k, where in enumerate(plan):
    args = cases[k % len(cases)]
    try:
        if where.startswith("side"):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                energy, forces = run(*args)
            torch.cuda.current_stream().wait_stream(side)
            if where == "side-sync":
                torch.cuda.synchronize()
        else:
            energy, forces = run(*args)
        torch.cuda.synchronize()
        print(f"  call {k} ({where}): ok E={float(energy):.8f} |F|={float(forces.abs().max()):.6f}", flush=True)
    except Exception as err:
        print(f"  call {k} ({where}): {type(err).__name__}: {str(err)[:400]}", flush=True)
"""

VARIANTS = ("default", "side", "default-then-side", "side-synced", "graphed-runner", "loader", "loader-graphed")


def main(argv: list[str]) -> int:
    out = Path(argv[0]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    package = out / "m.pt2"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if not package.exists():
        export = subprocess.run([sys.executable, "-c", _PREPARE, str(out), str(ROOT)], capture_output=True, text=True, env=env, cwd=ROOT)
        if export.returncode:
            print("preparing failed:", export.stderr[-3000:])
            return 1
        code = export.stdout
        run = subprocess.run(
            [sys.executable, "-c", code, str(package), "float32", "1", "cells", "fixed"], capture_output=True, text=True, env=env, cwd=ROOT
        )
        print(f"export: exit {run.returncode} {run.stdout[-300:]} {run.stderr[-1500:] if run.returncode else ''}", flush=True)
        if run.returncode:
            return 1
    for variant in VARIANTS:
        print(f"=== {variant}", flush=True)
        try:
            proc = subprocess.run(
                [sys.executable, "-X", "faulthandler", "-c", _RUN, variant, str(package), str(out / "inputs.pt")],
                capture_output=True,
                text=True,
                env=env,
                cwd=ROOT,
                timeout=90,
            )
        except subprocess.TimeoutExpired as err:
            print(f"  timed out after 90 s; output so far: {err.stdout!r}", flush=True)
            continue
        print(proc.stdout, end="", flush=True)
        if proc.returncode:
            print(f"  exit {proc.returncode}: {proc.stderr[-1500:]}", flush=True)
        elif "rror" in proc.stderr:
            print("  stderr:", proc.stderr[-800:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
