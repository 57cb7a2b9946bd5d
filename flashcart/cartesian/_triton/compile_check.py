"""Compile the generated tensor-product kernels for an NVIDIA target without a GPU.

The interpreter (``TRITON_INTERPRET=1``) runs the kernels as Python, so it does not check
what Triton's compiler accepts (constexpr branches, loop-carried values) nor what the code
costs in registers. This compiles each kernel with the configurations the launchers use
through Triton's bundled ``ptxas`` and reports the cubin's resource usage (registers per
thread, ``STACK``/``LOCAL`` bytes of spills)::

    python -m flashcart.cartesian._triton.compile_check --key 2,3,2,0,0 --dtype fp32 --block-f 64

``--maxnreg N`` caps the registers per thread (what the cap costs in spills), ``--only TEXT``
compiles just the variants whose label contains ``TEXT``. ``--instructions`` adds the cubin's
machine instructions by class (:func:`instruction_counts`): one program's straight-line work
per thread, which for the products' kernels (one channel per thread) bounds their issue rate.
With ``FLASHCART_STATIC_SHAPES=1`` the kernels are compiled for the sizes of ``--channels``
channels (default ``--block-f``; input 2 one broadcast channel, as a convolution's edge
attributes), the widths a model of that width passes (:func:`shape_values`).

``--linear-tiles T ...`` compiles the linear maps' grouped matmul instead, with ``--linear-key``
(``'3|3|64|64|4,6,7,6'``) and ``--linear-kind`` (0 forward, 1 input gradient, 2 weight gradient)
as the launcher compiles that map's launch, its global loads counted by width; with
``--linear-pair-key`` too, the launch of that map paired with a second one (``flashcart::lin_pair``).

Run it without ``TRITON_INTERPRET`` (the interpreter replaces ``@triton.jit``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

__all__ = ["resource_usage", "main"]

_INDEX = {"rowptr_ptr", "send_ptr", "recv_ptr", "perm_ptr", "srowptr_ptr", "widx_ptr", "wrows_ptr"}


def _variants(dbwd_only: bool):
    from .signatures import TP_BWD_CSR, TP_BWD_EDGE, TP_BWD_X1_CSR, TP_DBWD_ROW, TP_DBWD_X1_CSR, TP_FWD

    every = dict(
        HAS_GG1=True, HAS_GG2=True, HAS_GGW=True, NEED_GO=True, NEED_X2=True, NEED_W=True, RED_X2=True, SHARED_W=False, ROW_GROUPS=False
    )
    training = {**every, "NEED_X2": False}
    out = []
    if not dbwd_only:
        out += [
            ("product", TP_FWD, "tp_fwd conv", dict(CONV=True, PIPELINE=False)),
            ("product", TP_FWD, "tp_fwd conv, pipelined", dict(CONV=True, PIPELINE=True)),
            ("product", TP_FWD, "tp_fwd conv, pipelined, 4 splits", dict(CONV=True, PIPELINE=True, SPLITS=4)),
            ("product", TP_BWD_EDGE, "tp_bwd_edge conv g2+gw", dict(CONV=True, NEED_G1=False, NEED_G2=True, NEED_GW=True, REDUCE_G2=True)),
            ("product", TP_BWD_X1_CSR, "tp_bwd_x1_csr", {}),
            ("product", TP_BWD_CSR, "tp_bwd_csr g1+g2+gw", dict(NEED_G2=True, NEED_GW=True, REDUCE_G2=True)),
            (
                "product",
                TP_BWD_CSR,
                "tp_bwd_csr g1+g2+gw, weight rows",
                dict(NEED_G2=True, NEED_GW=True, REDUCE_G2=True, W_INDEX=True, W_ROWS=True),
            ),
            (
                "product",
                TP_BWD_CSR,
                "tp_bwd_csr g1+g2+gw, weight rows, no prefetch",
                dict(NEED_G2=True, NEED_GW=True, REDUCE_G2=True, W_INDEX=True, W_ROWS=True, PREFETCH=False),
            ),
            (
                "product",
                TP_BWD_CSR,
                "tp_bwd_csr g1+g2+gw, rows, 4 splits",
                dict(NEED_G2=True, NEED_GW=True, REDUCE_G2=True, W_INDEX=True, W_ROWS=True, SPLITS=4),
            ),
            (
                "product",
                TP_BWD_CSR,
                "tp_bwd_csr g1+g2+gw, weight rows, slopes",
                dict(NEED_G2=True, NEED_GW=True, REDUCE_G2=True, W_INDEX=True, W_ROWS=True, W_SLOPE=True),
            ),
            (
                "product",
                TP_BWD_EDGE,
                "tp_bwd_edge conv g2+gw, weight rows, slopes",
                dict(CONV=True, NEED_G1=False, NEED_G2=True, NEED_GW=True, REDUCE_G2=True, W_INDEX=True, W_ROWS=True, W_SLOPE=True),
            ),
            ("product", TP_FWD, "tp_fwd conv, pipelined, table", dict(CONV=True, PIPELINE=True, W_TABLE=True)),
            ("product", TP_BWD_X1_CSR, "tp_bwd_x1_csr, table", dict(W_TABLE=True)),
            (
                "product",
                TP_BWD_CSR,
                "tp_bwd_csr g1+g2+gw, slopes, table",
                dict(NEED_G2=True, NEED_GW=True, REDUCE_G2=True, W_SLOPE=True, W_TABLE=True),
            ),
            (
                "product",
                TP_BWD_EDGE,
                "tp_bwd_edge conv g2+gw, slopes, table",
                dict(CONV=True, NEED_G1=False, NEED_G2=True, NEED_GW=True, REDUCE_G2=True, W_SLOPE=True, W_TABLE=True),
            ),
            (
                "product",
                TP_BWD_EDGE,
                "tp_bwd_edge conv gw, weight rows",
                dict(CONV=True, NEED_G1=False, NEED_G2=False, NEED_GW=True, REDUCE_G2=False, W_INDEX=True, W_ROWS=True),
            ),
        ]
    out += [
        ("dbwd", TP_DBWD_ROW, "tp_dbwd_row conv all", dict(CONV=True, NEED_X1=False, RED_X1=False, **every)),
        (
            "dbwd",
            TP_DBWD_ROW,
            "tp_dbwd_row conv all, groups",
            dict(CONV=True, NEED_X1=False, RED_X1=False, **{**every, "ROW_GROUPS": True}),
        ),
        (
            "dbwd",
            TP_DBWD_ROW,
            "tp_dbwd_row conv d_go only",
            dict(CONV=True, NEED_X1=False, RED_X1=False, **{**every, "NEED_X2": False, "NEED_W": False}),
        ),
        ("dbwd", TP_DBWD_ROW, "tp_dbwd_row conv d_x2+d_w", dict(CONV=True, NEED_X1=False, RED_X1=False, **{**every, "NEED_GO": False})),
        ("dbwd", TP_DBWD_ROW, "tp_dbwd_row dense all", dict(CONV=False, NEED_X1=True, RED_X1=False, **every)),
        ("dbwd", TP_DBWD_X1_CSR, "tp_dbwd_x1_csr", dict(HAS_GG2=True, HAS_GGW=True, RED_X1=False)),
        (
            "dbwd",
            TP_DBWD_ROW,
            "tp_dbwd_row conv all, weight rows",
            dict(CONV=True, NEED_X1=False, RED_X1=False, W_INDEX=True, W_ROWS=True, **every),
        ),
        ("dbwd", TP_DBWD_X1_CSR, "tp_dbwd_x1_csr, weight rows", dict(HAS_GG2=True, HAS_GGW=True, RED_X1=False, W_INDEX=True, W_ROWS=True)),
        (
            "dbwd",
            TP_DBWD_ROW,
            "tp_dbwd_row conv all, 4 splits",
            dict(CONV=True, NEED_X1=False, RED_X1=False, W_INDEX=True, W_ROWS=True, SPLITS=4, **every),
        ),
        ("dbwd", TP_DBWD_X1_CSR, "tp_dbwd_x1_csr, 4 splits", dict(HAS_GG2=True, HAS_GGW=True, RED_X1=False, SPLITS=4)),
        (
            # what a training step on forces runs (edge attributes carry no parameters: no d x2)
            "dbwd",
            TP_DBWD_ROW,
            "tp_dbwd_row training (go+w), rows, 4 splits",
            dict(CONV=True, NEED_X1=False, RED_X1=False, W_INDEX=True, W_ROWS=True, SPLITS=4, **training),
        ),
        (
            "dbwd",
            TP_DBWD_ROW,
            "tp_dbwd_row training, rows, groups",
            dict(CONV=True, NEED_X1=False, RED_X1=False, W_INDEX=True, W_ROWS=True, SPLITS=4, **{**training, "ROW_GROUPS": True}),
        ),
        (
            # the default: d x1 added into the senders' rows, no sender pass (the variants above
            # without NEED_X1 are the receiver pass of FLASHCART_FUSED_DOUBLE_BACKWARD=sender)
            "dbwd",
            TP_DBWD_ROW,
            "tp_dbwd_row training + atomic d_x1, rows, 4 splits",
            dict(CONV=True, NEED_X1=True, X1_ATOMIC=True, RED_X1=False, W_INDEX=True, W_ROWS=True, SPLITS=4, **training),
        ),
        (
            "dbwd",
            TP_DBWD_ROW,
            "tp_dbwd_row conv all + atomic d_x1, 4 splits",
            dict(CONV=True, NEED_X1=True, X1_ATOMIC=True, RED_X1=False, SPLITS=4, **every),
        ),
    ]
    return out


# SASS opcodes by class, for instruction_counts (the rest counted under "other")
_CLASSES = {
    "fp": ("FFMA", "FMUL", "FADD", "DFMA", "DMUL", "DADD"),
    "load": ("LDG",),
    "store": ("STG", "RED", "ATOM", "ATOMG"),
    "shuffle": ("SHFL",),
    "spill": ("STL", "LDL"),
}


def instruction_counts(sass: str) -> dict[str, int]:
    """Machine instructions of ``cuobjdump -sass`` text by class: ``fp`` (FFMA, FMUL, FADD and
    their float64 forms), ``load`` (global), ``store`` (global stores, reductions and atomics),
    ``shuffle`` (warp shuffles: the channel sums), ``spill`` (local stores and loads), ``other``
    (integer and address arithmetic, moves, branches) and ``all``. Counted over the code, each
    instruction once (a loop body once)."""
    counts = dict.fromkeys([*_CLASSES, "other", "all"], 0)
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", line)
        if not m:
            continue
        op = m.group(1)
        cls = next((c for c, ops in _CLASSES.items() if op in ops), "other")
        counts[cls] += 1
        counts["all"] += 1
    return counts


def shape_values(key: str, channels: int) -> dict[str, int]:
    """The :data:`~.signatures.SHAPE_ARGS` of configuration ``key`` at ``channels`` channels:
    input 1 per channel, input 2 broadcast (one channel), weights per path and channel, input
    2's gradient summed over channels."""
    from .source import product_spec

    spec = product_spec(key)
    F = channels
    x1, x2, w, out = spec.in1_comps * F, spec.in2_comps, spec.n_paths * F, spec.n_out_blocks * F
    sizes = dict(F1S=1, F2S=0, F1C=F, F2C=1, F=F, x1_row=x1, x2_row=x2, w_row=w, out_row=out, go_row=out)
    return sizes | dict(g1_row=x1, g2_row=x2, gw_row=w, dx1_row=x1, dx2_row=x2, dw_row=w)


