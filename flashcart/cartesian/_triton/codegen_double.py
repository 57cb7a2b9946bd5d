"""Emit the fused double backward of the tensor product as Triton kernels.

The backward ``(g1, g2, gw) = tp_bwd(go, x1, x2, w)`` is linear in each operand, so with
cotangents ``gg1, gg2, ggw`` of its outputs and, per path ``p``, the product ``B_p`` and its
vector-Jacobian products ``A_p`` (towards input 1) and ``C_p`` (towards input 2):

* ``d go = sum_p B_p(w_p gg1 + ggw_p x1, x2) + w_p B_p(x1, gg2)``
* ``d x2 = sum_p C_p(go, w_p gg1 + ggw_p x1)``
* ``d w_p = <go, B_p(gg1, x2)> + <go, B_p(x1, gg2)>``
* ``d x1 = sum_p A_p(go, w_p gg2 + ggw_p x2)``

(each term present only with its cotangent). Two kernels evaluate these with each operand
loaded once per edge:

* ``tp_dbwd_row``: one program per receiver (convolution) or row (dense) and channel block.
  It loads the receiver's ``go`` row once, walks the receiver's edges (CSR ``rowptr``) and
  per edge gathers the sender rows of ``x1``/``gg1`` and the edge rows of ``x2``/``gg2``/
  ``w``/``ggw``: it accumulates ``d go`` in registers (one store per receiver) and stores the
  edge's ``d x2`` and ``d w`` (edges are grouped by receiver, so every edge row is written by
  exactly one program, without atomics; with ``W_ROWS`` the weight term is added atomically into
  the edge's weight row instead, and ``ggw`` is read per weight row). In dense mode it also
  stores ``d x1``.
* ``tp_dbwd_x1_csr``: convolution-mode ``d x1``, one program per sender walking that
  sender's edges (``perm`` sorts edges by sender), again without atomics. With ``X1_ATOMIC``
  the receiver pass adds each edge's ``d x1`` term into its sender's row instead (atomics; the
  weights and their cotangent are then read once per edge, not twice), and this pass is not run.

With ``ROW_GROUPS`` (convolution mode) the receiver pass splits its paths by output rank over
grid axis 2: a program holds one rank's output cotangent, accumulators and weight columns
(fewer registers), and stores its part of ``d x2`` as a partial sum the launcher adds up.

Absent cotangents and results nobody needs are compiled out through ``tl.constexpr`` flags
(``HAS_*``, ``NEED_*``); the launcher clears a ``NEED_*`` flag whose terms are all absent, so a
kernel never evaluates an empty sum. Parameter lists come from ``signatures``.
"""

from __future__ import annotations

from .._codegen_torch import bilinear_lines
from .._expressions import product_table, product_vjp_a_table, product_vjp_b_table
from .._paths import Path
from . import codegen
from .codegen import (
    _I,
    _lit,
    _load,
    _ranks,
    listed_mask,
    out_offsets,
    rank_groups,
    receiver_prologue,
    sender_edges_head,
    sender_edges_next,
    sender_edges_prologue,
    sender_prologue,
    weight_grad_out,
    weight_row,
)
from .signatures import STATIC_SHAPES, TP_DBWD_ROW, TP_DBWD_X1_CSR

__all__ = ["generate_double_backward_source"]

# Register names in the generated code: a/b: x1/x2 components, c/d: gg1/gg2 components,
# w/q: weights and their cotangent per path, go/gop: output cotangent (by block / by path).


def _either(indent: str, flag1: str, flag2: str, both: list[str], only1: list[str], only2: list[str]) -> list[str]:
    """Constexpr branches for a sum of two optional terms (the caller knows one is present)."""
    i2 = indent + _I
    return (
        [f"{indent}if {flag1} and {flag2}:"]
        + [i2 + s for s in both]
        + [f"{indent}elif {flag1}:"]
        + [i2 + s for s in only1]
        + [f"{indent}else:"]
        + [i2 + s for s in only2]
    )


