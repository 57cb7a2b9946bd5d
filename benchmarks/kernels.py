"""Convolution tensor-product kernels on the periodic diamond workload (GPU).

Diamond, a = 3.567 Å, 5x5x5 cubic cells (1000 atoms), r_max 6 Å (158k edges); hidden
l_max 2 (senders), edge l_max 3 (one channel), output l_max 2 (``--out-l-max``; 3 is the
published models' convolution), path-resolved; per-edge weights. For each feature count:
forward, backward (all inputs) and double backward (all four results: output cotangent,
both inputs and weights, as in force training), in ms (median of CUDA-event timings after
warm-up, float32, TF32 off), with the bytes each must move at least and the achieved
fraction of the measured copy bandwidth.

The Triton double backward is timed in each ``--dbwd`` mode: ``fused`` (the generated fused
kernels, the default: one receiver pass that also adds d x1 into the senders' rows by
atomics, the edge operands read once), ``sender`` (fused, d x1 in a pass per sender without
atomics: two launches), ``split`` (as ``sender``, with the output cotangent's result in a
receiver pass of its own: three launches, fewer registers), ``grouped`` (as ``sender``, the
receiver pass split by output rank over a grid axis: two launches, no register spills) and
``composed`` (tp_fwd/tp_bwd launches with substituted operands,
``FLASHCART_FUSED_DOUBLE_BACKWARD=0``). The Triton backward is also timed the other way of
``FLASHCART_FUSED_CSR_BACKWARD`` (one pass per sender, ``tp_bwd_csr``, against the two kernels).
``--splits 1 2 4`` times the Triton kernels with each node's edges walked by that many programs
in every walk (``FLASHCART_TP_SPLITS`` and ``FLASHCART_DBWD_SPLITS``; default: the environment's
settings, ``auto`` by default: see ``common.auto_splits``; the table's column says the
forward-and-backward / double-backward splits of the timed product).
``--prefetch 0 1 auto`` times the Triton kernels with each ``FLASHCART_INDEX_PREFETCH`` setting in
turn (the node walks load the indices of the next edges ahead: ``common.index_prefetch``).
``--row-sums atomic pass`` gives the Triton kernels per-pair weights instead (the radial MLP's
rows, one per pair of reverse edges, read by both edges through ``WeightRows``, as the model runs
them) and times each way of summing the weights' gradient into rows in turn
(``FLASHCART_WEIGHT_ROW_SUM``, see ``flashcart.cartesian._triton.weight_rows``).

    python benchmarks/kernels.py --features 20 64 128 [--dbwd fused sender split grouped composed] [--splits 1 4] [--json out.json]
    python benchmarks/kernels.py --features 20 --out-l-max 3 --backends triton --dbwd fused --row-sums atomic pass

``--host-overhead`` measures instead, on the CPU, what the Python side of each call costs:
the launchers run with the kernel launch replaced by a no-op (argument names still checked),
on a small graph, best of 5 rounds of 200 calls (no GPU, no ``TRITON_INTERPRET`` needed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

import torch
import triton.testing

from flashcart.cartesian import DirectionExpansion, TensorProduct, WeightRows, edge_csr
from flashcart.cartesian._triton import common, double_backward, ops
from flashcart.cartesian._triton import weight_rows as row_sums
from flashcart.data.neighbors import neighbor_list
from flashcart.nn.edge_pairs import edge_pairs
from flashcart.utils.io import atomic_write_text


def diamond(device, dtype=torch.float32):
    a = 3.567
    basis = torch.tensor(
        [
            [0, 0, 0],
            [0, 0.5, 0.5],
            [0.5, 0, 0.5],
            [0.5, 0.5, 0],
            [0.25, 0.25, 0.25],
            [0.25, 0.75, 0.75],
            [0.75, 0.25, 0.75],
            [0.75, 0.75, 0.25],
        ],
        dtype=torch.float64,
    )
    cells = torch.cartesian_prod(*[torch.arange(5, dtype=torch.float64)] * 3)
    pos = ((cells[:, None, :] + basis[None]) * a).reshape(-1, 3)
    cell = torch.eye(3, dtype=torch.float64) * 5 * a
    i, j, shifts = neighbor_list(pos.to(device), 6.0, cell.to(device), (True, True, True))
    vec = pos.to(device)[j] - pos.to(device)[i] + shifts @ cell.to(device)
    return pos.shape[0], i, j, vec.to(dtype), shifts


def copy_bandwidth() -> float:
    x = torch.empty(2**29, device="cuda")  # 2 GiB
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=25, rep=200, return_mode="median")
    return 2 * x.numel() * 4 / (ms * 1e-3)


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


# (ops.FUSED_DOUBLE_BACKWARD, double_backward.SPLIT_ROW_PASS, double_backward.ROW_GROUPS, double_backward.X1_ATOMIC)
# by the FLASHCART_FUSED_DOUBLE_BACKWARD value each mode stands for
DBWD_MODES = {
    name: double_backward.ENV_MODES[value]
    for name, value in (("fused", "1"), ("sender", "sender"), ("split", "split"), ("grouped", "grouped"), ("composed", "0"))
}
_DBWD_SWITCHES = ("SPLIT_ROW_PASS", "ROW_GROUPS", "X1_ATOMIC")


@contextlib.contextmanager
def dbwd_mode(mode: str):
    """Select the Triton double backward (see the module docstring) inside the block."""
    saved = (ops.FUSED_DOUBLE_BACKWARD, *(getattr(double_backward, n) for n in _DBWD_SWITCHES))

    def put(values):
        ops.FUSED_DOUBLE_BACKWARD = values[0]
        for n, v in zip(_DBWD_SWITCHES, values[1:]):
            setattr(double_backward, n, v)

    put(DBWD_MODES[mode])
    try:
        yield
    finally:
        put(saved)


def host_overhead(features: int = 20, rounds: int = 5, calls: int = 200) -> dict[str, float]:
    """Microseconds of host work per call (kernel launches stubbed) and launches per call."""
    from flashcart.cartesian._triton import signatures

    launches = [0]

    def stub(self, module, grid, num_warps=None, **values):
        if values.keys() != self._names:
            raise TypeError(f"kernel {self.name}: wrong argument names")
        launches[0] += 1

    real = signatures.KernelSignature.launch
    signatures.KernelSignature.launch = stub
    os_env = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # lets backend="triton" take CPU tensors; nothing is interpreted
    try:
        g = torch.Generator().manual_seed(0)
        n, e = 10, 20
        tp = TensorProduct(2, 3, 2, features, 1, backend="triton")
        rec = torch.sort(torch.randint(0, n, (e,), generator=g)).values
        snd = torch.randint(0, n, (e,), generator=g)
        csr = edge_csr(rec, snd, n)
        x1 = torch.randn(n, tp.in1_width, generator=g).requires_grad_()
        x2 = torch.randn(e, tp.in2_width, generator=g).requires_grad_()
        w = torch.randn(e, tp.weight_numel, generator=g).requires_grad_()
        ins = [x1, x2, w]
        out = tp(x1, x2, w, rec, snd, csr)
        go = torch.randn(out.shape, generator=g).requires_grad_()
        grads = torch.autograd.grad(out, ins, go, create_graph=True)
        s = sum((t * torch.randn(t.shape, generator=g)).sum() for t in grads)

        def per_call(fn):
            for _ in range(20):
                fn()
            best = float("inf")
            for _ in range(rounds):
                launches[0] = 0
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                best = min(best, (time.perf_counter() - t0) / calls * 1e6)
            return best, launches[0] / calls

        result = {}
        with torch.no_grad():
            result["fwd"] = per_call(lambda: tp(x1, x2, w, rec, snd, csr))
        result["bwd"] = per_call(lambda: torch.autograd.grad(out, ins, go, retain_graph=True))
        for mode in DBWD_MODES:
            with dbwd_mode(mode):
                result[f"dbwd {mode}"] = per_call(lambda: torch.autograd.grad(s, [go, *ins], retain_graph=True))
        return result
    finally:
        signatures.KernelSignature.launch = real
        if os_env is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = os_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", type=int, nargs="+", default=[20, 64, 128])
    parser.add_argument("--out-l-max", type=int, default=2, help="output rank limit (the published models' convolution: 3)")
    parser.add_argument("--backends", nargs="+", default=["triton", "torch"])
    parser.add_argument("--dbwd", nargs="+", default=list(DBWD_MODES), choices=list(DBWD_MODES), help="Triton double-backward modes")
    parser.add_argument("--host-overhead", action="store_true", help="host cost per call on the CPU, launches stubbed")
    parser.add_argument("--splits", type=int, nargs="+", default=None, help="Triton: programs per node's edge walk (each value in turn)")
    parser.add_argument(
        "--row-sums",
        nargs="+",
        default=None,
        choices=["atomic", "pass"],
        help="Triton: per-pair weight rows, the weights' gradient summed into rows each of these ways in turn",
    )
    parser.add_argument(
        "--prefetch",
        nargs="+",
        choices=list(common.PREFETCH_MODES),
        default=None,
        help="Triton: time the kernels with each FLASHCART_INDEX_PREFETCH setting in turn (the node walks' index prefetch)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.splits and not all(1 <= n <= 16 for n in args.splits):
        parser.error(f"--splits values must be integers from 1 to 16, got {args.splits}")
    if args.host_overhead:
        for what, (us, n_launch) in host_overhead(args.features[0]).items():
            print(f"{what:14s} {us:8.1f} us/call  {n_launch:.0f} launches")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    n, rec, snd, vec, shifts = diamond(dev)
    E = rec.numel()
    csr = edge_csr(rec, snd, n)
    pairs = edge_pairs(rec, snd, shifts, torch.ones(E, dtype=torch.bool, device=dev), n)
    pair_rows = WeightRows(pairs.pair_of_edge, pairs.row_edges)
    attrs = DirectionExpansion(3)(vec)
    bw = copy_bandwidth()
    print(f"atoms {n}, edges {E}, copy bandwidth {bw / 1e12:.2f} TB/s")
    rows = []
    runs = [
        (b, S, R, P)
        for b in args.backends
        for S in (args.splits or [None] if b == "triton" else [None])
        for R in (args.row_sums or [None] if b == "triton" else [None])
        for P in (args.prefetch or [None] if b == "triton" else [None])
    ]
    for F in args.features:
        for backend, splits, row_sum, prefetch in runs:
            if splits is not None:  # every walk split alike; else the environment's settings
                common.TP_SPLITS = common.DBWD_SPLITS = splits
            if prefetch is not None:
                common.INDEX_PREFETCH = prefetch
            if row_sum is not None:
                row_sums.IN_KERNEL = row_sum != "pass"
            rows_arg = pair_rows if row_sum is not None else None
            tp = TensorProduct(2, 3, args.out_l_max, F, 1, backend=backend)
            x1 = torch.randn(n, tp.in1_width, device=dev, requires_grad=True)
            x2 = attrs.detach().clone().requires_grad_()
            w = torch.randn(pairs.leader.numel() if rows_arg else E, tp.weight_numel, device=dev, requires_grad=True)
            ins = [x1, x2, w]
            try:
                fwd = lambda: tp(x1, x2, w, rec, snd, csr, rows_arg)  # noqa: E731
                out = fwd()
                go = torch.randn_like(out).requires_grad_()
                grads = torch.autograd.grad(out, ins, go, create_graph=True)
                vs = [torch.randn_like(g) for g in grads]
                s = sum((g * v).sum() for g, v in zip(grads, vs))
                with torch.no_grad():
                    t_f = bench(fwd)
                t_b = bench(lambda: torch.autograd.grad(out, ins, go, retain_graph=True))
                t_b2 = None
                if backend == "triton":  # the backward as two kernels (tp_bwd_edge, tp_bwd_x1_csr)
                    saved, ops.FUSED_CSR_BACKWARD = ops.FUSED_CSR_BACKWARD, not ops.FUSED_CSR_BACKWARD
                    try:
                        t_b2 = bench(lambda: torch.autograd.grad(out, ins, go, retain_graph=True))
                    finally:
                        ops.FUSED_CSR_BACKWARD = saved
                t_d = {}
                for mode in args.dbwd if backend == "triton" else ["torch"]:
                    with dbwd_mode(mode) if mode in DBWD_MODES else contextlib.nullcontext():
                        t_d[mode] = bench(lambda: torch.autograd.grad(s, [go, *ins], retain_graph=True))
            except torch.OutOfMemoryError:
                print(f"F={F} {backend}: out of memory")
                torch.cuda.empty_cache()
                continue
            el = 4
            in_bytes = (x1.numel() + x2.numel() + w.numel()) * el
            b_f = in_bytes + out.numel() * el
            b_b = 2 * in_bytes + out.numel() * el  # read inputs and go, write the three grads
            b_d = 2 * (in_bytes + out.numel() * el)  # read inputs, go, three cotangents; write four results
            first = next(iter(t_d.values()))
            row = dict(
                F=F,
                backend=backend,
                splits=f"{common.walk_splits(True, tp.n_paths, channels=F)}/{common.DBWD_SPLITS}",
                rows=row_sum or "edge",
                prefetch=common.INDEX_PREFETCH,
                paths=tp.n_paths,
                fwd_ms=t_f,
                bwd_ms=t_b,
                bwd_other_ms=t_b2,
                dbwd_ms=first,
                dbwd_modes_ms=t_d,
                fwd_bytes=b_f,
                bwd_bytes=b_b,
                dbwd_bytes=b_d,
                fwd_roofline=b_f / (t_f * 1e-3) / bw,
                bwd_roofline=b_b / (t_b * 1e-3) / bw,
                dbwd_roofline=b_d / (first * 1e-3) / bw,
            )
            rows.append(row)
            what = f"F={F} {backend} splits={row['splits']} rows={row['rows']} prefetch={row['prefetch']}"
            print(f"{what}: fwd {t_f:.3f} bwd {t_b:.3f} dbwd {first:.3f} ms", flush=True)
            del out, grads, s
            torch.cuda.empty_cache()
    head = f"{'F':>4} {'backend':>7} {'splits':>6} {'rows':>6} {'pref':>4} {'fwd ms':>8} {'bwd ms':>8} {'dbwd ms':>8}"
    head += f" {'fwd %bw':>8} {'bwd %bw':>8} {'dbwd %bw':>8}"
    other = "two kernels" if ops.FUSED_CSR_BACKWARD else "one pass per sender"
    print(head + f"  bwd {other} ms  dbwd by mode (x fwd)")
    for r in rows:
        modes = "  ".join(f"{m} {t:.3f} ({t / r['fwd_ms']:.1f}x)" for m, t in r["dbwd_modes_ms"].items())
        print(
            f"{r['F']:4d} {r['backend']:>7} {r['splits']:>6} {r['rows']:>6} {r['prefetch']:>4} "
            f"{r['fwd_ms']:8.3f} {r['bwd_ms']:8.3f} {r['dbwd_ms']:8.3f} "
            f"{100 * r['fwd_roofline']:7.1f}% {100 * r['bwd_roofline']:7.1f}% {100 * r['dbwd_roofline']:7.1f}%  "
            f"{'-' if r['bwd_other_ms'] is None else format(r['bwd_other_ms'], '.3f'):>8}  {modes}"
        )
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(dict(copy_bandwidth=bw, atoms=n, edges=E, rows=rows), indent=1))


if __name__ == "__main__":
    main()
