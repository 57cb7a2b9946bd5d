"""Tile shapes of the linear maps' grouped matmul (``FLASHCART_LINEAR_TILES``), on CUDA.

The H200 kernel profile of 2026-11-30 found the linear maps compute-bound at about 2 % of
the FP32 peak (half the kernel time of i3c3f64l2), and compiling the kernel for sm_90 shows
the default 32x32x32 tile spilling registers. This times every linear map of a published
model at the rows of the 1000-atom diamond cell, forward and input gradient (the two a force
call runs), for each tile shape, checks each result against the default tile's, and prints
the summed time and the FP32 rate.

    python benchmarks/linear_tiles.py --model i3c3f64l2
    python benchmarks/linear_tiles.py --model i2c3f20l2r --tiles 32x32x32x4 32x32x16x4x2
    python benchmarks/linear_tiles.py --model i3c3f64l2 --weight-grad 0x64 1024x16   # weight-gradient splits
    python benchmarks/linear_tiles.py --model i3c3f64l2 --split 0x2 528x2 1056x1   # forward / input-gradient splits
    python benchmarks/linear_tiles.py --model i3c3f64l2 --tiles default --unit 0 1   # contiguous axes (FLASHCART_LINEAR_UNIT)

``--weight-grad PROGRAMSxROWS ...`` times the weight gradients instead (``lin_bwd_w``, the
training step's extra launch per map) under each split rule of ``ops.WeightGradSplit``
(about PROGRAMS programs, at least ROWS rows per split; ``0x64``: the first rule,
``min(64, rows // 64)`` splits), each layer with its default tiles.

``--cublas`` also times, against the grouped kernel's default tiles, the same maps through cuBLAS:
the PyTorch backend as a model runs it (``EquivariantLinear._forward_torch``: one ``matmul`` per
rank on the strided rank views, then ``cat``; the input gradient the same way), and the floor of
that route, one ``mm`` per rank on operands already packed as contiguous ``[rows * (2l+1), K]``
matrices (no copies, no ``cat``).

``--split PROGRAMSxKSTEPS ...`` times the forward and input gradient (each layer with its
default tiles) under each rule of ``ops.RowMapSplit``: their reduction over paths x channels
split for about PROGRAMS programs, at least KSTEPS K steps per split (``0x2``: no split, the
default).

Protocol: float32, TF32 off, warm-up excluded, CUDA synchronised (``triton.testing.do_bench``,
median); on CUDA the calls are replayed as a CUDA graph
(``triton.testing.do_bench_cudagraph``), so launch overhead (which decided the 20-channel model's
figures when timed eagerly) is left out. ``default`` is each layer's ``default_tiles``.
"""

from __future__ import annotations

import argparse
import time

import torch
import triton
from kernel_profile import MODELS  # this script's folder: the published models' options

from flashcart.cartesian import EquivariantLinear
from flashcart.cartesian._linear_spec import COLUMN
from flashcart.cartesian._triton import ops
from flashcart.cartesian._triton.linear_kernel import linear_tiles
from flashcart.config import load_config
from flashcart.model.potential import FlashCartPotential

TILES = ["default", "32x32x32x4", "32x32x16x4x2", "64x32x16x4x2", "64x64x16x4x2", "64x64x32x4x3", "128x64x32x8x3", "64x128x32x8x3"]


