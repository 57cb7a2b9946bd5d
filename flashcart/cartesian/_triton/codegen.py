"""Emit Triton kernels from the symbolic tables in ``_expressions``.

One generated module per tensor-product configuration (input/output rank limits,
symmetry, path reduction) holds three kernels:

* ``tp_fwd``: output rows. In convolution mode one program owns one receiver and a block
  of channels, walks that receiver's edges (CSR ``rowptr``), gathers sender rows, and keeps
  the messages in registers: one store per output element, no atomics, no zero-fill.
  In dense mode the same kernel walks a single row.
* ``tp_bwd_edge``: per row/edge, the gradients of input 2 and of the weights (and of
  input 1 in dense mode), only those requested (``NEED_*`` constexpr flags).
* ``tp_bwd_x1_csr``: convolution-mode gradient of input 1, one program per sender walking
  that sender's edges (a permutation sorting edges by sender), again without atomics.
* ``tp_bwd_csr``: the two above in one pass (convolution mode, when input 1's gradient is
  needed with another): per sender, input 1's gradient, and for each of its edges those of
  input 2 and the weights. Each edge's output cotangent, input 2 and weights are read once, and
  the sender's row of input 1 once for all its edges, instead of twice and once per edge.

With ``W_SLOPE`` the two kernels that produce the weights' gradient contract it instead with the
weights' slopes ``dw/dt`` (weights that are a function of one variable per row, such as tabulated
radial MLPs) and write one scalar per edge or weight row, the gradient of ``t``. With ``W_TABLE``
the four first-order kernels read the weights as a cubic table of ``t`` instead
(:mod:`flashcart.cartesian._weight_table`): per edge the interval of ``t``, its coefficients, the
cubic where the weights are read and (``W_SLOPE``) its derivative where the gradient is contracted.

Parameter lists come from ``signatures`` (shared with the launcher in ``ops.py``, which passes
every argument by name). Inputs with one channel are broadcast by a zero channel stride; gradients are produced
per channel and reduced by the caller. The double backward is composed of these kernels
with substituted operands (every map here is bilinear), see ``ops.py``.

A second module, ``expansion``, holds the direction-expansion forward, its
vector-Jacobian product and the second-order kernel (Jacobian- and Hessian-vector products).
"""

from __future__ import annotations

import contextlib
from fractions import Fraction

from .._codegen_torch import bilinear_lines, literal, monomial
from .._expressions import (
    expansion_gradient_table,
    expansion_table,
    product_table,
    product_vjp_a_table,
    product_vjp_b_table,
)
from .._paths import Path
from .signatures import EXPANSION_FWD, EXPANSION_SECOND, EXPANSION_VJP, STATIC_SHAPES, TP_BWD_CSR, TP_BWD_EDGE, TP_BWD_X1_CSR, TP_FWD

__all__ = ["generate_product_source", "generate_expansion_source", "out_offsets", "rank_groups"]

_I = "    "

# While the product kernels of a static-shape module are generated (:func:`generate_product_source`
# with ``signatures.STATIC_SHAPES``): loads under the channel mask ``fm`` are emitted unmasked at
# the clamped channels (``fc``; ``f1``/``f2`` from it), the lanes past ``F`` loading the last channel
# again, and every channel sum masks those lanes instead. A masked load first sets its masked lanes
# (an instruction per load, and registers to hold them).
_CLAMP = False


@contextlib.contextmanager
def _channels_clamped(on: bool):
    global _CLAMP
    saved, _CLAMP = _CLAMP, on
    try:
        yield
    finally:
        _CLAMP = saved


def _channel_lines(I: str, f1: bool = True, f2: bool = True) -> list[str]:
    """``f1``/``f2``, the input channels (``fc`` and the clamped ones while :data:`_CLAMP`)."""
    base = "f"
    L = []
    if _CLAMP:
        L.append(f"{I}fc = tl.minimum(f, F - 1)")
        base = "fc"
    return L + ([f"{I}f1 = {base} * F1S"] if f1 else []) + ([f"{I}f2 = {base} * F2S"] if f2 else [])


def _lit(c: Fraction, block: str = "BLOCK_F") -> str:
    """A constant of the kernel's dtype ``DT``: Python floats would be rounded to float32."""
    return f"tl.full([{block}], {literal(c)}, DT)"


def _lit_rows(c: Fraction) -> str:
    return _lit(c, "BLOCK")


def out_offsets(paths: list[Path], out_l_max: int, reduce: bool) -> tuple[dict[tuple[int, int], int], int]:
    """Channel-block index of output component ``c`` of path ``p`` (units of ``F``).

    Returns ``({(path_index, c): block}, n_blocks)``; with ``reduce`` the paths of one rank
    share blocks (and ranks without paths still own zero blocks).
    """
    per_rank = [[i for i, p in enumerate(paths) if p.l_out == l] for l in range(out_l_max + 1)]
    offsets, base = {}, 0
    for l, idxs in enumerate(per_rank):
        n = 1 if reduce else len(idxs)
        for q, pi in enumerate(idxs):
            for c in range(2 * l + 1):
                offsets[(pi, c)] = base + c * n + (0 if reduce else q)
        base += (2 * l + 1) * n
    return offsets, base


def weight_row(indent: str, edge: str, ptr: str = "pw", table: bool = False) -> list[str]:
    """``{ptr}``: the weight row of edge/row ``edge`` (int64): row ``wr = widx[edge]`` with ``W_INDEX``
    (several edges sharing one row, e.g. the two edges of a pair of reverse edges), else ``edge``.
    ``table``: the kernel has ``W_TABLE`` (:func:`table_row`)."""
    lines = [
        f"{indent}if W_INDEX:",
        f"{indent}{_I}wr = tl.load(widx_ptr + {edge})",
        f"{indent}else:",
        f"{indent}{_I}wr = {edge}",
    ]
    return lines + (table_row(indent, ptr) if table else [f"{indent}{ptr} = w_ptr + wr * w_row"])