def _combine(indent: str, out: str, n: int, flag1: str, w1: str, v1: str, flag2: str, w2: str, v2: str) -> list[str]:
    """``out{i} = w1 * v1{i} + w2 * v2{i}`` for ``i < n``, each term only with its flag."""
    both = [f"{out}{i} = {w1} * {v1}{i} + {w2} * {v2}{i}" for i in range(n)]
    only1 = [f"{out}{i} = {w1} * {v1}{i}" for i in range(n)]
    only2 = [f"{out}{i} = {w2} * {v2}{i}" for i in range(n)]
    return _either(indent, flag1, flag2, both, only1, only2)


def _comps(ranks) -> list[tuple[int, int]]:
    return [(l, i) for l in ranks for i in range(2 * l + 1)]


def _zeros(indent: str, prefix: str, ranks) -> list[str]:
    return [f"{indent}{prefix}{l}_{i} = tl.zeros([BLOCK_F], dtype=DT)" for l, i in _comps(ranks)]


def _store_input_grad(indent: str, ptr: str, prefix: str, ranks, l_max: int, red: str, group: int = 0, atomic: bool = False) -> list[str]:
    """Store every component ``0..(l_max+1)^2`` of an input gradient (zeros for ranks without
    paths): per channel, or with ``red`` set the channel-block sum in column block ``pf``.
    Path group ``group`` (``ROW_GROUPS``) writes its partial sum in column block ``group``.
    With ``atomic`` the values are added (``tl.atomic_add``, relaxed) into a zeroed row instead,
    and components without paths are skipped."""
    n = (l_max + 1) ** 2
    values = [(l * l + i, f"{prefix}{l}_{i}" if l in ranks else "tl.zeros([BLOCK_F], dtype=DT)") for l, i in _comps(range(l_max + 1))]
    if atomic:
        values = [(k, v) for k, v in values if not v.startswith("tl.zeros")]

    def write(address: str, value: str, mask: str = "") -> str:
        return f'tl.atomic_add({address}, {value}{mask}, sem="relaxed")' if atomic else f"tl.store({address}, {value}{mask})"

    col = f"({group} * tl.num_programs(1) + pf) * {n}" if group else f"pf * {n}"
    L = [f"{indent}if {red}:"]
    # with unmasked loads (codegen._channels_clamped) the lanes past F hold the last channel again
    summed = [(k, f"tl.where(fm, {v}, 0.0)" if codegen._CLAMP and not v.startswith("tl.zeros") else v) for k, v in values]
    L += [f"{indent}{_I}" + write(f"{ptr} + {col} + {k}", f"tl.sum({v}, axis=0)") for k, v in summed]
    L += [f"{indent}else:"]
    base = f"{group * n} * F + " if group else ""
    L += [f"{indent}{_I}" + write(f"{ptr} + {base}{k} * F + f", v, ", mask=fm") for k, v in values]
    return L


def _load_rank_rows(indent: str, paths, attr: str, name: str, ptr: str, width: str, fvec: str) -> list[str]:
    return [indent + _load(f"{name}{l}_{i}", ptr, f"{l * l + i} * {width}", fvec) for l, i in _comps(_ranks(paths, attr))]


def _load_paths(indent: str, sel, name: str, ptr: str, mask: str = "fm") -> list[str]:
    return [indent + _load(f"{name}{pi}", ptr, f"{pi} * F", "f", mask) for pi, _ in sel]


def _load_ggw(indent: str, sel) -> list[str]:
    """The weight cotangent ``q{p}`` of edge ``e64``: per weight row with ``W_ROWS`` (row ``wr``,
    zero unless the row lists the edge, ``lwm``), else per edge."""
    I2 = indent + _I
    return (
        [f"{indent}if W_ROWS:", f"{I2}pq = ggw_ptr + wr * w_row"]
        + _load_paths(I2, sel, "q", "pq", "lwm")
        + [f"{indent}else:", f"{I2}pq = ggw_ptr + e64 * w_row"]
        + _load_paths(I2, sel, "q", "pq")
    )


def _alias_go(indent: str, sel, offsets) -> list[str]:
    return [f"{indent}gop{pi}_{c} = go{offsets[(pi, c)]}" for pi, p in sel for c in range(2 * p.l_out + 1)]


def _blocks(sel, offsets) -> list[int]:
    """Output channel blocks the selected paths write."""
    return sorted({offsets[(pi, c)] for pi, p in sel for c in range(2 * p.l_out + 1)})


