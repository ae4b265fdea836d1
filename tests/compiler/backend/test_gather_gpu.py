"""Gathers (``x[idx]``, ``np.take``, ``np.take_along_axis``, ``x[np.arange(n), y]``) on
the GPU: one generated kernel with the elementwise work around them, NaN-poisoned
memory, answers against NumPy in float64 on fresh random data; indices out of range
wrap as CuPy's take does. The same programs run on the CPU emulator in
``tests/compiler/test_gather_fusion.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from tests.compiler.backend.support import poison_pool
from tests.compiler.test_gather_fusion import PROGRAMS

cp = pytest.importorskip("cupy")

F16, F32, F64 = np.float16, np.float32, np.float64
_TOL = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-12}

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("n", [3, 1000])
def test_gather_kernels_match_float64_numpy(name, dtype, n):
    rng = np.random.default_rng()
    fn, make = PROGRAMS[name]
    args = make(rng, dtype, n)
    f = pl.compile(fn, backend="cupy")
    dev = [cp.asarray(a) for a in args]
    report = f.explain(*dev)
    assert report.graph_breaks == []
    assert [k["kind"] for k in report.kernels] == ["elementwise"]
    poison_pool()
    got = cp.asnumpy(f(*dev))
    with np.errstate(all="ignore"):
        same = fn(*args)
        want = fn(*[a.astype(F64) if a.dtype.kind == "f" else a for a in args])
    assert got.dtype == same.dtype and got.shape == same.shape
    tol = _TOL[got.dtype.name]
    np.testing.assert_allclose(got.astype(F64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_out_of_range_indices_wrap_like_cupy_take(index_dtype):
    rng = np.random.default_rng()
    x = rng.standard_normal((5, 7)).astype(F32)
    idx = np.array([0, -1, 5, -6, 12, -13, 2**30 + 3], dtype=index_dtype)
    f = pl.compile(lambda x, i: x[i] * 2, backend="cupy")
    got = cp.asnumpy(f(cp.asarray(x), cp.asarray(idx)))
    np.testing.assert_array_equal(got, np.take(x, idx, axis=0, mode="wrap") * 2)
    np.testing.assert_array_equal(got, cp.asnumpy(cp.take(cp.asarray(x), cp.asarray(idx),
                                                          axis=0) * 2))


def test_cross_entropy_with_integer_labels_in_float64():
    rng = np.random.default_rng()
    x = rng.standard_normal((257, 1000)).astype(F32)
    y = rng.integers(0, 1000, 257)

    def loss(x, y):
        z = x - x.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return -logp[np.arange(x.shape[0]), y].mean()

    f = pl.compile(loss, backend="cupy")
    got = float(f(cp.asarray(x), cp.asarray(y)))
    assert f.explain(cp.asarray(x), cp.asarray(y)).graph_breaks == []
    np.testing.assert_allclose(got, loss(x.astype(F64), y), rtol=1e-5)
