"""What the radial MLP would cost evaluated once per pair instead of once per edge (issue 14).

Without element features a radial MLP's input is a function of the distance alone, and a full
neighbour list holds every pair twice (i -> j with image shift S and j -> i with -S, at the same
distance bit for bit). Evaluating each MLP once per pair would halve its GEMMs, the largest
non-Triton share of a force call (~0.9 ms of 2.77 ms for i2c3f20l2r on the 1000-atom diamond,
H200, 2026-12-01). Whether it pays depends on how the per-edge weights reach the products. This
script times, for every interaction's MLP, the forward and the gradient with respect to its
input (what a force call needs), in three ways:

* ``edges``: the MLP on every edge (today);
* ``pairs + gather``: the MLP on one edge per pair, the weights gathered to both edges
  (``index_select``; its backward adds both edges' gradients back with ``index_add``);
* ``pairs + rows``: the MLP on one edge per pair, read by the products through the pair index
  (``WeightRows``): no gather; the per-edge weight gradient is summed per pair (timed here as the
  separate pass, ``weight_rows_sum``: one Triton pass on CUDA, two rows read per pair; the model's
  products add it into the rows in their own kernels by default, ``FLASHCART_WEIGHT_ROW_SUM``). What
  the model runs with ``radial_pairs`` on;
* ``pairs only``: the MLP on one edge per pair and nothing else. This is the lower bound.

It also checks that the list is pair-complete, and times how long finding the reverse edges takes
(a sort of integer keys, once per neighbour list). On CUDA the calls are timed as CUDA-graph
replays (``triton.testing.do_bench_cudagraph``, median): the kernels' time, as in a compiled
call. Float32, TF32 off::

    python benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond
    python benchmarks/radial_pairs.py --device cpu --model tiny --structure ethanol   # smoke test

``--calls MODE`` times whole Predictor calls instead (padded unless ``--unpadded``, compiled with
``MODE``, or eager with ``eager``): the force call, and with ``--training`` the training step as the
trainer runs it (compiled: loss and parameter gradients in one compiled function,
``Predictor.loss_and_grads``; eager: predict with create_graph, loss, outer backward), with ``FlashCartPotential.radial_pairs`` off and on,
each in a process of its own (``--setting edge|pair`` runs one; ``--same-process`` alternates both
in rounds in one process),
median ms per call, CUDA synchronised, warm-up and compiles excluded::

    python benchmarks/radial_pairs.py --device cuda --model i2c3f20l2r --structure diamond --calls reduce-overhead
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kernel_profile import build, masked_loss, model_arguments  # noqa: E402
from flashcart.cartesian._weight_rows import weight_rows_sum  # noqa: E402
from flashcart.nn.edge_pairs import edge_pairs  # noqa: E402


def reverse_edges(receivers: torch.Tensor, senders: torch.Tensor, shifts: torch.Tensor, n: int, span: int) -> torch.Tensor:
    """``[E]`` index of each edge's reverse (``senders -> receivers`` with the opposite shift), or -1;
    ``n`` nodes, shifts within ``+-span`` (given: reading them from the device cannot be captured)."""
    s = shifts.round().long()
    base = 2 * span + 1

    def key(r, q, sh):
        k = r * n + q
        for c in range(3):
            k = k * base + (sh[:, c] + span)
        return k

    forward = key(receivers.long(), senders.long(), s)
    backward = key(senders.long(), receivers.long(), -s)
    order = torch.argsort(forward)
    pos = torch.searchsorted(forward[order], backward).clamp(max=forward.numel() - 1)
    found = forward[order][pos] == backward
    return torch.where(found, order[pos], torch.full_like(pos, -1))


def _ms(fn, cuda: bool) -> float:
    if cuda:
        import triton

        return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")
    fn()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    return (time.perf_counter() - t0) / 3 * 1e3


def whole_calls_by_process(args) -> None:
    """Each setting in a process of its own (``--calls`` without ``--setting``): nothing one
    setting compiled or cached can serve the other. (On 2026-12-02 "per pair" compiled in 0.1 s in
    the process of "per edge" and timed the same: traced CUDA calls then skipped the pairs before
    reading ``radial_pairs``, so no guard told the two models apart. Dynamo does guard the
    attribute once it is read: a change traces again.)"""
    import re
    import subprocess

    medians: dict[str, dict[str, float]] = {}
    for name in SETTINGS:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--setting", name.split()[1]]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        print(proc.stdout, end="", flush=True)
        if proc.returncode:
            raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        for phase, ms in re.findall(r"^(force call|training step): per \w+ ([0-9.]+) ms", proc.stdout, re.M):
            medians.setdefault(phase, {})[name] = float(ms)
    for phase, by in medians.items():
        if len(by) == 2:
            print(f"{phase}: per pair / per edge {by['per pair'] / by['per edge']:.3f} (separate processes)")


SETTINGS = {"per edge": False, "per pair": True}


def whole_calls(args, base, batch, device) -> None:
    """Predictor calls with the radial MLPs per edge and per pair, alternating (``--calls``)."""
    import statistics

    from flashcart.model import Predictor

    cuda = device.type == "cuda"
    compiled = args.calls != "eager"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def make(setting):
        # a copy of its own, so that the two settings never share a model
        model = copy.deepcopy(base)
        model.radial_pairs = setting
        params = [p for p in model.parameters() if p.requires_grad]
        predictor = Predictor(model, compile=compiled, compile_mode=args.calls if compiled else "default", pad=not args.unpadded)

        def force():
            with predictor.frozen():
                predictor(batch, forces=True)

        def training():  # the trainer's way: compiled, the gradients inside the graph (Predictor.loss_and_grads)
            if compiled:
                return predictor.loss_and_grads(batch, masked_loss, params, forces=True)
            for p in params:
                p.grad = None
            out = predictor(batch, forces=True, create_graph=True)
            ((out["energy"] ** 2).sum() + (out["forces"] ** 2).mean()).backward(inputs=params)

        return {"force call": force, "training step": training}

    settings = SETTINGS if args.setting is None else {f"per {args.setting}": SETTINGS[f"per {args.setting}"]}
    fns = {name: make(value) for name, value in settings.items()}
    phases = ["force call"] + (["training step"] if args.training else [])
    padding = "unpadded" if args.unpadded else "padded"
    print(
        f"[calls] {args.model} on {args.structure}: {batch.receivers.shape[0]} edges, {device}, float32, Predictor {args.calls}, {padding}"
    )
    for phase in phases:
        for name in settings:  # compile and warm up each
            t0 = time.perf_counter()
            for _ in range(3):
                fns[name][phase]()
            sync()
            print(f"  {phase}, {name}: first three calls (compile, warm-up) {time.perf_counter() - t0:.1f} s", flush=True)
        times = {name: [] for name in settings}
        for _ in range(args.rounds):
            for name in settings:
                sync()
                t0 = time.perf_counter()
                for _ in range(args.calls_per_round):
                    fns[name][phase]()
                sync()
                times[name].append((time.perf_counter() - t0) / args.calls_per_round * 1e3)
        line = ", ".join(f"{name} {statistics.median(v):.3f} ms" for name, v in times.items())
        if len(settings) == 2:
            line += f" (per pair / per edge {statistics.median(times['per pair']) / statistics.median(times['per edge']):.3f})"
        print(f"{phase}: {line} (median of {args.rounds} rounds of {args.calls_per_round} calls)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser)
    parser.add_argument("--calls", default=None, help="time whole Predictor calls: a torch.compile mode, or eager")
    parser.add_argument("--training", action="store_true", help="with --calls: the training step too")
    parser.add_argument(
        "--setting",
        choices=["edge", "pair"],
        default=None,
        help="with --calls: this setting only (default: each in a process of its own)",
    )
    parser.add_argument(
        "--same-process", action="store_true", help="with --calls: both settings in this process (see whole_calls_by_process)"
    )
    parser.add_argument("--unpadded", action="store_true", help="with --calls: the Predictor without padding")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls-per-round", type=int, default=20)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model, batch = build(args, device)
    if args.calls is not None and args.setting is None and not args.same_process:
        whole_calls_by_process(args)
        return
    if args.calls is not None:
        whole_calls(args, model, batch, device)
        return
    if any(block.element_features for block in model.interactions):
        raise SystemExit(f"{args.model}: its radial MLPs take element features, so their input is not a function of the pair alone")
    n_nodes = batch.positions.shape[0]
    span = int(batch.shifts.abs().max()) if batch.shifts.numel() else 0
    rev = reverse_edges(batch.receivers, batch.senders, batch.shifts, n_nodes, span)
    if bool((rev < 0).any()):
        raise SystemExit(f"the neighbour list is not pair-complete: {int((rev < 0).sum())} edges without a reverse")
    edges = rev.numel()
    e = torch.arange(edges, device=device)
    first = e < rev  # one edge per pair (no edge is its own reverse: no zero-shift self edges)
    reps = e[first]
    pair_of_edge = torch.empty_like(e)
    pair_of_edge[reps] = torch.arange(reps.numel(), device=device)
    pair_of_edge[rev[reps]] = pair_of_edge[reps]
    find_ms = _ms(lambda: reverse_edges(batch.receivers, batch.senders, batch.shifts, n_nodes, span), cuda)
    live = torch.ones_like(batch.receivers, dtype=torch.bool)
    group_ms = _ms(lambda: edge_pairs(batch.receivers, batch.senders, batch.shifts, live, n_nodes), cuda)

    vec = batch.positions[batch.senders] - batch.positions[batch.receivers]
    vec = vec + (batch.shifts.to(vec.dtype)[:, :, None] * batch.cell[batch.edge_batch]).sum(1)
    d = vec.norm(dim=-1)
    radial = (model.basis(d) * model.envelope(d)[:, None]).detach()
    print(f"[setup] {args.model} on {args.structure}: {edges} edges, {reps.numel()} pairs, {device}, float32")
    print(f"finding the reverse edges (once per neighbour list): {find_ms:.3f} ms")
    print(f"grouping the edges into pairs (flashcart.nn.edge_pairs, once per model call): {group_ms:.3f} ms")
    row_edges = torch.stack([reps, rev[reps]], 1)
    if cuda:  # the products' Triton pass; the PyTorch formula on the CPU
        from flashcart.cartesian._triton.ops import weight_rows_sum as kernel_sum

        def rows_sum(g):
            return kernel_sum(g, row_edges, pair_of_edge)
    else:

        def rows_sum(g):
            return weight_rows_sum(g, row_edges)

    head = f"{'MLP':<22} {'edges ms':>9} {'pairs + gather ms':>18} {'pairs + rows ms':>16} {'pairs only ms':>14}"
    print(f"{head} {'max |w_pair - w_edge|':>22}")
    g = torch.Generator(device=device).manual_seed(0)
    totals = [0.0, 0.0, 0.0, 0.0]
    for k, block in enumerate(model.interactions):
        mlp = block.radial.requires_grad_(False)
        x_edges = radial.clone().requires_grad_(True)
        x_pairs = radial[reps].clone().requires_grad_(True)
        n_out = mlp.layers[-1].out_features
        gw_edges = torch.randn(edges, n_out, device=device, generator=g)
        gw_pairs = torch.randn(reps.numel(), n_out, device=device, generator=g)

        def per_edge():
            w = mlp(x_edges)
            return torch.autograd.grad(w, x_edges, gw_edges)

        def pairs_gathered():
            w = mlp(x_pairs).index_select(0, pair_of_edge)
            return torch.autograd.grad(w, x_pairs, gw_edges)

        def pairs_rows():
            w = mlp(x_pairs)
            return torch.autograd.grad(w, x_pairs, rows_sum(gw_edges))

        def pairs_only():
            w = mlp(x_pairs)
            return torch.autograd.grad(w, x_pairs, gw_pairs)

        with torch.no_grad():
            diff = float((mlp(radial[reps]).index_select(0, pair_of_edge) - mlp(radial)).abs().max())
        times = [_ms(fn, cuda) for fn in (per_edge, pairs_gathered, pairs_rows, pairs_only)]
        totals = [a + b for a, b in zip(totals, times)]
        row = f"{f'interaction {k} ({n_out} out)':<22} {times[0]:>9.3f} {times[1]:>18.3f} {times[2]:>16.3f} {times[3]:>14.3f}"
        print(f"{row} {diff:>22.1e}")
    print(f"{'all':<22} {totals[0]:>9.3f} {totals[1]:>18.3f} {totals[2]:>16.3f} {totals[3]:>14.3f}")


if __name__ == "__main__":
    main()
