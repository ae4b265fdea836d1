"""``np.nanvar``/``np.nanstd`` as NumPy's own steps: bit for bit NumPy's values, dtypes,
shapes and scalars (float16 to float64, ``ddof``/``correction``, several axes, keepdims,
slices of NaN only and slices with too few values), and over the last axis one generated
row kernel on the GPU (its plan checked here, the emulated kernel against NumPy)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.codegen import supports
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.policy import choose
from pyc_lab.compiler.tracer import trace
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_fuzz_emulated import _check_program


@pytest.fixture
def rng():
    return np.random.default_rng()


def _data(rng, shape, dtype):
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    flat = x.reshape(-1)
    flat[rng.choice(x.size, min(5, x.size - 1), replace=False)] = np.nan
    if x.ndim == 2 and x.shape[0] > 3:
        x[2] = np.nan  # a slice of NaN only
        x[3, 1:] = np.nan  # one value left: dof <= 0 for ddof >= 1
    return x


@pytest.mark.parametrize("fn", [np.nanvar, np.nanstd])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape, axis", [((37, 130), -1), ((37, 130), 0), ((5, 6, 7), (0, 2)),
                                         ((1001,), None), ((4, 3), None), ((6, 2), 1)])
def test_nan_variances_are_numpys_bit_for_bit(rng, fn, dtype, shape, axis):
    x = _data(rng, shape, dtype)
    for kw in ({}, {"ddof": 1}, {"ddof": 2, "keepdims": True}, {"correction": 1},
               {"keepdims": True}):
        def program(a, kw=kw):
            return fn(a, axis=axis, **kw)

        f = pl.compile(program)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's dof <= 0 warning
            got, want = f(x), program(x)
        assert type(got) is type(want), kw
        assert np.asarray(got).dtype == np.asarray(want).dtype, kw
        assert np.shape(got) == np.shape(want), kw
        np.testing.assert_array_equal(got, want, err_msg=str(kw))
        assert not f.explain(x).graph_breaks


def test_what_stays_numpys_own_call(rng):
    """Integers (NumPy's plain np.var), out=, where= and mean= run as written."""
    x = rng.standard_normal((4, 6)).astype(np.float32)
    n = (x * 10).astype(np.int32)
    for program, arg in ((lambda a: np.nanvar(a, axis=-1), n),
                         (lambda a: np.nanstd(a, axis=-1, where=a > 0), x)):
        f = pl.compile(program)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            np.testing.assert_array_equal(f(arg), program(arg))
        assert f.explain(arg).graph_breaks


def test_a_row_nanstd_is_one_row_kernel(rng):
    x = _data(rng, (37, 130), np.float32)
    graph, _ = trace(lambda a: np.nanstd(a, axis=-1, ddof=1), (x,))
    res = PassManager().run(graph)
    kernels = [(res.graph.node(d.node).op, d.choice)
               for d in choose(res.graph, "cupy", "balanced", supports)
               if d.choice != "source"]
    assert kernels == [("fused_rows", "reduction_kernel")], kernels


@needs_gxx
@pytest.mark.parametrize("expr", ["np.nanvar(x, axis=-1)", "np.nanstd(x, axis=-1, ddof=1)",
                                  "np.nanstd(x, axis=0, keepdims=True)"])
def test_the_generated_nan_variance_kernels_compute_numpys_values(expr):
    source = f"def f(x, y, m):\n    return {expr}\n"
    specs = [((37, 130), np.dtype(np.float32)), ((130,), np.dtype(np.float32)),
             ((37, 130), np.dtype(bool))]
    assert _check_program(source, specs, True, 11) >= 1