def table_prologue(indent: str) -> list[str]:
    """``W_TABLE``: the table's cutoff ``tab_r`` and intervals per unit of ``t`` ``tab_scale``
    (``geom_ptr``, the kernel's dtype: Triton passes Python floats as float32)."""
    return [f"{indent}if W_TABLE:", f"{indent}{_I}tab_r = tl.load(geom_ptr)", f"{indent}{_I}tab_scale = tl.load(geom_ptr + 1)"]


def table_row(indent: str, ptr: str = "pw", mask: str | None = None) -> list[str]:
    """``{ptr}``: where weight row ``wr``'s weights are. Plain: row ``wr`` of ``w_ptr``. With
    ``W_TABLE`` the weights are a cubic table ``[tab_n, 4, w_row]`` (:mod:`flashcart.cartesian._weight_table`)
    in the row's variable ``t[wr]``: ``{ptr}`` is its interval's coefficient row, ``ts`` the
    position in the interval, ``tin`` 1 below the cutoff, else 0 (the last interval's end is
    evaluated, then masked). ``mask``: a scalar condition for the ``t`` load (past a walk's end)."""
    II = indent + _I
    masked = f", mask={mask}, other=0.0" if mask else ""
    return [
        f"{indent}if W_TABLE:",
        f"{II}tv = tl.load(t_ptr + wr{masked})",
        f"{II}tx = tl.minimum(tv, tab_r) * tab_scale",
        f"{II}tk = tl.minimum(tl.maximum(tl.floor(tx), 0.0), tab_n - 1.0)",
        f"{II}ts = tx - tk",
        f"{II}tin = tl.where(tv < tab_r, 1.0, 0.0)",
        f"{II}{ptr} = w_ptr + tl.cast(tk, tl.int64) * (4 * w_row)",
        f"{indent}else:",
        f"{II}{ptr} = w_ptr + wr * w_row",
    ]


def load_weight(
    indent: str, name: str, pi: int, mask: str | None = "fm", ptr: str = "pw", when: str = "always", fvec: str = "f"
) -> list[str]:
    """``{name}``: path ``pi``'s weights of the row at ``{ptr}`` (:func:`table_row`), with
    ``W_TABLE`` the table's cubic at ``ts`` by Horner's rule (as ``_weight_table.evaluate``).
    ``when``: ``"table"`` emits only the table's branch, ``"plain"`` only the other: kernels
    that hold plain weights across a step re-evaluate a table's where they use it, rather than
    hold four times the loads in flight."""
    II = indent + _I

    masked = "" if mask is None or (_CLAMP and mask == "fm") else f", mask={mask}, other=0.0"
    fvec = _clamped(fvec) if not masked else fvec

    def c(j: int) -> str:
        return f"tl.load({ptr} + {j} * w_row + {pi} * F + {fvec}{masked})"

    table = [f"{indent}if W_TABLE:", f"{II}{name} = ({c(0)} + ts * ({c(1)} + ts * ({c(2)} + ts * {c(3)}))) * tin"]
    plain = f"{II}" + _load(name, ptr, f"{pi} * F", fvec, mask)
    if when == "table":
        return table
    if when == "plain":
        return [f"{indent}if not W_TABLE:", plain]
    return table + [f"{indent}else:", plain]


def load_slope(indent: str, name: str, pi: int) -> list[str]:
    """``{name}``: path ``pi``'s slopes ``dw/dt`` of weight row ``wr`` (``W_SLOPE``): the table's
    derivative at ``ts`` with ``W_TABLE`` (coefficients re-read: cached), else ``ws_ptr``'s row."""
    II = indent + _I

    def c(j: int) -> str:
        return f"tl.load(pw + {j} * w_row + {pi} * F + fc)" if _CLAMP else f"tl.load(pw + {j} * w_row + {pi} * F + f, mask=fm, other=0.0)"

    return [
        f"{indent}if W_TABLE:",
        f"{II}{name} = ({c(1)} + ts * (2.0 * {c(2)} + 3.0 * ts * {c(3)})) * tab_scale * tin",
        f"{indent}else:",
        f"{II}" + _load(name, "ws_ptr", f"wr * w_row + {pi} * F", "f"),
    ]


def listed_mask(indent: str, edge: str) -> list[str]:
    """Lines defining ``lwm`` (emitted under ``W_ROWS``): the channels ``fm`` where edge ``edge``
    (int64) is listed by its weight row ``wr`` (``wrows[wr]``, two entries, ``-1`` for none), else
    no channel. Listed edges are those whose weight gradients the row sums, and those that get the
    row's cotangent in the second derivative. A vector comparison: the interpreter cannot combine
    a scalar condition with a vector mask."""
    return [
        f"{indent}wl0 = tl.load(wrows_ptr + 2 * wr)",
        f"{indent}wl1 = tl.load(wrows_ptr + 2 * wr + 1)",
        f"{indent}lwm = fm & ((f * 0 + wl0 == {edge}) | (f * 0 + wl1 == {edge}))",
    ]


def weight_grad_out(indent: str, ptr: str, base: str, row: str, pi: int, value: str) -> list[str]:
    """Lines writing path ``pi``'s weight gradient ``value`` of edge ``base``: with ``W_ROWS`` added
    (atomically) into its weight row (``wr``, under ``lwm``) of ``{ptr}`` (rows of ``{row}``
    elements, zeroed by the caller), else stored in row ``{base}``. A row sums at most two edges
    into zero, and ``0 + a + b == 0 + b + a`` exactly in floating point, so the result does not
    depend on the order of the additions."""
    return [
        f"{indent}if W_ROWS:",
        f'{indent}{_I}tl.atomic_add({ptr} + wr * {row} + {pi} * F + f, {value}, mask=lwm, sem="relaxed")',
        f"{indent}else:",
        f"{indent}{_I}tl.store({ptr} + {base} * {row} + {pi} * F + f, {value}, mask=fm)",
    ]


