"""Reductions with ``where=`` or ``initial=`` as plain reductions, so that they fuse.

On the CPU: sums, means, maxima and minima with ``where=`` (masks of the input's shape
and broadcast ones, keepdims, several axes, the whole array, rows with nothing
selected) and maxima/minima with ``initial=`` against NumPy on the numpy backend —
dtypes exactly, maxima and minima bit for bit, sums and means against float64 within
the rounding a sum can make —
in float16, float32 and float64 with NaN/Inf/-0.0; a masked softmax written with
``where=`` is one row kernel; what is left alone (empty axes, integer inputs); the
generated kernels on the CPU emulator into poisoned outputs. On the GPU (marked
``gpu``): against float64 NumPy.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.codegen import supports
from pyc_lab.compiler.policy import choose
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_counts import _graph, simplify_notes
from tests.compiler.test_fuzz_emulated import _check_program

F16, F32, F64 = np.float16, np.float32, np.float64

#: name -> source of f(x, y, m) (y: a row of x's last axis, m: a mask of x's shape)
MASKED = {
    "sum_rows": "def f(x, y, m):\n    return np.sum(x, axis=-1, where=m)\n",
    "sum_cols": "def f(x, y, m):\n    return x.sum(axis=0, where=m, keepdims=True) * 2\n",
    "sum_all": "def f(x, y, m):\n    return np.sum(x * y, where=m)\n",
    "mean_rows": "def f(x, y, m):\n    return np.mean(x, axis=-1, where=m)\n",
    "mean_cols": "def f(x, y, m):\n    return x.mean(axis=0, where=m)\n",
    "mean_broadcast": ("def f(x, y, m):\n"
                       "    return np.mean(x, axis=-1, where=m[:1], keepdims=True)\n"),
    "max_rows": "def f(x, y, m):\n    return np.max(x, axis=-1, initial=-np.inf, where=m)\n",
    "min_cols": "def f(x, y, m):\n    return np.min(x, axis=0, initial=0.5, where=m)\n",
    "max_initial": "def f(x, y, m):\n    return np.max(x + y, axis=-1, initial=0.25)\n",
    "min_initial": "def f(x, y, m):\n    return x.min(initial=-1.0)\n",
    "masked_softmax": ("def f(x, y, m):\n"
                       "    s = x * y\n"
                       "    e = np.exp(s - np.max(s, axis=-1, where=m, initial=-np.inf,"
                       " keepdims=True))\n"
                       "    return e / np.sum(e, axis=-1, where=m, keepdims=True)\n"),
}

@pytest.fixture
def rng():
    return np.random.default_rng()


def _fn(source):
    scope = {"np": np}
    exec(source, scope)
    return scope["f"]


def _args(rng, dtype, shape=(37, 130), special=True):
    x = (rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)
    if special:
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, size=8, replace=False)
        flat[picks] = [np.nan, np.inf, -np.inf, -0.0, 0.0, np.nan, 1.0, -1.0]
        x[4] = -0.0
    y = rng.uniform(0.5, 1.5, shape[-1:]).astype(dtype)
    m = rng.random(shape) < 0.5
    m[2] = False  # a row with nothing selected
    m[6] = True   # a row with everything selected
    m[:, 3] = False
    return x, y, m


def _notes(res):
    return simplify_notes(res, "where=/initial=")


def _compare(got, want, name, dtype, fn, args):
    """Maxima and minima bit for bit; sums and means against float64 within the rounding
    a sum of ``n`` terms may make, ``(log2 n + 2) eps`` times the sum of their sizes."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    if name.startswith(("max", "min")):
        np.testing.assert_array_equal(got, want)  # NaN where NumPy has NaN; exact
        return
    x, y, m = args
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # the mean of nothing selected
        exact = np.asarray(fn(x.astype(F64), y.astype(F64), m), dtype=F64)
        size = np.asarray(fn(np.abs(x.astype(F64)), np.abs(y.astype(F64)), m), dtype=F64)
    g = got.astype(F64)
    assert np.array_equal(np.isnan(g), np.isnan(want.astype(F64)))
    finite = np.isfinite(exact)
    assert np.array_equal(g[~finite], exact[~finite], equal_nan=True)
    eps = float(np.finfo(dtype).eps)
    if name == "masked_softmax":  # values in [0, 1]
        tol = 16 * eps * np.ones_like(exact)
    else:
        tol = (np.log2(x.size) + 2) * eps * size + eps * np.abs(exact)
    err = np.abs(g[finite] - exact[finite])
    assert (err <= tol[finite]).all(), float(np.max(err / tol[finite]))


@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("name", sorted(MASKED))
def test_masked_and_initial_reductions_keep_numpys_answers(rng, name, dtype):
    fn = _fn(MASKED[name])
    args = _args(rng, dtype)
    res = _graph(fn, args)
    assert _notes(res), res.graph.text()
    assert not any(n.op in ("sum", "mean", "max", "min") and
                   (len(n.inputs) == 2 or n.attrs.get("initial") is not None)
                   for n in res.graph)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # the mean of nothing selected
        got, want = pl.compile(fn)(*args), fn(*args)
    _compare(got, want, name, dtype, fn, args)


def test_a_masked_softmax_written_with_where_is_one_row_kernel(rng):
    graph = _graph(_fn(MASKED["masked_softmax"]), _args(rng, F32)).graph
    kernels = [graph.node(d.node).op for d in choose(graph, "cupy", "balanced", supports)
               if d.choice not in ("source",) and graph.node(d.node).op != "slice"]
    assert kernels == ["fused_rows"], graph.text()


def test_empty_axes_and_integer_inputs_are_left_to_numpys_rules():
    x = np.ones((4, 0), dtype=F32)
    res = _graph(lambda x: np.max(x, axis=-1, initial=1.0), (x,))
    assert not _notes(res)
    np.testing.assert_array_equal(pl.compile(lambda x: np.max(x, axis=-1, initial=1.0))(x),
                                  np.ones(4, F32))
    xi, m = np.arange(12).reshape(3, 4), np.ones((3, 4), dtype=bool)
    res = _graph(lambda x, m: np.sum(x, axis=-1, where=m), (xi, m))
    assert not _notes(res)


@needs_gxx
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("name", sorted(set(MASKED) - {"sum_all", "min_initial"}))
def test_the_masked_kernels_match_numpy_on_the_emulator(name, special):
    specs = [((37, 130), np.dtype(F32)), ((130,), np.dtype(F32)),
             ((37, 130), np.dtype(bool))]
    assert _check_program(MASKED[name], specs, special, seed=5) >= 1


# -- on the GPU ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("name", sorted(MASKED))
@pytest.mark.parametrize("shape", [(37, 130), (515, 2049)])
def test_masked_reductions_on_the_gpu(rng, name, dtype, shape):
    import cupy as cp

    from tests.compiler.backend.support import poison_pool

    fn = _fn(MASKED[name])
    f = pl.compile(fn, backend="cupy")
    args = _args(rng, dtype, shape)
    poison_pool()
    got = cp.asnumpy(f(*[cp.asarray(a) for a in args]))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        want = fn(*args)
    _compare(got, want, name, dtype, fn, args)
