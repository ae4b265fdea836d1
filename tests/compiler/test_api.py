"""pyc_lab.compile on the numpy backend: results, caching, explain, errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError


@pytest.fixture
def rng():
    return np.random.default_rng()


def mlp(x, w, b):
    return np.tanh(x @ w + b)


def test_decorator_and_function_forms_match_numpy(rng):
    x, w, b = rng.standard_normal((8, 16)), rng.standard_normal((16, 4)), rng.standard_normal(4)

    @pl.compile
    def f(x, w, b):
        return np.tanh(x @ w + b)

    g = pl.compile(mlp, backend="numpy", mode="memory_first")
    h = pl.compile(backend="numpy")(mlp)
    for fn in (f, g, h):
        out = fn(x, w, b)
        assert isinstance(out, np.ndarray)
        np.testing.assert_allclose(out, mlp(x, w, b), rtol=1e-13)


def test_tuple_outputs_and_static_arguments(rng):
    def stats(x, axis, scale=2.0):
        return x.mean(axis=axis) * scale, (x.max(axis=axis), x.min())

    f = pl.compile(stats)
    x = rng.standard_normal((5, 6))
    got = f(x, 1)
    want = stats(x, 1)
    np.testing.assert_allclose(got[0], want[0])
    np.testing.assert_allclose(got[1][0], want[1][0])
    np.testing.assert_allclose(got[1][1], want[1][1])
    np.testing.assert_allclose(f(x, 0, scale=3.0)[0], stats(x, 0, 3.0)[0])
    assert f.cache_info()["signatures"] == 2


def test_retraced_per_signature_and_cached(rng):
    f = pl.compile(mlp)
    x, w, b = rng.standard_normal((8, 16)), rng.standard_normal((16, 4)), rng.standard_normal(4)
    f(x, w, b)
    f(x + 1, w, b)
    assert f.cache_info() == {"hits": 1, "misses": 1, "signatures": 1}
    f(x[:4], w, b)  # new shape
    f(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32))  # new dtype
    assert f.cache_info()["signatures"] == 3
    f.clear_cache()
    assert f.cache_info()["signatures"] == 0


def test_results_keep_dtype(rng):
    f = pl.compile(lambda x: np.tanh(x) * 0.5 + x)
    for dt in (np.float32, np.float64, np.float16):
        x = rng.standard_normal(100).astype(dt)
        out = f(x)
        assert out.dtype == dt
        np.testing.assert_allclose(out, np.tanh(x) * 0.5 + x, rtol=1e-3 if dt == np.float16
                                   else 1e-6)


def test_nan_inf_and_integer_semantics_survive_optimisation():
    f = pl.compile(lambda x, y: (np.maximum(x, y) * 1.0 + 0.0, x - x, x / x, np.negative(-x)))
    x = np.array([np.nan, np.inf, -np.inf, -0.0, 2.0], dtype=np.float64)
    y = np.array([1.0, np.nan, 0.0, 0.0, np.inf])
    with np.errstate(all="ignore"):
        want = (np.maximum(x, y) * 1.0 + 0.0, x - x, x / x, np.negative(-x))
    for got, ref in zip(f(x, y), want, strict=True):
        np.testing.assert_array_equal(got, ref)
    g = pl.compile(lambda a, b: (a * 1 + 0, a / b, a * 3 - b))
    a = np.array([7, -3, 2**31 - 1], dtype=np.int32)
    b = np.array([2, 2, 1], dtype=np.int32)
    for got, ref in zip(g(a, b), (a * 1 + 0, a / b, a * 3 - b), strict=True):
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(got, ref)


def test_graph_breaks_keep_results_correct_and_are_reported(rng):
    f = pl.compile(lambda x: np.unwrap(np.exp(x), axis=0) * 2)
    x = rng.standard_normal((6, 3))
    np.testing.assert_allclose(f(x), np.unwrap(np.exp(x), axis=0) * 2)
    ex = f.explain(x)
    assert ex.graph_breaks == [{"node": ex.graph_breaks[0]["node"], "op": "np.unwrap",
                                "reason": "np.unwrap has no op in pyc_lab's registry"}]
    assert "GRAPH_BREAK" in set(ex.decisions["reason"])


def test_explain_has_every_part(rng):
    f = pl.compile(lambda x, w, b: np.tanh(x @ w + b) * 0.5 + 1.0)
    x, w, b = rng.standard_normal((8, 16)), rng.standard_normal((16, 4)), rng.standard_normal(4)
    ex = f.explain(x, w, b)
    assert ex.ir_before.startswith("graph <lambda>(") and ex.ir_after.startswith("graph")
    assert ex.ir_before != ex.ir_after
    assert {"node", "op", "choice", "reason"} <= set(ex.decisions.columns)
    assert set(ex.decisions["choice"]) == {"numpy"}
    assert ex.peak_bytes <= ex.naive_bytes
    assert list(ex.pass_log["pass"])[:2] == ["canonicalize", "constant_folding"]
    assert ex.backend == "numpy"
    html = ex._repr_html_()
    assert html.count("<svg") == 1 and html == f.explain(x, w, b)._repr_html_()
    assert "kernels:" in repr(ex)
    assert f.explain().ir_after == ex.ir_after  # no args: the last compiled signature


def test_explain_before_any_call_says_what_to_do():
    f = pl.compile(mlp)
    with pytest.raises(pl.PycLabError, match="has not been compiled yet"):
        f.explain()


def test_bad_options_and_arguments_are_clear(rng):
    with pytest.raises(pl.PycLabError, match="backend must be one of"):
        pl.compile(mlp, backend="tpu")
    with pytest.raises(pl.PycLabError, match="mode must be one of"):
        pl.compile(mlp, mode="fast")
    f = pl.compile(mlp)
    with pytest.raises(pl.PycLabError, match="argument 'x' is a list of numbers"):
        f([1.0, 2.0], rng.standard_normal((2, 2)), rng.standard_normal(2))
    with pytest.raises(pl.PycLabError, match="argument 'x' is a tuple of numbers"):
        f((1.0, 2.0), rng.standard_normal((2, 2)), rng.standard_normal(2))
    shaped = pl.compile(lambda a, shape, axes: a.reshape(shape).sum(axis=axes))
    a = rng.standard_normal((3, 4))  # a tuple of ints is a shape or axes: static
    np.testing.assert_array_equal(shaped(a, (2, 6), (0,)), a.reshape(2, 6).sum(axis=0))
    np.testing.assert_array_equal(shaped(a, (4, 3), (1,)), a.reshape(4, 3).sum(axis=1))
    assert shaped.cache_info()["misses"] == 2
    with pytest.raises(pl.PycLabError, match="missing a required argument"):
        f(rng.standard_normal((2, 2)))
    with pytest.raises(pl.PycLabError, match=r"mlp\(x: f64\[3,4\], w: f64\[5,2\], b: f64\[2\]\)"
                       r": matmul: inner dimensions differ"):
        f(rng.standard_normal((3, 4)), rng.standard_normal((5, 2)), rng.standard_normal(2))
    with pytest.raises(pl.PycLabError) as err:  # the op is named once
        f(rng.standard_normal((3, 4)), rng.standard_normal((5, 2)), rng.standard_normal(2))
    assert str(err.value).count("matmul") == 1


def test_signature_checks_name_the_argument(rng):
    f = pl.compile(mlp, signature={"x": "f32[*,16]", "w": "f32[16,4]"})
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((3, 16), (16, 4), (4,)))
    f(x, w, b)
    with pytest.raises(pl.PycLabError, match=r"argument 'w': expected size 4 on axis 1 "
                       r"\(f32\[16,4\]\), got 5 \(f32\[16,5\]\)"):
        f(x, rng.standard_normal((16, 5)).astype(np.float32), b)
    with pytest.raises(pl.PycLabError, match=r"argument 'x': expected rank 2"):
        f(x[0], w, b)
    with pytest.raises(pl.PycLabError, match=r"argument 'x': expected dtype float32"):
        f(x.astype(np.float64), w, b)
    with pytest.raises(pl.PycLabError, match="does not take"):
        pl.compile(mlp, signature={"y": "f32[3]"})


def test_cupy_backend_without_a_gpu_is_a_clear_error(rng):
    if pl.hardware.cupy_status()[0] is not None:
        pytest.skip("a GPU is usable here")
    f = pl.compile(mlp, backend="cupy")
    with pytest.raises(pl.DeviceUnavailableError, match="needs a CUDA device"):
        f(rng.standard_normal((2, 2)), rng.standard_normal((2, 2)), rng.standard_normal(2))


def test_gemm_problems_lists_the_matmuls_the_tuner_can_take():
    """A compiled MLP's GEMMs, after the passes fused bias and GELU into the first one,
    as autotune_many takes them; batched and integer matmuls are left out."""
    from pyc_lab.compiler.functions import gelu
    from pyc_lab.kernels.tuning.many import parse_problems

    def mlp(x, w1, b1, w2, batch):
        h = gelu(x @ w1.T + b1)
        return h @ w2.T, batch @ batch

    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (8, 64)).astype(np.float16)
    w1 = rng.uniform(-1, 1, (128, 64)).astype(np.float16)
    b1 = rng.uniform(-1, 1, 128).astype(np.float16)
    w2 = rng.uniform(-1, 1, (64, 128)).astype(np.float16)
    batch = rng.uniform(-1, 1, (3, 4, 4)).astype(np.float32)
    problems = pl.compile(mlp).gemm_problems(x, w1, b1, w2, batch)
    assert {"m": 8, "n": 128, "k": 64, "dtype": "f16", "layout": "tn", "bias": True,
            "activation": "gelu"} in problems
    assert {"m": 8, "n": 64, "k": 128, "dtype": "f16", "layout": "tn", "bias": False,
            "activation": None} in problems
    assert all(p["m"] != 4 for p in problems)  # the batched matmul is not a tuner problem
    assert len(problems) == len({tuple(p.items()) for p in problems})
    labels = {p.label for p in parse_problems(problems)}
    assert "f16 tn 8x128x64 +bias_gelu" in labels and "f16 tn 8x64x128" in labels


def test_a_call_like_the_last_one_takes_the_fast_path_and_stays_right():
    """The fast path (the last call's artifact for arguments of the same kinds) never
    serves a call the full path would have compiled or chosen differently."""
    scale = {"k": np.float32(2)}

    def f(x, w):
        return x * w + scale["k"]

    g = pl.compile(f, backend="numpy")
    rng = np.random.default_rng()
    x, w = rng.standard_normal((3, 4)).astype(np.float32), np.float32(3) * np.ones(4, np.float32)
    np.testing.assert_array_equal(g(x, w), f(x, w))
    hits = g.cache_info()["hits"]
    for _ in range(3):  # the same kinds: the fast path, each a hit
        x = rng.standard_normal((3, 4)).astype(np.float32)
        np.testing.assert_array_equal(g(x, w), f(x, w))
    assert g.cache_info()["hits"] == hits + 3 and g.cache_info()["misses"] == 1
    # another dtype, shape, contiguity or kind: the full path, its own artifact
    for other in (x.astype(np.float64), x[:2], np.asfortranarray(rng.standard_normal((4, 3)))
                  .T.copy(order="F"), x[:, ::2].repeat(2, axis=1)[:, :4]):
        np.testing.assert_array_equal(g(other, w), f(other, w))
    t = rng.standard_normal((3, 4)).astype(np.float32)
    t.shape = (4, 3)  # the same object reshaped in place
    w3 = np.ones(3, np.float32)
    np.testing.assert_array_equal(g(t, w3), f(t, w3))
    np.testing.assert_array_equal(g(x, w), f(x, w))
    # a guarded value changed: traced again, never the stale artifact
    scale["k"] = np.float32(-5)
    np.testing.assert_array_equal(g(x, w), f(x, w))
    # a static argument where an array was: the full path (no AttributeError)
    np.testing.assert_array_equal(g(x, 2.0), f(x, 2.0))
    g.clear_cache()
    assert g._fast is None
    np.testing.assert_array_equal(g(x, w), f(x, w))


class _Runner:
    """A runner offering a trusted entry, as the CuPy executable does."""

    def __init__(self, inner, fail=False):
        self.inner, self.fail, self.trusted_runs, self.offered = inner, fail, 0, 0

    def __call__(self, inputs):
        if self.fail:
            raise PycLabError("the run failed")
        return self.inner(inputs)

    def trusted(self, args):
        self.offered += 1

        def run(inputs):
            self.trusted_runs += 1
            return self.inner(inputs)
        return run


def test_the_fast_path_takes_the_runners_trusted_entry_after_a_run_went_through():
    def f(x, w):
        return x * w - 1

    g = pl.compile(f, backend="numpy")
    rng = np.random.default_rng()
    x, w = rng.standard_normal((3, 4)), rng.standard_normal(4)
    g(x, w)
    (art,) = [a for arts in g._cache.values() for a in arts]
    g._fast = None
    art.runner = _Runner(art.runner, fail=True)
    with pytest.raises(PycLabError, match="the run failed"):
        g(x, w)
    assert g._fast is None  # a run that failed leaves no fast entry behind
    art.runner.fail = False
    np.testing.assert_allclose(g(x, w), f(x, w))  # the full path, then the entry
    assert art.runner.offered == 1 and art.runner.trusted_runs == 0
    for _ in range(3):
        x = rng.standard_normal((3, 4))
        np.testing.assert_allclose(g(x, w), f(x, w))
    assert art.runner.trusted_runs == 3
    np.testing.assert_allclose(g(x[:2], w), f(x[:2], w))  # another kind: the full path
    assert art.runner.trusted_runs == 3


def test_the_fast_path_under_threads_of_alternating_kinds():
    from concurrent.futures import ThreadPoolExecutor

    def f(x, y):
        return x * y + 1

    g = pl.compile(f, backend="numpy")
    rng = np.random.default_rng()
    cases = [(rng.standard_normal((5, 3)).astype(dt), rng.standard_normal(3).astype(dt))
             for dt in (np.float32, np.float64, np.float32, np.float16)] * 50
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda c: g(*c), cases))
    for (x, y), out in zip(cases, outs, strict=True):
        assert out.dtype == x.dtype
        np.testing.assert_array_equal(out, f(x, y))


def test_results_come_back_in_the_structure_the_function_returned():
    from collections import OrderedDict, namedtuple

    pair = namedtuple("pair", "loss grad")
    x = np.random.default_rng().standard_normal((3, 4))
    cases = [lambda x: {"sum": x + 1, "parts": [x * 2, (x * 3, x.sum())]},
             lambda x: [x, x - 1], lambda x: pair(x.mean(), 2 * x),
             lambda x: OrderedDict(b=x, a=-x), lambda x: (x, {"k": np.tanh(x)}),
             lambda x: (x + 1,), lambda x: (x * 2, x + 1), lambda x: (x - 1, x * 3, x.T)]
    def same(g, w):
        assert type(g) is type(w) or (np.ndim(w) == 0 and np.ndim(g) == 0)
        if isinstance(w, dict):
            assert list(g) == list(w)
            for k in w:
                same(g[k], w[k])
        elif isinstance(w, (list, tuple)):
            assert len(g) == len(w)
            for a, b in zip(g, w, strict=True):
                same(a, b)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-12)

    for fn in cases:
        compiled = pl.compile(fn, backend="numpy")
        for call in range(2):  # the second call: the fast path's packing
            same(compiled(x), fn(x))
            assert compiled.cache_info()["hits"] == call


def test_array_subclasses_with_behaviour_of_their_own_are_refused(tmp_path):
    """A masked array's mask, np.matrix's products, a recarray's type: compiled code would
    drop them silently, also after a plain array of the same shape was compiled."""
    x = np.random.default_rng(3).random((3, 4)).astype(np.float32)
    f = pl.compile(lambda a: a * 2)
    np.testing.assert_array_equal(f(x), x * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # np.matrix's own
        matrix = np.asmatrix(x)
    for value in (np.ma.masked_array(x, mask=x > 0.5), matrix, np.rec.array(x)):
        with pytest.raises(PycLabError, match=type(value).__name__):
            f(value)
    mm = np.memmap(tmp_path / "x.dat", dtype=np.float32, mode="w+", shape=(3, 4))
    mm[:] = x
    got = f(mm)
    assert type(got) is np.ndarray
    np.testing.assert_array_equal(got, x * 2)


@pytest.mark.parametrize("value", [np.array([1, "a"], dtype=object), np.array(["a", "b"]),
                                   np.zeros(2, dtype=[("f", np.float32)])])
def test_arrays_of_objects_strings_or_records_are_a_clear_error(value):
    with pytest.raises(PycLabError, match="dtype"):
        pl.compile(lambda a: a * 2)(value)


def test_array_likes_are_refused_not_compiled_in_as_constants():
    """A pandas Series (or any object with ``__array__``) passed or read inside was baked
    into the graph as a constant: a later call saw its old contents."""
    import pandas as pd

    series = pd.Series([1.0, 2.0])
    f = pl.compile(lambda a: a * 2)
    with pytest.raises(PycLabError, match=r"Series.*np\.asarray"):
        f(series)

    class Holder:  # an array-like of a user's own
        def __array__(self, dtype=None, copy=None):
            return np.ones(2)

    with pytest.raises(PycLabError, match="Holder"):
        f(Holder())
    inside = pl.compile(lambda a: a * series)
    with pytest.raises(PycLabError, match=r"Series.*argument"):
        inside(np.ones(2))
    np.testing.assert_array_equal(f(np.float32(3)), np.float32(6))  # scalars stay static
    cast = pl.compile(lambda a, dt: a.astype(dt))  # a dtype's scalar type has __array__
    assert cast(np.ones(2), np.float16).dtype == np.float16
    assert cast(np.ones(2), np.dtype(np.int8)).dtype == np.int8