def _load(name: str, ptr: str, index: str, fvec: str, mask: str | None = "fm") -> str:
    """``{name} = tl.load(...)`` at ``ptr + index + fvec``, masked lanes 0 (``mask=None``: unmasked)."""
    if mask is None or (_CLAMP and mask == "fm"):
        return f"{name} = tl.load({ptr} + {index} + {_clamped(fvec)})"
    return f"{name} = tl.load({ptr} + {index} + {fvec}, mask={mask}, other=0.0)"


def _clamped(fvec: str) -> str:
    """The channel vector of an unmasked load: ``fc`` for ``f`` while :data:`_CLAMP` (``f1``/``f2``
    are clamped where they are defined)."""
    return "fc" if _CLAMP and fvec == "f" else fvec


def _ranks(paths, attr):
    return sorted({getattr(p, attr) for p in paths})


def _load_inputs(lines, paths, indent, a_ptr="pa", b_ptr="pb", need_a=True, need_b=True, prefix="", mask="fm"):
    """Append loads of input 1's components ``{prefix}a{l}_{i}`` (from ``a_ptr``) and input 2's
    ``{prefix}b{l}_{j}`` (from ``b_ptr``) under ``mask``."""
    if need_a:
        for l in _ranks(paths, "l1"):
            for i in range(2 * l + 1):
                lines.append(indent + _load(f"{prefix}a{l}_{i}", a_ptr, f"{l * l + i} * F1C", "f1", mask))
    if need_b:
        for l in _ranks(paths, "l2"):
            for j in range(2 * l + 1):
                lines.append(indent + _load(f"{prefix}b{l}_{j}", b_ptr, f"{l * l + j} * F2C", "f2", mask))


def _split_node(I: str, node: str) -> list[str]:
    """``{node}`` (int64): the node of this program; ``o{node}``: the row its per-node results go
    to. Grid axis 0 holds ``SPLITS`` programs per node (``SPLITS * nodes`` in all): program
    ``o = s * nodes + node`` walks part ``s`` of the node's edges and writes its partial sums to
    row ``o`` of a ``[SPLITS * nodes, ...]`` output that the launcher sums over ``s``."""
    return [
        f"{I}o{node} = tl.cast(tl.program_id(0), tl.int64)",
        f"{I}if SPLITS > 1:",
        f"{I}{_I}n_nodes = tl.cast(tl.num_programs(0) // SPLITS, tl.int64)",
        f"{I}{_I}{node} = o{node} % n_nodes",
        f"{I}else:",
        f"{I}{_I}{node} = o{node}",
    ]


def _split_range(I: str, node: str) -> list[str]:
    """With ``SPLITS``: narrow ``start:end`` to this program's part, ``ceil(degree / SPLITS)``
    consecutive edges (possibly none)."""
    II = I + _I
    return [
        f"{I}if SPLITS > 1:",
        f"{II}part = o{node} // n_nodes",
        f"{II}chunk = (end - start + SPLITS - 1) // SPLITS",
        f"{II}start = start + part * chunk",
        f"{II}end = tl.minimum(end, start + chunk)",
    ]


def receiver_prologue(I: str) -> list[str]:
    """Opening lines of a kernel with one program per output row (a receiver's edge range
    ``start:end`` of ``rowptr`` in convolution mode, the row itself in dense mode) and channel
    block ``pf``: ``f`` channels, ``fm`` their mask, ``f1``/``f2`` the input channels. In
    convolution mode a receiver's edges may be split over ``SPLITS`` programs: per-receiver
    results go to row ``orow`` (:func:`_split_node`; ``orow == row`` without splits)."""
    II = I * 2
    return [
        *_split_node(I, "row"),
        f"{I}pf = tl.program_id(1)",
        f"{I}f = pf * BLOCK_F + tl.arange(0, BLOCK_F)",
        f"{I}fm = f < F",
        *_channel_lines(I),
        f"{I}if CONV:",
        f"{II}start = tl.load(rowptr_ptr + row)",
        f"{II}end = tl.load(rowptr_ptr + row + 1)",
        *_split_range(II, "row"),
        f"{I}else:",
        f"{II}start = row",
        f"{II}end = row + 1",
    ]


def sender_prologue(I: str) -> list[str]:
    """Opening lines of a kernel with one program per sender ``j`` (its edges ``start:end`` of
    ``srowptr``, possibly split over ``SPLITS`` programs: per-sender results go to row ``oj``)
    and channel block ``pf``."""
    return [
        *_split_node(I, "j"),
        f"{I}pf = tl.program_id(1)",
        f"{I}f = pf * BLOCK_F + tl.arange(0, BLOCK_F)",
        f"{I}fm = f < F",
        *_channel_lines(I, f1=False),
        f"{I}start = tl.load(srowptr_ptr + j)",
        f"{I}end = tl.load(srowptr_ptr + j + 1)",
        *_split_range(I, "j"),
    ]


def sender_edges_prologue(I: str) -> list[str]:
    """Before a sender walk's loop (``PREFETCH``): the first edge ``e_a`` (``perm``) and its
    receiver ``gi_a``, and the second edge ``e_b``. Masked loads: a sender may have no edges."""
    II = I + _I
    return [
        f"{I}if PREFETCH:",
        f"{II}k0 = tl.cast(start, tl.int64)",
        f"{II}e_a = tl.load(perm_ptr + k0, mask=k0 < end, other=0)",
        f"{II}gi_a = tl.load(recv_ptr + e_a, mask=k0 < end, other=0)",
        f"{II}e_b = tl.load(perm_ptr + k0 + 1, mask=k0 + 1 < end, other=0)",
    ]


