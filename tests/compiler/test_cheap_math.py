"""Integer powers as multiplications: the rewrite, its conditions and its error bound.

The bound is checked against float64 ``x ** n`` on fresh random values over a wide range
(never zeros), per dtype, in units in the last place of the result; special values
(NaN, +-inf, +-0.0, overflow) must give NumPy's answers exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler import trace
from pyc_lab.compiler.ops import run_graph
from pyc_lab.compiler.passes import PassContext, cheap_math
from pyc_lab.compiler.passes.cheap_math import MAX_EXPONENT


def _rewritten(fn, x):
    graph, _ = trace(fn, (x,))
    g = graph.copy()
    ctx = PassContext()
    changed = cheap_math.run(g, ctx)
    g.verify()
    return graph, g, changed, ctx.notes


def _ulps(got: np.ndarray, exact: np.ndarray, dtype) -> np.ndarray:
    """|got - exact| in units of the last place of ``exact`` rounded to ``dtype``."""
    info = np.finfo(dtype)
    ref = exact.astype(dtype).astype(np.float64)
    spacing = np.maximum(np.spacing(np.abs(ref).astype(dtype)).astype(np.float64),
                         float(info.smallest_normal) * float(info.eps))
    return np.abs(got.astype(np.float64) - exact) / spacing


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("n", range(3, MAX_EXPONENT + 1))
def test_integer_powers_become_multiplications_within_the_stated_ulps(n, dtype):
    rng = np.random.default_rng(100 + n)
    # magnitudes whose n-th power stays normal in the dtype
    top = float(np.finfo(dtype).max) ** (1.0 / n) / 2
    low = float(np.finfo(dtype).smallest_normal) ** (1.0 / n) * 2
    mag = np.exp(rng.uniform(np.log(low), np.log(top), 4000))
    x = (mag * rng.choice([-1.0, 1.0], mag.size)).astype(dtype)
    _graph, g, changed, notes = _rewritten(lambda v: v ** n, x)
    assert changed and "power" not in g.ops() and set(g.ops()) >= {"multiply"}
    k = bin(n).count("1") + n.bit_length() - 2
    assert g.ops().count("multiply") == k
    assert notes == [f"cheap_math: x**{n} as {k} multiplications (within {n - 1} ulp): "
                     + notes[0].split("ulp): ")[1]]
    (got,) = run_graph(g, [x], np)
    assert got.dtype == dtype
    exact = x.astype(np.float64) ** n
    assert float(_ulps(got, exact, dtype).max()) <= n - 1


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_special_values_keep_numpys_answers(dtype):
    big = float(np.finfo(dtype).max) ** 0.5
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, big, -big], dtype)
    for n in (3, 4, 5, 8):
        _, g, changed, _ = _rewritten(lambda v, n=n: v ** n, x)
        assert changed
        with np.errstate(all="ignore"):  # big ** n overflows to inf, as NumPy's does
            (got,) = run_graph(g, [x], np)
            want = x ** n
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


NOT_REWRITTEN = [
    ("x**2 (simplify's, exact)", lambda x: x ** 2),
    ("x**9 (past the bound)", lambda x: x ** 9),
    ("x**2.5", lambda x: x ** 2.5),
    ("x**-3", lambda x: x ** -3),
    ("array exponent", lambda x: x ** np.full((6,), 3.0, np.float32)),
    ("promoting 0-d float64 exponent", lambda x: x ** np.array(3.0)),
]


@pytest.mark.parametrize(("label", "fn"), NOT_REWRITTEN, ids=[c[0] for c in NOT_REWRITTEN])
def test_what_is_not_rewritten(label, fn):
    x = (np.random.default_rng(1).standard_normal(6) + 0.1).astype(np.float32)
    graph, g, changed, _ = _rewritten(fn, x)
    assert not changed, label
    assert g.text() == graph.text()


def test_integer_powers_of_integers_stay_exact_powers():
    x = np.arange(1, 9, dtype=np.int64)
    _graph, g, changed, _ = _rewritten(lambda v: v ** 3, x)
    assert not changed and "power" in g.ops()


def test_compiled_function_explains_the_rewrite_and_matches_numpy():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(1001) + 0.1).astype(np.float32)

    def gelu_tanh(x):
        return 0.5 * x * (1 + np.tanh(np.float32(0.7978846) * (x + np.float32(0.044715)
                                                               * x ** 3)))

    f = pl.compile(gelu_tanh)
    got = f(x)
    want = gelu_tanh(x.astype(np.float64))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    notes = f.explain(x).notes
    assert any("x**3 as 2 multiplications (within 2 ulp)" in n for n in notes), notes


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_bfloat16_powers_become_multiplications_within_the_stated_ulps(n):
    """ml_dtypes' bfloat16 (dtype kind ``V``, a bf16 exponent constant too) takes the
    rewrite: within ``n - 1`` bfloat16 ulps of the exact power, and NumPy's answer for
    NaN, infinities and signed zeros."""
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    info = ml_dtypes.finfo(bf16)
    rng = np.random.default_rng(200 + n)
    top = float(info.max) ** (1.0 / n) / 2
    low = float(info.smallest_normal) ** (1.0 / n) * 2
    mag = np.exp(rng.uniform(np.log(low), np.log(top), 4000))
    x = (mag * rng.choice([-1.0, 1.0], mag.size)).astype(bf16)
    _graph, g, changed, notes = _rewritten(lambda v: v ** n, x)
    assert changed and "power" not in g.ops(), notes
    (got,) = run_graph(g, [x], np)
    assert got.dtype == bf16
    exact = x.astype(np.float64) ** n
    # a bfloat16 ulp of the exact value rounded to bfloat16: 2**(exponent - 7)
    ref = exact.astype(bf16).astype(np.float64)
    ulp = 2.0 ** (np.floor(np.log2(np.abs(ref))) - 7)
    assert float((np.abs(got.astype(np.float64) - exact) / ulp).max()) <= n - 1
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0], np.float32).astype(bf16)
    _, g, _, _ = _rewritten(lambda v: v ** n, special)
    (got,) = run_graph(g, [special], np)
    want = (special.astype(np.float32) ** n).astype(bf16)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    np.testing.assert_array_equal(np.signbit(got.astype(np.float32)),
                                  np.signbit(want.astype(np.float32)))
