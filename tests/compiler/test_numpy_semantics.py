"""Compiled functions follow NumPy 2: cache keys, scalars (NEP 50), ufunc and reduction
arguments, operators and methods, errors where NumPy errors."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler import CastingError, ScalarOverflowError
from pyc_lab.compiler.cache_keys import static_key


@pytest.fixture
def rng():
    return np.random.default_rng()


def same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


# -- 1: static arguments are keyed by type and value ------------------------------------------
def test_static_scalars_of_different_types_are_different_cache_entries(rng):
    f = pl.compile(lambda x, s: x * s)
    x = rng.integers(1, 9, 6).astype(np.int32)
    for s in (1, 1.0, True, 1, np.float32(1), np.int8(1)):
        same(f(x, s), x * s)
    g = pl.compile(lambda b, s: b + s)
    b = rng.random(5) > 0.5
    same(g(b, True), b + True)
    same(g(b, 1), b + 1)  # int64 under NEP 50, not bool


def test_static_keys_are_nan_safe_and_keep_the_sign_of_zero(rng):
    f = pl.compile(lambda x, s: x * s)
    x = rng.standard_normal(4)
    with np.errstate(invalid="ignore"):
        same(f(x, float("nan")), x * float("nan"))
        same(f(x, float("nan")), x * float("nan"))
    assert f.cache_info()["hits"] == 1  # nan hits its own entry
    same(np.signbit(f(x, 0.0)), np.signbit(x * 0.0))
    same(np.signbit(f(x, -0.0)), np.signbit(x * -0.0))


def test_static_keys_recurse_into_containers():
    assert static_key((1, 2)) != static_key((1.0, 2))
    assert static_key([True]) != static_key([1])
    assert static_key({"a": (0.0,)}) != static_key({"a": (-0.0,)})
    assert static_key((float("nan"),)) == static_key((float("nan"),))
    assert static_key(slice(1, None)) != static_key(slice(1.0, None))
    assert static_key([1, [2, 3]]) == static_key([1, [2, 3]])


# -- 2: np.clip's NumPy 2 keywords ----------------------------------------------------------
def test_clip_takes_numpy2_min_max_keywords(rng):
    x = rng.standard_normal((4, 5)) * 2
    for fn in (lambda a: np.clip(a, min=0, max=1), lambda a: np.clip(a, min=-0.5),
               lambda a: np.clip(a, max=0.25), lambda a: a.clip(min=0),
               lambda a: a.clip(-1, 1), lambda a: np.clip(a, a_min=0, a_max=1)):
        same(pl.compile(fn)(x), fn(x))
    with pytest.raises(ValueError, match="forbidden"):
        pl.compile(lambda a: np.clip(a, 0, 1, min=0))(x)


def test_clip_with_integer_bounds_outside_the_dtype_is_numpys():
    x = np.array([0, 5, 255], np.uint8)
    for fn in (lambda a: np.clip(a, -1, 300), lambda a: np.clip(a, 2, 300),
               lambda a: np.clip(a, -5, 4)):
        same(pl.compile(fn)(x), fn(x))


# -- 3: reduction methods take NumPy's signatures --------------------------------------------
def test_reduction_methods_keep_initial_where_and_dtype(rng):
    a = rng.standard_normal((3, 4))
    mask = rng.random((3, 4)) > 0.4

    def fn(a, m):
        return (a.sum(initial=10.0), a.sum(where=m), a.max(initial=100.0),
                a.min(where=m, initial=5.0), a.mean(where=m), a.prod(1, initial=2.0),
                a.sum(0, np.float32), a.sum(0, np.float32, None, True),
                a.max(1, None, True), a.var(0, None, None, 1), a.std(where=m, ddof=1),
                np.sum(a, 1, initial=1.0, where=m), np.var(a, correction=1))

    with np.errstate(all="ignore"):
        for got, want in zip(pl.compile(fn)(a, mask), fn(a, mask), strict=True):
            assert np.asarray(got).dtype == np.asarray(want).dtype
            np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)


def test_reduction_method_signatures_are_numpys(rng):
    a = rng.standard_normal((3, 4))
    with pytest.raises(TypeError):
        pl.compile(lambda a: a.argmax(0, None, True))(a)  # keepdims is keyword-only
    with pytest.raises(TypeError):
        pl.compile(lambda a: a.mean(0, None, None, True, True))(a)
    f = pl.compile(lambda a: (a.argmax(1, keepdims=True), a.argmin(), a.any(0), a.all()))
    for got, want in zip(f(a > 0), (np.argmax(a > 0, 1, keepdims=True), np.argmin(a > 0),
                                    (a > 0).any(0), (a > 0).all()), strict=True):
        same(got, want)


def test_reductions_with_out_write_into_the_array(rng):
    a = rng.standard_normal((3, 4))

    def fn(a):
        out = np.zeros_like(a[0])
        np.sum(a, axis=0, out=out)
        np.max(a, axis=0, out=out[None], keepdims=True)  # through a view of it
        return out

    np.testing.assert_allclose(pl.compile(fn)(a), fn(a), rtol=1e-12)

    def local(a):
        out = np.zeros(4)  # not traced: a write into it could not be followed
        np.sum(a, axis=0, out=out)
        return out

    with pytest.raises(pl.PycLabError, match=r"np\.zeros_like"):
        pl.compile(local)(a)


# -- 4: reciprocal, square and ** on integers and bools -------------------------------------
def test_reciprocal_square_and_pow_keep_numpys_dtypes():
    i = np.array([1, 2, -1, 3, 7], np.int32)
    b = np.array([True, False, True])
    same(pl.compile(np.reciprocal)(i), np.reciprocal(i))
    with np.errstate(divide="ignore", invalid="ignore"):  # reciprocal(False)
        for fn in (lambda b: np.square(b), lambda b: b ** 2, lambda b: np.power(b, 2),
                   lambda b: b ** 2.0, lambda b: b ** True, lambda b: np.reciprocal(b)):
            same(pl.compile(fn)(b), fn(b))
    h = np.array([4.0, -0.0, 0.5], np.float16)
    with np.errstate(divide="ignore"):
        for fn in (lambda h: h ** -1, lambda h: h ** 0.5, lambda h: h ** 2):
            same(pl.compile(fn)(h), fn(h))
    with pytest.raises(ValueError, match="negative integer powers"):
        pl.compile(lambda i: i ** -1)(i)


def test_pow_on_numpy_scalars_has_no_array_fast_path():
    """``b ** 2`` is np.square for an array (bool -> int8) but np.power for the NumPy
    scalar a reduction returns (bool -> int64)."""
    b = np.array([[True, False, True], [False, False, True]])
    for fn in (lambda b: b.max() ** 2, lambda b: np.any(b) ** 2, lambda b: b.max(axis=0) ** 2,
               lambda b: b.sum() ** 0.5, lambda b: (b.min() ** 2) * b):
        same(pl.compile(fn)(b), fn(b))


# -- 5: dtype= computes in that dtype ----------------------------------------------------------
def test_ufunc_dtype_argument_computes_in_that_dtype():
    a = np.array([100, -100, 7], np.int8)
    fn = lambda a: (np.add(a, a, dtype=np.float32), np.multiply(a, 3, dtype=np.int64),  # noqa: E731
                    np.sqrt(a, dtype=np.float32), np.true_divide(a, 2, dtype=np.float16))
    with np.errstate(invalid="ignore"):
        for got, want in zip(pl.compile(fn)(a), fn(a), strict=True):
            same(got, want)
    with pytest.raises(CastingError, match="same_kind"):
        pl.compile(lambda a: np.add(a, 1.5, dtype=np.int32))(a.astype(np.float64))


# -- 10: Python integers outside the dtype (NEP 50) -------------------------------------------
def test_out_of_range_python_ints_follow_nep50():
    x = np.array([0, 5, 255], np.uint8)
    for fn in (lambda x: x == -1, lambda x: x != -1, lambda x: x < 300, lambda x: x >= 256,
               lambda x: np.less(-1, x), lambda x: x / -3, lambda x: x / 300, lambda x: x > -1.5,
               lambda x: np.where(x > 0, x, -1), lambda x: x == 2**70,
               lambda x: np.less(x, 1000)):
        same(pl.compile(fn)(x), fn(x))
    for fn in (lambda x: x + 300, lambda x: x * -1, lambda x: np.maximum(x, -1),
               lambda x: x // -1, lambda x: x & 256, lambda x: x + 2**70):
        with pytest.raises(OverflowError):
            fn(x)  # NumPy raises ...
        with pytest.raises(ScalarOverflowError, match=r"out of bounds|too large"):
            pl.compile(fn)(x)  # ... and so does the compiled function, saying why


# -- 11: operators, methods and pl.compile's own arguments ------------------------------------
def test_bitwise_floor_mod_and_invert_operators(rng):
    a = rng.integers(-50, 50, 8).astype(np.int32)
    b = rng.integers(1, 9, 8).astype(np.int32) * rng.choice([-1, 1], 8).astype(np.int32)
    m = rng.random(8) > 0.5
    fn = lambda a, b, m: (~a, a & b, a | b, a ^ b, a // b, a % b, divmod(a, b), a << 2,  # noqa: E731
                          a >> 1, ~m, m & (a > 0), m | m, m ^ True, 7 // b, 7 % b)
    got, want = pl.compile(fn)(a, b, m), fn(a, b, m)
    for g, w in zip(got, want, strict=True):
        for gg, ww in zip(g, w, strict=True) if isinstance(w, tuple) else [(g, w)]:
            same(gg, ww)
    x = rng.standard_normal(6)
    for g, w in zip(pl.compile(lambda x: (x // 0.7, x % -0.7))(x), (x // 0.7, x % -0.7),
                    strict=True):
        same(g, w)


def test_common_methods_are_supported(rng):
    a = rng.standard_normal((3, 4))
    fn = lambda a: (a.std(), a.std(0, ddof=1), a.prod(), a.argmax(), a.argmin(axis=1),  # noqa: E731
                    a.ravel(), a.flatten(), a.copy(), a.cumsum(0), a.round(2),
                    a.swapaxes(0, 1), np.moveaxis(a[None], 0, -1), a.dot(a.T), a.mT)
    for got, want in zip(pl.compile(fn)(a), fn(a), strict=True):
        assert np.asarray(got).dtype == np.asarray(want).dtype
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_methods_that_need_values_or_write_oddly_say_so(rng):
    a = rng.standard_normal(3)
    with pytest.raises(pl.PycLabError, match=r"x\.item"):
        pl.compile(lambda a: a.item())(a)
    with pytest.raises(pl.PycLabError, match=r"x\.put"):
        pl.compile(lambda a: a.put([0], [1.0]))(a)
    with pytest.raises(pl.PycLabError, match=r"np\.put "):
        pl.compile(lambda a: np.put(a, [0], [1.0]))(a)
    with pytest.raises(pl.PycLabError, match=r"np\.add\.at .*np\.zeros_like"):
        pl.compile(lambda a: np.add.at(np.zeros(3), [0], a))(a)


def test_compile_accepts_ufuncs_and_refuses_builtins_clearly(rng):
    x, y = rng.standard_normal(5), rng.standard_normal(5)
    same(pl.compile(np.tanh)(x), np.tanh(x))
    same(pl.compile(np.add)(x, y), np.add(x, y))
    assert pl.compile(np.tanh).__name__ == "tanh"
    with pytest.raises(pl.PycLabError, match="builtin without one"):
        pl.compile(max)
    with pytest.raises(pl.PycLabError, match="needs a function"):
        pl.compile(42)


@pytest.mark.parametrize("signature, message", [
    ({"x": 5}, "must be a dict of argument name -> spec string"),
    (["x"], "must be a dict"),
    ({"x": "f99[3]"}, "is not a dtype"),
    ({"x": "f32[a]"}, "is not a non-negative integer"),
    ({"x": "f32[-1]"}, "is not a non-negative integer"),
    ({"x": "f32[3"}, "is not like 'f32"),
    ({"x": "f32[3,,4]"}, "is not a non-negative integer"),
])
def test_malformed_signatures_are_one_line_errors(signature, message):
    with pytest.raises(pl.PycLabError, match=message):
        pl.compile(lambda x: x, signature=signature)