def _bilinear(indent: str, table, u: str, v: str, out: str) -> list[str]:
    return [indent + s for s in bilinear_lines(table, u, v, out, _lit)]


def _u_side(indent: str, pi: int, p: Path) -> list[str]:
    """``u = w_p gg1 + ggw_p x1`` (input-1 side of ``d go`` and ``d x2``)."""
    return _combine(indent, f"u{pi}_", 2 * p.l1 + 1, "HAS_GG1", f"w{pi}", f"c{p.l1}_", "HAS_GGW", f"q{pi}", f"a{p.l1}_")


def _m_side(indent: str, pi: int, p: Path) -> list[str]:
    """``m = w_p gg2 + ggw_p x2`` (input-2 side of ``d x1``)."""
    return _combine(indent, f"m{pi}_", 2 * p.l2 + 1, "HAS_GG2", f"w{pi}", f"d{p.l2}_", "HAS_GGW", f"q{pi}", f"b{p.l2}_")


def _d_go(indent: str, sel, offsets) -> list[str]:
    I2 = indent + _I
    L = []
    for pi, p in sel:
        table, n_out = product_table(p.l1, p.l2, p.l_out), 2 * p.l_out + 1
        L.append(f"{indent}if HAS_GG1 or HAS_GGW:")
        L += _u_side(I2, pi, p)
        L += _bilinear(I2, table, f"u{pi}_", f"b{p.l2}_", f"s{pi}_")
        L += [f"{I2}acc{offsets[(pi, c)]} += s{pi}_{c}" for c in range(n_out)]
        L.append(f"{indent}if HAS_GG2:")
        L += _bilinear(I2, table, f"a{p.l1}_", f"d{p.l2}_", f"r{pi}_")
        L += [f"{I2}acc{offsets[(pi, c)]} += w{pi} * r{pi}_{c}" for c in range(n_out)]
    return L


def _d_x2(indent: str, sel, in2_l_max: int, group: int) -> list[str]:
    ranks = _ranks([p for _, p in sel], "l2")
    L = _zeros(indent, "h", ranks)
    for pi, p in sel:
        L += _u_side(indent, pi, p)
        L += _bilinear(indent, product_vjp_b_table(p.l1, p.l2, p.l_out), f"gop{pi}_", f"u{pi}_", f"y{pi}_")
        L += [f"{indent}h{p.l2}_{j} += y{pi}_{j}" for j in range(2 * p.l2 + 1)]
    L.append(f"{indent}pdx2 = dx2_ptr + e64 * dx2_row")
    return L + _store_input_grad(indent, "pdx2", "h", ranks, in2_l_max, "RED_X2", group)


def _d_w(indent: str, sel) -> list[str]:
    I2 = indent + _I
    L = []
    for pi, p in sel:
        table, n_out = product_table(p.l1, p.l2, p.l_out), 2 * p.l_out + 1
        L.append(f"{indent}if HAS_GG1:")
        L += _bilinear(I2, table, f"c{p.l1}_", f"b{p.l2}_", f"z{pi}_")
        L.append(f"{indent}if HAS_GG2:")
        L += _bilinear(I2, table, f"a{p.l1}_", f"d{p.l2}_", f"r{pi}_")
        sz = " + ".join(f"gop{pi}_{c} * z{pi}_{c}" for c in range(n_out))
        sr = " + ".join(f"gop{pi}_{c} * r{pi}_{c}" for c in range(n_out))
        L += _either(indent, "HAS_GG1", "HAS_GG2", [f"dwp = {sz} + {sr}"], [f"dwp = {sz}"], [f"dwp = {sr}"])
        L.append(f"{indent}if SHARED_W:")
        L.append(f"{I2}dwa{pi} += dwp")
        L.append(f"{indent}else:")
        L += weight_grad_out(I2, "dw_ptr", "e64", "dw_row", pi, "dwp")
    return L


def _d_x1_terms(indent: str, sel) -> list[str]:
    """Accumulate ``g += sum_p A_p(go, w_p gg2 + ggw_p x2)`` (``g`` zeroed by the caller)."""
    L = []
    for pi, p in sel:
        L += _m_side(indent, pi, p)
        L += _bilinear(indent, product_vjp_a_table(p.l1, p.l2, p.l_out), f"gop{pi}_", f"m{pi}_", f"n{pi}_")
        L += [f"{indent}g{p.l1}_{i} += n{pi}_{i}" for i in range(2 * p.l1 + 1)]
    return L


