"""NumPy functions that are other ops in disguise — ``np.flip`` (a reversed view),
``np.vstack``/``np.hstack`` (concatenations), ``np.<ufunc>.reduce`` (reductions) — traced
as those ops, with NumPy's results bit for bit and no graph break; forms they do not
cover stay graph breaks that still give NumPy's answer."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl


def _same(fn, *args, breaks=0):
    f = pl.compile(fn)
    got, want = f(*args), fn(*args)
    assert np.asarray(got).dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert f"graph breaks: {breaks}" in str(f.explain()), str(f.explain())


@pytest.fixture
def x():
    x = np.random.default_rng(11).standard_normal((7, 13)).astype(np.float32)
    x[0, :3] = [np.nan, -0.0, np.inf]
    return x


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1)])
def test_flip_is_a_reversed_view(x, axis):
    _same(lambda a: np.flip(a, axis) * 2 + a, x)


def test_fliplr_and_flipud(x):
    _same(lambda a: np.fliplr(a) - np.flipud(a), x)


def test_vstack_and_hstack_are_concatenations(x):
    _same(lambda a: np.vstack([a, a * 2, a[0]]), x)
    _same(lambda a: np.vstack((a[0], a[1])), x)
    _same(lambda a: np.hstack([a, a[:, :2] + 1]), x)
    _same(lambda a: np.hstack([a[0], a[1]]), x)
    _same(lambda a: np.hstack([a.astype(np.float64), a]), x)  # promoted as NumPy does


def test_stacking_an_array_is_a_graph_break(x):
    _same(lambda a: np.vstack(a), x, breaks=1)


@pytest.mark.parametrize("ufunc, kw", [
    (np.add, {}), (np.add, {"axis": 1}), (np.add, {"axis": None}),
    (np.add, {"axis": 1, "keepdims": True}), (np.maximum, {"axis": 1}),
    (np.minimum, {}), (np.multiply, {"axis": 0}),
])
def test_ufunc_reduce_is_the_reduction(x, ufunc, kw):
    _same(lambda a: ufunc.reduce(a, **kw), x)


def test_ufunc_reduce_of_integers_and_bools_follows_numpy():
    b = np.random.default_rng(2).standard_normal((6, 9)) > 0
    _same(lambda m: np.add.reduce(m.astype(np.int32), axis=0), b)  # int32 sums to int64
    _same(lambda m: np.logical_and.reduce(m, axis=1), b)
    _same(lambda m: np.logical_or.reduce(m), b)


def test_other_ufunc_methods_stay_graph_breaks(x):
    _same(lambda a: np.add.accumulate(a, axis=1), x, breaks=1)
