"""Reductions over axes no reduction kernel covers (axes apart: ``(1, 3)`` of a 4-D
array): small ones unrolled into elementwise work on strided views
(``passes/small_reduction.py``: pooling written with a reshape), larger ones in many
rows a row program of their own (``passes/row_fusion.py``); and reductions of a few
last values a row (the lengths of 3-D vectors), unrolled the same way instead of a
warp per row.

On the CPU: which reductions unroll and which do not (axes a row or column kernel
takes, more than 16 values a result, ``where=``/``dtype=``, a variance); every op and
dtype against NumPy on the numpy backend with NaN/Inf/-0.0 and odd extents (maxima,
minima and integer results bit for bit, float sums within rounding of float64
NumPy); the prologue that only the reduction reads joining the one kernel; the
generated kernel run on the CPU emulator into poisoned outputs. On the GPU (marked
``gpu``): the same programs against NumPy through the cupy backend, one kernel each.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler import trace
from pyc_lab.compiler.codegen import supports
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.passes.small_reduction import MAX_VALUES
from pyc_lab.compiler.policy import choose
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_fuzz_emulated import _check_program

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
INTS = [np.dtype(np.int32), np.dtype(np.uint8), np.dtype(np.int64)]
OPS = ["sum", "mean", "max", "min", "prod"]


def pool(op, keepdims=False):
    """2x2 pooling as NumPy users write it: a reshape and a reduction over two axes."""
    def f(x):
        n, c, h, w = x.shape
        y = x.reshape(n, c, h // 2, 2, w // 2, 2)
        return getattr(y, op)(axis=(3, 5), keepdims=keepdims)
    return f


def _data(rng, shape, dtype, special=True):
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -9
        return rng.integers(lo, 9, shape).astype(dtype)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    if special:
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, size=6, replace=False)
        flat[picks] = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, np.inf]).astype(dtype)
    return x


def _notes(fn, *args):
    graph, _ = trace(fn, args)
    res = PassManager().run(graph)
    return res, [n for rec in res.log if rec.name == "small_reduction" for n in rec.notes]


def _kernels(graph):
    return [(graph.node(d.node).op, d.choice)
            for d in choose(graph, "cupy", "balanced", supports)
            if d.choice not in ("source", "view") and graph.node(d.node).op != "reshape"]


def _check(got, want, exact_in_float64, dtype):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype.kind in "iu" or exact_in_float64 is None:
        wide = np.float64 if got.dtype == BF16 else got.dtype  # NumPy's NaN checks
        np.testing.assert_array_equal(got.astype(wide), want.astype(wide))
        return
    ref = np.asarray(exact_in_float64).astype(got.dtype).astype(np.float64)
    tol = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 2e-6}.get(dtype.name, 1e-13)
    g = got.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(ref))
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(g[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])
    np.testing.assert_allclose(g[finite], ref[finite], rtol=tol,
                               atol=tol * float(np.abs(ref[finite]).max(initial=1.0)))


@pytest.mark.parametrize("op", OPS)
def test_pooling_by_reshape_unrolls_and_the_reduction_is_gone(op):
    x = np.ones((2, 3, 8, 6), np.float32)
    res, notes = _notes(pool(op), x)
    assert len(notes) == 1 and "4 values per result" in notes[0] and "(3, 5)" in notes[0]
    assert not any(n.op == op for n in res.graph)
    assert _kernels(res.graph) == [("fused", "fused_kernel")]


@pytest.mark.parametrize("source", [
    "x.sum(-1)",                               # 20 last values: a row kernel
    "x.reshape(4, 3, 2, 20).max((2, 3))",      # 40 last values: a row kernel
    "x.sum(axis=0)",                           # leading: a column kernel
    "x.reshape(24, 5, 4).sum(axis=1)",         # a middle axis: a column kernel
    "x.reshape(4, 3, 2, 20).sum(axis=(1, 3))",  # 60 values a result over axes apart
    "x.reshape(4, 3, 2, 20).var(axis=(0, 2))",  # not a sum, mean, max, min or prod
    # 8 values a result over axes apart, broadcast back: a column program's
    "(x.reshape(4, 3, 2, 20) - x.reshape(4, 3, 2, 20).mean((0, 2), keepdims=True))",
])
def test_what_the_kernels_take_or_too_much_stays_a_reduction(source):
    fn = eval(f"lambda x: {source}", {"np": np})
    x = np.random.default_rng(0).standard_normal((24, 20)).astype(np.float32)
    _res, notes = _notes(fn, x)
    assert notes == []
    np.testing.assert_allclose(pl.compile(fn)(x), fn(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("source", [
    "x.reshape(4, 3, 2, 10).sum(axis=(0, 2), dtype=np.float64)",
    "x.reshape(4, 3, 2, 10).sum(axis=(0, 2), where=x.reshape(4, 3, 2, 10) > 0)",
    "np.count_nonzero(x.reshape(4, 3, 2, 10) > 0, axis=(0, 2))",
])
def test_dtype_where_and_counts_as_simplify_writes_them_unroll_too(source):
    fn = eval(f"lambda x: {source}", {"np": np})
    x = np.random.default_rng().standard_normal((24, 10)).astype(np.float32)
    _res, notes = _notes(fn, x)
    assert len(notes) == 1
    got, want = pl.compile(fn)(x), fn(x)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_axes_apart_of_up_to_sixteen_values_unroll():
    x = np.ones((5, 4, 7, 4), np.float32)
    _res, notes = _notes(lambda v: v.sum(axis=(1, 3)), x)
    assert len(notes) == 1 and f"{4 * 4} values per result" in notes[0]
    assert MAX_VALUES == 16
    _res, notes = _notes(lambda v: v.sum(axis=(1, 3)), np.ones((5, 4, 7, 5), np.float32))
    assert notes == []


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("keepdims", [False, True])
def test_every_op_and_dtype_gives_numpys_answer(dtype, op, keepdims):
    rng = np.random.default_rng()
    x = _data(rng, (3, 5, 6, 10), dtype)
    if op == "prod" and dtype.kind == "f":
        x = np.where(np.isfinite(x), x * 0.5, x).astype(dtype)
    fn = pool(op, keepdims)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        got = pl.compile(fn)(x)
        want = fn(x)
        if dtype == BF16 and op in ("sum", "mean", "prod"):
            # ml_dtypes accumulates in bfloat16; the compiler's contract is float32
            want = fn(x.astype(np.float32)).astype(BF16)
        exact = None if op in ("max", "min") or dtype.kind in "iu" else fn(
            x.astype(np.float64))
    _check(got, want, exact, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_a_prologue_only_the_pooling_reads_joins_its_one_kernel(dtype):
    def fn(x, b):
        n, c, h, w = x.shape
        y = np.maximum(x * 2 + b, 0)
        return y.reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))

    rng = np.random.default_rng()
    x = _data(rng, (2, 3, 10, 14), dtype)
    b = np.asarray(0.25, dtype=dtype)
    res, notes = _notes(fn, x, b)
    assert notes and _kernels(res.graph) == [("fused", "fused_kernel")]
    assert sum(n.op == "maximum" for n in res.graph.nodes[
        next(k for k, n in res.graph.nodes.items() if n.op == "fused")].attrs["body"]) == 4
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        got = pl.compile(fn)(x, b)
        exact = fn(x.astype(np.float64), np.float64(b))
    want = fn(x, b) if dtype != BF16 else exact.astype(BF16)
    _check(got, want, exact, dtype)


def test_a_prologue_read_elsewhere_is_computed_once_and_pooled():
    def fn(x):
        n, c, h, w = x.shape
        y = np.maximum(x, 0)
        return y.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5)), y

    x = _data(np.random.default_rng(), (2, 3, 8, 6), np.dtype(np.float32))
    res, notes = _notes(fn, x)
    assert notes
    assert sum(n.op == "maximum" for n in res.graph) <= 1  # not rebuilt per view
    got, want = pl.compile(fn)(x), fn(x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@needs_gxx
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_the_generated_kernel_on_the_emulator_into_poisoned_outputs(dtype, special):
    source = ("def f(x):\n"
              "    n, c, h, w = x.shape\n"
              "    s = (n, c, h // 2, 2, w // 2, 2)\n"
              "    return np.abs(x).reshape(s).max(axis=(3, 5)) + (x * x).reshape(s).mean(\n"
              "        axis=(3, 5))\n")
    assert _check_program(source, [((3, 5, 6, 14), dtype)], special, 11) == 1


LARGE = {"sum_0_2": ("lambda x: x.sum(axis=(0, 2))", (4, 1030, 33)),
         "mean_1_3_keep": ("lambda x: x.mean(axis=(1, 3), keepdims=True)", (64, 30, 17, 19)),
         "max_0_2": ("lambda x: x.max(axis=(0, 2))", (9, 350, 31, 3)),
         "min_0_2_3": ("lambda x: x.min(axis=(0, 2, 3))", (3, 1100, 5, 6))}


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(LARGE))
def test_larger_reductions_over_axes_apart_are_one_row_program(name, dtype):
    source, shape = LARGE[name]
    fn = eval(source)
    x = _data(np.random.default_rng(), shape, dtype)
    res, notes = _notes(fn, x)
    assert notes == []
    assert _kernels(res.graph) == [("fused_rows", "reduction_kernel")]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        got = pl.compile(fn)(x)
        exact = fn(x.astype(np.float64))
        want = fn(x) if dtype != BF16 else exact.astype(BF16)
    _check(got, want, None if "sum" not in name and "mean" not in name else exact, dtype)


def test_a_lone_reduction_over_axes_apart_in_few_rows_stays_cupys():
    x = np.ones((64, 512, 256), np.float32)  # 512 rows: CuPy's reduction was faster
    res, _ = _notes(lambda v: v.sum(axis=(0, 2)), x)
    assert _kernels(res.graph) == [("sum", "cupy")]


TRAILING = {
    "norms": ("lambda d: np.sqrt((d * d).sum(-1))", (1001, 3)),
    "rgb_mean": ("lambda x: x.mean(-1)", (37, 41, 3)),
    "pairs_max": ("lambda x: x.reshape(x.shape[0], 7, 2).max(-1)", (50, 14)),
    "last_two_min": ("lambda x: x.min(axis=(-2, -1), keepdims=True)", (30, 4, 4)),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(TRAILING))
def test_a_few_last_values_a_row_are_one_elementwise_kernel(name, dtype):
    source, shape = TRAILING[name]
    fn = eval(source, {"np": np})
    x = _data(np.random.default_rng(), shape, dtype)
    res, notes = _notes(fn, x)
    assert len(notes) == 1
    assert _kernels(res.graph) == [("fused", "fused_kernel")]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        got = pl.compile(fn)(x)
        exact = fn(x.astype(np.float64))
        want = fn(x) if dtype != BF16 else exact.astype(BF16)
    _check(got, want, None if "max" in name or "min" in name else exact, dtype)


@pytest.mark.parametrize("source", [
    "lambda d: d / np.sqrt((d * d).sum(-1, keepdims=True))",   # broadcast back
    "lambda d: (d - d.max(-1, keepdims=True)).sum(-1)",         # made from a reduction
    "lambda d: np.exp(d - d.max(-1, keepdims=True)) / np.exp(d - d.max(-1, keepdims=True)"
    ").sum(-1, keepdims=True)",                                  # a softmax
])
def test_chains_of_reductions_over_a_few_values_stay_row_programs(source):
    fn = eval(source, {"np": np})
    x = _data(np.random.default_rng(), (64, 4), np.dtype(np.float32), special=False)
    res, notes = _notes(fn, x)
    assert notes == []
    assert [op for op, _ in _kernels(res.graph)][-1] in ("fused_rows", "softmax")
    np.testing.assert_allclose(pl.compile(fn)(x), fn(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cols", [2, 3, 7, 8, 9, 15, 16])
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), np.dtype(np.float32)],
                         ids=lambda d: d.name)
def test_a_float_sum_of_a_few_last_values_is_numpys_bit_for_bit(cols, dtype):
    x = _data(np.random.default_rng(), (4000, cols), dtype, special=False)
    for fn in (lambda v: v.sum(-1), lambda v: v.mean(-1, keepdims=True)):
        _res, notes = _notes(fn, x)
        assert len(notes) == 1
        got, want = pl.compile(fn)(x), fn(x)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@needs_gxx
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("name", sorted(TRAILING))
def test_the_unrolled_rows_on_the_emulator_into_poisoned_outputs(name, special):
    source, shape = TRAILING[name]
    program = f"def f(x):\n    return ({source})(x)\n"
    assert _check_program(program, [(shape, np.dtype(np.float32))], special, 3) == 1


@needs_gxx
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("name", sorted(LARGE))
def test_the_row_programs_on_the_emulator_into_poisoned_outputs(name, special):
    source, shape = LARGE[name]
    program = f"def f(x):\n    return ({source})(x)\n"
    assert _check_program(program, [(shape, np.dtype(np.float32))], special, 5) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16)],
                         ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(LARGE))
def test_on_the_gpu_reductions_over_axes_apart_give_numpys_answer(name, dtype):
    cp = pytest.importorskip("cupy")
    source, shape = LARGE[name]
    fn = eval(source)
    x = _data(np.random.default_rng(), tuple(d * 3 for d in shape), dtype)
    f = pl.compile(fn, backend="cupy")
    got = cp.asnumpy(f(cp.asarray(x)))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        exact = fn(x.astype(np.float64))
    _check(got, fn(x), None if "sum" not in name and "mean" not in name else exact, dtype)
    assert len(f.explain(cp.asarray(x)).kernels) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(TRAILING))
def test_on_the_gpu_a_few_last_values_give_numpys_answer_in_one_kernel(name, dtype):
    cp = pytest.importorskip("cupy")
    source, shape = TRAILING[name]
    fn = eval(source, {"np": np})
    x = _data(np.random.default_rng(), (shape[0] * 97, *shape[1:]), dtype)
    f = pl.compile(fn, backend="cupy")
    got = cp.asnumpy(f(cp.asarray(x)))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        exact = fn(x.astype(np.float64))
        want = fn(x) if dtype != BF16 else exact.astype(BF16)
    _check(got, want, None if "max" in name or "min" in name else exact, dtype)
    assert len(f.explain(cp.asarray(x)).kernels) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [*FLOATS, np.dtype(np.int32)], ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["max", "mean", "sum"])
def test_on_the_gpu_pooling_by_reshape_is_one_kernel_with_numpys_answer(dtype, op):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng()
    x = _data(rng, (4, 19, 30, 34), dtype)
    fn = pool(op)
    f = pl.compile(fn, backend="cupy")
    got = cp.asnumpy(f(cp.asarray(x)))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        want = fn(x) if dtype != BF16 or op == "max" else fn(
            x.astype(np.float32)).astype(BF16)
        exact = None if op == "max" or dtype.kind in "iu" else fn(x.astype(np.float64))
    _check(got, want, exact, dtype)
    assert len(f.explain(cp.asarray(x)).kernels) == 1