def _row_body(indent: str, sel, offsets, in1_l_max: int, in2_l_max: int, group: int, dense_x1: bool) -> list[str]:
    """The receiver/row pass over the selected paths ``sel`` (``[(path index, path)]``)."""
    I, II, III = indent, indent + _I, indent + _I * 2
    paths = [p for _, p in sel]
    blocks = _blocks(sel, offsets)
    L = [f"{I}if NEED_X1 or NEED_X2 or NEED_W:", f"{II}pg = go_ptr + row * go_row"]
    L += [II + _load(f"go{k}", "pg", f"{k} * F", "f") for k in blocks]
    L += _alias_go(II, sel, offsets)
    L.append(f"{I}if NEED_GO:")
    L += [f"{II}acc{k} = tl.zeros([BLOCK_F], dtype=DT)" for k in blocks]
    L.append(f"{I}if NEED_W and SHARED_W:")
    L += [f"{II}dwa{pi} = tl.zeros([BLOCK_F], dtype=DT)" for pi, _ in sel]
    # PREFETCH: each step loads the next edge's sender (src_a) after its own operand loads, so
    # they do not wait on the dependent index load
    L += [
        f"{I}if CONV and PREFETCH:",
        f"{II}s0 = tl.cast(start, tl.int64)",
        f"{II}src_a = tl.load(send_ptr + s0, mask=s0 < end, other=0)",
        f"{I}for e in range(start, end):",
        f"{II}e64 = tl.cast(e, tl.int64)",
        f"{II}if CONV and PREFETCH:",
        f"{III}src = src_a",
        f"{II}elif CONV:",
        f"{III}src = tl.load(send_ptr + e64)",
        f"{II}else:",
        f"{III}src = e64",
        f"{II}pa = x1_ptr + src * x1_row",
        f"{II}pb = x2_ptr + e64 * x2_row",
        *weight_row(II, "e64"),
        f"{II}if W_ROWS and (HAS_GGW or NEED_W):",
        *listed_mask(III, "e64"),
    ]
    # x1, x2 and w always exist; loads a configuration does not use are removed by the compiler
    L += _load_rank_rows(II, paths, "l1", "a", "pa", "F1C", "f1")
    L += _load_rank_rows(II, paths, "l2", "b", "pb", "F2C", "f2")
    L += _load_paths(II, sel, "w", "pw")
    L += [f"{II}if HAS_GG1:", f"{III}pc = gg1_ptr + src * x1_row"]
    L += _load_rank_rows(III, paths, "l1", "c", "pc", "F1C", "f1")
    L += [f"{II}if HAS_GG2:", f"{III}pd = gg2_ptr + e64 * x2_row"]
    L += _load_rank_rows(III, paths, "l2", "d", "pd", "F2C", "f2")
    L += [f"{II}if HAS_GGW:"]
    L += _load_ggw(III, sel)
    L += [f"{II}if CONV and PREFETCH:", f"{III}src_a = tl.load(send_ptr + e64 + 1, mask=e64 + 1 < end, other=0)"]
    L.append(f"{II}if NEED_GO:")
    L += _d_go(III, sel, offsets)
    L.append(f"{II}if NEED_X2:")
    L += _d_x2(III, sel, in2_l_max, group)
    L.append(f"{II}if NEED_W:")
    L += _d_w(III, sel)
    if dense_x1:
        # dense mode stores each row's d x1; convolution mode adds each edge's term into its
        # sender's row with X1_ATOMIC (else tp_dbwd_x1_csr walks the senders)
        L.append(f"{II}if NEED_X1:")
        IV = III + _I
        ranks1 = _ranks(paths, "l1")
        L += _zeros(III, "g", ranks1)
        L += _d_x1_terms(III, sel)
        L.append(f"{III}pdx1 = dx1_ptr + src * dx1_row")
        L.append(f"{III}if X1_ATOMIC:")
        L += _store_input_grad(IV, "pdx1", "g", ranks1, in1_l_max, "RED_X1", atomic=True)
        L.append(f"{III}else:")
        L += _store_input_grad(IV, "pdx1", "g", ranks1, in1_l_max, "RED_X1")
    L.append(f"{I}if NEED_GO:")
    L.append(f"{II}pdgo = dgo_ptr + orow * go_row")
    L += [f"{II}tl.store(pdgo + {k} * F + f, acc{k}, mask=fm)" for k in blocks]
    L.append(f"{I}if NEED_W and SHARED_W:")
    L += [f"{II}tl.store(dw_ptr + orow * dw_row + {pi} * F + f, dwa{pi}, mask=fm)" for pi, _ in sel]
    return L


