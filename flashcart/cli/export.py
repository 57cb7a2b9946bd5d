"""flashcart-export: a checkpoint as a TorchScript file (openmm-torch) or an AOTInductor package."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

FORMATS = {"torchscript": ".pt", "aoti": ".pt2"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashcart-export",
        description=(
            "Export a trained potential. torchscript: forward(positions [N,3] nm, box [3,3] nm) -> energy kJ/mol "
            "for the atoms of --structure, for openmm-torch's TorchForce. aoti: an AOTInductor package "
            "runner(positions Å, atomic_numbers, cell Å, pbc) -> (energy eV, forces eV/Å) for any structure "
            "of the model's elements. Both compute the neighbour list inside."
        ),
    )
    p.add_argument("checkpoint", help="checkpoint directory (best/, log/) or its model.pt")
    p.add_argument("--format", required=True, help="torchscript or aoti")
    p.add_argument("--structure", required=True, help="structure file (any format ASE reads; first frame)")
    p.add_argument("-o", "--output", required=True, help="output file (.pt for torchscript, .pt2 for aoti)")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where the file runs (default cpu)")
    p.add_argument("--dtype", default="float32", help="float32 or float64 (default float32)")
    p.add_argument(
        "--max-images",
        type=int,
        default=None,
        help="aoti only: periodic images enumerated along each lattice vector (default: what --structure needs)",
    )
    p.add_argument(
        "--triton",
        action="store_true",
        help=(
            "aoti on cuda only: compile the model's Triton kernels into the package instead of inductor's kernels "
            "for the generated PyTorch backend (the C++ wrapper is compiled with a compiler that links libstdc++.so; "
            "every package is load-checked in a fresh process before it is written)"
        ),
    )
    p.add_argument(
        "--neighbours",
        default=None,
        help=(
            "the file's neighbour search: cells (bins a cutoff wide: time linear in the atoms) or all-pairs "
            "(a dense N^2 x images test); default for aoti: cells; for torchscript: "
            "cells from 256 atoms"
        ),
    )
    p.add_argument(
        "--fixed-capacity",
        action="store_true",
        help=(
            "aoti only: a package without data-dependent sizes (fixed edge slots per atom and, with cells, atoms per "
            "bin): it never synchronises with the host, so a CUDA graph can capture it (load_exported does on CUDA); "
            "a structure beyond its capacity or checks gets NaN energy and forces"
        ),
    )
    p.add_argument(
        "--edges-per-atom",
        type=int,
        default=None,
        help="with --fixed-capacity: edge slots per atom (default: the structure's pairs per atom x 1.1, rounded up)",
    )
    p.add_argument(
        "--atoms-per-bin",
        type=int,
        default=None,
        help="with --fixed-capacity and cells: atoms a bin holds (default: the structure's fullest bin x 1.5 + 2)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p


def export(args: argparse.Namespace) -> Path:
    """Validate everything, then build and write the file (atomically). Returns the path."""
    import torch

    from ..export import export_aoti, export_torchscript, read_structure
    from ..export.neighbors import SEARCHES
    from ..model.checkpoint import load_checkpoint
    from ..utils.device import resolve_device
    from ..utils.progress import progress_bar

    if args.format not in FORMATS:
        raise ValueError(f"unknown --format {args.format!r}; choose one of {sorted(FORMATS)}")
    if args.dtype not in ("float32", "float64"):
        raise ValueError(f"--dtype must be float32 or float64, got {args.dtype!r}")
    if args.device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {args.device!r}")
    if args.max_images is not None and args.format != "aoti":
        raise ValueError("--max-images applies to --format aoti only (TorchScript files enumerate images from each box)")
    if args.neighbours is not None and args.neighbours not in SEARCHES:
        raise ValueError(f"--neighbours must be {' or '.join(SEARCHES)}, got {args.neighbours!r}")
    if args.triton and (args.format != "aoti" or args.device != "cuda"):
        raise ValueError("--triton applies to --format aoti --device cuda only (elsewhere the PyTorch backend is always used)")
    if args.fixed_capacity and args.format != "aoti":
        raise ValueError("--fixed-capacity applies to --format aoti only")
    for flag, value in (("--edges-per-atom", args.edges_per_atom), ("--atoms-per-bin", args.atoms_per_bin)):
        if value is not None and not args.fixed_capacity:
            raise ValueError(f"{flag} applies with --fixed-capacity only")
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be a positive integer, got {value}")
    if args.atoms_per_bin is not None and args.neighbours == "all-pairs":
        raise ValueError("--atoms-per-bin applies to the binned search (--neighbours cells), not all-pairs")
    out = Path(args.output)
    if out.suffix != FORMATS[args.format]:
        raise ValueError(f"-o {out}: a {args.format} file must end in {FORMATS[args.format]}")
    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    with progress_bar(None, total=3, desc="flashcart-export", disable=args.no_progress) as bar:
        bar.set_postfix_str("loading")
        model = load_checkpoint(args.checkpoint)
        atoms = read_structure(args.structure, model.elements)
        bar.update()
        bar.set_postfix_str("tracing and compiling" if args.format == "aoti" else "tracing")
        if args.format == "torchscript":
            export_torchscript(model, atoms, out, dtype, str(device), neighbours=args.neighbours)
        else:
            export_aoti(
                model,
                atoms,
                out,
                dtype,
                str(device),
                max_images=args.max_images,
                triton=args.triton,
                neighbours=args.neighbours,
                fixed_capacity=args.fixed_capacity,
                edges_per_atom=args.edges_per_atom,
                atoms_per_bin=args.atoms_per_bin,
            )
        bar.update(2)
    return out


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from ..model.checkpoint import CheckpointError

    start = time.perf_counter()
    try:
        out = export(args)
    except (CheckpointError, ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"flashcart-export: error: {err}", file=sys.stderr)
        return 2
    size = out.stat().st_size / 1e6
    print(f"[export] wrote {out} ({args.format}, {size:.1f} MB, {time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
