"""Two-stage full sums: when they split, how, and that the answer stays NumPy's."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler import trace
from pyc_lab.compiler.ops import run_graph
from pyc_lab.compiler.passes import PassContext, split_reduction
from pyc_lab.compiler.passes.split_reduction import (
    MAX_COLUMNS,
    MIN_COLUMNS,
    MIN_ELEMENTS,
    columns_for,
)


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
    ("float16", lambda v: v.sum(), np.ones(1 << 20, np.float16)),
    ("an axis", lambda v: v.sum(axis=0), np.ones((1024, 1024), np.float32)),
    ("with dtype=", lambda v: v.sum(dtype=np.float64), np.ones(1 << 20, np.float32)),
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
