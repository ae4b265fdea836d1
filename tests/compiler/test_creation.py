"""``np.zeros_like``/``ones_like``/``empty_like``/``full_like`` of traced arrays: NumPy's
values, dtypes and shapes bit for bit (``dtype=``, ``shape=``, an unsafe cast of the fill
value, a traced fill value, NaN), no graph break, writable results, and fused into the
kernels that read them (the generated kernel checked on the CPU emulator)."""

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


def _filled_empty(a):
    e = np.empty_like(a)  # its values are undefined until written
    e[...] = a * 2
    return e


def _shift(a):
    out = np.zeros_like(a)
    out[1:] = a[:-1]  # a result one writes into
    return out


PROGRAMS = {
    "zeros_plus": lambda a: np.zeros_like(a) + a,
    "zeros_shape": lambda a: np.zeros_like(a, shape=(2, 3)) + 1,
    "full_cast": lambda a: np.full_like(a, 2.7) * a,  # 2 for integers, as NumPy casts
    "ones_dtype": lambda a: np.ones_like(a, dtype=np.int32),
    "empty_written": _filled_empty,
    "full_shape_int": lambda a: np.full_like(a, 3, shape=5),
    "full_traced": lambda a: np.full_like(a, a.max()),
    "full_row": lambda a: np.full_like(a, a[0]),
    "where_zeros": lambda a: np.where(a > 0, a, np.zeros_like(a)),
    "shift": _shift,
    "full_nan": lambda a: np.full_like(a, np.nan),
    "full_overflow": lambda a: np.full_like(a, 1e10, dtype=np.float16),
    "ones_0d": lambda a: np.ones_like(a, shape=()),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int16, np.bool_])
def test_like_constructors_are_numpys_without_a_graph_break(name, dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 3)) * 10).astype(dtype)
    fn = PROGRAMS[name]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            want = fn(x)
        except (TypeError, ValueError) as exc:  # NumPy refuses (NaN into bool, say)
            with pytest.raises(type(exc)):
                pl.compile(fn)(x)
            return
        f = pl.compile(fn)
        got = f(x)
    assert type(got) is type(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert not f.explain(x).graph_breaks


def test_what_stays_numpys_call():
    x = np.ones((3, 2), np.float32)
    for fn in (lambda a: np.zeros_like(a, order="F") + 1,
               lambda a: np.full_like(a, np.ones(5)) + 1):  # does not broadcast
        f = pl.compile(fn)
        try:
            want = fn(x)
        except ValueError:
            with pytest.raises(ValueError):
                f(x)
            continue
        np.testing.assert_array_equal(f(x), want)
        assert f.explain(x).graph_breaks


def test_a_masked_fill_is_one_generated_kernel():
    x = np.random.default_rng(2).standard_normal((64, 33)).astype(np.float32)
    graph, _ = trace(PROGRAMS["where_zeros"], (x,))
    res = PassManager().run(graph)
    kernels = [d.choice for d in choose(res.graph, "cupy", "balanced", supports)
               if d.choice not in ("source", "cupy")]
    assert kernels == ["fused_kernel"], kernels


@needs_gxx
@pytest.mark.parametrize("expr", ["np.where(x > 0, x, np.zeros_like(x)) * 2",
                                  "np.full_like(x, 0.5) + x * np.ones_like(x, dtype=np.float64)",
                                  "np.maximum(x, np.full_like(x, x.mean()))"])
def test_the_generated_kernels_compute_numpys_values(expr):
    source = f"def f(x, y, m):\n    return {expr}\n"
    specs = [((37, 130), np.dtype(np.float32)), ((130,), np.dtype(np.float32)),
             ((37, 130), np.dtype(bool))]
    assert _check_program(source, specs, True, 5) >= 1
