"""NumPy's helper functions compiled as the ops they are made of instead of graph
breaks: diagonals (``np.diagonal``/``x.diagonal()``, ``np.diag``, ``np.trace``),
``np.rot90``, ``np.ediff1d``, covariances (``np.cov``, ``np.corrcoef``) and weighted
means (``np.average``), ``np.select``, ``np.sinc``, ``np.fix``, ``np.angle``,
``np.real``, ``np.cross``, ``np.add``/``np.multiply.accumulate``, lookups in constant
tables (``np.isin``, ``np.searchsorted``, ``np.digitize``, ``np.interp``) and
``np.nancumsum``/
``np.nancumprod``, NumPy 2's array-API names (``np.matrix_transpose``,
``np.linalg.vector_norm``/``matrix_norm``, ``np.cumulative_sum``/``cumulative_prod``),
``np.append``, ``np.concatenate(..., axis=None)``, ufunc ``outer`` products, and
questions about arrays (``np.shape``, ``np.size``, ``np.result_type``...) answered in
Python as NumPy answers them.

Each is checked against NumPy on fresh random data with NaN, infinities and -0.0 (bit
for bit where NumPy's steps are elementwise; to rounding where a matrix product or a
float16 sum over a strided view adds in another order), with NumPy's dtypes, shapes and
scalars, NumPy's errors where it refuses, no graph break, NumPy's view semantics for
diagonals (read-only; a write into the array seen through it), and the generated
kernels on the CPU emulator into poisoned outputs. The GPU side:
``tests/compiler/backend/test_numpy_helpers_gpu.py``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.errors import ReadOnlyError, UnsupportedOperationError
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_fuzz_emulated import _check_program


@pytest.fixture
def rng():
    return np.random.default_rng()


def _data(rng, shape, dtype, special=True):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    if special and x.dtype.kind == "f" and x.size >= 8:  # and points lying on a table's
        flat = x.reshape(-1)
        flat[rng.choice(x.size, 8, replace=False)] = [np.nan, np.inf, -0.0, 0.0, -np.inf,
                                                      1.0, -1.0, 2.0]
    return x


def _numpy(fn, *args):
    """NumPy's answer, or the exception it raises."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return fn(*args)
        except Exception as exc:
            return exc


def _check(fn, *args, exact=True, rtol=None):
    """``pl.compile(fn)`` gives NumPy's answer (type, dtype, shape, values), or NumPy's
    error, without a graph break."""
    want = _numpy(fn, *args)
    f = pl.compile(fn)
    if isinstance(want, Exception):
        with pytest.raises(type(want)):
            f(*args)
        return
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        got = f(*args)
    assert type(got) is type(want)
    assert np.asarray(got).dtype == np.asarray(want).dtype
    assert np.shape(got) == np.shape(want)
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, equal_nan=True)
    assert not f.explain(*args).graph_breaks, f.explain(*args).graph_breaks


DTYPES = [np.float32, np.float64, np.float16, np.int32, np.uint8, np.bool_]


# -- diagonals, rotations, differences ----------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 5), (4, 7), (7, 3), (1, 1), (3, 0), (2, 3, 4),
                                   (4, 3, 5, 2)])
def test_diagonals_and_traces_are_numpys(rng, dtype, shape):
    x = _data(rng, shape, dtype)
    pairs = [(0, 1), (1, 0)] if len(shape) == 2 else [(0, 1), (-1, -2), (0, 2), (2, 0)]
    for offset in (-5, -1, 0, 1, 3):
        for a1, a2 in pairs:
            for fn, exact in _diagonal_programs(offset, a1, a2):
                # NumPy sums float16 along a strided view in float16, pyc_lab in float32
                _check(fn, x, exact=exact or dtype != np.float16 or len(shape) == 2,
                       rtol=1e-2)


def _diagonal_programs(offset, a1, a2):
    """(program, exact even for a float16 sum) pairs of one diagonal."""
    return [(lambda v: np.diagonal(v, offset, a1, a2) * 1, True),
            (lambda v: v.diagonal(offset, a1, a2) + v.diagonal(offset, a1, a2), True),
            (lambda v: np.trace(v, offset, a1, a2), False),
            (lambda v: v.trace(offset, a1, a2, dtype=np.float64), True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 4, 6])
