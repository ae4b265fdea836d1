"""Reductions with ``dtype=`` (canonicalize): the attribute is dropped where it changes
nothing and moved onto a cast of the operand where NumPy's reduction into that dtype is
the cast array's own, so such reductions get generated kernels; answers stay NumPy's,
dtypes included, on fresh random data with NaN and infinities."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.codegen import supports
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.policy import choose
from pyc_lab.compiler.tracer import trace


def _data(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 9, shape).astype(dtype)
    x = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    x.reshape(-1)[:3] = [np.nan, np.inf, -0.0]
    return x.astype(dtype)


def _gpu_choices(fn, args):
    graph, _ = trace(fn, tuple(args))
    graph = PassManager().run(graph).graph
    return {graph.node(d.node).op: d.choice
            for d in choose(graph, "cupy", "balanced", supports)}


CASES = [("sum", np.float32, np.float32), ("sum", np.float32, np.float64),
         ("sum", np.float16, np.float32), ("sum", np.int8, np.int64), ("sum", np.bool_, None),
         ("sum", np.int8, np.float64), ("sum", np.int8, np.int8), ("prod", np.float32,
                                                                     np.float64),
         ("mean", np.float32, np.float64), ("mean", np.float16, np.float16),
         ("mean", np.float16, np.float32), ("mean", np.int16, np.float64),
         ("mean", np.float64, np.float32)]


@pytest.mark.parametrize("op, dtype, acc", CASES)
def test_reductions_with_dtype_give_numpys_answers(op, dtype, acc):
    rng = np.random.default_rng()
    x = _data(rng, (6, 40), dtype)

    def program(a):
        return getattr(a, op)(axis=-1, dtype=acc), getattr(np, op)(a, axis=0, dtype=acc)

    f = pl.compile(program)
    with np.errstate(all="ignore"):
        for got, want in zip(f(x), program(x), strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                       rtol=1e-3 if np.float16 in (dtype, acc) else 1e-6,
                                       equal_nan=True)


def test_a_row_dot_through_einsum_is_one_row_kernel():
    rng = np.random.default_rng()
    a, b = _data(rng, (64, 33), np.float32), _data(rng, (64, 33), np.float32)

    def row_dot(a, b):
        return np.einsum("ij,ij->i", a, b)

    assert _gpu_choices(row_dot, [a, b]) == {"input": "source",
                                             "fused_rows": "reduction_kernel"}
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(pl.compile(row_dot)(a, b), row_dot(a, b), rtol=1e-5, atol=1e-5,
                                   equal_nan=True)


def test_what_keeps_its_dtype():
    """A float16 mean in float16 (NumPy would accumulate in float32 without it), and a
    sum of int8 into int8 (an int8 array's own sum is int64) keep ``dtype=``."""
    rng = np.random.default_rng()
    for fn, x in [(lambda a: a.mean(axis=-1, dtype=np.float16), _data(rng, (4, 9), np.float16)),
                  (lambda a: a.sum(axis=-1, dtype=np.int8), _data(rng, (4, 9), np.int8))]:
        graph, _ = trace(fn, (x,))
        graph = PassManager().run(graph).graph
        (red,) = [n for n in graph if n.op in ("mean", "sum")]
        assert red.attrs.get("dtype") is not None
        got, want = pl.compile(fn)(x), fn(x)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