def _row_kernel(paths, offsets, n_out, in1_l_max, in2_l_max) -> list[str]:
    I, II = _I, _I * 2
    L = TP_DBWD_ROW.header(I)
    L += receiver_prologue(I)
    L += [
        # convolution mode can split the paths by output rank over grid axis 2: each program
        # holds the output cotangent and accumulators of one rank only (fewer registers); the
        # input-2 result is then a partial sum per group (column block ``group``)
        f"{I}if ROW_GROUPS:",
        f"{II}grp = tl.program_id(2)",
    ]
    for g, idx in enumerate(rank_groups(paths)):
        L.append(f"{II}if grp == {g}:")
        L += _row_body(II + _I, [(i, paths[i]) for i in idx], offsets, in1_l_max, in2_l_max, g, dense_x1=False)
    L.append(f"{I}else:")
    L += _row_body(II, list(enumerate(paths)), offsets, in1_l_max, in2_l_max, 0, dense_x1=True)
    return L


def _x1_csr_kernel(paths, offsets, n_out, in1_l_max) -> list[str]:
    I, II, III = _I, _I * 2, _I * 3
    L = TP_DBWD_X1_CSR.header(I)
    L += sender_prologue(I)
    ranks1 = _ranks(paths, "l1")
    L += _zeros(I, "g", ranks1)
    L += sender_edges_prologue(I)
    L += [
        f"{I}for k in range(start, end):",
        *sender_edges_head(II, "e64"),
        f"{II}pg = go_ptr + gi * go_row",
        f"{II}pb = x2_ptr + e64 * x2_row",
        *weight_row(II, "e64"),
    ]
    L += [II + _load(f"go{k}", "pg", f"{k} * F", "f") for k in range(n_out)]
    L += _alias_go(II, list(enumerate(paths)), offsets)
    L += [f"{II}if HAS_GGW:"]
    L += _load_rank_rows(III, paths, "l2", "b", "pb", "F2C", "f2")
    L += [f"{III}if W_ROWS:"]
    L += listed_mask(III + _I, "e64")
    L += _load_ggw(III, list(enumerate(paths)))
    L += [f"{II}if HAS_GG2:"]
    L += _load_paths(III, list(enumerate(paths)), "w", "pw")
    L += [f"{III}pd = gg2_ptr + e64 * x2_row"]
    L += _load_rank_rows(III, paths, "l2", "d", "pd", "F2C", "f2")
    L += sender_edges_next(II)
    L += _d_x1_terms(II, list(enumerate(paths)))
    L.append(f"{I}pdx1 = dx1_ptr + oj * dx1_row")
    L += _store_input_grad(I, "pdx1", "g", ranks1, in1_l_max, "RED_X1")
    return L


def generate_double_backward_source(paths: list[Path], in1_l_max: int, in2_l_max: int, out_l_max: int, reduce: bool) -> str:
    """Source of the fused double-backward Triton module for one tensor-product configuration."""
    offsets, n_out = out_offsets(paths, out_l_max, reduce)
    lines = [
        '"""Generated by FlashCart: fused double backward of the Triton tensor product. Do not edit."""',
        "import triton",
        "import triton.language as tl",
        f"N_OUT_BLOCKS = {n_out}",
        f"N_ROW_GROUPS = {len(rank_groups(paths))}",
        "",
    ]
    with codegen._channels_clamped(STATIC_SHAPES):  # unmasked loads with static shapes, as the products'
        lines += _row_kernel(paths, offsets, n_out, in1_l_max, in2_l_max) + [""]
        lines += _x1_csr_kernel(paths, offsets, n_out, in1_l_max) + [""]
    return "\n".join(lines) + "\n"