def sender_edges_head(I: str, e: str = "e") -> list[str]:
    """First lines of a sender walk's step ``k``: its edge ``e`` and receiver ``gi``. With
    ``PREFETCH`` both were loaded by the steps before (:func:`sender_edges_next`), so the
    step's operand loads do not wait on the two dependent index loads ``perm[k]`` and
    ``recv[perm[k]]``."""
    II = I + _I
    return [
        f"{I}if PREFETCH:",
        f"{II}{e} = e_a",
        f"{II}gi = gi_a",
        f"{I}else:",
        f"{II}{e} = tl.load(perm_ptr + tl.cast(k, tl.int64))",
        f"{II}gi = tl.load(recv_ptr + {e})",
    ]


def sender_edges_next(I: str) -> list[str]:
    """After a sender walk step's operand loads (``PREFETCH``): the next edge's receiver (its
    edge ``e_b`` came one step earlier) and the edge after it, a two-stage index pipeline."""
    II = I + _I
    return [
        f"{I}if PREFETCH:",
        f"{II}k2 = tl.cast(k, tl.int64) + 2",
        f"{II}gi_a = tl.load(recv_ptr + e_b, mask=k2 - 1 < end, other=0)",
        f"{II}e_a = e_b",
        f"{II}e_b = tl.load(perm_ptr + k2, mask=k2 < end, other=0)",
    ]


def _operand_names(paths) -> list[str]:
    """The registers one edge step of the forward reads: input 1's and input 2's components and
    every path's weights (``a{l}_{i}``, ``b{l}_{j}``, ``w{p}``)."""
    names = [f"a{l}_{i}" for l in _ranks(paths, "l1") for i in range(2 * l + 1)]
    names += [f"b{l}_{j}" for l in _ranks(paths, "l2") for j in range(2 * l + 1)]
    return names + [f"w{pi}" for pi in range(len(paths))]


def _fwd_operands(paths, indent: str, edge: str, prefix: str, mask: str | None) -> list[str]:
    """Lines loading edge ``edge``'s operands (:func:`_operand_names`, each name prefixed with
    ``prefix``) under ``mask``: its sender's row of input 1, its row of input 2, its weight row.
    Defines ``lm``: the channels in range, for an edge before ``end`` (a vector comparison: the
    interpreter cannot combine a scalar condition with a vector mask). ``mask=None``: ``edge`` is
    an edge of the walk, loaded without masks at the clamped channels (:func:`_fwd_clamped`)."""
    guard = "" if mask is None else f", mask={edge} < end, other=0"
    L = [
        f"{indent}if CONV:",
        f"{indent}{_I}src = tl.load(send_ptr + {edge}{guard})",
        f"{indent}else:",
        f"{indent}{_I}src = {edge}",
        f"{indent}if W_INDEX:",
        f"{indent}{_I}wr = tl.load(widx_ptr + {edge}{guard})",
        f"{indent}else:",
        f"{indent}{_I}wr = {edge}",
        *([] if mask is None else [f"{indent}lm = fm & (f * 0 + {edge} < end)"]),
        f"{indent}pa = x1_ptr + src * x1_row",
        f"{indent}pb = x2_ptr + {edge} * x2_row",
        *table_row(indent, "pw", mask=None if mask is None else f"{edge} < end"),
    ]
    _load_inputs(L, paths, indent, prefix=prefix, mask=mask)
    for pi in range(len(paths)):
        L += load_weight(indent, f"{prefix}w{pi}", pi, mask)
    return L


def _fwd_clamped(paths, offsets, n_out) -> list[str]:
    """The forward's receiver walk without masked loads (static shapes): the operands of the
    walk's edges only, channels past ``F`` clamped to the last one (``fc``: their lanes compute
    values that are never stored), and the pipelined walk peeled (the first edge's operands
    before the loop, the last edge's messages after it), so that no step loads an edge past the
    walk's end. A masked load sets its masked lanes first: about one instruction per load and
    the registers to hold them (compiled for sm_90 with a table, 128 registers instead of 246)."""
    L = TP_FWD.header(_I)
    I, II, III, IIII = _I, _I * 2, _I * 3, _I * 4
    L += receiver_prologue(I) + table_prologue(I)
    L += [f"{I}acc{k} = tl.zeros([BLOCK_F], dtype=DT)" for k in range(n_out)]
    names = _operand_names(paths)
    L.append(f"{I}if PIPELINE:")
    L.append(f"{II}if start < end:")
    L.append(f"{III}last = tl.cast(end, tl.int64) - 1")
    L.append(f"{III}e64 = tl.cast(start, tl.int64)")
    L += _fwd_operands(paths, III, "e64", "n", None)
    L.append(f"{III}for e in range(start, end):")
    L += [f"{IIII}{name} = n{name}" for name in names]
    L.append(f"{IIII}e64 = tl.minimum(tl.cast(e, tl.int64) + 1, last)")
    L += _fwd_operands(paths, IIII, "e64", "n", None)
    L += _fwd_messages(paths, offsets, IIII)
    L.append(f"{I}else:")
    L += [f"{II}for e in range(start, end):", f"{III}e64 = tl.cast(e, tl.int64)"]
    L += _fwd_operands(paths, III, "e64", "", None)
    L += _fwd_messages(paths, offsets, III)
    L.append(f"{I}po = out_ptr + orow * out_row")
    L += [f"{I}tl.store(po + {k} * F + f, acc{k}, mask=fm)" for k in range(n_out)]
    return L


