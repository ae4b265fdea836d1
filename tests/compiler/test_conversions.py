"""``np.asarray``/``np.array``/``np.asanyarray``/``np.ascontiguousarray``/
``np.asfortranarray`` inside compiled functions: NumPy's answers on traced arrays and on
lists of them — the same array where NumPy returns its argument (a write through it
reaches the argument), a copy where NumPy copies (a write through it does not), casts,
NumPy's dtype for a list of arrays and Python numbers, ``ndmin``, NumPy's ValueError for
``copy=False`` where a copy is needed — also through ``from numpy import asarray`` and in
helper functions called by name; no graph break; NumPy's own function for everything
else (constants)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy import array as np_array
from numpy import asarray

import pyc_lab as pl
from tests.compiler.test_numpy_helpers import _check


@pytest.fixture
def x():
    x = np.random.default_rng().standard_normal((3, 4)).astype(np.float32)
    x[0, :3] = [np.nan, -0.0, np.inf]
    return x


def _helper(v):
    v = np.asarray(v, dtype=np.float64)  # the first line of many NumPy functions
    return v * 2


PROGRAMS = {
    "asarray": lambda x: np.asarray(x) * 2,
    "asarray_dtype": lambda x: np.asarray(x, dtype=np.float64) * 2,
    "asarray_same_dtype": lambda x: np.asarray(x, dtype=np.float32) + 1,
    "asarray_int": lambda x: np.asarray(np.nan_to_num(x), dtype=np.int16),
    "array": lambda x: np.array(x) * 2,
    "array_dtype_ndmin": lambda x: np.array(x[0], dtype=np.float16, ndmin=3),
    "asanyarray": lambda x: np.asanyarray(x) - 1,
    "ascontiguousarray": lambda x: np.ascontiguousarray(x.T) * 2,
    "ascontiguousarray_0d": lambda x: np.ascontiguousarray(x.sum()),
    "asfortranarray": lambda x: np.asfortranarray(x) + 1,
    "list_of_rows": lambda x: np.array([x[0], x[2]]) * 2,
    "list_of_statistics": lambda x: np.asarray([x.sum(), x.max(), x.min()]),
    "list_with_number": lambda x: np.asarray([x[1, 1], 1.0]),  # float64: NumPy's
    "list_with_int": lambda x: np.array([x[1, 1], 2]),
    "nested_lists": lambda x: np.array([[x[1, 0], x[1, 1]], [x[2, 0], 3]]),
    "tuple_of_arrays": lambda x: np.asarray((x[0], x[1].astype(np.float16))),
    "scalar_to_0d": lambda x: np.asarray(x.sum()),
    "constant": lambda x: x + np.asarray([1.0, 2.0, 3.0, 4.0]),
    "from_import": lambda x: asarray(x, np.float16) * np_array(3, dtype=np.float16),
    "helper": lambda x: _helper(x) + 1,
    "copy_false": lambda x: np.array(x, copy=False) * 2,
    "copy_false_needs_copy": lambda x: np.array(x, dtype=np.float64, copy=False),
    "asarray_copy_false_transposed": lambda x: np.asarray(x.T, order="C", copy=False),
    "inhomogeneous": lambda x: np.array([x[0], x[0, :2]]),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_array_constructors_on_traced_values_are_numpys(x, name):
    # NumPy's refusals (copy=False, an inhomogeneous list) are the compiled function's
    _check(PROGRAMS[name], x)


def test_asarray_is_the_argument_and_array_a_copy(x):
    def through_asarray(a):
        v = np.asarray(a)
        v[0, 0] = 5.0
        return a

    def through_array(a):
        v = np.array(a)
        v[0, 0] = 5.0
        return a, v

    arg = x.copy()
    np.testing.assert_array_equal(pl.compile(through_asarray)(arg), through_asarray(x.copy()))
    assert arg[0, 0] == 5.0  # the write reached the caller's array, as in NumPy
    arg = x.copy()
    got_a, got_v = pl.compile(through_array)(arg)
    np.testing.assert_array_equal(arg, x)  # untouched
    np.testing.assert_array_equal(got_a, x)
    assert got_v[0, 0] == 5.0


def test_the_numpy_module_seen_while_tracing_is_numpy_elsewhere(x):
    seen = []

    def f(a):
        seen.append(np)
        return np.asarray(a) * np.float32(np.pi)

    got = pl.compile(f)(x)
    np.testing.assert_array_equal(got, x * np.float32(np.pi))
    assert seen and seen[0] is not np and seen[0].asarray is not np.asarray
    assert seen[0].float32 is np.float32 and seen[0].linalg is np.linalg
    assert np.asarray(x) is x  # nothing outside the trace changed