def test_diag_of_a_vector_and_of_a_matrix_is_numpys(rng, dtype, n):
    v = _data(rng, (n,), dtype)
    m = _data(rng, (n, n + 2), dtype)
    for k in (-3, -1, 0, 2):
        of_vector, of_matrix, round_trip = _diags(k)
        _check(of_vector, v)
        _check(of_matrix, m)
        _check(round_trip, m)


def _diags(k):
    return (lambda a: np.diag(a, k), lambda a: np.diag(a, k) * 1,
            lambda a: np.diag(np.diag(a, k)) * 1)


def test_a_diagonal_is_a_read_only_view_as_in_numpy():
    x = np.arange(16.0).reshape(4, 4)

    def later_write(a):
        y = a * 1
        d = y.diagonal(1, 1, 0)  # a view of y: the write below shows through it
        y[2, 1] = 100.0
        return d * 2

    np.testing.assert_array_equal(pl.compile(later_write)(x), later_write(x))

    def write_through(a):
        d = np.diagonal(a)
        d[0] = 1.0
        return d

    with pytest.raises(ValueError, match="read-only"):
        write_through(x.copy())
    with pytest.raises(ReadOnlyError, match="read-only"):
        pl.compile(write_through)(x)

    def transposed(a):  # not a chain of views pyc_lab follows: refused, never stale
        y = a * 1
        d = y[:, ::2].T.diagonal()
        y[0, 0] = 100.0
        return d * 2

    with pytest.raises(UnsupportedOperationError, match="cannot follow"):
        pl.compile(transposed)(x)


@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.bool_])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (1, 5)])
def test_rot90_and_ediff1d_are_numpys(rng, dtype, shape):
    x = _data(rng, shape, dtype)
    axes_list = [(0, 1), (1, 0), (-1, 0), (0, 0)] + ([(0, 2), (2, 1)] if len(shape) == 3 else [])
    for k in (-3, -1, 0, 1, 2, 3, 5):
        for axes in axes_list:
            _check(_rotation(k, axes), x)
    _check(lambda a: np.ediff1d(a), x)  # booleans: NumPy's TypeError

    def written(a):
        y = a * 1
        r = np.rot90(y)
        y[0, 1] = 1
        return r + 0

    _check(written, x)


def _rotation(k, axes):
    return lambda a: np.rot90(a, k, axes) * 1


# -- covariances and weighted means --------------------------------------------------------
COVARIANCES = {
    "cov": lambda x, y: np.cov(x),
    "cov_columns": lambda x, y: np.cov(x.T, rowvar=False),
    "cov_xy": lambda x, y: np.cov(x, y),
    "cov_bias": lambda x, y: np.cov(x, bias=True),
    "cov_ddof": lambda x, y: np.cov(x, ddof=3),
    "cov_f32": lambda x, y: np.cov(x, dtype=np.float32),
    "cov_vector": lambda x, y: np.cov(x[0]),
    "cov_vector_columns": lambda x, y: np.cov(x[0], rowvar=False),
    "cov_two_vectors": lambda x, y: np.cov(x[0], y[1]),
    "corrcoef": lambda x, y: np.corrcoef(x),
    "corrcoef_columns": lambda x, y: np.corrcoef(x[:, :8], rowvar=False),
    "corrcoef_vector": lambda x, y: np.corrcoef(x[0]),
    "corrcoef_xy": lambda x, y: np.corrcoef(x, y),
    "cov_fused": lambda x, y: np.cov(x * 2 - y[:1]) + 1,
}


@pytest.mark.parametrize("name", sorted(COVARIANCES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.bool_])
def test_covariances_are_numpys(rng, name, dtype):
    x = _data(rng, (5, 37), dtype, special=False)
    y = _data(rng, (2, 37), dtype, special=False)
    # a matrix product: NumPy's BLAS may add in another order (and use syrk)
    _check(COVARIANCES[name], x, y, exact=False, rtol=1e-3 if dtype == np.float32 else 1e-9)


