"""Two-stage full sums, maxima, minima and means: when they split, how, and that the
answer stays NumPy's (maxima, minima and integer sums bit for bit, NaN included)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyc_lab as pl
from pyc_lab.compiler import trace
from pyc_lab.compiler.codegen import supports
from pyc_lab.compiler.ops import run_graph
from pyc_lab.compiler.passes import PassContext, PassManager, split_reduction
from pyc_lab.compiler.passes.split_reduction import (
    MAX_COLUMNS,
    MIN_COLUMNS,
    MIN_ELEMENTS,
    PLAIN_MIN_ELEMENTS,
    columns_for,
)
from pyc_lab.compiler.policy import choose
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_fuzz_emulated import _check_program

BF16 = np.dtype(ml_dtypes.bfloat16)


def _split(fn, x):
    graph, _ = trace(fn, (x,))
    g = graph.copy()
    ctx = PassContext()
    changed = split_reduction.run(g, ctx)
    g.verify()
    return graph, g, changed, ctx.notes


def test_columns_divide_and_stay_in_range():
    for n in (1 << 18, 1 << 26, 3 * 5 * 7 * 11 * 13 * 17, 10 ** 6, 4096 * 4097):
        c = columns_for(n)
        assert c is not None and n % c == 0 and MIN_COLUMNS <= c <= MAX_COLUMNS
        assert n // c >= 2
    assert columns_for(1_000_003) is None  # prime
    assert columns_for(2 * 1_000_003) is None  # no divisor in range


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.bool_])
@pytest.mark.parametrize("keepdims", [False, True])
def test_integer_and_bool_sums_split_bit_for_bit(dtype, keepdims):
    rng = np.random.default_rng(4)
    x = (rng.integers(-100, 100, (512, 1024)) if dtype != np.bool_
         else rng.random((512, 1024)) < 0.5).astype(dtype)
    graph, g, changed, notes = _split(lambda v: v.sum(keepdims=keepdims), x)
    assert changed and notes and "two stages" in notes[0]
    (want,) = run_graph(graph, [x], np)
    (got,) = run_graph(g, [x], np)
    assert got.dtype == want.dtype and got.shape == want.shape == np.sum(
        x, keepdims=keepdims).shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_sums_split_within_rounding_and_keep_specials(dtype):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(1 << 20) + 0.1).astype(dtype)
    _graph, g, changed, _ = _split(lambda v: (v * v).sum(), x)
    assert changed
    (got,) = run_graph(g, [x], np)
    exact = float((x.astype(np.float64) ** 2).sum())
    assert got.dtype == dtype
    assert abs(float(got) - exact) <= 1e-5 * exact
    for special, want in ((np.nan, np.nan), (np.inf, np.inf)):
        y = x.copy()
        y[12345] = special
        (got,) = run_graph(g, [y], np)
        np.testing.assert_array_equal(got, np.asarray(want, dtype))


@pytest.mark.parametrize(("label", "fn", "x"), [
    ("small", lambda v: v.sum(), np.ones(MIN_ELEMENTS - 1, np.float32)),
    ("prime size", lambda v: v.sum(), np.ones(1_000_003, np.float32)),
    ("an axis", lambda v: v.sum(axis=0), np.ones((1024, 1024), np.float32)),
    ("with dtype=", lambda v: v.sum(dtype=np.float64), np.ones(1 << 20, np.float32)),
    ("float16 sum to float32", lambda v: v.sum(dtype=np.float32), np.ones(1 << 20, np.float16)),
    ("small max", lambda v: v.max(), np.ones(MIN_ELEMENTS - 1, np.float32)),
])
def test_what_stays_one_reduction(label, fn, x):
    graph, g, changed, _ = _split(fn, x)
    assert not changed, label
    assert g.text() == graph.text()


def test_compiled_full_sum_matches_numpy_and_explains():
    x = (np.random.default_rng(6).standard_normal(3 << 19) + 0.1).astype(np.float32)
    f = pl.compile(lambda v: np.sum(v * v))
    got = f(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.sum(x.astype(np.float64) ** 2), rtol=1e-5)
    assert any("split_reduction: sum over 1572864 elements" in n for n in f.explain(x).notes)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32, np.float64, np.int8,
                                   np.uint16, np.bool_])
def test_maxima_and_minima_split_bit_for_bit_with_nan(rng, op, dtype):
    """Exact in any order: the answer is NumPy's, a NaN anywhere included; a float16 or
    bfloat16 maximum splits too (nothing rounds)."""
    shape = (300, 1001)  # a plain array past PLAIN_MIN_ELEMENTS
    x = (rng.standard_normal(shape) * 50).astype(dtype) if dtype != np.bool_ \
        else rng.random(shape) < 0.001
    graph, g, changed, notes = _split(lambda v: getattr(v, op)(), x)
    assert changed and f"{op} over {x.size} elements in two stages" in notes[0]
    for y in (x, _with(x, np.nan), _with(x, -np.inf)):
        (want,) = run_graph(graph, [y], np)
        (got,) = run_graph(g, [y], np)
        assert got.dtype == want.dtype and got.shape == want.shape
        if got.dtype == BF16:  # NumPy's testing does not see bfloat16 NaNs as equal
            got, want = got.astype(np.float32), want.astype(np.float32)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_half_precision_sums_and_means_split_with_float32_partials(rng, dtype, op, keepdims):
    """A float16 or bfloat16 sum or mean keeps float32 partial results and rounds once, as
    one row kernel does: the two stages give the float32 answer rounded to the dtype (a
    16-bit partial result would not), NaN and infinities as NumPy has them; the prologue
    and the widening join the first stage's kernel, the rounding the second's."""
    x = (rng.standard_normal((300, 1001)) * 0.3 + 0.05).astype(dtype)  # float16 sum < 65504
    fn = {"sum": lambda v: (v * v).sum(keepdims=keepdims),
          "mean": lambda v: (v * v).mean(keepdims=keepdims)}[op]
    graph, g, changed, notes = _split(fn, x)
    assert changed and f"{op} over 300300 elements in two stages" in notes[0]
    casts = [n for n in g if n.op == "astype"]
    assert [c.dtype for c in casts] == [np.dtype(np.float32), np.dtype(dtype)]
    exact = getattr(np, op)(x.astype(np.float64) ** 2, keepdims=keepdims)
    (got,) = run_graph(g, [x], np)
    assert got.dtype == np.dtype(dtype) and got.shape == exact.shape
    # within the float32 sum's error, then one rounding to the dtype
    ulp = 2.0 ** -10 if dtype == np.float16 else 2.0 ** -7
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=ulp, atol=0)
    for special in (np.nan, np.inf, -np.inf):  # NaN, or +inf (squared)
        y = x.copy()
        y.reshape(-1)[123457] = special
        (got,) = run_graph(g, [y], np)
        want = np.full(exact.shape, np.nan if np.isnan(special) else np.inf)
        np.testing.assert_array_equal(got.astype(np.float64), want)
    fused = PassManager().run(graph.copy()).graph
    rows = [n for n in fused if n.op == "fused_rows"]
    assert len(rows) == 2 and all(supports(n, fused)[0] for n in rows)
    assert "astype" in rows[0].attrs["ops"] and rows[0].dtype == np.float32
    assert rows[1].attrs["ops"][-1] == "astype" or (
        keepdims and rows[1].attrs["ops"][-2:] == ("astype", "reshape"))


def test_between_one_row_and_plain_min_elements_only_a_prologue_splits(rng):
    """135201 values: a plain sum or maximum stays CuPy's full reduction (faster there),
    one with elementwise work before it splits so that the work joins the first stage."""
    x = rng.standard_normal((33, 4097)).astype(np.float32)
    assert MIN_ELEMENTS <= x.size < PLAIN_MIN_ELEMENTS
    for op in ("sum", "max"):
        _graph, _g, changed, _ = _split(lambda v, op=op: getattr(v, op)(), x)
        assert not changed, op
        _graph, g, changed, _ = _split(lambda v, op=op: getattr(np.abs(v) * 2, op)(), x)
        assert changed, op
        (got,) = run_graph(g, [x], np)
        want = getattr(np.abs(x) * 2, op)()
        np.testing.assert_allclose(got, want, rtol=1e-5)
    # a plain bfloat16 sum or mean splits: CuPy's path would copy it to float32 first
    xb = x.astype(BF16)
    for op in ("sum", "mean"):
        _graph, _g, changed, _ = _split(lambda v, op=op: getattr(v, op)(), xb)
        assert changed, op
    _graph, _g, changed, _ = _split(lambda v: v.max(), xb)  # exact, no copy: CuPy's
    assert not changed


def _with(x, value):
    if x.dtype.kind != "f":
        return x
    y = x.copy()
    y.reshape(-1)[123457] = value
    return y


@pytest.fixture
def rng():
    return np.random.default_rng()


def test_any_of_a_large_array_is_two_row_kernels_with_the_test_in_the_first(rng):
    """``np.isnan(x).any()`` over 135201 values: the isnan test runs inside the first
    stage's kernel (it read a materialised float32 copy through CuPy's reduction)."""
    x = rng.standard_normal((33, 4097)).astype(np.float32)
    graph, _ = trace(lambda v: np.isnan(v).any(), (x,))
    res = PassManager().run(graph)
    kernels = [(res.graph.node(d.node).op, d.choice)
               for d in choose(res.graph, "cupy", "balanced", supports)
               if d.choice != "source" and res.graph.node(d.node).op != "reshape"]
    assert kernels == [("fused_rows", "reduction_kernel")] * 2, kernels
    f = pl.compile(lambda v: np.isnan(v).any())
    assert f(x) is np.False_ or f(x) == np.False_
    x[20, 4000] = np.nan
    assert f(x) == np.True_ and np.asarray(f(x)).dtype == np.bool_


def _huber(p, t):
    d = np.abs(p - t)  # read three times, all inside the loss
    return np.where(d < 1, 0.5 * d * d, d - 0.5).mean()


def _huber_and_d(p, t):
    d = np.abs(p - t)
    return np.where(d < 1, 0.5 * d * d, d - 0.5).mean(), d  # d also returned


def test_a_value_read_several_times_inside_the_prologue_joins_the_first_stage(rng):
    """A Huber loss's ``abs(p - t)`` is read three times by the loss and by nothing
    else: the whole prologue runs in the first stage's kernel (it was a pass of its own
    writing ``d``); returned as well, ``d`` is computed once at its own shape."""
    p, t = (rng.standard_normal((512, 1024)).astype(np.float32) for _ in range(2))
    for fn, kernels in ((_huber, [("fused_rows", "reduction_kernel"),
                                  ("mean", "reduction_kernel")]),
                        (_huber_and_d, [("fused", "fused_kernel"),
                                        ("fused_rows", "reduction_kernel"),
                                        ("mean", "reduction_kernel")])):
        graph, _ = trace(fn, (p, t))
        res = PassManager().run(graph)
        got = [(res.graph.node(d.node).op, d.choice)
               for d in choose(res.graph, "cupy", "balanced", supports)
               if d.choice != "source" and res.graph.node(d.node).op != "reshape"]
        assert got == kernels, got
        want = fn(p, t)
        out = pl.compile(fn)(p, t)
        for g, w in zip(out if isinstance(out, tuple) else (out,),
                        want if isinstance(want, tuple) else (want,), strict=True):
            assert np.asarray(g).dtype == np.asarray(w).dtype
            np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_means_split_within_rounding(rng, dtype):
    x = (rng.standard_normal((300, 1001)) * 5 + 1).astype(dtype)
    _graph, g, changed, notes = _split(lambda v: v.mean(), x)
    assert changed and "mean over 300300 elements" in notes[0]
    (got,) = run_graph(g, [x], np)
    want = np.mean(x)
    assert got.dtype == want.dtype
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got, np.mean(x.astype(np.float64)), rtol=tol, atol=tol)


_PROLOGUES = {
    "x": lambda v: v,
    "x*x": lambda v: v * v,
    "abs(x)+1": lambda v: np.abs(v) + 1,
    "x-(x>0)": lambda v: v - (v > 0),
}


@settings(deadline=None)
@given(rows=st.sampled_from([31, 63, 64, 65, 255, 257, 1031]),
       cols=st.sampled_from([1024, 1025, 2048]),
       op=st.sampled_from(["sum", "max", "min", "mean"]),
       dtype=st.sampled_from([np.int8, np.int32, np.uint16, np.bool_, np.float16, BF16,
                              np.float32, np.float64]),
       prologue=st.sampled_from(sorted(_PROLOGUES)),
       keepdims=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_random_full_reductions_around_the_threshold_are_numpys(rows, cols, op, dtype,
                                                                 prologue, keepdims, seed):
    """Sums, maxima, minima and means over every element, of sizes below, at and above
    MIN_ELEMENTS (some with no divisor in range), after a small elementwise prologue:
    the compiled call gives NumPy's dtype and shape, integers, maxima and minima bit for
    bit, floats within rounding."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        x = rng.random((rows, cols)) < 0.5
    elif np.dtype(dtype).kind in "iu":
        x = rng.integers(1, 100, (rows, cols)).astype(dtype)
    else:
        x = (rng.standard_normal((rows, cols)) + 0.1).astype(dtype)
    pro = _PROLOGUES[prologue]

    def fn(v):
        return getattr(np, op)(pro(v), keepdims=keepdims)

    with np.errstate(all="ignore"):
        try:
            want = fn(x)
        except TypeError:  # NumPy refuses the prologue for this dtype (bool - bool)
            return
        got = pl.compile(fn, backend="numpy")(x)
    assert np.asarray(got).dtype == np.asarray(want).dtype
    assert np.shape(got) == np.shape(want)
    half = np.dtype(dtype) in (np.dtype(np.float16), BF16)
    if (np.asarray(want).dtype.kind == "f" or half) and op in ("sum", "mean"):
        with np.errstate(all="ignore"):  # the prologue in NumPy's dtype, then exactly
            exact = getattr(np, op)(pro(x).astype(np.float64), keepdims=keepdims)
            if half:  # float32 accumulation, one rounding (overflow to inf included)
                exact = np.asarray(exact).astype(dtype).astype(np.float64)
        rtol = {np.dtype(np.float16): 2.0 ** -9, BF16: 2.0 ** -7,
                np.dtype(np.float32): 1e-5}.get(np.dtype(dtype), 1e-12)
        np.testing.assert_allclose(np.asarray(got).astype(np.float64), exact, rtol=rtol)
    else:
        np.testing.assert_array_equal(got, want)


