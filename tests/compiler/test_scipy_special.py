"""``scipy.special.softmax``, ``log_softmax`` and ``logsumexp`` inside compiled functions
(``compiler/scipy_special.py``): SciPy's answers and dtypes without a graph break, however
the function reaches them (imported by name, through ``scipy.special`` or ``scipy``, from
a helper it calls), on fresh random data with infinities, NaN and huge values; the forms
the stand-ins do not cover run SciPy itself as a graph break; functions that use none of
them are traced as they are. The same on a GPU: ``backend/test_scipy_special_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.rebind import rebind

scipy = pytest.importorskip("scipy")
import scipy.special as sp  # noqa: E402
from scipy import special  # noqa: E402
from scipy.special import log_softmax, logsumexp, softmax  # noqa: E402

F32, F64 = np.float32, np.float64


def _data(dtype, shape=(9, 33)):
    rng = np.random.default_rng()
    if np.dtype(dtype).kind == "i":
        return rng.integers(-20, 20, shape).astype(dtype)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    x[0, :] = -np.inf  # a row of nothing
    x[1, 3] = np.inf
    x[2, 5] = np.nan
    x[3, :] = np.finfo(dtype).max / 4  # exp overflows without the shift
    x[4, 7] = -0.0
    return x


def _helper(x):
    return sp.softmax(x * 2, axis=-1)


FORMS = {
    "softmax_rows": lambda x: sp.softmax(x, axis=-1),
    "softmax_all": lambda x: softmax(x),
    "softmax_cols": lambda x: special.softmax(x, axis=0),
    "log_softmax_rows": lambda x: scipy.special.log_softmax(x, axis=1),
    "log_softmax_all": lambda x: log_softmax(x),
    "logsumexp_rows_keepdims": lambda x: sp.logsumexp(x, axis=-1, keepdims=True),
    "logsumexp_all": lambda x: logsumexp(x),
    "logsumexp_axes": lambda x: special.logsumexp(x, axis=(0, 1)),
    "logsumexp_cols": lambda x: logsumexp(x, axis=0),
    "helper": lambda x: _helper(x) + 1,
}


@pytest.mark.parametrize("name", sorted(FORMS))
@pytest.mark.parametrize("dtype", [F32, F64, np.int64])
def test_scipy_s_answers_without_graph_breaks(name, dtype):
    fn = FORMS[name]
    x = _data(dtype)
    f = pl.compile(fn, backend="numpy")
    with np.errstate(all="ignore"):
        got, want = np.asarray(f(x)), np.asarray(fn(x))
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 1e-5 if want.dtype == F32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert f.explain(x).graph_breaks == []


def test_softmax_written_through_scipy_is_one_row_kernel_as_written_by_hand():
    x = _data(F32)
    by_hand = pl.compile(lambda x: np.exp(x - x.max(-1, keepdims=True))
                         / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True),
                         backend="numpy")
    through = pl.compile(lambda x: sp.softmax(x, axis=-1), backend="numpy")
    ops = [n.op for n in through.explain(x).graph if n.op not in ("input", "constant")]
    assert ops == [n.op for n in by_hand.explain(x).graph
                   if n.op not in ("input", "constant")]


def test_weights_and_signs_run_scipy_itself_as_a_graph_break():
    x, b = _data(F64)[5:], np.random.default_rng().uniform(-1, 1, 33)
    fn = lambda x: sp.logsumexp(x, axis=-1, b=b, return_sign=True)  # noqa: E731
    f = pl.compile(fn, backend="numpy")
    got, want = f(x), fn(x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    assert [b["op"] for b in f.explain(x).graph_breaks]


def test_functions_that_use_none_of_them_are_traced_as_they_are():
    def plain(x):
        return np.tanh(x)

    stand_ins = pl.compiler.scipy_special.shims()
    assert stand_ins  # SciPy is imported here
    assert rebind(plain, stand_ins) is plain
    assert rebind(_helper, stand_ins) is not _helper  # reaches scipy.special by name