def _fwd(paths, offsets, n_out) -> list[str]:
    """The forward's receiver walk. With ``PIPELINE`` each step loads the next edge's operands
    before it computes the current edge's messages (software pipelining, one edge ahead: the
    loads' latency overlaps the arithmetic, for the registers of one more set of operands)."""
    L = TP_FWD.header(_I)
    I, II, III = _I, _I * 2, _I * 3
    L += receiver_prologue(I) + table_prologue(I)
    L += [f"{I}acc{k} = tl.zeros([BLOCK_F], dtype=DT)" for k in range(n_out)]
    names = _operand_names(paths)
    L.append(f"{I}if PIPELINE:")
    L.append(f"{II}e64 = tl.cast(start, tl.int64)")
    L += _fwd_operands(paths, II, "e64", "n", "lm")
    L.append(f"{II}for e in range(start, end):")
    L += [f"{III}{name} = n{name}" for name in names]
    L.append(f"{III}e64 = tl.cast(e, tl.int64) + 1")
    L += _fwd_operands(paths, III, "e64", "n", "lm")
    L += _fwd_messages(paths, offsets, III)
    L.append(f"{I}else:")
    L += [
        f"{II}for e in range(start, end):",
        f"{III}e64 = tl.cast(e, tl.int64)",
        f"{III}if CONV:",
        f"{III}{I}src = tl.load(send_ptr + e64)",
        f"{III}else:",
        f"{III}{I}src = e64",
        f"{III}pa = x1_ptr + src * x1_row",
        f"{III}pb = x2_ptr + e64 * x2_row",
        *weight_row(III, "e64", table=True),
    ]
    _load_inputs(L, paths, III)
    L += _fwd_messages(paths, offsets, III, load_w=True)
    L.append(f"{I}po = out_ptr + orow * out_row")
    L += [f"{I}tl.store(po + {k} * F + f, acc{k}, mask=fm)" for k in range(n_out)]
    return L


def _fwd_messages(paths, offsets, indent: str, load_w: bool = False) -> list[str]:
    """Each path's message of one edge added to the accumulators (its weights loaded first with ``load_w``)."""
    L = []
    for pi, p in enumerate(paths):
        if load_w:
            L += load_weight(indent, f"w{pi}", pi)
        L += [indent + s for s in bilinear_lines(product_table(p.l1, p.l2, p.l_out), f"a{p.l1}_", f"b{p.l2}_", f"t{pi}_", _lit)]
        for c in range(2 * p.l_out + 1):
            L.append(f"{indent}acc{offsets[(pi, c)]} += w{pi} * t{pi}_{c}")
    return L


def _alias_go(lines, paths, offsets, indent):
    for pi, p in enumerate(paths):
        for c in range(2 * p.l_out + 1):
            lines.append(f"{indent}gop{pi}_{c} = go{offsets[(pi, c)]}")


def _bwd_edge(paths, offsets, n_out, in1_l_max, in2_l_max) -> list[str]:
    L = TP_BWD_EDGE.header(_I) + table_prologue(_I)
    I, II = _I, _I * 2
    L += [
        f"{I}r = tl.cast(tl.program_id(0), tl.int64)",
        f"{I}f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)",
        f"{I}fm = f < F",
        *_channel_lines(I),
        f"{I}if CONV:",
        f"{II}gi = tl.load(recv_ptr + r)",
        f"{II}si = tl.load(send_ptr + r)",
        f"{I}else:",
        f"{II}gi = r",
        f"{II}si = r",
        f"{I}pg = go_ptr + gi * go_row",
        f"{I}pa = x1_ptr + si * x1_row",
        f"{I}pb = x2_ptr + r * x2_row",
        *weight_row(I, "r", table=True),
    ]
    L += [I + _load(f"go{k}", "pg", f"{k} * F", "f") for k in range(n_out)]
    _alias_go(L, paths, offsets, I)
    _load_inputs(L, paths, I)
    # gradient of input 1 (dense mode only)
    L.append(f"{I}if NEED_G1:")
    L += _grad_block(paths, "l1", II, "g1_ptr + r * g1_row", "a", in1_l_max)
    _edge_grads(L, paths, I, "r", in2_l_max, load_w=True)
    return L


def _edge_grads(L, paths, indent, row: str, in2_l_max, load_w: bool) -> None:
    """The ``NEED_G2`` and ``NEED_GW`` blocks: input 2's and the weights' gradients of edge/row
    ``row`` from ``a*``, ``b*`` and ``gop*`` (and ``w*``, loaded here with ``load_w``)."""
    inner = indent + _I
    L.append(f"{indent}if NEED_G2:")
    L += _grad_block(paths, "l2", inner, f"g2_ptr + {row} * g2_row", "b", in2_l_max, reduce_flag="REDUCE_G2", load_w=load_w)
    L.append(f"{indent}if NEED_GW:")
    L.append(f"{inner}if W_ROWS:")
    L += listed_mask(inner + _I, row)
    L.append(f"{inner}if W_SLOPE:")
    L.append(f"{inner}{_I}gdv = tl.zeros([BLOCK_F], dtype=DT)")
    for pi, p in enumerate(paths):
        L += [inner + s for s in bilinear_lines(product_table(p.l1, p.l2, p.l_out), f"a{p.l1}_", f"b{p.l2}_", f"t{pi}_", _lit)]
        L.append(f"{inner}gwv{pi} = " + " + ".join(f"gop{pi}_{c} * t{pi}_{c}" for c in range(2 * p.l_out + 1)))
        L.append(f"{inner}if W_SLOPE:")
        L += load_slope(inner + _I, f"ws{pi}", pi)
        L.append(f"{inner}{_I}gdv += gwv{pi} * ws{pi}")
        L.append(f"{inner}else:")
        L += weight_grad_out(inner + _I, "gw_ptr", row, "gw_row", pi, f"gwv{pi}")
    L += slope_grad_out(inner, row)


