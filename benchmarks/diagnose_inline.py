"""Which Triton op breaks when inductor inlines its kernels (CUDA, one case per process).

On the H200 (torch 2.11, 2026-11-30) ``torch.compile`` with the Triton ops decomposed into
their kernel launches (``torch.library.triton_op``) ended in an illegal memory access, and so
did the CUDA AOTInductor package; opaque ops had passed there. (Found with this script on
2026-12-01: every op alone passed, the model cases failed, and their output code showed the
linear maps' launch table cloned and copied back around each launch, inductor having taken it
for written; fixed in the kernel, and inlining is the Predictor's default since.) Each
case below compiles one op, or one op fed by a layout inductor may choose differently from
eager (a slice, a concatenation), with inductor and ``FLASHCART_INLINE_TRITON_OPS=1``,
compares it with the eager op in float64 at two sizes (one dynamic graph), and runs in its own process with
``CUDA_LAUNCH_BLOCKING=1`` so a crash names its case and does not end the others. A failing
case also writes inductor's output code to ``--out``.

    python benchmarks/diagnose_inline.py --out /tmp/diag            # every case
    python benchmarks/diagnose_inline.py --case tp_fwd_conv          # one case, in this process
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

CASES = [
    "expansion",
    "tp_fwd_dense",
    "tp_fwd_conv",
    "tp_bwd_conv",
    "tp_dbwd_conv",
    "lin_fwd",
    "lin_bwd_x",
    "lin_bwd_w",
    "tp_fwd_conv_sliced_input",
    "tp_fwd_conv_concatenated_input",
    "lin_fwd_concatenated_input",
    "model_forces",
    "model_forces_reduce_overhead",
]


def run_case(name: str) -> None:
    """Compile case ``name`` once (dynamic sizes) and compare it with eager at two sizes."""
    import torch

    from flashcart.cartesian import EquivariantLinear
    from flashcart.cartesian._layout import edge_csr
    from flashcart.cartesian._triton import ops
    from flashcart.cartesian._triton.double_backward import tp_dbwd
    from flashcart.cartesian._triton.source import product_key, product_spec

    if name.startswith("model_forces"):
        model_case(name.endswith("reduce_overhead"))
        return
    if name not in CASES:
        raise SystemExit(f"unknown case {name!r}; cases: {CASES}")
    torch.manual_seed(0)
    # a CPU smoke test of the cases themselves: TRITON_INTERPRET=1 DIAGNOSE_DEVICE=cpu (aot_eager)
    dev, dt = os.environ.get("DIAGNOSE_DEVICE", "cuda"), torch.float64
    key = product_key(2, 3, 2, False, False)
    spec, F = product_spec(key), 8
    lin = EquivariantLinear(2, 2, F, F, backend="triton").to(dev, dt)
    lw = torch.cat([p.detach().reshape(-1) for p in lin.weights])
    table = lin.launch_table

    def inputs(n: int, e: int) -> tuple:
        """Graph tensors (receivers, senders, rowptr, perm, srowptr), then the case's operands."""
        receivers = torch.randint(0, n, (e,), device=dev).sort().values
        senders = torch.randint(0, n, (e,), device=dev)
        g = (receivers, senders, *edge_csr(receivers, senders, n))
        rnd = lambda *shape: torch.randn(*shape, device=dev, dtype=dt)  # noqa: E731
        x1, x2, w = rnd(n, spec.in1_comps * F), rnd(e, spec.in2_comps), rnd(e, spec.n_paths * F)
        go = rnd(n, spec.n_out_blocks * F)
        xl, gl = rnd(n, lin.in_width), rnd(n, lin.out_width)
        half, lhalf = x1.shape[1] // 2, xl.shape[1] // 2
        u = torch.nn.functional.normalize(rnd(e, 3), dim=1)
        return {
            "expansion": (u,),
            "tp_fwd_dense": (rnd(e, spec.in1_comps * F), x2, w),
            "tp_fwd_conv": (*g, x1, x2, w),
            "tp_bwd_conv": (*g, go, x1, x2, w),
            "tp_dbwd_conv": (*g, go, x1, x2, w, torch.randn_like(x1), torch.randn_like(x2), torch.randn_like(w)),
            "lin_fwd": (xl, lw),
            "lin_bwd_x": (gl, lw),
            "lin_bwd_w": (gl, xl),
            "tp_fwd_conv_sliced_input": (*g, rnd(n, x1.shape[1] + 5), x2, w),
            "tp_fwd_conv_concatenated_input": (*g, x1[:, :half].contiguous(), x1[:, half:].contiguous(), x2, w),
            "lin_fwd_concatenated_input": (xl[:, :lhalf].contiguous(), xl[:, lhalf:].contiguous(), lw),
        }[name]

    def fn(*a):
        if name == "expansion":
            return ops.expansion_fwd.op(a[0], 3) * 2
        if name == "tp_fwd_dense":
            return ops.tp_fwd.op(*a, None, None, None, None, None, None, None, key) * 2
        if name == "lin_fwd":
            return ops.lin_fwd.op(a[0], a[1], table, lin.key) * 2
        if name == "lin_bwd_x":
            return ops.lin_bwd_x.op(a[0], a[1], table, lin.key) * 2
        if name == "lin_bwd_w":
            return ops.lin_bwd_w.op(a[0], a[1], table, lin.key) * 2
        if name == "lin_fwd_concatenated_input":
            return ops.lin_fwd.op(torch.cat([a[0].sin(), a[1].cos()], 1), a[2], table, lin.key)
        g, rest = (*a[:5], None, None), a[5:]
        if name == "tp_fwd_conv":
            return ops.tp_fwd.op(*rest, *g, key) * 2
        if name == "tp_bwd_conv":
            return [t * 2 for t in ops.tp_bwd.op(*rest, *g, key, True, True, True)]
        if name == "tp_dbwd_conv":
            return [None if t is None else t * 2 for t in tp_dbwd(*rest, *g, key, True, True, True, True)]
        if name == "tp_fwd_conv_sliced_input":
            return ops.tp_fwd.op((rest[0] * 2)[:, 5:], rest[1], rest[2], *g, key)
        return ops.tp_fwd.op(torch.cat([rest[0] * 2, rest[1] + 1], 1), rest[2], rest[3], *g, key)  # concatenated input

    backend = "inductor" if dev == "cuda" else "aot_eager"
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=backend)
    for n, e in ((48, 400), (53, 437)):  # a second call with other (odd) sizes reuses the dynamic graph
        args = inputs(n, e)
        eager, got = fn(*args), compiled(*args)
        torch.cuda.synchronize() if dev == "cuda" else None
        eager = eager if isinstance(eager, (list, tuple)) else [eager]
        got = got if isinstance(got, (list, tuple)) else [got]
        worst = max(float((a - b).abs().max()) for a, b in zip(eager, got) if a is not None)
        print(f"{n} rows, {e} edges: max |compiled - eager| = {worst:.3e}")
        assert worst < 1e-10, worst


