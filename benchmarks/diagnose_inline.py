"""Which Triton op breaks when inductor inlines its kernels (CUDA, one case per process).

On the H200 (torch 2.11, 2026-11-30) ``torch.compile`` with the Triton ops decomposed into
their kernel launches (``torch.library.triton_op``) ended in an illegal memory access, and so
did the CUDA AOTInductor package; the opaque ops (the Predictor's default since) did not. Each
case below compiles one op, or one op fed by a layout inductor may choose differently from
eager (a slice, a concatenation), with inductor and ``FLASHCART_INLINE_TRITON_OPS=1``,
compares it with the eager op in float64, and runs in its own process with
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
    import torch

    from flashcart.cartesian import EquivariantLinear
    from flashcart.cartesian._layout import edge_csr
    from flashcart.cartesian._triton import ops
    from flashcart.cartesian._triton.double_backward import tp_dbwd
    from flashcart.cartesian._triton.source import product_key, product_spec

    torch.manual_seed(0)
    # a CPU smoke test of the cases themselves: TRITON_INTERPRET=1 DIAGNOSE_DEVICE=cpu (aot_eager)
    dev, dt = os.environ.get("DIAGNOSE_DEVICE", "cuda"), torch.float64
    key = product_key(2, 3, 2, False, False)
    spec, F, n, e = product_spec(key), 8, 50, 400
    receivers = torch.randint(0, n, (e,), device=dev).sort().values
    senders = torch.randint(0, n, (e,), device=dev)
    g = (receivers, senders, *edge_csr(receivers, senders, n))
    x1 = torch.randn(n, spec.in1_comps * F, device=dev, dtype=dt)
    x2 = torch.randn(e, spec.in2_comps, device=dev, dtype=dt)
    w = torch.randn(e, spec.n_paths * F, device=dev, dtype=dt)
    go = torch.randn(n, spec.n_out_blocks * F, device=dev, dtype=dt)
    lin = EquivariantLinear(2, 2, F, F, backend="triton").to(dev, dt)
    lw = torch.cat([p.detach().reshape(-1) for p in lin.weights])
    xl, gl = torch.randn(n, lin.in_width, device=dev, dtype=dt), torch.randn(n, lin.out_width, device=dev, dtype=dt)

    if name == "expansion":
        u = torch.nn.functional.normalize(torch.randn(e, 3, device=dev, dtype=dt), dim=1)
        fn, args = (lambda u: ops.expansion_fwd.op(u, 3) * 2), (u,)
    elif name == "tp_fwd_dense":
        xd = torch.randn(e, spec.in1_comps * F, device=dev, dtype=dt)
        fn, args = (lambda a, b, c: ops.tp_fwd.op(a, b, c, None, None, None, None, None, key) * 2), (xd, x2, w)
    elif name == "tp_fwd_conv":
        fn, args = (lambda a, b, c: ops.tp_fwd.op(a, b, c, *g, key) * 2), (x1, x2, w)
    elif name == "tp_bwd_conv":
        fn, args = (lambda o, a, b, c: [t * 2 for t in ops.tp_bwd.op(o, a, b, c, *g, key, True, True, True)]), (go, x1, x2, w)
    elif name == "tp_dbwd_conv":
        gg = (torch.randn_like(x1), torch.randn_like(x2), torch.randn_like(w))
        fn = lambda o, a, b, c, p, q, r: [  # noqa: E731
            None if t is None else t * 2 for t in tp_dbwd(o, a, b, c, p, q, r, *g, key, True, True, True, True)
        ]
        args = (go, x1, x2, w, *gg)
    elif name == "lin_fwd":
        fn, args = (lambda x, wt: ops.lin_fwd.op(x, wt, lin.launch_table, lin.key) * 2), (xl, lw)
    elif name == "lin_bwd_x":
        fn, args = (lambda gy, wt: ops.lin_bwd_x.op(gy, wt, lin.launch_table, lin.key) * 2), (gl, lw)
    elif name == "lin_bwd_w":
        fn, args = (lambda gy, x: ops.lin_bwd_w.op(gy, x, lin.launch_table, lin.key) * 2), (gl, xl)
    elif name == "tp_fwd_conv_sliced_input":
        big = torch.randn(n, x1.shape[1] + 5, device=dev, dtype=dt)
        fn, args = (lambda a, b, c: ops.tp_fwd.op((a * 2)[:, 5:], b, c, *g, key)), (big, x2, w)
    elif name == "tp_fwd_conv_concatenated_input":
        half = x1.shape[1] // 2
        fn = lambda a, b, c, d: ops.tp_fwd.op(torch.cat([a * 2, b + 1], 1), c, d, *g, key)  # noqa: E731
        args = (x1[:, :half].contiguous(), x1[:, half:].contiguous(), x2, w)
    elif name == "lin_fwd_concatenated_input":
        half = xl.shape[1] // 2
        fn = lambda a, b, wt: ops.lin_fwd.op(torch.cat([a.sin(), b.cos()], 1), wt, lin.launch_table, lin.key)  # noqa: E731
        args = (xl[:, :half].contiguous(), xl[:, half:].contiguous(), lw)
    elif name.startswith("model_forces"):
        model_case(name.endswith("reduce_overhead"))
        return
    else:
        raise SystemExit(f"unknown case {name!r}; cases: {CASES}")

    eager = fn(*args)
    torch._dynamo.reset()
    backend = "inductor" if dev == "cuda" else "aot_eager"
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=backend)(*args)
    torch.cuda.synchronize() if dev == "cuda" else None
    eager = eager if isinstance(eager, (list, tuple)) else [eager]
    compiled = compiled if isinstance(compiled, (list, tuple)) else [compiled]
    worst = max(float((a - b).abs().max()) for a, b in zip(eager, compiled) if a is not None)
    print(f"max |compiled - eager| = {worst:.3e}")
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
