"""``x[mask] op= v`` and ``x[mask] = f(x[mask])`` with a traced boolean mask: NumPy's
values and dtypes, one select of the whole array instead of two graph breaks (the
selection's shape depends on the values), NumPy's casting error for an in-place
operator; a sum or mean of every selected value as the reduction of the whole array
with ``where=`` the mask; and the graph break as before wherever the selection is used
as an array otherwise (its shape, another reduction, a returned value, a write in
between, a different mask). The
generated kernel is checked on the CPU emulator; the GPU side is in
``tests/compiler/backend/test_numpy_helpers_gpu.py``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pyc_lab as pl
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_fuzz_emulated import _check_program


def _minus(x):
    y = x * 2
    y[y > 0.5] -= 1
    return y


def _leaky(x):
    y = x.copy()
    y[y < 0] *= 0.1
    return y


def _root(x):
    y = x + 0
    m = y > 1
    y[m] = np.sqrt(y[m])
    return y


def _rows(x):
    y = x * 1
    y[y[:, 0] > 0] /= 2  # a mask of the leading axis: whole rows
    return y


def _centred(x):
    y = x * 1
    y[y > 0] -= y.mean()  # a 0-d traced value
    return y


def _twice_computed_mask(x):
    y = x * 1
    y[y > 0] = np.maximum(-y[y > 0] ** 2, -3)
    return y


def _floor_into_ints(x):
    y = (x * 10).astype(np.int32)
    y[y > 3] //= 2
    return y


FUSED = {f.__name__: f for f in (_minus, _leaky, _root, _rows, _centred,
                                  _twice_computed_mask, _floor_into_ints)}


def _selection_summed_by_columns(x):
    y = x * 1
    return y[y[:, 0] > 0].sum(axis=0), y


def _selection_returned(x):
    y = x * 1
    m = y > 0
    t = y[m]
    t -= 1
    y[m] = t
    return y, t


def _written_in_between(x):
    y = x * 1
    m = y > 0
    t = y[m] * 2
    y[0, 0] = 5
    y[m] = t
    return y


def _another_mask(x):
    y = x * 1
    y[y > 0] = y[y > 0.5] * 2  # NumPy's shape error (or values, if the masks agree)
    return y


AS_ARRAYS = {f.__name__: f for f in (_selection_summed_by_columns, _selection_returned,
                                      _written_in_between, _another_mask)}


@pytest.fixture
def x():
    x = np.random.default_rng().standard_normal((6, 9)).astype(np.float32)
    x[0, :3] = [np.nan, -0.0, np.inf]
    return x


def _same(got, want):
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,), strict=True):
        assert np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("name", sorted(FUSED))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_masked_updates_are_one_select_with_numpys_values(x, name, dtype):
    fn, arg = FUSED[name], x.astype(dtype)
    with np.errstate(all="ignore"):
        want = fn(arg.copy())
        f = pl.compile(fn)
        got = f(arg.copy())
    _same(got, want)
    assert not f.explain(arg).graph_breaks


@pytest.mark.parametrize("name", sorted(AS_ARRAYS))
def test_a_selection_used_as_an_array_is_the_graph_break_it_was(x, name):
    fn = AS_ARRAYS[name]
    try:
        want = fn(x.copy())
    except ValueError:  # NumPy's own error: the same from the compiled function
        with pytest.raises(ValueError):
            pl.compile(fn)(x.copy())
        return
    f = pl.compile(fn)
    _same(f(x.copy()), want)
    assert f.explain(x).graph_breaks


REDUCED = {
    "sum": lambda a: a[a > 0].sum(),
    "mean": lambda a: a[a > 0].mean(),
    "np_mean_of_squares": lambda a: np.mean(a[a > 0.5] ** 2),
    "np_sum_float64": lambda a: np.sum(a[a > 0], dtype=np.float64),
    "masked_loss": lambda a: (a * 2)[a < 1].mean() + 1,
    "rows_mean": lambda a: a[a[:, 0] > 0].mean(),
    "mean_of_nothing": lambda a: a[a > 100].mean(),  # NaN (NumPy warns)
}


@pytest.mark.parametrize("name", sorted(REDUCED))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_sums_and_means_of_a_selection_are_masked_reductions(x, name, dtype):
    """``loss[mask].mean()``: the reduction of the whole array with ``where=`` the mask,
    no selection made (NumPy's dtype; its sum in another order, to rounding)."""
    fn, arg = REDUCED[name], x.astype(dtype)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the mean of nothing
        want = fn(arg)
        f = pl.compile(fn)
        got = f(arg)
    assert type(got) is type(want) and got.dtype == want.dtype
    tol = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-14}[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)
    assert not f.explain(arg).graph_breaks


def test_an_in_place_operator_keeps_numpys_casting_error(x):
    def into_ints(a):
        y = (a * 10).astype(np.int32)
        y[y > 0] -= 1.5
        return y

    with pytest.raises(TypeError):
        into_ints(x)
    with pytest.raises(TypeError, match="same_kind"):
        pl.compile(into_ints)(x)


@needs_gxx
def test_the_generated_select_computes_numpys_values():
    source = ("def f(x, y, m):\n"
              "    z = x * y\n"
              "    z[z < 0] *= 0.25\n"
              "    z[z > 1] = np.sqrt(z[z > 1]) + 1\n"
              "    return z\n")
    specs = [((37, 130), np.dtype(np.float32)), ((130,), np.dtype(np.float32)),
             ((37, 130), np.dtype(bool))]
    assert _check_program(source, specs, True, 5) >= 1