def slope_grad_out(indent: str, row: str) -> list[str]:
    """Lines writing ``W_SLOPE``'s result, the channel sum of ``gdv`` (``sum_p gw_p * dw_p/dt``
    per channel): with ``W_ROWS`` added (atomically, listed edges only) into the zeroed scalar of
    the edge's weight row ``wr``, else stored as edge ``{row}``'s scalar. A row sums at most two
    edges into zero, so the result does not depend on their order."""
    II = indent + _I
    return [
        f"{indent}if W_SLOPE:",
        f"{II}if W_ROWS:",
        f'{II}{_I}tl.atomic_add(gw_ptr + wr, tl.sum(tl.where(lwm, gdv, 0.0), axis=0), sem="relaxed")',
        f"{II}else:",
        f"{II}{_I}tl.store(gw_ptr + {row}, tl.sum(tl.where(fm, gdv, 0.0), axis=0))",
    ]


def _grad_block(paths, attr, indent, ptr, vjp, l_max, reduce_flag=None, load_w=True) -> list[str]:
    """Accumulate ``sum_p w_p * VJP_p`` for input ``a`` (vjp='a') or ``b`` and store all ranks.

    With ``reduce_flag`` set at run time the input is broadcast (one channel) and the
    program, which then covers every channel, stores the channel sum. ``load_w=False``: the
    weights ``w{p}`` are loaded already.
    """
    L = []
    ranks = _ranks(paths, attr)
    for l in ranks:
        for i in range(2 * l + 1):
            L.append(f"{indent}g{l}_{i} = tl.zeros([BLOCK_F], dtype=DT)")
    for pi, p in enumerate(paths):
        if load_w:
            L += load_weight(indent, f"w{pi}", pi)
        if vjp == "a":
            table, other, l_in = product_vjp_a_table(p.l1, p.l2, p.l_out), f"b{p.l2}_", p.l1
        else:
            table, other, l_in = product_vjp_b_table(p.l1, p.l2, p.l_out), f"a{p.l1}_", p.l2
        L += [indent + s for s in bilinear_lines(table, f"gop{pi}_", other, f"v{pi}_", _lit)]
        for i in range(2 * l_in + 1):
            L.append(f"{indent}g{l_in}_{i} += w{pi} * v{pi}_{i}")
    return L + _grad_stores(ranks, indent, ptr, l_max, reduce_flag)


def _grad_stores(ranks, indent, ptr, l_max, reduce_flag=None) -> list[str]:
    """Store the accumulated gradient ``g{l}_{i}`` of ranks ``ranks`` (zeros for the other ranks up
    to ``l_max``) at ``ptr``; with ``reduce_flag`` set at run time, the channel sums."""
    L = [f"{indent}pgo = {ptr}"]
    stores, sums = [], []
    for l in range(l_max + 1):
        for i in range(2 * l + 1):
            value = f"g{l}_{i}" if l in ranks else "tl.zeros([BLOCK_F], dtype=DT)"
            stores.append(f"tl.store(pgo + {l * l + i} * F + f, {value}, mask=fm)")
            summed = f"tl.where(fm, {value}, 0.0)" if _CLAMP and l in ranks else value  # lanes past F: the last channel again
            sums.append(f"tl.store(pgo + {l * l + i}, tl.sum({summed}, axis=0))")
    if reduce_flag is None:
        return L + [indent + s for s in stores]
    L.append(f"{indent}if {reduce_flag}:")
    L += [indent + _I + s for s in sums]
    L.append(f"{indent}else:")
    L += [indent + _I + s for s in stores]
    return L


def _sender_walk(L, paths, offsets, n_out, acc: str, hoist_w: bool, g1: bool = True) -> None:
    """Zeroed node-gradient accumulators ``{acc}{l}_{i}``, then the loop over a sender's edges
    (``perm``) with each edge's output cotangent ``go*``, input 2 ``b*`` and weights ``w*`` loaded
    (all plain weights first with ``hoist_w``, else each before its path; the next edges' indices
    prefetched after the loads), accumulating input 1's gradient (with ``g1``; the loop body
    continues at two indents)."""
    I, II = _I, _I * 2
    for l in _ranks(paths, "l1"):
        for i in range(2 * l + 1):
            L.append(f"{I}{acc}{l}_{i} = tl.zeros([BLOCK_F], dtype=DT)")
    L += sender_edges_prologue(I)
    L += [
        f"{I}for k in range(start, end):",
        *sender_edges_head(II),
        f"{II}pg = go_ptr + gi * go_row",
        f"{II}pb = x2_ptr + e * x2_row",
        *weight_row(II, "e", table=True),
    ]
    L += [II + _load(f"go{k}", "pg", f"{k} * F", "f") for k in range(n_out)]
    _alias_go(L, paths, offsets, II)
    _load_inputs(L, paths, II, need_a=False)
    if hoist_w:  # plain weights; a table's are evaluated per path below
        for pi in range(len(paths)):
            L += load_weight(II, f"w{pi}", pi, when="plain")
    L += sender_edges_next(II)
    if g1:
        for pi, p in enumerate(paths):  # input 1's gradient, accumulated over the sender's edges
            if not hoist_w:
                L += load_weight(II, f"w{pi}", pi)
            L += _x1_grad_terms(p, pi, II, acc)


def _x1_grad_terms(p, pi: int, indent: str, acc: str) -> list[str]:
    """Path ``pi``'s term of input 1's gradient added into ``{acc}{l}_{i}``."""
    table = product_vjp_a_table(p.l1, p.l2, p.l_out)
    L = [indent + s for s in bilinear_lines(table, f"gop{pi}_", f"b{p.l2}_", f"v{pi}_", _lit)]
    return L + [f"{indent}{acc}{p.l1}_{i} += w{pi} * v{pi}_{i}" for i in range(2 * p.l1 + 1)]