def flops(lin: EquivariantLinear, rows: int) -> int:
    """Multiply-adds x 2 of the forward (the input gradient costs the same)."""
    total = 0
    for r in lin.launch_table[0].tolist():
        m = r[COLUMN["m_mul"]] * rows + r[COLUMN["m_const"]]
        k = r[COLUMN["k_mul"]] * rows + r[COLUMN["k_const"]]
        total += 2 * m * r[COLUMN["n_size"]] * k
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="i3c3f64l2", choices=list(MODELS))
    parser.add_argument("--rows", type=int, default=1000, help="atoms (rows of the node features)")
    parser.add_argument("--tiles", nargs="+", default=TILES)
    parser.add_argument("--weight-grad", nargs="+", metavar="PROGRAMSxROWS", help="time the weight gradients under these split rules")
    parser.add_argument("--split", nargs="+", metavar="PROGRAMSxKSTEPS", help="time forward + input gradient under these split rules")
    parser.add_argument("--cublas", action="store_true", help="also time the maps through cuBLAS (PyTorch backend, and packed operands)")
    parser.add_argument(
        "--unit",
        nargs="+",
        default=["1"],
        choices=["0", "1"],
        help="FLASHCART_LINEAR_UNIT settings to time each case under (1: contiguous axes compiled as such, 0: general addressing)",
    )
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to smoke-test the script under TRITON_INTERPRET=1")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = FlashCartPotential.from_config(load_config(overrides=[*MODELS[args.model], "use_triton=true"]), ["C"]).to(args.device)
    maps = [m for m in model.modules() if isinstance(m, EquivariantLinear)]
    g = torch.Generator(device=args.device).manual_seed(0)
    cases = []
    for lin in maps:
        w = torch.cat([p.detach().reshape(-1) for p in lin.weights])
        x = torch.randn(args.rows, lin.in_width, device=args.device, generator=g)
        gy = torch.randn(args.rows, lin.out_width, device=args.device, generator=g)
        cases.append((lin, w, x, gy))
    total_flop = 2 * sum(flops(lin, args.rows) for lin, *_ in cases)
    print(f"{args.model}: {len(maps)} linear maps, {args.rows} rows, {total_flop / 1e9:.2f} GFLOP (forward + input gradient)")

    if args.weight_grad:
        weight_grads(cases, total_flop // 2, args)
        return
    if args.split:
        row_map_splits(cases, total_flop, args)
        return

    def run():
        return [
            (ops.lin_fwd.op(x, w, lin.launch_table, lin.key), ops.lin_bwd_x.op(gy, w, lin.launch_table, lin.key)) for lin, w, x, gy in cases
        ]

    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    reference = None
    print(f"{'tiles':<24} {'ms':>8} {'TFLOP/s':>8} {'max rel. diff':>14}")
    for raw, unit in [(raw, unit) for raw in args.tiles for unit in args.unit]:
        ops.LINEAR_TILES = None if raw == "default" else linear_tiles(raw)  # default: each layer's default_tiles
        ops.LINEAR_UNIT = unit == "1"
        label = f"{raw} unit={unit}"
        try:
            out = run()
            sync()
        except Exception as exc:  # a shape that does not compile or launch: report and go on
            print(f"{label:<24} failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if reference is None:
            reference = out
        diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for pa, pb in zip(out, reference) for a, b in zip(pa, pb))
        ms = _milliseconds(run, cuda)
        print(f"{label:<24} {ms:>8.3f} {total_flop / (ms * 1e-3) / 1e12:>8.2f} {diff:>14.2e}")
    ops.LINEAR_TILES = None
    ops.LINEAR_UNIT = ops._linear_unit_mode()
    if args.cublas:
        cublas(cases, total_flop, args, reference)


def _torch_input_grad(lin: EquivariantLinear, gy: torch.Tensor) -> torch.Tensor:
    """``dL/dx`` of ``lin._forward_torch`` for ``gy = dL/dy``: one ``matmul`` per rank, then ``cat``."""
    from flashcart.cartesian._components import dim
    from flashcart.cartesian._layout import split_ranks

    blocks = split_ranks(gy, lin.out_l_max, lin.out_features)
    out = []
    for l, p in enumerate(lin.in_paths):
        if l < len(lin.weights):
            out.append(torch.matmul(blocks[l], lin.weights[l] * lin.scales[l]).reshape(gy.shape[0], -1))
        else:
            out.append(gy.new_zeros(gy.shape[0], dim(l) * p * lin.in_features))
    return torch.cat(out, dim=1)


def cublas(cases, flop: int, args, reference) -> None:
    """The same maps through cuBLAS: the PyTorch backend as a model runs it, and one ``mm`` per
    rank on packed contiguous operands (that route's floor)."""
    from flashcart.cartesian._layout import split_ranks

    cuda = args.device == "cuda"
    with torch.no_grad():

        def backend():
            return [(lin._forward_torch(x), _torch_input_grad(lin, gy)) for lin, w, x, gy in cases]

        out = backend()
        diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for pa, pb in zip(out, reference) for a, b in zip(pa, pb))
        ms = _milliseconds(backend, cuda)
        print(f"{'torch backend':<16} {ms:>8.3f} {flop / (ms * 1e-3) / 1e12:>8.2f} {diff:>14.2e}")
        packed = []
        for lin, _w, x, gy in cases:
            xs = split_ranks(x, lin.in_l_max, lin.in_features, lin.in_paths)
            gs = split_ranks(gy, lin.out_l_max, lin.out_features)
            for l, wl in enumerate(lin.weights):
                wl = (wl * lin.scales[l]).detach()
                packed.append((xs[l].reshape(-1, xs[l].shape[-1]).contiguous(), gs[l].reshape(-1, gs[l].shape[-1]).contiguous(), wl))

        def floor():
            return [(a @ wl.T, g @ wl) for a, g, wl in packed]

        floor()
        ms = _milliseconds(floor, cuda)
        print(f"{'packed mm':<16} {ms:>8.3f} {flop / (ms * 1e-3) / 1e12:>8.2f} {'-':>14}")
        print(f"per map (forward + input gradient, ms): {'key':<28} {'MFLOP/row':>9} {'kernel':>8} {'torch':>8}")
        for lin, w, x, gy in cases:
            table, key = lin.launch_table, lin.key
            kernel_ms = _milliseconds(lambda: (ops.lin_fwd.op(x, w, table, key), ops.lin_bwd_x.op(gy, w, table, key)), cuda)
            torch_ms = _milliseconds(lambda: (lin._forward_torch(x), _torch_input_grad(lin, gy)), cuda)
            per_row = 2 * ops.linear_flops_per_row(lin) / 1e6  # forward and input gradient, the routing rule's count
            print(f"{'':<40} {lin.key:<28} {per_row:>9.3f} {kernel_ms:>8.3f} {torch_ms:>8.3f}")