def test_a_covariance_of_nan_is_nan_and_forms_numpy_warns_on_run_as_written(rng):
    x = _data(rng, (4, 9), np.float64)
    _check(lambda a: np.cov(a), x, exact=False, rtol=1e-12)
    for fn in (lambda a: np.cov(a, ddof=9),  # no degrees of freedom: NumPy warns
               lambda a: np.cov(a, fweights=np.arange(1, 10)),
               lambda a: np.cov(a + 1j)):
        f = pl.compile(fn)
        np.testing.assert_allclose(f(x), _numpy(fn, x), equal_nan=True)
        assert f.explain(x).graph_breaks


WEIGHTED = {
    "mean_axis": lambda x: np.average(x, axis=1),
    "weights_axis": lambda x: np.average(x, axis=1, weights=np.arange(1.0, 38.0)),
    "weights_full": lambda x: np.average(x, weights=np.full((5, 37), 0.5, np.float32)),
    "weights_keepdims": lambda x: np.average(x, axis=(1,), weights=np.arange(37),
                                             keepdims=True),
    "weights_two_axes": lambda x: np.average(x, axis=(1, 0),
                                             weights=np.arange(185.0).reshape(37, 5)),
    "weights_sum_zero": lambda x: np.average(x, axis=1, weights=np.zeros(37)),
    "weights_bad_shape": lambda x: np.average(x, axis=1, weights=np.ones(5)),
}


@pytest.mark.parametrize("name", sorted(WEIGHTED))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.bool_])
def test_weighted_means_are_numpys(rng, name, dtype):
    x = _data(rng, (5, 37), dtype)
    if name in ("weights_sum_zero", "weights_bad_shape"):  # NumPy's errors, as written
        want = _numpy(WEIGHTED[name], x)
        with pytest.raises(type(want)):
            pl.compile(WEIGHTED[name])(x)
        return
    _check(WEIGHTED[name], x)


def test_traced_weights_run_as_written(rng):
    x, w = _data(rng, (4, 6), np.float32), rng.random(6).astype(np.float32) + 0.1
    f = pl.compile(lambda a, b: np.average(a, axis=1, weights=b))
    np.testing.assert_array_equal(f(x, w), np.average(x, axis=1, weights=w))
    assert f.explain(x, w).graph_breaks  # NumPy checks the weights' sum for zero


# -- elementwise helpers -------------------------------------------------------------------
ELEMENTWISE = {
    "select": lambda x, y: np.select([x < -1, x > 1], [x * 2, x * 3], default=0),
    "select_scalars": lambda x, y: np.select([x < -1, x > 1], [2, 3.5], default=x),
    "select_arrays": lambda x, y: np.select([x < 0], [y], default=-1),
    "select_broadcast": lambda x, y: np.select([x[:, :1] < 0, x > 1], [x[:1], 2], default=7),
    "select_wraps": lambda x, y: np.select([x < 0], [300], default=1),
    "select_numpy_scalar": lambda x, y: np.select([x < 0], [np.float64(2)], default=x),
    "select_constant": lambda x, y: np.select([x < 0, np.ones(9, bool)],
                                              [x, np.arange(9)], default=1.5),
    "select_not_bool": lambda x, y: np.select([x], [y]),
    "sinc": lambda x, y: np.sinc(x),
    "fix": lambda x, y: np.fix(x),
    "angle": lambda x, y: np.angle(x),
    "angle_degrees": lambda x, y: np.angle(x, deg=True),
    "real": lambda x, y: np.real(x) * 2,
    "imag": lambda x, y: np.imag(x) + x,
    "imag_attribute": lambda x, y: x.imag * 2,
    "conjugate": lambda x, y: np.conjugate(x) - y,
    "conj_method": lambda x, y: x.conj(),
    "add_accumulate": lambda x, y: np.add.accumulate(x),
    "add_accumulate_rows": lambda x, y: np.add.accumulate(x, axis=1),
    "multiply_accumulate": lambda x, y: np.multiply.accumulate(x, axis=-1),
    "accumulate_dtype": lambda x, y: np.add.accumulate(x, axis=1, dtype=np.float64),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int8,
                                   np.uint8, np.bool_])
def test_elementwise_helpers_are_numpys_bit_for_bit(rng, name, dtype):
    x, y = _data(rng, (4, 9), dtype), _data(rng, (4, 9), dtype)
    _check(ELEMENTWISE[name], x, y)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.bool_])
