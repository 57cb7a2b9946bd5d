"""Generator and launcher of the Triton kernels share argument and column names (no positional contract)."""

import ast

import pytest

from flashcart.cartesian import _linear_spec as spec
from flashcart.cartesian._triton import codegen, ops, signatures
from flashcart.cartesian._triton.source import product_spec

PRODUCT_SIGNATURES = (signatures.TP_FWD, signatures.TP_BWD_EDGE, signatures.TP_BWD_X1_CSR, signatures.TP_BWD_CSR)
EXPANSION_SIGNATURES = (signatures.EXPANSION_FWD, signatures.EXPANSION_VJP, signatures.EXPANSION_SECOND)


def _parameters(source):
    """``{kernel name: [parameter names]}`` of the functions in a generated module's source."""
    return {f.name: [a.arg for a in f.args.args] for f in ast.parse(source).body if isinstance(f, ast.FunctionDef)}


def test_generated_kernels_take_exactly_the_shared_argument_names():
    s = product_spec("2,3,2,0,1")
    kernels = _parameters(codegen.generate_product_source(s.paths, s.in1_l_max, s.in2_l_max, s.out_l_max, s.reduce))
    kernels |= _parameters(codegen.generate_expansion_source(2))
    assert sorted(kernels) == sorted(sig.name for sig in PRODUCT_SIGNATURES + EXPANSION_SIGNATURES)
    for sig in PRODUCT_SIGNATURES + EXPANSION_SIGNATURES:
        assert kernels[sig.name] == [*sig.args, *sig.constexprs], sig.name


def test_launch_refuses_missing_or_unknown_argument_names():
    class Module:
        def __getattr__(self, name):
            raise AssertionError("must not launch")

    args = {name: 0 for name in signatures.EXPANSION_FWD.args + signatures.EXPANSION_FWD.constexprs}
    with pytest.raises(TypeError, match=r"missing arguments \['n'\], unknown arguments \['rows'\]"):
        signatures.EXPANSION_FWD.launch(Module(), (1,), **{**{k: v for k, v in args.items() if k != "n"}, "rows": 3})


def test_launch_passes_every_argument_by_name():
    seen = {}

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.update(grid=grid, args=args, kw=kw)

    class Module:
        expansion_vjp = Kernel()

    values = {name: k for k, name in enumerate(signatures.EXPANSION_VJP.args + signatures.EXPANSION_VJP.constexprs)}
    signatures.EXPANSION_VJP.launch(Module(), (4,), num_warps=2, **values)
    assert seen == {"grid": (4,), "args": (), "kw": {**values, "num_warps": 2}}