def resource_usage(
    key: str,
    dtype: str = "fp32",
    block_f: int = 64,
    dbwd_only: bool = False,
    maxnreg: int | None = None,
    only: str | None = None,
    instructions: bool = False,
    channels: int | None = None,
) -> dict[str, str]:
    """``{kernel variant: cuobjdump resource-usage line}`` for sm_90 (H100/H200).

    ``key``: product configuration ``"l1,l2,lout,symmetric,reduce"``; ``dtype``: ``fp32`` or
    ``fp64``; ``block_f``: channels per program (``num_warps = block_f // 32``); ``maxnreg``: the
    register cap per thread passed to ptxas (Triton's ``maxnreg`` option; ``None``: ptxas picks, at
    most 255), which trades spills for resident warps (65,536 registers per multiprocessor hold
    ``65536 // (32 * REG)`` warps); ``only``: just the variants whose label contains it;
    ``instructions``: each line also gives :func:`instruction_counts` of the cubin; ``channels``:
    the sizes of static-shape kernels (:func:`shape_values`; default ``block_f``).
    """
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_check needs TRITON_INTERPRET unset (the interpreter replaces @triton.jit)")
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .source import double_backward_module, product_module

    dts = {"fp32": tl.float32, "fp64": tl.float64}
    if dtype not in dts:
        raise ValueError(f"dtype must be one of {sorted(dts)}, got {dtype!r}")
    modules = {"product": product_module(key), "dbwd": double_backward_module(key)}
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    report = {}
    for which, sig, label, flags in _variants(dbwd_only):
        if only is not None and only not in label:
            continue
        signature = {a: ("*i64" if a in _INDEX else f"*{dtype}") if a.endswith("_ptr") else "i32" for a in sig.args}
        signature |= {c: "constexpr" for c in sig.constexprs}
        defaults = {
            c: v
            for c, v in (("SPLITS", 1), ("PREFETCH", True), ("W_SLOPE", False), ("W_TABLE", False), ("X1_ATOMIC", False))
            if c in sig.constexprs
        }
        sizes = {n: v for n, v in shape_values(key, channels or block_f).items() if n in sig.constexprs}
        constexprs = {**defaults, **flags, **sizes, "BLOCK_F": block_f, "DT": dts[dtype]}
        src = ASTSource(fn=getattr(modules[which], sig.name), signature=signature, constexprs=constexprs)
        options = dict(num_warps=max(1, block_f // 32)) | ({} if maxnreg is None else {"maxnreg": maxnreg})
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
            fh.write(kernel.asm["cubin"])
            fh.flush()
            usage = subprocess.run([str(tool), "--dump-resource-usage", fh.name], capture_output=True, text=True, check=True).stdout
            sass = subprocess.run([str(tool), "-sass", fh.name], capture_output=True, text=True, check=True).stdout if instructions else ""
        line = next(s for s in usage.splitlines() if "REG:" in s)
        report[label] = " ".join(f for f in line.split() if f.split(":")[0] in ("REG", "STACK", "LOCAL"))
        if instructions:
            report[label] += " " + " ".join(f"{c}:{n}" for c, n in instruction_counts(sass).items())
    if not report:
        labels = ", ".join(repr(v[2]) for v in _variants(dbwd_only))
        raise ValueError(f"only={only!r} matches no kernel variant; the labels: {labels}")
    return report


def linear_resource_usage(
    tiles: list[str], dtype: str = "fp32", n_groups: int = 3, key: str | None = None, kind: int = 0, pair_key: str | None = None
) -> dict[str, str]:
    """``{tile shape: resource usage}`` of the grouped matmul compiled for sm_90, for each
    ``FLASHCART_LINEAR_TILES`` value in ``tiles``. With ``key`` (a linear map) it is compiled for
    that map's launch ``kind`` as the launcher compiles it (``_linear_spec.unit_axes``, operands
    16-byte aligned), and the line also counts the global loads by width in bytes
    (``loads 16B:n 8B:m ...``, see :func:`global_loads`). With ``pair_key`` too, as the launch
    of the pair of ``key`` and ``pair_key`` (``flashcart::lin_pair``)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_check needs TRITON_INTERPRET unset (the interpreter replaces @triton.jit)")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .._linear_spec import N_COLS, launch_rows, linear_spec
    from .linear_kernel import default_tiles, grouped_matmul, kernel_unit_axes, kernel_unit_axes_of_rows, linear_tiles

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    report = {}
    for raw in tiles:
        t = linear_tiles(raw) or default_tiles(64, 64, dtype != "fp64")
        signature = {
            "a_ptr": f"*{dtype}",
            "b_ptr": f"*{dtype}",
            "c_ptr": f"*{dtype}",
            "table_ptr": "*i64",
            "n_rows": "i32",
            "c_split_stride": "i32",
            "a2_ptr": f"*{dtype}",
            "b2_ptr": f"*{dtype}",
            "c2_ptr": f"*{dtype}",
            "table2_ptr": "*i64",
        }
        constexprs = dict(
            N_GROUPS=n_groups,
            NCOL=N_COLS,
            BM=t.bm,
            BN=t.bn,
            BK=t.bk,
            USE_DOT=dtype != "fp64",
            SPLIT=1,
            PRECISION=t.precision,
            UNIT=0,
            ALIGN=1,
        )
        attrs = None
        if key is not None:
            constexprs["N_GROUPS"] = linear_spec(key).n_mixed
            constexprs["UNIT"], constexprs["ALIGN"] = kernel_unit_axes(key, kind, dtype != "fp64")
            # the pointers, as Triton specialises aligned tensors
            attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 6, 7, 8, 9)}
        constexprs["N_FIRST"] = constexprs["N_GROUPS"]  # one map
        if key is not None and pair_key is not None:
            constexprs["N_GROUPS"] += linear_spec(pair_key).n_mixed
            rows = launch_rows(key)[kind] + launch_rows(pair_key)[kind]
            constexprs["UNIT"], constexprs["ALIGN"] = kernel_unit_axes_of_rows(rows, dtype != "fp64")
        signature |= {c: "constexpr" for c in constexprs}
        src = ASTSource(fn=grouped_matmul, signature=signature, constexprs=constexprs, attrs=attrs)
        options = {"num_warps": t.warps} | ({} if t.stages is None else {"num_stages": t.stages})
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
            fh.write(kernel.asm["cubin"])
            fh.flush()
            usage = subprocess.run([str(tool), "--dump-resource-usage", fh.name], capture_output=True, text=True, check=True).stdout
        line = next(s for s in usage.splitlines() if "REG:" in s)
        text = " ".join(f for f in line.split() if f.split(":")[0] in ("REG", "STACK", "LOCAL"))
        if key is not None:
            text += " loads " + " ".join(f"{b}B:{n}" for b, n in sorted(global_loads(kernel.asm["ptx"]).items(), reverse=True))
        report[raw or "default"] = text
    return report


def global_loads(ptx: str) -> dict[int, int]:
    """``{bytes: count}`` of the global-memory reads in ``ptx`` by width: ``cp.async`` copies into
    shared memory and plain ``ld.global`` loads (the grouped matmul's launch-table entries are
    8-byte plain loads; its operand tiles are copied)."""
    counts: dict[int, int] = {}
    for m in re.finditer(r"cp\.async\.c[ag]\.shared\.global \[[^\]]*\], \[[^\]]*\], 0x([0-9a-f]+)", ptx):
        b = int(m.group(1), 16)
        counts[b] = counts.get(b, 0) + 1
    for m in re.finditer(r"ld\.global(?:\.\w+)*?(?:\.v(\d))?\.(?:f|b)(32|64)\b", ptx):
        b = int(m.group(1) or 1) * int(m.group(2)) // 8
        counts[b] = counts.get(b, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--key", default="2,3,2,0,0", help="product configuration l1,l2,lout,symmetric,reduce")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "fp64"])
    parser.add_argument("--block-f", type=int, default=64)
    parser.add_argument("--dbwd-only", action="store_true", help="only the fused double-backward kernels")
    parser.add_argument("--maxnreg", type=int, default=None, help="register cap per thread (Triton's maxnreg option)")
    parser.add_argument("--only", default=None, metavar="TEXT", help="only the kernel variants whose label contains TEXT")
    parser.add_argument("--instructions", action="store_true", help="also count the machine instructions by class")
    parser.add_argument("--channels", type=int, default=None, help="channels of static-shape kernels (FLASHCART_STATIC_SHAPES=1)")
    parser.add_argument("--linear-tiles", nargs="+", help="compile the grouped matmul with these FLASHCART_LINEAR_TILES values instead")
    parser.add_argument(
        "--linear-key", default=None, help="with --linear-tiles: compile for this map's contiguous axes (e.g. '3|3|64|64|4,6,7,6')"
    )
    parser.add_argument("--linear-kind", type=int, default=0, choices=[0, 1, 2], help="forward, input gradient, weight gradient")
    parser.add_argument("--linear-pair-key", default=None, help="with --linear-key: compile the launch of that map paired with this one")
    args = parser.parse_args(argv)
    if args.linear_pair_key is not None and (args.linear_key is None or args.linear_kind == 2):
        parser.error("--linear-pair-key needs --linear-key and --linear-kind 0 or 1 (pairs run forwards and input gradients)")
    for opt, value in (("--linear-key", args.linear_key), ("--linear-pair-key", args.linear_pair_key)):
        if value is None:
            continue
        from .._linear_spec import linear_spec

        try:
            linear_spec(value)
        except ValueError as exc:
            parser.error(f"{opt} {value!r} is not a linear map key 'in_l|out_l|F_in|F_out|p0,p1,...': {exc}")
    if args.linear_tiles:
        usages = linear_resource_usage(
            args.linear_tiles, args.dtype, key=args.linear_key, kind=args.linear_kind, pair_key=args.linear_pair_key
        )
        for label, usage in usages.items():
            print(f"linear {label:25s} {usage}")
        return
    try:
        usage = resource_usage(
            args.key, args.dtype, args.block_f, args.dbwd_only, args.maxnreg, args.only, args.instructions, args.channels
        )
    except ValueError as exc:
        parser.error(str(exc))
    for label, line in usage.items():
        print(f"{label:32s} {line}")


if __name__ == "__main__":
    main()