def test_cross_products_are_numpys(rng, dtype):
    a, b = _data(rng, (5, 3), dtype), _data(rng, (5, 3), dtype)
    _check(lambda p, q: np.cross(p, q), a, b)  # booleans: NumPy's TypeError
    _check(lambda p, q: np.cross(p, q[0]), a, b)
    _check(lambda p, q: np.cross(p.T, q.T, axisa=0, axisb=0, axisc=0), a, b)
    _check(lambda p, q: np.cross(p[None], q[:, None], axis=-1), a, b)
    _check(lambda p, q: np.cross(p, q.astype(np.float64)), a, b)


def test_helpers_numpy_does_not_cover_run_as_written(rng):
    x = _data(rng, (4, 3), np.float32)
    for fn in (lambda a: np.cross(a[:, :2], a[:, 1:]),  # 2-vectors: deprecated in NumPy
               lambda a: np.ediff1d(a, to_begin=0.0),
               lambda a: np.append(a[0], [a[1, 0], a[2, 0]]),  # a list of traced values
               lambda a: np.angle(a * 1j)):
        f = pl.compile(fn)
        want = _numpy(fn, x)
        np.testing.assert_array_equal(f(x), want)
        assert f.explain(x).graph_breaks


# -- lookups in constant tables and NaN-skipping scans -------------------------------------
LOOKUPS = {
    "isin": lambda x: np.isin(x, [0, 1, 2.5, -1]),
    "isin_invert": lambda x: np.isin(x, [0, 1, 2], invert=True),
    "isin_float32_table": lambda x: np.isin(x, np.array([0.0, np.nan, 3], np.float32)),
    "isin_empty": lambda x: np.isin(x, []),
    "isin_integers": lambda x: np.isin(x * 1, np.arange(-2, 3)),
    "searchsorted_left": lambda x: np.searchsorted([-1.0, 0.0, 0.0, 2.0, np.nan], x),
    "searchsorted_right": lambda x: np.searchsorted(np.array([-1, 0, 2, 5]), x,
                                                    side="right"),
    "searchsorted_empty": lambda x: np.searchsorted(np.array([], np.float32), x),
    "searchsorted_nan_table": lambda x: np.searchsorted(np.array([0.0, np.nan, np.nan]), x,
                                                        side="right"),
    "searchsorted_0d": lambda x: np.searchsorted([0.0, 1.0], x[0, 0]),
    "digitize": lambda x: np.digitize(x, [-1.0, 0.0, 1.0, 2.0]),
    "digitize_right": lambda x: np.digitize(x, [-1.0, 0.0, 1.0, 2.0], right=True),
    "digitize_decreasing": lambda x: np.digitize(x, [2, 1, 0, -1]),
    "digitize_decreasing_right": lambda x: np.digitize(x, [2, 1, 1, -1], right=True),
    "digitize_not_monotonic": lambda x: np.digitize(x, [2, 1, 3]),  # NumPy's ValueError
    "digitize_0d": lambda x: np.digitize(x.sum(), [0.0, 1.0]),
    "interp": lambda x: np.interp(x, [-2.0, -1.0, 0.0, 1.0, 2.0], [4.0, 1.0, 0.0, 1.0, 4.0]),
    "interp_left_right": lambda x: np.interp(x, [-1, 0, 1], [0.0, 1.0, 4.0], left=-5,
                                             right=np.nan),
    "interp_repeated_point": lambda x: np.interp(x, [-1.0, 1.0, 1.0, 2.0],
                                                 [0.0, 1.0, 3.0, 4.0]),
    "interp_infinite_value": lambda x: np.interp(x, [-1.0, 0.0, 1.0], [0.0, np.inf, 1.0]),
    "interp_infinite_points": lambda x: np.interp(x, [-np.inf, 0.0, np.inf], [0.0, 1.0, 2.0]),
    "interp_one_point": lambda x: np.interp(x, [0.5], [3.0]),
    "interp_table": lambda x: np.interp(x * 2, np.linspace(-3, 3, 13, dtype=np.float32),
                                        np.sin(np.linspace(-3, 3, 13))),
    "interp_empty": lambda x: np.interp(x, [], []),  # NumPy's ValueError
    "nancumsum": lambda x: np.nancumsum(x, axis=1),
    "nancumsum_flat": lambda x: np.nancumsum(x),
    "nancumprod": lambda x: np.nancumprod(x, axis=0),
    "nancumsum_float64": lambda x: np.nancumsum(x, axis=1, dtype=np.float64),
}


