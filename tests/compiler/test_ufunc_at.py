"""``np.<ufunc>.at`` into a traced array: a graph break that computes the written array
(NumPy's on the numpy backend, ``cupyx.scatter_add``/CuPy's on the GPU), then a write of
the whole array through :mod:`pyc_lab.compiler.mutation` — repeated indices accumulate,
views of the array see the write, a written argument is copied back to the caller, and a
NumPy array made inside the function is refused with what to write instead."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl


@pytest.fixture
def rng():
    return np.random.default_rng()


def _scatter(x, y):
    out = np.zeros_like(x, shape=(16, x.shape[1]))
    np.add.at(out, y, x)
    return out * 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_a_scatter_add_with_repeated_indices_is_numpys(rng, dtype):
    x = (rng.standard_normal((64, 8)) * 10).astype(dtype)
    y = rng.integers(0, 16, 64)  # repeated indices
    f = pl.compile(_scatter)
    got, want = f(x, y), _scatter(x, y)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert any(b["op"] == "_ufunc_at" for b in f.explain(x, y).graph_breaks)


def test_a_histogram_and_a_write_into_an_argument(rng):
    y = rng.integers(0, 16, 200)

    def hist(y):
        h = np.zeros_like(y, shape=16)
        np.add.at(h, y, 1)
        return h

    np.testing.assert_array_equal(pl.compile(hist)(y), np.bincount(y, minlength=16))

    def bump(a, y):
        np.add.at(a, y, 0.5)
        return a.sum()

    a1, a2 = np.zeros(16), np.zeros(16)
    assert pl.compile(bump)(a1, y) == bump(a2, y) == 100.0
    np.testing.assert_array_equal(a1, a2)  # the caller's array written, as NumPy writes it


def test_other_ufuncs_and_views_see_the_write(rng):
    x = rng.standard_normal((40, 3)).astype(np.float32)
    y = rng.integers(0, 16, 40)

    def running_max(x, y):
        o = np.full_like(x, -np.inf, shape=16)
        head = o[:4]  # a view taken before the write sees it, as in NumPy
        np.maximum.at(o, y, x[:, 0])
        return o, head * 1

    for got, want in zip(pl.compile(running_max)(x, y), running_max(x, y), strict=True):
        np.testing.assert_array_equal(got, want)

    def negate(x, y):
        h = x[:16, 0].copy()
        np.negative.at(h, y)  # a unary ufunc: no operand
        return h

    np.testing.assert_array_equal(pl.compile(negate)(x, y), negate(x, y))


def test_into_an_array_numpy_made_inside_is_refused_with_the_fix():
    with pytest.raises(pl.PycLabError, match=r"np\.zeros_like\(x, shape=\.\.\.\)"):
        pl.compile(lambda a: np.add.at(np.zeros(3), [0, 0], a[:2]))(np.ones(3))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_a_scatter_add_on_the_gpu_is_numpys(rng, dtype):
    cp = pytest.importorskip("cupy")
    x = (rng.standard_normal((1000, 8)) * 10).astype(dtype)
    y = rng.integers(0, 16, 1000)
    got = pl.compile(_scatter, backend="cupy")(cp.asarray(x), cp.asarray(y))
    want = _scatter(x, y)
    assert isinstance(got, cp.ndarray) and got.dtype == want.dtype
    if dtype == np.int32:
        np.testing.assert_array_equal(cp.asnumpy(got), want)
    else:  # atomic adds: any order of the same values
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-5, atol=1e-3)


class _DeviceArray(np.ndarray):
    """Stands in for a CuPy array: its class lives in a ``cupy`` module."""


_DeviceArray.__module__ = "cupy._core.core"


def test_a_dtype_cupys_scatter_refuses_runs_on_the_host_with_a_warning(monkeypatch, caplog):
    """The graph break's CuPy path: ``cupyx.scatter_add`` first; where it refuses (CuPy's
    atomics have no int64 add), NumPy's ``add.at`` on a host copy, the result back on the
    device, and a warning that says so."""
    import sys
    import types

    from pyc_lab.compiler import ufuncs

    calls = []

    def refuse(a, slices, value):
        calls.append(a.dtype)
        raise TypeError(f"scatter_add does not support {a.dtype}")

    fake_cupy = types.SimpleNamespace(
        ndarray=_DeviceArray, asnumpy=lambda v: np.asarray(v).view(np.ndarray),
        asarray=lambda v: np.asarray(v).view(_DeviceArray))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(scatter_add=refuse))
    base = np.zeros(8, np.int64).view(_DeviceArray)
    idx = np.array([1, 1, 3, 7, 1]).view(_DeviceArray)
    with caplog.at_level("WARNING", logger="pyc_lab.compiler.ufuncs"):
        out = ufuncs._ufunc_at(base, idx, 2, ufunc="add")
    assert calls == [np.dtype(np.int64)]
    assert isinstance(out, _DeviceArray)
    np.testing.assert_array_equal(out.view(np.ndarray), [0, 6, 0, 2, 0, 0, 0, 2])
    assert not base.view(np.ndarray).any()  # the input is not written
    assert "computing it with NumPy on a host copy" in caplog.text
