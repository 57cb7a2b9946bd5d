"""The PyTorch backend's two ways of running a tensor product: dense couplings against generated straight-line code.

``TensorProduct`` on its PyTorch backend either contracts every path's coupling at once (a
dense ``[K, I, J]`` tensor read off the generated code: a matrix product and a batched one per
product, ``TensorProduct._rows_dense``; the default) or runs the generated straight-line code
per path (dozens of small operations each). This script compares them on one model and
structure: an eager force call through the ``Predictor`` (energy + forces), or a training step
(forces with ``create_graph``, energy + force loss, parameter gradients). It reports, per way:

* ms per call: median over ``--rounds`` rounds of ``--per-round`` calls, the two ways
  interleaved in one process (so a busy machine slows both alike);
* ATen operations per call, and those that are not views (each of those is a kernel launch on a
  GPU: what decides the TorchScript file's speed there);
* the largest energy and force differences between the two ways.

    python benchmarks/torch_backend.py --model i2c3f20l2r --structure ethanol --threads 1
    python benchmarks/torch_backend.py --model i2c3f20l2r --structure diamond --cells 2 --phase train
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from ase.build import bulk, molecule
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flashcart.cartesian.tensor_product as tensor_product  # noqa: E402
from benchmarks.kernel_profile import MODELS  # noqa: E402
from flashcart.config import load_config  # noqa: E402
from flashcart.data.batch import collate  # noqa: E402
from flashcart.data.dataset import structure_from_atoms  # noqa: E402
from flashcart.model.potential import FlashCartPotential  # noqa: E402
from flashcart.model.predictor import Predictor  # noqa: E402

WAYS = {"dense": ("cuda", "cpu"), "generated": ()}  # tensor_product.DENSE_DEVICES for each way
VIEWS = set(
    "view _unsafe_view select t detach slice expand unsqueeze squeeze alias _reshape_alias as_strided permute transpose "
    "reshape split unbind split_with_sizes empty empty_like new_empty".split()
)  # views and allocations: no kernel of their own


class CountOps(TorchDispatchMode):
    """ATen operations dispatched, and those that are not views or allocations."""

    def __init__(self):
        super().__init__()
        self.all = self.launching = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.all += 1
        self.launching += func.overloadpacket.__name__ not in VIEWS
        return func(*args, **(kwargs or {}))


def build(args):
    atoms = molecule("CH3CH2OH") if args.structure == "ethanol" else bulk("C", "diamond", a=3.567, cubic=True) * ((args.cells,) * 3)
    cfg = load_config(overrides=[f"r_max={args.r_max}", *MODELS[args.model], "use_triton=false"])
    model = FlashCartPotential.from_config(cfg, sorted(set(atoms.get_chemical_symbols())))
    model.set_avg_neighbors(16.0)
    s = structure_from_atoms(atoms, args.r_max, require_labels=False)
    s.energy = torch.tensor(0.0, dtype=torch.float64)
    s.forces = torch.zeros(len(atoms), 3, dtype=torch.float64)
    batch = collate([s], model.z_to_type.cpu()).to("cpu", torch.float32)
    return model.float(), batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="i2c3f20l2r", choices=list(MODELS))
    parser.add_argument("--structure", default="ethanol", choices=["ethanol", "diamond"])
    parser.add_argument("--cells", type=int, default=2, help="diamond: cubic cells per side (8 atoms each)")
    parser.add_argument("--r-max", type=float, default=5.0)
    parser.add_argument("--phase", default="force", choices=["force", "train"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, batch = build(args)
    predictor = Predictor(model, compile=False, pad=False)
    params = [p for p in model.parameters() if p.requires_grad]

    def call():
        if args.phase == "force":
            return predictor(batch, forces=True)
        out = predictor(batch, forces=True, create_graph=True)
        ((out["energy"] ** 2).sum() + (out["forces"] ** 2).mean()).backward(inputs=params)
        return out

    print(f"[setup] {args.model} on {args.structure} ({batch.positions.shape[0]} atoms, {batch.receivers.shape[0]} edges), "
          f"{args.phase}, float32, {args.threads} thread(s), torch {torch.__version__}")  # fmt: skip
    times, counts, results = {w: [] for w in WAYS}, {}, {}
    for way, devices in WAYS.items():
        tensor_product.DENSE_DEVICES = devices
        out = call()
        results[way] = (out["energy"].detach().double(), out["forces"].detach().double())
        with CountOps() as mode:
            call()
        counts[way] = (mode.all, mode.launching)
    for _ in range(args.rounds):
        for way, devices in WAYS.items():
            tensor_product.DENSE_DEVICES = devices
            t0 = time.perf_counter()
            for _ in range(args.per_round):
                call()
            times[way].append((time.perf_counter() - t0) / args.per_round * 1e3)
    tensor_product.DENSE_DEVICES = WAYS["dense"]
    print(f"{'way':<10} {'ms/call (median)':>17} {'min':>9} {'ATen ops':>9} {'not views':>10}")
    for way in WAYS:
        print(f"{way:<10} {statistics.median(times[way]):>17.2f} {min(times[way]):>9.2f} {counts[way][0]:>9} {counts[way][1]:>10}")
    (e1, f1), (e2, f2) = results["dense"], results["generated"]
    print(f"max |dE| {float((e1 - e2).abs().max()):.1e} eV, max |dF| {float((f1 - f2).abs().max()):.1e} eV/Å")


if __name__ == "__main__":
    main()