@pytest.mark.parametrize("name", sorted(LOOKUPS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int8,
                                   np.uint8, np.bool_])
def test_lookups_and_nan_scans_are_numpys_bit_for_bit(rng, name, dtype):
    _check(LOOKUPS[name], _data(rng, (4, 9), dtype))


def test_lookups_numpy_does_not_cover_run_as_written(rng):
    x = _data(rng, (4, 9), np.float32)
    table = np.linspace(-1, 1, 7)  # closed over: an input, whose values may change
    for fn in (lambda a: np.isin(a, table),
               lambda a: np.searchsorted(a[0], 0.5),  # the table is traced
               lambda a: np.searchsorted([3.0, 1.0, 2.0], a),  # unsorted: NumPy bisects
               lambda a: np.interp(a, [1.0, 0.0], [1.0, 2.0]),
               lambda a: np.interp(a, [0.0, 1.0], [1.0, 2.0], period=3.0),
               lambda a: np.digitize(a, np.linspace(-1, 1, 100)),  # a long table
               lambda a: np.isin(a.astype(np.int8), np.array([2**63 + 5], np.uint64))):
        f = pl.compile(fn)
        np.testing.assert_array_equal(f(x), fn(x))
        assert f.explain(x).graph_breaks


# -- NumPy 2's array-API names, outer products, appends ------------------------------------
ARRAY_API = {
    "matrix_transpose": lambda x: np.matrix_transpose(x) * 1,
    "linalg_matrix_transpose": lambda x: np.linalg.matrix_transpose(x[0]) + 1,
    "matrix_transpose_1d": lambda x: np.matrix_transpose(x[0, 0]),  # NumPy's ValueError
    "vector_norm": lambda x: np.linalg.vector_norm(x),
    "vector_norm_axis": lambda x: np.linalg.vector_norm(x, axis=1),
    "vector_norm_axes": lambda x: np.linalg.vector_norm(x, axis=(0, 2)),
    "vector_norm_keepdims": lambda x: np.linalg.vector_norm(x, axis=-1, keepdims=True),
    "vector_norm_l1_axes_keepdims": lambda x: np.linalg.vector_norm(x, axis=(1, 2),
                                                                    keepdims=True, ord=1),
    "vector_norm_inf": lambda x: np.linalg.vector_norm(x, ord=np.inf),
    "vector_norm_zero": lambda x: np.linalg.vector_norm(x, axis=2, ord=0),
    "vector_norm_all_keepdims": lambda x: np.linalg.vector_norm(x, keepdims=True),
    "matrix_norm": lambda x: np.linalg.matrix_norm(x),
    "matrix_norm_keepdims": lambda x: np.linalg.matrix_norm(x, keepdims=True),
    "matrix_norm_1": lambda x: np.linalg.matrix_norm(x, ord=1),
    "matrix_norm_minus_inf": lambda x: np.linalg.matrix_norm(x, ord=-np.inf),
    "cumulative_sum": lambda x: np.cumulative_sum(x, axis=1),
    "cumulative_sum_1d": lambda x: np.cumulative_sum(x[0, 0]),
    "cumulative_sum_initial": lambda x: np.cumulative_sum(x, axis=-1, include_initial=True),
    "cumulative_prod_initial": lambda x: np.cumulative_prod(x, axis=0, include_initial=True,
                                                            dtype=np.float64),
    "cumulative_sum_no_axis": lambda x: np.cumulative_sum(x),  # NumPy's ValueError
    "append": lambda x: np.append(x, x[0]),
    "append_axis": lambda x: np.append(x, x[:1], axis=0),
    "append_list": lambda x: np.append(x[0, 0], [1.5, 2.0]),
    "append_number": lambda x: np.append(x[0, 0], 3),
    "concatenate_flat": lambda x: np.concatenate([x, x[0]], axis=None),
    "add_outer": lambda x: np.add.outer(x[0, 0], x[1, 1]),
    "multiply_outer": lambda x: np.multiply.outer(x[0], x[1, 0]),
    "subtract_outer_constant": lambda x: np.subtract.outer(x[0, 0], np.arange(3)),
    "greater_outer": lambda x: np.greater.outer(x[0, 0], x[1, 1]),
}


