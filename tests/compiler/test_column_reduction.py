"""Column kernels: sum/mean/max/min over leading or middle axes.

On the CPU: which reductions take the column kernel (and why others do not), the
``outer x R x inner`` view, the split of the reduced axes for a GPU of a given size,
deterministic sources, and every representative source compiled by ``nvcc``. On the
GPU (marked ``gpu``): results against float64 NumPy on fresh random inputs with odd
sizes, NaN/Inf/-0.0, split and unsplit launches into poisoned outputs, misaligned
views, determinism, and the kernels chosen through ``pl.compile``.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.codegen import generate, supports
from pyc_lab.compiler.codegen.column_reduction import (
    MIN_ROWS_PER_THREAD,
    column_split,
    split_count,
)
from tests.compiler.graphs import op_graph
from tests.compiler.test_codegen import compile_ptx, needs_nvcc

F16, F32, F64 = np.float16, np.float32, np.float64
I32, BOOL = np.int32, np.bool_


@pytest.fixture
def rng():
    return np.random.default_rng()


def _source(op, shape, dtype, axis):
    g, node = op_graph(op, [(shape, dtype)], {"axis": axis, "keepdims": False})
    ok, why = supports(node, g)
    assert ok, why
    return generate(node, g)


@pytest.mark.parametrize("shape, axes, want", [
    ((8, 16), (0,), (1, 8, 16)),
    ((4, 5, 6), (1,), (4, 5, 6)),
    ((4, 5, 6), (0, 1), (1, 20, 6)),
    ((2, 3, 4, 5), (1, 2), (2, 12, 5)),
    ((3, 1, 7), (0,), (1, 3, 7)),
])
def test_column_split_views_the_input_as_outer_r_inner(shape, axes, want):
    assert column_split(shape, axes) == want


@pytest.mark.parametrize("shape, axes", [
    ((8, 16), (1,)),          # the last axis: a row reduction
    ((8, 16), (0, 1)),        # everything: split_reduction's two stages
    ((4, 5, 6), (0, 2)),      # not one block of axes
    ((16,), (0,)),            # rank 1
    ((4, 5, 6), ()),
])
def test_column_split_refuses_other_axis_sets(shape, axes):
    assert column_split(shape, axes) is None


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype", [F16, F32, F64, I32, BOOL])
def test_leading_and_middle_axis_reductions_are_column_kernels(op, dtype):
    src = _source(op, (33, 5, 7), dtype, (0, 1))
    assert src.kind == "columns"
    assert src.entries[0] == src.name and src.entries[-1] == f"{src.name}_combine"
    assert src.launch["outer"] == 1 and src.launch["r"] == 165 and src.launch["inner"] == 7


def test_other_axis_sets_fall_back_with_the_reason():
    g, node = op_graph("sum", [((5, 6, 7), F32)], {"axis": (0, 2), "keepdims": False})
    ok, why = supports(node, g)
    assert not ok and "consecutive axes" in why and "CuPy" in why
    g, node = op_graph("var", [((5, 6), F32)], {"axis": (0,), "keepdims": False})
    ok, why = supports(node, g)
    assert not ok and "only the last axes" in why
    g, node = op_graph("sum", [((0, 6), F32)], {"axis": (0,), "keepdims": False})
    ok, why = supports(node, g)
    assert not ok and "empty" in why


def test_vector_entry_only_when_the_columns_allow_it():
    assert _source("sum", (64, 4096), F32, (0,)).launch["vec"] == 4
    assert _source("sum", (64, 4096), F16, (0,)).launch["vec"] == 8
    assert _source("sum", (64, 4098), F16, (0,)).launch["vec"] == 2
    odd = _source("sum", (64, 4097), F32, (0,))
    assert odd.launch["vec"] == 0 and odd.launch["vec_kernel"] is None
    assert f"{odd.name}_vec" not in odd.source


def test_a_tall_column_sum_is_split_and_a_wide_one_is_not():
    tall = _source("sum", (16384, 4096), F32, (0,)).launch
    parts = split_count(tall, 132, True)
    blocks = tall["outer"] * tall["vec_config"]["tiles"]
    assert parts > 1 and blocks * parts >= 4 * 132
    assert -(-tall["r"] // parts) >= tall["vec_config"]["ty"] * MIN_ROWS_PER_THREAD
    wide = _source("sum", (512, 1024, 1024), F32, (1,)).launch
    assert split_count(wide, 132, True) == 1
    short = _source("sum", (20, 8), F32, (0,)).launch  # too few rows to split
    assert split_count(short, 132, False) == 1


def test_narrow_columns_use_more_rows_per_block():
    cfg = _source("max", (1000, 3), F32, (0,)).launch["config"]
    assert cfg["tx"] == 4 and cfg["ty"] == 64 and cfg["tiles"] == 1


def test_sources_are_deterministic_and_name_the_layout():
    a, b = _source("mean", (6, 300, 40), F16, (1,)), _source("mean", (6, 300, 40), F16, (1,))
    assert a.source == b.source
    assert "6 x (300 reduced) x 40 columns" in a.source
    assert "pyc_float_to_f16" in a.source  # a float16 result is rounded once, at the end


@needs_nvcc
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype, shape, axis", [
    (F32, (257, 4096), (0,)), (F16, (9, 100, 64), (1,)), (F64, (5, 6, 3), (0, 1)),
    (I32, (17, 9), (0,)), (BOOL, (8, 8, 2), (1,)),
])
def test_column_sources_compile(tmp_path, op, dtype, shape, axis):
    compile_ptx(tmp_path, _source(op, shape, dtype, axis))


# -- on the GPU ------------------------------------------------------------------------------
def _rand(rng, shape, dtype):
    if dtype == BOOL:
        return rng.random(shape) < 0.4
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, shape).astype(dtype)
    return (rng.uniform(0.1, 3.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def _reference(op, x, axis):
    """float64 NumPy (integers exactly), in the result dtype NumPy gives."""
    want_dtype = getattr(np, op)(x[(slice(0, 1),) * x.ndim], axis=axis).dtype
    wide = x.astype(F64) if x.dtype.kind == "f" else x
    return getattr(np, op)(wide, axis=axis), want_dtype


def _check(op, got, x, axis):
    want, dtype = _reference(op, x, axis)
    assert got.dtype == dtype and got.shape == want.shape
    if op in ("max", "min") or x.dtype.kind != "f":
        if dtype.kind == "f":
            np.testing.assert_array_equal(got.astype(F64), want)  # exact: no rounding
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12)
        return
    # a sum's error bound: a few roundings of the sum of magnitudes
    eps = float(np.finfo(dtype).eps)
    mag = np.sum(np.abs(x.astype(F64)), axis=axis)
    if op == "mean":
        mag = mag / (x.size // want.size)
    bound = 8 * eps * mag + 4 * eps * np.abs(want)
    assert np.all(np.abs(got.astype(F64) - want) <= bound + 1e-300)


CASES = [((3000, 257), (0,)), ((4097, 64), (0,)), ((5, 1000, 33), (1,)),
         ((2, 3, 4, 5), (1, 2)), ((1, 7), (0,)), ((100000, 3), (0,)),
         ((64, 2048), (0,)), ((3, 64, 4096), (0, 1))]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype", [F32, F16, F64, I32])
@pytest.mark.parametrize("shape, axis", CASES)
def test_column_reductions_match_float64_numpy(rng, op, dtype, shape, axis):
    import cupy as cp

    x = _rand(rng, shape, dtype)
    f = pl.compile(lambda v: getattr(np, op)(v, axis=axis), backend="cupy")
    dev = cp.asarray(x)
    got = cp.asnumpy(f(dev))
    assert [k["kind"] for k in f.explain(dev).kernels] == ["columns"]
    _check(op, got, x, axis)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["sum", "max"])
def test_bool_column_reductions_match_numpy(rng, op):
    import cupy as cp

    x = _rand(rng, (999, 5, 17), BOOL)
    f = pl.compile(lambda v: getattr(np, op)(v, axis=(0, 1)), backend="cupy")
    got = cp.asnumpy(f(cp.asarray(x)))
    want = getattr(np, op)(x, axis=(0, 1))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("shape", [(5000, 40), (33, 130)])
def test_nan_inf_and_signed_zero_follow_numpy(rng, dtype, shape):
    import cupy as cp

    x = _rand(rng, shape, dtype)
    x[7 % shape[0], 0] = np.nan
    x[3, 1] = np.inf
    x[4, 2], x[5, 2] = np.inf, -np.inf        # inf - inf: NaN
    x[:, 3] = -0.0                            # a column of negative zeros
    x[2, 4] = -np.inf
    dev = cp.asarray(x)
    for op in ("sum", "mean", "max", "min"):
        got = cp.asnumpy(pl.compile(lambda v, op=op: getattr(np, op)(v, axis=0),
                                    backend="cupy")(dev))
        with np.errstate(all="ignore"):
            want = getattr(np, op)(x.astype(F64), axis=0)
        special = slice(0, 5)  # the columns holding NaN/Inf/-0.0 must match exactly
        np.testing.assert_array_equal(got[special].astype(F64), want[special])
        assert np.array_equal(np.signbit(got[3]), np.signbit(want[3])), op


@pytest.mark.gpu
@pytest.mark.parametrize("shape, axis", [((20000, 96), (0,)), ((7, 300, 40), (1,))])
@pytest.mark.parametrize("aligned", [True, False])
def test_split_and_unsplit_launches_write_every_output(rng, shape, axis, aligned):
    import cupy as cp

    from pyc_lab.compiler.backend.launch import ColumnLaunch
    from pyc_lab.compiler.codegen.cache import compile_kernel

    src = _source("sum", shape, F32, axis)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    launch = ColumnLaunch(src, sms, cp)
    kernels = {e: compile_kernel(src, e) for e in src.entries}
    x = _rand(rng, shape, F32)
    n = int(np.prod(shape))
    buf = cp.empty(n + 1, dtype=F32)
    dev = buf[1:] if not aligned else buf[:n]
    dev[...] = cp.asarray(x.ravel())
    dev = dev.reshape(shape)
    out = cp.full(np.sum(x, axis=axis).shape, cp.nan, dtype=F32)  # poisoned
    entry = launch.launch(kernels, dev, out)
    assert entry == (src.name + "_vec" if aligned else src.name)
    _check("sum", cp.asnumpy(out), x, axis)
    first = cp.asnumpy(out).copy()
    out[...] = cp.nan
    launch.launch(kernels, dev, out)
    assert np.array_equal(cp.asnumpy(out), first)  # deterministic, bit for bit
    if shape[0] == 20000:
        assert launch.splits[entry] > 1  # the tall case took the two-kernel path


@pytest.mark.gpu
def test_column_reductions_inside_compiled_programs(rng):
    import cupy as cp

    def centre(x, s):
        return (x - x.mean(axis=0)) * s + x.sum(axis=0).max()

    x, s = _rand(rng, (3001, 129), F32), _rand(rng, (129,), F32)
    f = pl.compile(centre, backend="cupy")
    dev = [cp.asarray(x), cp.asarray(s)]
    got = cp.asnumpy(f(*dev))
    want = centre(x.astype(F64), s.astype(F64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    assert "columns" in [k["kind"] for k in f.explain(*dev).kernels]
