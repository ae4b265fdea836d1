"""Scans and sorts (``np.cumsum``, ``np.cumprod``, ``np.sort``, ``np.argsort``) as ops:
no graph break, NumPy's values, dtypes and shapes on the numpy backend for every dtype,
axis and form (function, method, ``x.sort()`` in place), with NaN, infinities and -0.0
in the data and odd sizes; the kernels around them still fuse; on the CuPy backend
(lowered here without a device) each is a library step between generated kernels.
The GPU side: ``tests/compiler/backend/test_scans_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.backend.lowering import lower
from pyc_lab.compiler.codegen import supports
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.policy import choose
from pyc_lab.compiler.tracer import trace


@pytest.fixture
def rng():
    return np.random.default_rng()


DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.float16,
          np.float32, np.float64]


def _data(rng, shape, dtype, special=True):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -5), min(info.max, 5), shape, endpoint=True) \
            .astype(dtype)
    x = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    if special and x.size >= 4:
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, 4, replace=False)] = [np.nan, np.inf, -np.inf, -0.0]
    return x.astype(dtype)


def _same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-3 if want.dtype == np.float16 else 1e-6,
                                   atol=0, equal_nan=True)
        assert np.array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0]))
    else:
        np.testing.assert_array_equal(got, want)


def _breaks(f, *args):
    return len(f.explain(*args).graph_breaks)


FORMS = {
    "cumsum": lambda x, axis: np.cumsum(x, axis=axis),
    "cumprod": lambda x, axis: np.cumprod(x, axis=axis),
    "sort": lambda x, axis: np.sort(x, axis=axis),
    "argsort_stable": lambda x, axis: np.argsort(x, axis=axis, kind="stable"),
    "cumsum_method": lambda x, axis: x.cumsum(axis),
    "cumprod_method": lambda x, axis: x.cumprod(axis=axis),
}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, axis", [((7,), 0), ((5, 9), -1), ((5, 9), 0),
                                         ((3, 4, 5), 1), ((3, 4, 5), None), ((1, 13), -1)])
def test_scans_and_sorts_are_numpys_without_a_graph_break(rng, form, dtype, shape, axis):
    fn = FORMS[form]
    x = _data(rng, shape, dtype)
    if form.startswith("cumprod") and np.dtype(dtype).kind in "iu":
        x = x % 3  # running products of small integers stay far from overflow

    def program(a):
        return fn(a, axis)

    f = pl.compile(program)
    with np.errstate(all="ignore"):
        want = program(x)
        _same(f(x), want)
        fresh = _data(rng, shape, dtype)
        if form.startswith("cumprod") and np.dtype(dtype).kind in "iu":
            fresh = fresh % 3
        _same(f(fresh), program(fresh))  # the same artifact on other values
    assert _breaks(f, x) == 0


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.bool_, np.float16, np.float32])
@pytest.mark.parametrize("acc", [None, np.int32, np.float64, np.float32])
def test_cumsums_accumulation_dtype_is_numpys(rng, dtype, acc):
    x = _data(rng, (4, 6), dtype, special=False)

    def program(a):
        return np.cumsum(a, axis=1, dtype=acc), np.cumprod(a, axis=0, dtype=acc)

    f = pl.compile(program)
    for got, want in zip(f(x), program(x), strict=True):
        _same(got, want)
    assert _breaks(f, x) == 0


def test_argsort_keeps_ties_in_order_and_its_default_kind_sorts(rng):
    x = rng.integers(0, 3, (6, 40)).astype(np.float32)  # many ties
    f = pl.compile(lambda a: np.argsort(a, axis=-1))
    got = f(x)
    np.testing.assert_array_equal(got, np.argsort(x, axis=-1, kind="stable"))
    # whatever NumPy's default order of ties, the indices sort the rows
    np.testing.assert_array_equal(np.take_along_axis(x, got, -1), np.sort(x, axis=-1))
    g = pl.compile(lambda a: a.argsort(axis=0))
    np.testing.assert_array_equal(g(x), np.argsort(x, axis=0, kind="stable"))


def test_sort_in_place_and_the_nan_last_rule(rng):
    x = _data(rng, (5, 8), np.float32)

    def program(a):
        b = a * 2
        b.sort(axis=1)
        return b

    f = pl.compile(program)
    got = f(x)
    _same(got, program(x))
    assert np.isnan(got[np.isnan(x).any(axis=1), -1]).all()  # NaN last in its row
    assert _breaks(f, x) == 0


def test_a_top_p_mask_fuses_around_the_scans(rng):
    """A nucleus (top-p) cut: softmax, sorted probabilities, their running sum, a mask.
    The softmax is one row kernel and the mask one elementwise kernel around the sort
    and the cumsum."""
    def top_p(logits):
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
        s = np.sort(p, axis=-1)[:, ::-1]
        return np.where(np.cumsum(s, axis=-1) - s < 0.9, s, 0)

    x = rng.standard_normal((16, 50)).astype(np.float32)
    f = pl.compile(top_p)
    np.testing.assert_allclose(f(x), top_p(x), rtol=1e-5, atol=1e-7)
    assert len(f.explain(x).graph_breaks) == 0
    graph, _ = trace(top_p, (x,))
    graph = PassManager().run(graph).graph
    impl = {d.node: d.choice for d in choose(graph, "cupy", "balanced", supports)}
    steps = lower(graph, impl).steps
    kinds = [(type(s).__name__, s.node.op) for s in steps]
    assert ("_LibraryStep", "sort") in kinds and ("_LibraryStep", "cumsum") in kinds
    assert [k for k, _ in kinds].count("_KernelStep") == 2  # softmax rows, the mask
    reasons = {d.reason for d in choose(graph, "cupy", "balanced", supports)}
    assert "SCAN" in reasons


def test_what_stays_a_graph_break(rng):
    x = _data(rng, (4, 5), np.float32, special=False)
    out = np.empty((4, 5), np.float32)

    def with_out(a):
        np.cumsum(a, axis=1, out=out)
        return out * 2

    f = pl.compile(with_out)
    np.testing.assert_allclose(f(x), np.cumsum(x, axis=1) * 2, rtol=1e-6)
    assert _breaks(f, x) >= 1
    with pytest.raises(Exception, match="axis"):
        pl.compile(lambda a: np.cumsum(a, axis=2))(x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int8,
                                   np.bool_])
@pytest.mark.parametrize("shape, axis", [((7,), None), ((6,), 0), ((4, 9), -1), ((4, 8), 0),
                                         ((3, 4, 5), 1), ((3, 4, 6), None), ((1, 5), 0)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_median_is_numpys_bit_for_bit(rng, dtype, shape, axis, keepdims):
    """Odd and even counts, NaN in some slices, every dtype's result dtype (float64 for
    integers and booleans), keepdims, and a NumPy scalar where NumPy returns one."""
    x = _data(rng, shape, dtype)

    def program(a):
        return np.median(a, axis=axis, keepdims=keepdims)

    f = pl.compile(program)
    with np.errstate(all="ignore"):
        got, want = f(x), program(x)
    assert type(got) is type(want)
    assert np.asarray(got).dtype == np.asarray(want).dtype
    assert np.shape(got) == np.shape(want)
    np.testing.assert_array_equal(got, want)  # NaN where NumPy has NaN
    assert _breaks(f, x) == 0
    method = pl.compile(lambda a: np.median(a, axis=axis) * 2)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(method(x), np.median(x, axis=axis) * 2)


QUANTILES = {
    "quantile": lambda a, q, axis, keep, method: np.quantile(a, q, axis=axis, keepdims=keep,
                                                              method=method),
    "percentile": lambda a, q, axis, keep, method: np.percentile(
        a, np.multiply(q, 100).tolist() if np.ndim(q) else q * 100, axis=axis, keepdims=keep,
        method=method),
}


@pytest.mark.parametrize("fn", sorted(QUANTILES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.bool_])
@pytest.mark.parametrize("shape, axis", [((7,), None), ((4, 9), -1), ((4, 8), 0),
                                         ((3, 4, 5), (0, 2)), ((3, 4, 6), None)])
@pytest.mark.parametrize("q", [0.9, 0.0, (0.1, 0.5, 1.0)])
def test_quantiles_are_numpys_bit_for_bit(rng, fn, dtype, shape, axis, q):
    """NumPy's own function on the numpy backend: values (NaN in some slices), dtypes
    (a tuple of q gives float64), shapes (q's axis first), scalars, keepdims."""
    x = _data(rng, shape, dtype)
    for keep, method in ((False, "linear"), (True, "nearest"), (False, "midpoint")):
        def program(a, keep=keep, method=method):
            return QUANTILES[fn](a, q, axis, keep, method)

        f = pl.compile(program)
        try:
            with np.errstate(all="ignore"):
                want = program(x)
        except TypeError as e:  # booleans between two values: NumPy's own TypeError
            with pytest.raises(TypeError, match=str(e)[:20]):
                f(x)
            continue
        with np.errstate(all="ignore"):
            got = f(x)
        assert type(got) is type(want)
        assert np.asarray(got).dtype == np.asarray(want).dtype
        assert np.shape(got) == np.shape(want)
        np.testing.assert_array_equal(got, want)
        assert _breaks(f, x) == 0


def test_a_percentile_clip_fuses_around_its_quantiles(rng):
    def clip(x):
        lo, hi = np.percentile(x, [1, 99], axis=-1, keepdims=True)
        return np.clip(x, lo, hi) * 2

    x = _data(rng, (16, 300), np.float32, special=False)
    f = pl.compile(clip)
    np.testing.assert_array_equal(f(x), clip(x))
    assert _breaks(f, x) == 0
    graph, _ = trace(clip, (x,))
    graph = PassManager().run(graph).graph
    ops = [graph.node(d.node).op for d in choose(graph, "cupy", "balanced", supports)
           if d.choice not in ("source", "cupy") or graph.node(d.node).op == "quantile"]
    assert ops.count("quantile") == 1 and "fused" in ops


def test_quantiles_numpy_refuses_or_pyc_lab_does_not_cover_run_as_written(rng):
    x = _data(rng, (4, 9), np.float32, special=False)
    for program in (lambda a: np.quantile(a, 0.5, method="hazen"),
                    lambda a: np.quantile(a, a[0, :2] * 0 + 0.5),  # q computed from data
                    lambda a: np.percentile(a, 50, weights=np.ones_like(a),
                                            method="inverted_cdf")):
        f = pl.compile(program)
        np.testing.assert_array_equal(f(x), program(x))
        assert _breaks(f, x) >= 1
    with pytest.raises(ValueError):
        pl.compile(lambda a: np.quantile(a, 1.5))(x)
    with pytest.raises(ValueError):
        np.quantile(x, 1.5)
