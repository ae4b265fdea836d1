"""Column programs on the GPU: functions normalising over a middle axis, over the batch
or over ``(H, W)`` of NHWC, compiled for CuPy arrays, run as one generated kernel and
match float64 NumPy on fresh random data with NaN and infinities, in float32, float16
and float64, at sizes that fill the GPU and at odd ones. The CPU side:
``tests/compiler/test_column_programs.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from tests.compiler.test_column_programs import APART, PROGRAMS, _data

cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

_TOL = {np.float32: 2e-5, np.float16: 1e-2, np.float64: 1e-11}


# a float16 np.var is its own kernel (float16 accumulation), read by the program
_CASES = [(name, dtype, r) for name in sorted(PROGRAMS)
          for dtype in (np.float32, np.float16, np.float64) for r in (37, 512)
          if not (name == "batch_stats_norm" and dtype == np.float16)]


@pytest.mark.parametrize("name, dtype, r", _CASES)
def test_column_programs_on_the_gpu_match_numpy(name, dtype, r):
    fn, shapes = PROGRAMS[name]
    rng = np.random.default_rng(r)
    args = [_data(rng, s, dtype) for s in shapes(r)]
    f = pl.compile(fn, backend="cupy")
    dargs = [cp.asarray(a) for a in args]
    got = cp.asnumpy(f(*dargs))
    with np.errstate(all="ignore"):
        want = np.asarray(fn(*[a.astype(np.float64) for a in args]))
    assert got.shape == want.shape and got.dtype == np.dtype(dtype)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    tol = _TOL[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    kernels = f.explain(*dargs).kernels
    assert [k["impl"] for k in kernels] == ["reduction_kernel"], kernels


@pytest.mark.parametrize("name", sorted(APART))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("r", [37, 300])
def test_programs_over_axes_apart_on_the_gpu_match_numpy(name, dtype, r):
    fn, shapes, _axes = APART[name]
    rng = np.random.default_rng(r)
    (x,) = [_data(rng, s, dtype) for s in shapes(r)]
    f = pl.compile(fn, backend="cupy")
    dx = cp.asarray(x)
    got = cp.asnumpy(f(dx))
    with np.errstate(all="ignore"):
        want = fn(x.astype(np.float64))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=_TOL[dtype], atol=_TOL[dtype])
    assert [k["impl"] for k in f.explain(dx).kernels] == ["reduction_kernel"]


def test_a_training_batch_norm_of_a_resnet_stage_is_one_kernel():
    rng = np.random.default_rng(3)
    x = _data(rng, (32, 256, 28, 28), np.float32, specials=False)
    fn = APART["batch_norm_nchw"][0]
    f = pl.compile(fn, backend="cupy")
    dx = cp.asarray(x)
    got = cp.asnumpy(f(dx))
    np.testing.assert_allclose(got, fn(x.astype(np.float64)), rtol=2e-5, atol=2e-5)
    assert len(f.explain(dx).kernels) == 1


def test_channel_norm_of_an_nchw_batch_is_one_kernel_and_deterministic():
    rng = np.random.default_rng(7)
    x = _data(rng, (16, 256, 56 * 56), np.float32, specials=False)
    g = _data(rng, (256, 1), np.float32, specials=False)
    fn = PROGRAMS["channel_norm"][0]
    f = pl.compile(fn, backend="cupy")
    dx, dg = cp.asarray(x), cp.asarray(g)
    a = cp.asnumpy(f(dx, dg))
    b = cp.asnumpy(f(dx, dg))
    assert np.array_equal(a, b)
    np.testing.assert_allclose(a, fn(x.astype(np.float64), g.astype(np.float64)),
                               rtol=2e-5, atol=2e-5)
