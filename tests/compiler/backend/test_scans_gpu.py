"""Scans and sorts compiled for CuPy arrays: ``np.cumsum``, ``np.cumprod``, ``np.sort``
and ``np.argsort`` run as CuPy's own functions between the generated kernels, matching
NumPy (float64 references where they are the meaningful ones) on fresh random data with
NaN, infinities and -0.0, into a poisoned memory pool; a program around them keeps its
fused kernels, and repeated calls (the fast path) stay right. The CPU side:
``tests/compiler/test_scans.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from tests.compiler.backend.support import poison_pool
from tests.compiler.test_scans import _data

cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "sort", "argsort"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int8,
                                   np.bool_])
@pytest.mark.parametrize("shape, axis", [((1000,), 0), ((37, 129), -1), ((37, 129), 0),
                                         ((3, 5, 7), 1), ((3, 5, 7), None)])
def test_scans_and_sorts_on_the_gpu_match_numpy(rng, op, dtype, shape, axis):
    x = _data(rng, shape, dtype)
    if op == "cumprod" and np.dtype(dtype).kind in "iu":
        x = x % 3
    elif op == "cumprod" and np.dtype(dtype).kind == "f":
        x = (1 + x.astype(np.float64) / 1000).astype(dtype)  # products stay in range
    if op == "argsort":
        x = _data(rng, shape, dtype, special=False)  # NaN ties order differently

    def program(a):
        if op == "argsort":
            return np.argsort(a, axis=axis)
        return getattr(np, op)(a, axis=axis)

    f = pl.compile(program, backend="cupy")
    poison_pool()
    got = cp.asnumpy(f(cp.asarray(x)))
    with np.errstate(all="ignore"):
        want = program(x) if op != "argsort" else np.argsort(x, axis=axis, kind="stable")
    assert got.dtype == want.dtype and got.shape == want.shape
    if op == "argsort":
        flat = x.reshape(-1) if axis is None else x
        np.testing.assert_array_equal(np.take_along_axis(flat, got, -1 if axis is None
                                                         else axis),
                                      np.sort(flat, axis=-1 if axis is None else axis))
    elif want.dtype.kind == "f":
        # CuPy's running sums may round float16 otherwise than NumPy's step by step
        tol = {"float16": 5e-2, "float32": 1e-4, "float64": 1e-10}[want.dtype.name]
        with np.errstate(all="ignore"):
            exact = program(x.astype(np.float64)).astype(np.float64)
        finite = np.isfinite(exact)
        scale = max(1.0, float(np.abs(exact[finite]).max())) if finite.any() else 1.0
        np.testing.assert_allclose(got.astype(np.float64), exact, rtol=tol,
                                   atol=tol * scale, equal_nan=True)
        assert np.array_equal(np.isnan(got), np.isnan(want))
    else:
        np.testing.assert_array_equal(got, want)
    assert [k["kind"] for k in f.explain(cp.asarray(x)).kernels].count("library") == 1


def test_a_top_p_cut_on_the_gpu_matches_numpy_call_after_call(rng):
    def top_p(logits):
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
        s = np.sort(p, axis=-1)[:, ::-1]
        return np.where(np.cumsum(s, axis=-1) - s < 0.9, s, 0)

    def margin(logits):  # how far each running sum is from the cut
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        s = np.sort(p / p.sum(axis=-1, keepdims=True), axis=-1)[:, ::-1]
        return np.abs(np.cumsum(s, axis=-1) - s - 0.9)

    f = pl.compile(top_p, backend="cupy")
    for _ in range(4):
        x = rng.standard_normal((64, 1000)).astype(np.float32)
        poison_pool()
        got, want = cp.asnumpy(f(cp.asarray(x))), top_p(x)
        # a value whose running sum is within rounding of 0.9 may fall either side of the
        # cut (the GPU's softmax sums in another order); everywhere else, NumPy's answer
        sure = margin(x) > 1e-5
        np.testing.assert_allclose(got[sure], want[sure], rtol=1e-4, atol=1e-6)
        assert sure.mean() > 0.99
    kinds = [k["kind"] for k in f.explain(cp.asarray(x)).kernels]
    assert kinds.count("library") == 2 and len(kinds) >= 4


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32])
@pytest.mark.parametrize("shape, axis", [((1001,), None), ((64, 130), -1), ((64, 129), 0),
                                         ((3, 8, 5), 1)])
def test_median_on_the_gpu_matches_numpy(rng, dtype, shape, axis):
    x = _data(rng, shape, dtype)

    def program(a):
        return np.median(a, axis=axis)

    _matches_numpy_on_the_gpu(program, x, rtol=1e-6)


def _matches_numpy_on_the_gpu(program, x, rtol):
    """``program`` compiled for CuPy against NumPy's own call: dtype, shape, values
    (NaN where NumPy has NaN), its outputs poisoned first."""
    f = pl.compile(program, backend="cupy")
    poison_pool()
    got = cp.asnumpy(f(cp.asarray(x)))
    with np.errstate(all="ignore"):
        want = program(x)
    assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32])
@pytest.mark.parametrize("shape, axis", [((1001,), None), ((64, 130), -1), ((64, 129), 0),
                                         ((3, 8, 5), (0, 2))])
@pytest.mark.parametrize("q, method", [(0.9, "linear"), ((0.01, 0.5, 0.99), "linear"),
                                       (0.3, "nearest"), (0.25, "midpoint")])
def test_quantiles_on_the_gpu_match_numpy(rng, dtype, shape, axis, q, method):
    """CuPy's quantile, with NumPy's NaN rule and result dtype."""
    x = _data(rng, shape, dtype)

    def program(a):
        return np.quantile(a, q, axis=axis, method=method) * 2

    _matches_numpy_on_the_gpu(program, x, rtol=2e-3 if dtype == np.float16 else 1e-6)