def test_launch_table_columns_are_named_once_and_decode_by_name():
    assert len(spec.COLUMNS) == len(set(spec.COLUMNS)) == spec.N_COLS
    key = spec.linear_key(2, 1, 3, 4, [1, 2, 1])
    table = spec.launch_table(key)
    assert table.shape == (3, 2, spec.N_COLS)
    s = spec.linear_spec(key)
    fwd_rank1 = dict(zip(spec.COLUMNS, table[spec.FWD, 1].tolist()))
    # rank 1 forward: y[row*3+c, o] = sum_k x[row*3+c, k] W1[o, k], K = 2 paths * 3 channels
    assert (fwd_rank1["m_mul"], fwd_rank1["m_const"], fwd_rank1["n_size"]) == (3, 0, 4)
    assert (fwd_rank1["k_mul"], fwd_rank1["k_const"], fwd_rank1["fan"]) == (0, 6, 6)
    assert (fwd_rank1["a_off"], fwd_rank1["a_di"], fwd_rank1["a_si_hi"], fwd_rank1["a_si_lo"]) == (s.in_off[1], 3, s.in_width, 6)
    assert (fwd_rank1["b_off"], fwd_rank1["b_si_lo"], fwd_rank1["b_sj_lo"]) == (s.w_off[1], 1, 6)
    assert (fwd_rank1["c_off"], fwd_rank1["c_si_hi"], fwd_rank1["c_si_lo"]) == (s.out_off[1], s.out_width, 4)
    bwd_w_rank0 = dict(zip(spec.COLUMNS, table[spec.BWD_W, 0].tolist()))
    assert (bwd_w_rank0["m_mul"], bwd_w_rank0["m_const"], bwd_w_rank0["k_mul"], bwd_w_rank0["k_const"]) == (0, 4, 1, 0)
    assert spec.n_tiles(key, spec.FWD, 100, 32, 32) == -(-100 // 32) + -(-300 // 32)


def test_linear_table_divisors_fit_the_kernels_32_bit_division():
    """grouped_matmul divides indices in 32 bits: a divisor of 2**62 became 0 there (the
    interpreter's division by zero happened to give the right offsets; a GPU's does not)."""
    for key in (spec.linear_key(2, 2, 4, 4, [2, 1, 3]), spec.linear_key(3, 2, 9, 20, [2, 3, 1, 2])):
        for kind in spec.launch_rows(key):
            for row in kind:
                for x in "abc":
                    for f in ("di", "dj"):
                        assert 0 < row[spec.COLUMN[f"{x}_{f}"]] < 2**31, (key, x, f)


def test_linear_kernel_reads_the_named_columns():
    from flashcart.cartesian._triton import linear_kernel as k

    assert (k._M_MUL, k._M_CONST, k._N_SIZE, k._K_MUL, k._K_CONST, k._FAN) == tuple(
        spec.COLUMN[c] for c in ("m_mul", "m_const", "n_size", "k_mul", "k_const", "fan")
    )
    assert (k._A, k._B, k._C) == (spec.COLUMN["a_off"], spec.COLUMN["b_off"], spec.COLUMN["c_off"])
    assert [k._OFF, k._DI, k._SI_HI, k._SI_LO, k._DJ, k._SJ_HI, k._SJ_LO] == list(range(len(spec.OPERAND_FIELDS)))


@pytest.mark.parametrize("name", ["tp_fwd", "tp_bwd", "lin_fwd", "lin_bwd_x", "lin_bwd_w", "expansion_fwd", "expansion_vjp"])
def test_module_names_are_dispatchers_over_the_custom_ops(name):
    dispatcher = getattr(ops, name)
    assert dispatcher.__name__ == name
    assert dispatcher.op._qualname == f"flashcart::{name}"  # the torch.library custom op


@pytest.mark.parametrize("key", ["0|0|20|20|1", "3|3|20|20|4,5,5,3", "2|3|64|64|1,1,1", "3|2|20|20|1,1,1,1"])
def test_grouped_plans_count_the_tiles_as_the_launch_rows_do(key):
    """The grouped matmul's cached launch plan (``ops._grouped_plan``) gives the same programs per
    launch as ``n_tiles`` for every launch kind, tile shape and row count, and the same
    constants as the launch table (groups) and the unit axes."""
    from flashcart.cartesian._triton.linear_kernel import NARROW_TILES, WIDE_TILES, kernel_unit_axes

    for kind in (spec.FWD, spec.BWD_X, spec.BWD_W):
        for tiles in (NARROW_TILES, WIDE_TILES):
            for use_dot in (True, False):
                plan = ops._grouped_plan(key, kind, use_dot, tiles, True)
                for rows in (0, 1, 7, 1000, 158_000):
                    assert plan.tiles(rows) == spec.n_tiles(key, kind, rows, tiles.bm, tiles.bn)
                assert plan.constants["N_GROUPS"] == spec.launch_table(key).shape[1]
                assert (plan.constants["UNIT"], plan.constants["ALIGN"]) == kernel_unit_axes(key, kind, use_dot)
                assert ops._grouped_plan(key, kind, use_dot, tiles, False).constants["UNIT"] == 0