def _table_edge(L, paths, indent: str, acc: str, in2_l_max: int, row: str) -> None:
    """One edge of ``tp_bwd_csr`` with ``W_TABLE``, path by path: each path's four coefficient
    vectors loaded once, its weights and slopes evaluated from them and used at once for input 1's
    gradient, input 2's (``NEED_G2``) and ``t``'s (``NEED_GW``, which with a table always
    has ``W_SLOPE``). Holding every path's weights across the edge's three gradients, as the
    plain kernel does, would hold four times the loads' registers."""
    inner = indent + _I
    _load_inputs(L, paths, indent, need_b=False)
    L.append(f"{indent}if NEED_G2:")
    L += [f"{inner}g{l}_{i} = tl.zeros([BLOCK_F], dtype=DT)" for l in _ranks(paths, "l2") for i in range(2 * l + 1)]
    L.append(f"{indent}if NEED_GW:")
    L.append(f"{inner}gdv = tl.zeros([BLOCK_F], dtype=DT)")
    L.append(f"{inner}if W_ROWS:")
    L += listed_mask(inner + _I, row)
    for pi, p in enumerate(paths):
        L += [
            f"{indent}tc{j} = tl.load(pw + {j} * w_row + {pi} * F + fc)"
            if _CLAMP
            else f"{indent}tc{j} = tl.load(pw + {j} * w_row + {pi} * F + f, mask=fm, other=0.0)"
            for j in range(4)
        ]
        L.append(f"{indent}w{pi} = (tc0 + ts * (tc1 + ts * (tc2 + ts * tc3))) * tin")
        L += _x1_grad_terms(p, pi, indent, acc)
        L.append(f"{indent}if NEED_G2:")
        table = product_vjp_b_table(p.l1, p.l2, p.l_out)
        L += [inner + s for s in bilinear_lines(table, f"gop{pi}_", f"a{p.l1}_", f"u{pi}_", _lit)]
        L += [f"{inner}g{p.l2}_{i} += w{pi} * u{pi}_{i}" for i in range(2 * p.l2 + 1)]
        L.append(f"{indent}if NEED_GW:")
        L += [inner + s for s in bilinear_lines(product_table(p.l1, p.l2, p.l_out), f"a{p.l1}_", f"b{p.l2}_", f"t{pi}_", _lit)]
        L.append(f"{inner}gwv{pi} = " + " + ".join(f"gop{pi}_{c} * t{pi}_{c}" for c in range(2 * p.l_out + 1)))
        L.append(f"{inner}gdv += gwv{pi} * ((tc1 + ts * (2.0 * tc2 + 3.0 * ts * tc3)) * tab_scale * tin)")
    L.append(f"{indent}if NEED_G2:")
    L += _grad_stores(_ranks(paths, "l2"), inner, f"g2_ptr + {row} * g2_row", in2_l_max, "REDUCE_G2")
    L.append(f"{indent}if NEED_GW:")
    L += slope_grad_out(inner, row)


def _store_sender_grad(L, paths, in1_l_max, acc: str) -> None:
    """Store the sender's accumulated input-1 gradient (zeros for ranks no path reaches)."""
    ranks = _ranks(paths, "l1")
    L.append(f"{_I}pgo = g1_ptr + oj * g1_row")
    for l in range(in1_l_max + 1):
        for i in range(2 * l + 1):
            value = f"{acc}{l}_{i}" if l in ranks else "tl.zeros([BLOCK_F], dtype=DT)"
            L.append(f"{_I}tl.store(pgo + {l * l + i} * F + f, {value}, mask=fm)")


def _bwd_x1_csr(paths, offsets, n_out, in1_l_max) -> list[str]:
    L = TP_BWD_X1_CSR.header(_I) + sender_prologue(_I) + table_prologue(_I)
    _sender_walk(L, paths, offsets, n_out, "g", hoist_w=False)
    _store_sender_grad(L, paths, in1_l_max, "g")
    return L


def rank_groups(paths) -> list[list[int]]:
    """Path indices grouped by output rank, in rank order: the fused double backward's
    ``ROW_GROUPS``."""
    ranks = sorted({p.l_out for p in paths})
    return [[i for i, p in enumerate(paths) if p.l_out == l] for l in ranks]


def _bwd_csr(paths, offsets, n_out, in1_l_max, in2_l_max) -> list[str]:
    L = TP_BWD_CSR.header(_I) + sender_prologue(_I) + table_prologue(_I)
    II = _I * 2
    III = II + _I
    L += [f"{_I}f1 = {'fc' if _CLAMP else 'f'} * F1S", f"{_I}pa = x1_ptr + j * x1_row"]
    _sender_walk(L, paths, offsets, n_out, "h", hoist_w=True, g1=False)
    L.append(f"{II}if W_TABLE:")
    _table_edge(L, paths, III, "h", in2_l_max, "e")
    L.append(f"{II}else:")
    for pi, p in enumerate(paths):
        L += _x1_grad_terms(p, pi, III, "h")
    # the sender's row of input 1, read per edge (cached) rather than held in registers across the loop
    _load_inputs(L, paths, III, need_b=False)
    _edge_grads(L, paths, III, "e", in2_l_max, load_w=False)
    _store_sender_grad(L, paths, in1_l_max, "h")
    return L


def generate_product_source(paths: list[Path], in1_l_max: int, in2_l_max: int, out_l_max: int, reduce: bool) -> str:
    """Source of the Triton module for one tensor-product configuration."""
    offsets, n_out = out_offsets(paths, out_l_max, reduce)
    lines = [
        '"""Generated by FlashCart: Triton tensor-product kernels. Do not edit."""',
        "import triton",
        "import triton.language as tl",
        f"N_OUT_BLOCKS = {n_out}",
        "",
    ]
    with _channels_clamped(STATIC_SHAPES):
        lines += (_fwd_clamped if STATIC_SHAPES else _fwd)(paths, offsets, n_out) + [""]
        lines += _bwd_edge(paths, offsets, n_out, in1_l_max, in2_l_max) + [""]
        lines += _bwd_x1_csr(paths, offsets, n_out, in1_l_max) + [""]
        lines += _bwd_csr(paths, offsets, n_out, in1_l_max, in2_l_max) + [""]
    return "\n".join(lines) + "\n"