@pytest.mark.parametrize("name", sorted(ARRAY_API))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.uint8,
                                   np.bool_])
def test_array_api_names_and_outer_products_are_numpys(rng, name, dtype):
    if name.startswith("cumulative") and not hasattr(np, "cumulative_sum"):
        pytest.skip("np.cumulative_sum is NumPy 2.1's")
    _check(ARRAY_API[name], _data(rng, (4, 5, 6), dtype))


def test_norms_numpy_computes_by_svd_run_as_written(rng):
    x = _data(rng, (3, 4, 5), np.float64, special=False)
    f = pl.compile(lambda a: np.linalg.matrix_norm(a, ord=2))
    np.testing.assert_array_equal(f(x), np.linalg.matrix_norm(x, ord=2))
    assert f.explain(x).graph_breaks


# -- questions about arrays: Python answers, as NumPy gives them ---------------------------
QUERIES = {
    "shape": lambda x: x * np.shape(x)[0],  # a Python int: x's dtype stays
    "ndim": lambda x: x * np.ndim(x),
    "size": lambda x: x / np.size(x),
    "size_axis": lambda x: x / np.size(x, -1),
    "size_axes": lambda x: x / np.size(x, (0, 1)),
    "result_type": lambda x: x.astype(np.result_type(x, 1.0)),
    "result_type_arrays": lambda x: x.astype(np.result_type(x, np.float16, x.sum())),
    "can_cast": lambda x: x * 2 if np.can_cast(x, np.float64) else x - 1,
    "iscomplexobj": lambda x: x * 2 if not np.iscomplexobj(x) else x,
    "isrealobj": lambda x: x + 1 if np.isrealobj(x) else x,
}


@pytest.mark.parametrize("name", sorted(QUERIES))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.bool_])
def test_questions_about_arrays_are_answered_as_numpy_answers_them(rng, name, dtype):
    _check(QUERIES[name], _data(rng, (4, 9), dtype))


def test_none_beside_arrays_in_a_result_is_returned_as_it_is(rng):
    x = _data(rng, (3, 4), np.float32)
    f = pl.compile(lambda a: (a * 2, None, {"stat": a.sum(), "extra": [None, a]}))
    doubled, nothing, rest = f(x)
    np.testing.assert_array_equal(doubled, x * 2)
    assert nothing is None and rest["extra"][0] is None
    np.testing.assert_array_equal(rest["extra"][1], x)
    with pytest.raises(pl.PycLabError, match="returned None"):
        pl.compile(lambda a: None)(x)


def test_a_write_into_the_imaginary_part_of_a_real_array_is_numpys_error(rng):
    def write(a):
        i = a.imag
        i[0] = 1
        return i

    x = _data(rng, (3, 4), np.float32)
    with pytest.raises(ValueError):
        write(x.copy())
    with pytest.raises(ValueError, match="read-only"):
        pl.compile(write)(x)


# -- the generated kernels -----------------------------------------------------------------
@needs_gxx
@pytest.mark.parametrize("expr", [
    "np.select([x < -1, x > 1], [x * 2, y], default=0.5) + np.sinc(x)",
    "np.fix(x * 3) - np.angle(x)",
    "np.diagonal(x[:, :37] * 2) + np.trace(x[:, :37])",
    "np.rot90(x * y)[::-1] - 1",
    "np.cross(x[:, :3], x[:, 3:6] * 2)",
    "np.average(x, axis=1, weights=np.arange(130.0)) * 2",
    "np.where(np.isin(np.floor(x * 3), [0.0, 2.0, -1.0]), x, y)",
    "np.digitize(x * 2, [-1.0, 0.0, 0.5, 2.0]) + np.searchsorted([0.0, 1.0], y)",
    "np.interp(x, [-1.0, 0.0, 0.5, 2.0], [3.0, -1.0, 0.0, 1.0]) * y",
])
def test_the_generated_kernels_compute_numpys_values(expr):
    source = f"def f(x, y, m):\n    return {expr}\n"
    specs = [((37, 130), np.dtype(np.float32)), ((130,), np.dtype(np.float32)),
             ((37, 130), np.dtype(bool))]
    assert _check_program(source, specs, True, 5) >= 1
