"""A compiled training step two ways: the parameter gradients by the outer backward, or inside the graph (issue 14).

The trainer compiles the prediction (energy and forces with ``create_graph``) and then calls
``loss.backward(inputs=parameters)``. AOTAutograd's compiled backward returns a gradient for
every input that requires grad, the positions included: the loss's derivative with respect to
the positions (a Hessian-vector product through every block) is computed and thrown away. The
Triton ops skip what a backward pass does not reach (``ops._engine_needs`` asks the autograd
engine), in eager mode and for ``autograd.grad`` calls traced inside a compiled function; the
outer backward's compiled graph cannot, since AOTAutograd asks it for every input. On this
CPU, for the export tests' tiny model, that part is 15 % of the backward graph's operations
(1,604 against 1,367 nodes).

``torch.func.grad`` would leave the positions without ``requires_grad`` at the graph's boundary,
but it cannot trace FlashCart's custom ops (torch 2.13: "Dynamo failed to run FX node with fake
tensors ... GradTrackingTensor"); dynamo refuses a leaf that requires grad created inside the
graph. What works is to compute the loss and ``torch.autograd.grad(loss, parameters)`` inside
the compiled function: nothing then asks for the positions' gradient.

This script times both on one model and structure and checks that they give the same
gradients:

* ``outer``: the compiled :class:`~flashcart.model.Predictor` with ``create_graph``, the loss,
  ``loss.backward(inputs=parameters)`` (what the trainer does with ``predict_compile``);
* ``in-graph``: one compiled function returning the loss and the parameter gradients
  (``Predictor.loss_and_grads``, padded: what the trainer runs with ``predict_compile`` since
  2026-12-03);
* ``eager``: the prediction uncompiled with the outer backward, a reference that compiles nothing.

``--ways`` picks them (the first is the gradients' reference).

    python benchmarks/compiled_step_grads.py --device cuda --model i2c3f20l2r --structure diamond --compile-mode default
    python benchmarks/compiled_step_grads.py --device cuda --model i2c3f20l2r --structure diamond \
        --compile-mode reduce-overhead --ways eager in-graph
    python benchmarks/compiled_step_grads.py --device cpu --model tiny --structure ethanol --repeat 5   # smoke test

Models: ``benchmarks/kernel_profile.py``'s ``MODELS`` (with ``--option KEY=VALUE``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.eager_overhead import timed  # noqa: E402  (synchronised seconds per call)
from benchmarks.kernel_profile import build, masked_loss, model_arguments  # noqa: E402
from flashcart.model.predictor import Predictor  # noqa: E402
from flashcart.profiling import synchronize  # noqa: E402


def _loss(energy: torch.Tensor, forces: torch.Tensor) -> torch.Tensor:
    return (energy**2).sum() + (forces**2).mean()


def outer_step(model, batch, compile_mode: str, compile: bool = True):
    """The prediction (compiled, or with ``compile=False`` eager: the reference, where the Triton ops
    skip the positions' terms) with ``create_graph``, then the outer backward."""
    predictor = Predictor(model, compile=compile, compile_mode=compile_mode, pad=False)
    params = [p for p in model.parameters() if p.requires_grad]

    def step():
        for p in params:
            p.grad = None
        out = predictor(batch, forces=True, create_graph=True)
        _loss(out["energy"], out["forces"]).backward(inputs=params)
        return [p.grad for p in params]

    return step


def in_graph_step(model, batch, compile_mode: str):
    """``Predictor.loss_and_grads``: what the trainer runs with ``predict_compile`` (padded)."""
    predictor = Predictor(model, compile=True, compile_mode=compile_mode)
    params = [p for p in model.parameters() if p.requires_grad]

    def step():
        _, grads = predictor.loss_and_grads(batch, masked_loss, params, forces=True)
        return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]

    return step


WAYS = {"eager": partial(outer_step, compile=False), "outer": outer_step, "in-graph": in_graph_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser)
    parser.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=list(WAYS), help="the first is the gradients' reference")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    model, batch = build(args, device)
    print(
        f"[setup] {args.model} on {args.structure} ({batch.positions.shape[0]} atoms, {batch.receivers.shape[0]} edges), "
        f"{device}, float32, compile mode {args.compile_mode}, torch {torch.__version__}"
    )
    results = {}
    for name in args.ways:
        step = WAYS[name](model, batch, args.compile_mode)
        t0 = time.perf_counter()
        grads = [g.detach().clone() for g in step()]
        synchronize(device)
        first = time.perf_counter() - t0
        for _ in range(args.warmup):
            step()
        results[name] = (grads, statistics.median(timed(step, device, args.repeat)), first)
    ref = results[args.ways[0]][0]
    scale = max(float(g.abs().max()) for g in ref)
    for name, (grads, seconds, first) in results.items():
        diff = max(float((a - b).abs().max()) for a, b in zip(grads, ref)) / scale
        print(
            f"{name:<9} {seconds * 1e3:9.3f} ms/step (median)  first call {first:7.1f} s  "
            f"max |grad - {args.ways[0]}| / max |grad| {diff:.1e}"
        )


if __name__ == "__main__":
    main()
