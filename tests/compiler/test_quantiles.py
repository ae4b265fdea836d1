"""The quantile op's GPU interpolation, run with NumPy as the array module: NumPy's values
and dtypes bit for bit (each of ``_lerp``'s steps in the dtype NumPy's promotion gives
it), for the linear and midpoint methods, quantiles and percentiles, ``q`` a Python
number, a NumPy scalar of another dtype, an int or a sequence (its dtype kept), float16
to float64 and integer data with NaN, several axes and keepdims. Compiled functions keep
``q``'s dtype too. The GPU side: ``tests/compiler/backend/test_scans_gpu.py``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler import quantiles


@pytest.fixture
def rng():
    return np.random.default_rng()


class _NotNumpy:
    """NumPy under another name: the op's reference takes its GPU path with it."""

    def __getattr__(self, name):
        return getattr(np, name)


QS = [0.9, 0.5, 0, 1, (0.01, 0.5, 0.99), [0.25, 0.75], (0, 1), np.float32(0.3),
      np.float16(0.5), np.float64(0.5), (np.float32(0.1), np.float32(0.75))]


def _percent(q):
    if isinstance(q, (int, float)) and type(q) in (int, float):
        return q * 100
    if np.ndim(q) == 0:
        return type(q)(q * 100)
    return type(q)(type(v)(v * 100) for v in q)


def _attrs(q, axis, keep, method, percentile):
    qs = np.asarray(q)
    attrs = {"q": q if np.ndim(q) == 0 else tuple(qs.tolist()), "axis": axis,
             "keepdims": keep, "method": method, "percentile": percentile}
    if np.ndim(q):
        attrs["q_dtype"] = qs.dtype.str
    return attrs


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.uint8])
@pytest.mark.parametrize("shape, axis", [((1001,), None), ((16, 130), -1), ((17, 9), 0),
                                         ((3, 8, 5), (0, 2)), ((2, 1), 1)])
@pytest.mark.parametrize("method", ["linear", "midpoint"])
@pytest.mark.parametrize("percentile", [False, True])
def test_the_gpu_interpolation_is_numpys_bit_for_bit(rng, dtype, shape, axis, method,
                                                     percentile):
    xp = _NotNumpy()
    for k, q in enumerate(QS):
        if dtype == np.uint8:
            x = rng.integers(0, 255, shape).astype(dtype)
        else:
            x = (rng.standard_normal(shape) * 3).astype(dtype)
            if dtype != np.int32 and k % 3 == 0:
                x.reshape(-1)[rng.integers(x.size)] = np.nan
        qq = _percent(q) if percentile else q
        fn = np.percentile if percentile else np.quantile
        for keep in (False, True):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                want = np.asarray(fn(x, qq, axis=axis, method=method, keepdims=keep))
                got = quantiles.REGISTRY["quantile"].reference(
                    xp, [x], _attrs(qq, axis, keep, method, percentile))
            if got.size == 1 and np.isnan(got.astype(np.float64)).all() \
                    and want.dtype == x.dtype:
                want = want.astype(got.dtype)  # NumPy's 0-d NaN in the array's dtype
            assert got.dtype == want.dtype, (q, keep)
            assert got.shape == want.shape, (q, keep)
            np.testing.assert_array_equal(got, want, err_msg=f"q={q!r} keep={keep}")


def test_a_float16_median_of_an_even_count_rounds_as_numpys(rng):
    """``b - (b - a) * 0.5`` in float64 rounded once to float16 where ``q`` is a
    sequence: the value CuPy's own interpolation missed by a unit in the last place."""
    x = rng.standard_normal((64, 130)).astype(np.float16)
    attrs = _attrs((0.01, 0.5, 0.99), -1, False, "linear", False)
    got = quantiles.REGISTRY["quantile"].reference(_NotNumpy(), [x], attrs)
    want = np.quantile(x, (0.01, 0.5, 0.99), axis=-1)
    assert got.dtype == want.dtype == np.float64
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("q, dtype", [((np.float32(0.1), np.float32(0.9)), np.float32),
                                      ((0.1, 0.9), np.float64), (np.float32(0.5), np.float32),
                                      (0.5, np.float16), (np.float64(0.5), np.float64)])
def test_compiled_quantiles_keep_the_dtype_q_gives(rng, q, dtype):
    """A sequence of float32 ``q`` keeps float32 (not the float64 of its Python values),
    and a NumPy float64 scalar is not a weak Python float."""
    x = rng.standard_normal((5, 7)).astype(np.float16)
    f = pl.compile(lambda a: np.quantile(a, q, axis=-1))
    got, want = f(x), np.quantile(x, q, axis=-1)
    assert got.dtype == want.dtype == dtype
    np.testing.assert_array_equal(got, want)