# ---- direction expansion ----------------------------------------------------------------


def _poly(table_entry, names=("ux", "uy", "uz")) -> str:
    terms = []
    for c, m in table_entry:
        mono = monomial(m, names)
        if mono == "1.0":
            mono = _lit_rows(Fraction(1))
        terms.append(mono if c == 1 else f"{_lit_rows(c)} * {mono}")
    return " + ".join(terms) if terms else "0.0 * ux"


def _second_derivatives(l: int):
    """``d^2 T_p / du_k du_m`` monomial tables, ``[p][k][m]``."""
    grad = expansion_gradient_table(l)
    out = []
    for per_p in grad:
        rows = []
        for k in range(3):
            cols = []
            for m in range(3):
                acc: dict[tuple[int, int, int], Fraction] = {}
                for c, mono in per_p[k]:
                    if mono[m]:
                        dm = list(mono)
                        dm[m] -= 1
                        acc[tuple(dm)] = acc.get(tuple(dm), Fraction(0)) + c * mono[m]
                cols.append(tuple((c, mm) for mm, c in acc.items() if c != 0))
            rows.append(tuple(cols))
        out.append(tuple(rows))
    return out


def generate_expansion_source(l_max: int) -> str:
    """Triton kernels for ``T^0..T^l_max`` of unit vectors: forward, VJP, and second order."""
    I = _I
    width = (l_max + 1) ** 2
    L = [
        '"""Generated by FlashCart: Triton direction-expansion kernels. Do not edit."""',
        "import triton",
        "import triton.language as tl",
        "",
    ]
    head = [
        f"{I}rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
        f"{I}rm = rows < n",
        f"{I}r64 = tl.cast(rows, tl.int64)",
        f"{I}ux = tl.load(u_ptr + r64 * 3 + 0, mask=rm, other=0.0)",
        f"{I}uy = tl.load(u_ptr + r64 * 3 + 1, mask=rm, other=0.0)",
        f"{I}uz = tl.load(u_ptr + r64 * 3 + 2, mask=rm, other=0.0)",
    ]
    comps = [(l, p) for l in range(l_max + 1) for p in range(2 * l + 1)]
    # forward: the components gathered into one [BLOCK, 2^k] tile, stored row by row (one
    # coalesced store, instead of one store per component at a stride of `width` elements)
    padded = 1 << (width - 1).bit_length()
    L += EXPANSION_FWD.header(_I) + head
    L += [f"{I}cols = tl.arange(0, {padded})[None, :]", f"{I}tile = tl.zeros([BLOCK, {padded}], dtype=DT)"]
    for k, (l, p) in enumerate(comps):
        value = "tl.full([BLOCK], 1.0, dtype=DT)" if l == 0 else _poly(expansion_table(l)[p])
        L.append(f"{I}tile = tl.where(cols == {k}, ({value})[:, None], tile)")
    L.append(f"{I}tl.store(out_ptr + r64[:, None] * {width} + cols, tile, mask=rm[:, None] & (cols < {width}))")
    L.append("")
    # vjp: grad_u[k] = sum_p g_p dT_p/du_k
    L += EXPANSION_VJP.header(_I) + head
    for k in range(3):
        L.append(f"{I}gu{k} = tl.zeros([BLOCK], dtype=DT)")
    for idx, (l, p) in enumerate(comps):
        if l == 0:
            continue
        L.append(f"{I}g = tl.load(g_ptr + r64 * {width} + {idx}, mask=rm, other=0.0)")
        for k in range(3):
            entry = expansion_gradient_table(l)[p][k]
            if entry:
                L.append(f"{I}gu{k} += g * ({_poly(entry)})")
    for k in range(3):
        L.append(f"{I}tl.store(gu_ptr + r64 * 3 + {k}, gu{k}, mask=rm)")
    L.append("")
    # second order: given g (output cotangent), v (cotangent of grad_u):
    #   d g  = J v        (jvp, [n, width])
    #   d u  = sum_p g_p H_p v   ([n, 3])
    L += EXPANSION_SECOND.header(_I) + head
    for k in range(3):
        L.append(f"{I}v{k} = tl.load(v_ptr + r64 * 3 + {k}, mask=rm, other=0.0)")
        L.append(f"{I}du{k} = tl.zeros([BLOCK], dtype=DT)")
    for idx, (l, p) in enumerate(comps):
        if l == 0:
            L.append(f"{I}tl.store(dg_ptr + r64 * {width} + {idx}, tl.zeros([BLOCK], dtype=DT), mask=rm)")
            continue
        grad = expansion_gradient_table(l)[p]
        jvp = " + ".join(f"v{k} * ({_poly(grad[k])})" for k in range(3) if grad[k]) or "0.0 * ux"
        L.append(f"{I}tl.store(dg_ptr + r64 * {width} + {idx}, {jvp}, mask=rm)")
        if l >= 2:
            hess = _second_derivatives(l)[p]
            L.append(f"{I}g = tl.load(g_ptr + r64 * {width} + {idx}, mask=rm, other=0.0)")
            for k in range(3):
                hv = " + ".join(f"v{m} * ({_poly(hess[k][m])})" for m in range(3) if hess[k][m])
                if hv:
                    L.append(f"{I}du{k} += g * ({hv})")
    for k in range(3):
        L.append(f"{I}tl.store(du_ptr + r64 * 3 + {k}, du{k}, mask=rm)")
    return "\n".join(L) + "\n"