@needs_gxx
@pytest.mark.parametrize(("source", "dtype"), [
    ("def f(x):\n    return ((x - 0.5) ** 2).mean()\n", np.float16),
    ("def f(x):\n    return np.abs(x).sum(keepdims=True)\n", BF16),
])
def test_the_generated_kernels_of_a_half_precision_split_compute_numpys_values(source, dtype):
    """Both stages' generated row kernels, run on the CPU on values with NaN and Inf and
    without: each one's output is the graph's reference value (the first stage's float32
    partial results, the rounded total)."""
    for special in (False, True):
        assert _check_program(source, [((300, 1001), np.dtype(dtype))], special, 7) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("name", ["mse", "huber", "plain_sum", "max_abs"])
def test_on_the_gpu_half_precision_losses_are_two_row_kernels_with_numpys_answer(dtype, name):
    cp = pytest.importorskip("cupy")
    fns = {"mse": lambda p, t: ((p - t) ** 2).mean(),
           "huber": lambda p, t: np.where(np.abs(p - t) < 1, 0.5 * (p - t) ** 2,
                                          np.abs(p - t) - 0.5).mean(),
           "plain_sum": lambda p, t: (p * 0.01).sum(),
           "max_abs": lambda p, t: np.abs(p - t).max()}
    fn = fns[name]
    rng = np.random.default_rng()
    p, t = ((rng.standard_normal((2048, 1000)) * 0.5).astype(dtype) for _ in range(2))
    f = pl.compile(fn, backend="cupy")
    got = f(cp.asarray(p), cp.asarray(t))
    got = cp.asnumpy(got)
    with np.errstate(all="ignore"):
        exact = np.asarray(fn(p.astype(np.float64), t.astype(np.float64)))
        numpys = np.asarray(fn(p[:2, :2], t[:2, :2])).dtype  # bf16 * 0.5 is float32
    assert got.dtype == numpys and got.shape == ()
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=2e-2 if dtype == BF16
                               else 2e-3)
    assert len(f.explain(cp.asarray(p), cp.asarray(t)).kernels) == 2