def _milliseconds(run, cuda: bool) -> float:
    """Median ms of ``run()``: on CUDA replayed as a CUDA graph (the kernels' time, not Python's
    launches, as in compiled calls); elsewhere one timed call (a smoke test)."""
    if cuda:
        return triton.testing.do_bench_cudagraph(run, rep=200, return_mode="median")
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) * 1e3


def _rule(raw: str, option: str) -> tuple[int, int]:
    try:
        a, b = (int(v) for v in raw.lower().split("x"))
    except ValueError:
        raise SystemExit(f"{option}: expected AxB with two integers, got {raw!r}") from None
    return a, b


def row_map_splits(cases, flop: int, args) -> None:
    """Time every map's forward + input gradient under each ``RowMapSplit`` rule (CUDA-graph replays on CUDA)."""
    from flashcart.cartesian._linear_spec import BWD_X, FWD

    cuda = args.device == "cuda"
    reference = None
    ops.LINEAR_TILES = None
    print(f"{'rule':<12} {'splits fwd / input grad (per map)':<44} {'ms':>8} {'TFLOP/s':>8} {'max rel. diff':>14}")
    for raw in args.split:
        ops.ROW_MAP_SPLIT = ops.RowMapSplit(*_rule(raw, "--split"))
        fwd = sorted({int(ops.row_map_split(lin.key, FWD, args.rows)) for lin, *_ in cases})
        bwd = sorted({int(ops.row_map_split(lin.key, BWD_X, args.rows)) for lin, *_ in cases})

        def run():
            return [
                (ops.lin_fwd.op(x, w, lin.launch_table, lin.key), ops.lin_bwd_x.op(gy, w, lin.launch_table, lin.key))
                for lin, w, x, gy in cases
            ]

        out = run()
        if reference is None:
            reference = out
        diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for pa, pb in zip(out, reference) for a, b in zip(pa, pb))
        ms = _milliseconds(run, cuda)
        print(f"{raw:<12} {str(fwd) + ' / ' + str(bwd):<44} {ms:>8.3f} {flop / (ms * 1e-3) / 1e12:>8.2f} {diff:>14.2e}")
    ops.ROW_MAP_SPLIT = ops.RowMapSplit()  # the default rule again


def weight_grads(cases, flop: int, args) -> None:
    """Time every map's weight gradient under each split rule (CUDA-graph replays on CUDA)."""
    cuda = args.device == "cuda"
    reference = None
    print(f"weight gradients: {flop / 1e9:.2f} GFLOP")
    print(f"{'rule':<12} {'splits (per map)':<40} {'ms':>8} {'TFLOP/s':>8} {'max rel. diff':>14}")
    for raw, unit in [(raw, unit) for raw in args.weight_grad for unit in args.unit]:
        programs, rows = _rule(raw, "--weight-grad")
        ops.WEIGHT_GRAD_SPLIT = ops.WeightGradSplit(programs, rows)
        ops.LINEAR_UNIT = unit == "1"
        splits = sorted({int(ops.weight_grad_split(lin.key, args.rows)) for lin, *_ in cases})

        def run():
            return [ops.lin_bwd_w.op(gy, x, lin.launch_table, lin.key) for lin, w, x, gy in cases]

        out = run()
        if reference is None:
            reference = out
        diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(out, reference))
        ms = _milliseconds(run, cuda)
        print(f"{raw + ' unit=' + unit:<12} {str(splits):<40} {ms:>8.3f} {flop / (ms * 1e-3) / 1e12:>8.2f} {diff:>14.2e}")
    ops.WEIGHT_GRAD_SPLIT = ops.WeightGradSplit()  # the default rule again
    ops.LINEAR_UNIT = ops._linear_unit_mode()


if __name__ == "__main__":
    main()
