"""Float16 reductions accumulate as NumPy does: in the NumPy backend, in the fused
nodes' references and in the generated CUDA row kernels."""

from __future__ import annotations

import re

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.codegen import generate
from tests.compiler.graphs import op_graph


@pytest.fixture
def rng():
    return np.random.default_rng()


def hand_variance(a):
    return ((a - a.mean(0, keepdims=True)) ** 2).mean(0)


def hand_variance_mul(a):
    d = a - a.mean(-1, keepdims=True)
    return (d * d).mean(-1)


def ln_var(a):
    return (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)


def ln_sq(a):
    c = a - a.mean(-1, keepdims=True)
    return c / np.sqrt(np.mean(c ** 2, axis=-1, keepdims=True) + 1e-5)


def same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_fused_float16_variance_does_not_overflow_where_numpy_does_not():
    a = np.array([[200.0], [-200.0]], np.float16)
    f = pl.compile(hand_variance)
    same(f(a), hand_variance(a))  # 40000, not inf
    # over axis 0: a column program whose body is the mean of squares as written (a
    # float16 np.var, which accumulates in float16, would keep its own kernel)
    ir = f.explain(a).ir_after
    assert "axes=(0,)" in ir and "ops=('mean', 'subtract', 'multiply', 'mean')" in ir
    g = pl.compile(hand_variance_mul)
    b = np.tile(a.reshape(1, 2), 10)  # rows past SHORT_ROW: the var node of its own
    same(g(b), hand_variance_mul(b))
    assert "form='mean_square'" in g.explain(b).ir_after


def test_fused_float16_layer_norm_keeps_the_variance_it_was_written_with():
    # rows past SHORT_ROW values, where a lone layer norm keeps its own node
    a = np.tile(np.array([[200.0, -200.0]], np.float16), 10)
    with np.errstate(over="ignore"):
        for fn, variance in ((ln_var, "np.var"), (ln_sq, "mean_square")):
            f = pl.compile(fn)
            same(f(a), fn(a))  # 0 (np.var overflows) and +-1 (a float32 mean of squares)
            assert f"variance='{variance}'" in f.explain(a).ir_after


@pytest.mark.parametrize("fn", [hand_variance, hand_variance_mul, ln_var, ln_sq])
@pytest.mark.parametrize("scale", [1.0, 150.0])
def test_float16_patterns_match_numpy_on_random_rows(fn, scale, rng):
    a = (rng.standard_normal((6, 40)) * scale).astype(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        same(pl.compile(fn)(a), fn(a))


# -- the generated row kernels: float32 accumulation, NumPy's float16 roundings ---------------
def _kernel(op, attrs, dtype=np.float16, cols=64):
    g, node = op_graph(op, [((4, cols), dtype)], attrs)
    src = generate(node, g).source
    return src[src.index('extern "C"'):]


def test_float16_variance_kernels_accumulate_in_float32_and_round_like_numpy():
    written = _kernel("var", {"axis": (1,), "keepdims": False, "form": "mean_square"})
    np_var = _kernel("var", {"axis": (1,), "keepdims": False})
    for src in (written, np_var):
        assert "float s = 0.0f;" in src and "float q = 0.0f;" in src  # float32 sums
        assert "double" not in src
        assert "q += pyc_round_f16(pyc_round_f16(v[k] - mean) * " \
               "pyc_round_f16(v[k] - mean));" in src  # each square rounded, as NumPy
    # np.mean divides the float32 sum; np.var rounds the sum to float16 first
    assert "mean = pyc_round_f16(s / static_cast<float>(64));" in written
    assert "pyc_round_f16(q / static_cast<float>(64))" in written
    assert "mean = pyc_round_f16(pyc_round_f16(s) / static_cast<float>(64));" in np_var
    assert "pyc_round_f16(pyc_round_f16(q) / static_cast<float>(64))" in np_var


def test_float16_layer_norm_kernels_round_each_step_like_numpy():
    for variance in ("np.var", "mean_square"):
        src = _kernel("layer_norm", {"eps": 1e-5, "axis": -1, "variance": variance})
        assert "float s = 0.0f;" in src and "float q = 0.0f;" in src
        assert re.search(r"denom = pyc_round_f16\(sqrt\(pyc_round_f16\(", src)
        # the division is float16 division (native/f16.cuh), NumPy's quotient bit for bit
        assert "r = pyc_round_f16(pyc_div_f16(pyc_round_f16(v[k] - mean), denom));" in src
        assert ("vmean" in src) == (variance == "np.var")


def test_float32_kernels_have_no_float16_rounding():
    for op, attrs in (("var", {"axis": (1,), "keepdims": False}),
                      ("layer_norm", {"eps": 1e-5, "axis": -1})):
        src = _kernel(op, attrs, np.float32)
        assert "pyc_round_f16" not in src
        assert re.search(r"const float mean = \(\(?s\)? / static_cast<float>\(64\)\);", src)


def _kernel_model(x, form):
    """The row kernel's arithmetic in NumPy: float32 sums, float16 roundings."""
    r = lambda v: np.float32(np.float16(v))  # noqa: E731
    n = np.float32(x.size)
    s = np.float32(x.astype(np.float32).sum(dtype=np.float32))
    mean = r(r(s) / n) if form == "np.var" else r(s / n)
    q = np.float32(0)
    for v in x.astype(np.float32):
        d = r(v - mean)
        q = np.float32(q + r(d * d))
    return np.float16(r(r(q) / n) if form == "np.var" else r(q / n))


@pytest.mark.parametrize("scale", [1.0, 100.0, 300.0])
def test_the_kernels_rounding_recipe_is_numpys(scale, rng):
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(5):
            x = (rng.standard_normal(32) * scale).astype(np.float16)
            d = x - x.mean()
            for form, want in (("np.var", np.var(x)), ("mean_square", (d * d).mean())):
                got = _kernel_model(x, form)
                if np.isinf(want):
                    assert np.isinf(got), form
                else:
                    np.testing.assert_allclose(np.float32(got), np.float32(want),
                                               rtol=2e-3, err_msg=form)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float32_and_float64_row_kernels_keep_the_precedence_of_their_terms(dtype):
    """Rounded pieces are composed as text: each must stay one term, or ``(x - m)**2``
    reads as ``x - m*x - m`` once no float16 rounding wraps it."""
    for cols in (513, 40000):  # a row kept in registers, and one re-read from memory
        g, var = op_graph("var", [((8, cols), dtype)], {"axis": (1,), "keepdims": False})
        src = generate(var, g).source
        assert re.search(r"q \+= \(\((v\[k\]|xv) - mean\) \* \(\1 - mean\)\);", src), src
        g, norm = op_graph("layer_norm", [((8, cols), dtype)], {"axis": -1, "eps": 1e-5})
        src = generate(norm, g).source
        assert re.search(r"q \+= \(\((v\[k\]|xv) - mean\) \* \(\1 - mean\)\);", src), src
        assert re.search(r"r = \(\((v\[k\]|xv) - mean\) / denom\);", src), src
