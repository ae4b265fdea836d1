"""Counts of booleans as float32 sums, and maxima/minima of booleans (``any``/``all``)
as float32 ones, so that they join row programs.

On the CPU: which counts are rewritten (sums and means of booleans, booleans cast to an
integer, ``np.count_nonzero``, ``dtype=``, keepdims, several axes, a full count) and
which are not (more than 2**24 values a result, ``where=``), the programs that become
one row kernel (a count over rows, a fraction, ``np.nanmean``, a masked mean, a
masked mean pooling, ``np.isnan(x).any(-1)`` and a normalisation guarded by
``np.isfinite(x).all(-1)``), answers bit for bit against NumPy on the numpy backend with
NaN/Inf/-0.0 and the generated kernels on the CPU emulator into poisoned outputs. On
the GPU (marked ``gpu``): exact counts against NumPy.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.codegen import supports
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.passes.simplify import EXACT_COUNT
from pyc_lab.compiler.policy import choose
from pyc_lab.compiler.tracer import trace
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_fuzz_emulated import _check_program

F32 = np.float32


@pytest.fixture
def rng():
    return np.random.default_rng()


#: name -> (source of f(x, y, m), whether it is one generated row kernel on the GPU)
COUNTS = {
    "count_rows": "def f(x, y, m):\n    return (x > 0.25).sum(-1)\n",
    "fraction_rows": "def f(x, y, m):\n    return (x > 0.25).mean(axis=-1, keepdims=True)\n",
    "count_nonzero": "def f(x, y, m):\n    return np.count_nonzero(x > y, axis=-1)\n",
    "count_int32": "def f(x, y, m):\n    return m.sum(axis=-1, dtype=np.int32)\n",
    "count_cast": "def f(x, y, m):\n    return m.astype(np.int8).sum(-1)\n",
    "nanmean": "def f(x, y, m):\n    return np.nanmean(x, axis=-1)\n",
    "masked_mean": "def f(x, y, m):\n    return (x * m).sum(-1) / m.sum(-1)\n",
    "columns": "def f(x, y, m):\n    return (x > y).sum(axis=0) * 2\n",
    "full": "def f(x, y, m):\n    return (x > 0).sum() + m.mean()\n",
    "any_rows": "def f(x, y, m):\n    return np.isnan(x).any(axis=-1)\n",
    "all_cols": "def f(x, y, m):\n    return (x > y).all(axis=0, keepdims=True)\n",
    "max_of_mask": "def f(x, y, m):\n    return m.max(axis=-1), m.min(axis=-1)\n",
    "guarded_norm": ("def f(x, y, m):\n"
                     "    bad = ~np.isfinite(x).all(axis=-1, keepdims=True)\n"
                     "    return np.where(bad, 0, x / np.abs(x).sum(-1, keepdims=True))\n"),
}


def _fn(source):
    scope = {"np": np}
    exec(source, scope)
    return scope["f"]


def _args(rng, shape=(37, 130), special=True):
    x = (rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(F32)
    if special:
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, size=8, replace=False)
        flat[picks] = [np.nan, np.inf, -np.inf, -0.0, 0.0, np.nan, 1.0, -1.0]
        x[3] = np.nan  # a row of NaN only: nanmean's 0 / 0
    y = rng.uniform(-1, 1, shape[-1:]).astype(F32)
    m = rng.random(shape) < 0.4
    m[5] = False  # a row of no true value: a masked mean's 0 / 0
    return x, y, m


def _graph(fn, args):
    graph, _ = trace(fn, tuple(args))
    return PassManager().run(graph)


def simplify_notes(res, *phrases):
    """The simplify pass's notes of ``res`` holding one of ``phrases``."""
    return [n for rec in res.log if rec.name == "simplify" for n in rec.notes
            if any(p in n for p in phrases)]


def _notes(res):
    return simplify_notes(res, "count of booleans", "of booleans as a float32")


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_counts_are_float32_sums_matching_numpy_bit_for_bit(rng, name):
    fn = _fn(COUNTS[name])
    args = _args(rng)
    res = _graph(fn, args)
    assert _notes(res)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmean's all-NaN row
        got, want = pl.compile(fn)(*args), fn(*args)
    assert np.asarray(got).dtype == np.asarray(want).dtype
    assert np.asarray(got).shape == np.asarray(want).shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["count_rows", "fraction_rows", "count_nonzero", "nanmean",
                                  "masked_mean", "count_int32", "any_rows", "guarded_norm"])
def test_a_count_over_rows_is_one_row_kernel_with_its_work(rng, name):
    graph = _graph(_fn(COUNTS[name]), _args(rng)).graph
    kernels = [(graph.node(d.node).op, d.choice)
               for d in choose(graph, "cupy", "balanced", supports)
               if d.choice not in ("source",) and graph.node(d.node).op not in ("slice",)]
    assert kernels == [("fused_rows", "reduction_kernel")], kernels


def test_a_masked_mean_pooling_keeps_its_division_in_the_column_program(rng):
    """The count's cast to int64 stays with the count, so the pooled sum's program (over
    another row space) still takes the division."""
    def pool(h, m):
        return (h * m[..., None]).sum(1) / m.sum(1, keepdims=True)

    h = rng.standard_normal((6, 33, 40)).astype(F32)
    m = rng.random((6, 33)) < 0.5
    m[:, 0] = True
    graph = _graph(pool, (h, m)).graph
    ops = [n.op for n in graph if n.op not in ("input", "constant", "slice")]
    assert ops == ["fused_rows", "fused_rows"], ops
    divide = [n for n in graph if n.op == "fused_rows"
              and "divide" in n.attrs["ops"]]
    assert len(divide) == 1 and "multiply" in divide[0].attrs["ops"]
    np.testing.assert_array_equal(pl.compile(pool)(h, m), pool(h, m))


def test_counts_past_float32_exactness_or_with_where_stay_integer_sums():
    big = np.zeros(EXACT_COUNT + 1, dtype=bool)
    res = _graph(lambda b: b.sum(), (big,))
    assert not _notes(res)
    assert all(n.dtype.kind in "biu" for n in res.graph)  # integer sums throughout
    x = np.ones((4, 6), dtype=bool)
    res = _graph(lambda b: b.sum(axis=-1, where=b), (x,))
    assert not _notes(res)


@needs_gxx
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("name", sorted(set(COUNTS) - {"full"}))
def test_the_count_kernels_compute_numpys_counts_on_the_emulator(name, special):
    specs = [((37, 130), np.dtype(F32)), ((130,), np.dtype(F32)),
             ((37, 130), np.dtype(bool))]
    assert _check_program(COUNTS[name], specs, special, seed=3) >= 1


# -- on the GPU ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(COUNTS))
@pytest.mark.parametrize("shape", [(37, 130), (300, 4099)])
def test_counts_on_the_gpu_are_numpys(rng, name, shape):
    import cupy as cp

    from tests.compiler.backend.support import poison_pool

    fn = _fn(COUNTS[name])
    f = pl.compile(fn, backend="cupy")
    for _ in range(2):
        args = _args(rng, shape)
        poison_pool()
        got = f(*[cp.asarray(a) for a in args])
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            want = fn(*args)
        pairs = zip(got, want, strict=True) if isinstance(want, tuple) else [(got, want)]
        for g, w in pairs:
            g, w = cp.asnumpy(g), np.asarray(w)
            assert g.dtype == w.dtype and g.shape == w.shape
            if w.dtype.kind in "biu":
                np.testing.assert_array_equal(g, w)
            else:  # sums of float values: the GPU adds in another order
                np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)