def model_case(reduce_overhead: bool) -> None:
    import torch
    from ase.build import bulk

    from flashcart.data import collate, structure_from_atoms
    from flashcart.model.potential import FlashCartPotential
    from flashcart.model.predictor import Predictor
    from flashcart.testing import TINY_MODEL

    model = FlashCartPotential(["C"], avg_neighbors=20.0, use_triton=True, **TINY_MODEL).double().cuda()
    atoms = bulk("C", "diamond", a=3.57) * (2, 2, 2)
    atoms.rattle(0.05, seed=0)
    batch = collate([structure_from_atoms(atoms, model.r_max, require_labels=False)], model.z_to_type).to("cuda", torch.float64)
    ref = Predictor(model)(batch, stress=True)
    mode = "reduce-overhead" if reduce_overhead else "default"
    out = Predictor(model, compile=True, compile_mode=mode)
    for _ in range(3):
        got = out(batch, stress=True)
    torch.cuda.synchronize()
    worst = max(float((got[k] - ref[k]).abs().max()) for k in ref)
    print(f"max |compiled - eager| = {worst:.3e}")
    assert worst < 1e-9, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", help="run one case in this process")
    parser.add_argument("--out", default="diagnose_inline", help="folder for the output code of failing cases")
    parser.add_argument("--timeout", type=float, default=240)
    args = parser.parse_args()
    if args.case:
        run_case(args.case)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FLASHCART_INLINE_TRITON_OPS": "1", "CUDA_LAUNCH_BLOCKING": "1"}
    failed = []
    for name in CASES:
        cmd = [sys.executable, "-X", "faulthandler", __file__, "--case", name]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            ok, text = proc.returncode == 0, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            ok, text = False, "timed out"
        last = [line for line in text.splitlines() if line.strip() and "DEBUG" not in line]
        print(f"{'ok  ' if ok else 'FAIL'} {name:<34} {last[-1][:150] if last else ''}", flush=True)
        if not ok:
            failed.append(name)
            (out / f"{name}.log").write_text(text[-20000:])
    if failed:  # the output code of the first failure (inductor's generated wrapper and kernels)
        env["TORCH_LOGS"] = "output_code"
        proc = subprocess.run([sys.executable, __file__, "--case", failed[0]], env=env, capture_output=True, text=True)
        (out / "output_code.txt").write_text((proc.stdout + proc.stderr)[-4_000_000:])
    print(f"{len(CASES) - len(failed)} of {len(CASES)} cases pass" + (f"; failing: {', '.join(failed)}" if failed else ""))


if __name__ == "__main__":
    main()
