"""Memory as NumPy has it: results share memory with arguments only where NumPy's do,
writes into arguments reach the caller, globals are guarded and re-read."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler import ReadOnlyError, UnsupportedOperationError, trace
from pyc_lab.compiler.passes import PassManager


@pytest.fixture
def rng():
    return np.random.default_rng()


def shares(out, x):
    return [np.shares_memory(o, x) for o in (out if isinstance(out, tuple) else (out,))]


# -- 8: simplified results are new arrays ----------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda x: x * 1, lambda x: 1 * x, lambda x: x.astype(x.dtype), lambda x: np.negative(-x),
    lambda x: x + 0, lambda x: x - 0, lambda x: x // 1, lambda x: +x,
    lambda x: np.clip(x, None, None), lambda x: np.positive(x), lambda x: x.copy(),
    lambda x: np.copy(x), lambda x: x.T.T.copy(), lambda x: x.reshape(x.shape) * 1,
], ids=["x*1", "1*x", "astype", "neg-neg", "x+0", "x-0", "x//1", "+x", "clip", "positive",
        "copy", "np.copy", "TT.copy", "reshape*1"])
def test_results_never_alias_arguments_numpy_would_not(fn, rng):
    x = rng.integers(-9, 9, (3, 4)).astype(np.int64)
    out = pl.compile(fn)(x)
    assert shares(out, x) == shares(fn(x.copy()), x.copy() * 0 + x) == [False]
    before = x.copy()
    out[...] = 123
    np.testing.assert_array_equal(x, before)


def test_views_and_returned_arguments_alias_like_numpy(rng):
    x = rng.standard_normal((2, 3))
    fn = lambda x: (x, x[1:], x.T, x.reshape(-1), x[:, None], x[..., ::2])  # noqa: E731
    out = pl.compile(fn)(x)
    assert shares(out, x) == [True] * 6
    assert out[0] is x
    out[1][0, 0] = 7.0
    assert x[1, 0] == 7.0  # a write through the view reaches x, as in NumPy


def test_equal_results_are_distinct_arrays_and_constants_are_fresh(rng):
    x = rng.standard_normal(3)
    a, b = pl.compile(lambda x: (x + 1, x + 1))(x)  # CSE makes one node of the two
    assert not np.shares_memory(a, b)
    f = pl.compile(lambda x: (x * 2, np.ones(3)))
    f(x)[1][:] = 99.0
    np.testing.assert_array_equal(f(x)[1], np.ones(3))  # the constant is not the caller's
    y, z = pl.compile(lambda x: (x * 2,) * 2)(x)
    assert y is z  # the same array twice, as NumPy returns it


def test_aliasing_is_kept_whatever_the_pipeline(rng):
    x = rng.standard_normal(4)
    graph, _ = trace(lambda x: x * 1.0, (x,))
    result = PassManager(["simplify"]).run(graph)
    assert result.graph.ops()[-1] == "copy"
    assert result.log[-1].name == "output_aliasing"
    assert "copied" in result.log[-1].notes[0]


def test_broadcast_to_results_stay_read_only(rng):
    x = rng.standard_normal(4)
    out = pl.compile(lambda x: np.broadcast_to(x, (4,)))(x)
    with pytest.raises(ValueError, match="read-only"):
        out[0] = 1.0


# -- 9: writes into arguments, views, out= ---------------------------------------------------
def _both(fn, *args):
    np_args = [a.copy() for a in args]
    pl_args = [a.copy() for a in args]
    want = fn(*np_args)
    got = pl.compile(fn)(*pl_args)
    for g, w in zip(pl_args, np_args, strict=True):
        np.testing.assert_array_equal(g, w)
    return got, want, pl_args


def test_in_place_operators_write_into_the_callers_array(rng):
    def f(a, b):
        a += 1
        a *= b
        b[0] = -7
        return a * 2

    got, want, _ = _both(f, rng.standard_normal(4), rng.standard_normal(4))
    np.testing.assert_array_equal(got, want)

    def g(a):
        a -= 1
        return a

    x = rng.standard_normal(3)
    out = pl.compile(g)(x)
    assert out is x  # NumPy returns the argument itself


def test_writes_through_views_reach_the_base_and_the_other_views(rng):
    def f(a):
        v = a[:2]
        t = a.T
        a[1:] += 10
        t[0, 0] = -5
        w = a.reshape(-1)
        w[-1] = 3
        return v.copy(), t.copy(), a[:, ::-1]

    got, want, args = _both(f, rng.standard_normal((3, 2)))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert np.shares_memory(got[2], args[0])  # a view of the written argument


def test_item_assignment_forms(rng):
    def f(a, idx):
        y = a * 2
        y[y > 1] = 0
        y[idx] = 5
        y[..., 0] = np.arange(y.shape[0])
        y[1] = y[0]
        return y

    a = rng.standard_normal((4, 3))
    np.testing.assert_array_equal(pl.compile(f)(a, np.array([0, 2])), f(a, np.array([0, 2])))


def test_out_arguments_and_copyto(rng):
    def f(a, b):
        np.add(a, b, out=b)
        np.multiply(b, 2, out=b, where=a > 0)
        np.copyto(a, b[::-1])
        return a.sum()

    got, want, _ = _both(f, rng.standard_normal(5), rng.standard_normal(5))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_in_place_casting_errors_are_numpys(rng):
    def f(a):
        a += 1.5
        return a

    with pytest.raises(TypeError, match="same_kind"):
        pl.compile(f)(np.arange(3))

    def g(a):
        np.broadcast_to(a, (2, 3))[0, 0] = 1
        return a

    with pytest.raises(ReadOnlyError, match="read-only"):
        pl.compile(g)(rng.standard_normal(3))


def test_scalars_are_not_written_in_place(rng):
    def f(a):
        s = a.sum()
        s += a  # a NumPy scalar: rebinds to a new array
        return s

    a = rng.standard_normal(4)
    np.testing.assert_allclose(pl.compile(f)(a), f(a.copy()))
    out = pl.compile(lambda a: a.sum())(a)
    assert isinstance(out, np.float64)  # the scalar NumPy returns
    with pytest.raises(TypeError, match="does not support item assignment"):
        pl.compile(lambda a: a.sum().__setitem__((), 1))(a)


def test_writes_through_graph_break_views_are_refused(rng):
    def f(a):
        v = np.real(a.astype(np.complex128))  # a view NumPy returns, through a graph break
        v[0] = 1.0
        return a

    with pytest.raises(UnsupportedOperationError, match="graph break"):
        pl.compile(f)(rng.standard_normal((3, 3)))


def test_writes_through_a_rotated_view_reach_the_argument(rng):
    def f(a):
        v = np.rot90(a)  # traced flips and transposes: a view, as NumPy's
        v[0] = 1.0
        return a

    a = rng.standard_normal((3, 4))
    want = f(a.copy())
    got = pl.compile(f)(a)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(a, want)


def test_writes_through_a_flipped_view_reach_the_argument(rng):
    def f(a):
        v = np.flip(a)  # a traced reversed view
        v[0] = 1.0
        return a

    a = rng.standard_normal(3)
    want = a.copy()
    want[-1] = 1.0
    got = pl.compile(f)(a)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(a, want)


# -- 9: globals are guarded ------------------------------------------------------------------
SCALE = 2.0
TABLE = np.ones(3)
OFFSETS = (1, 2)


def _scaled(x):
    return x * SCALE + TABLE + OFFSETS[0]


def test_rebinding_a_global_retraces(rng, caplog):
    global SCALE, OFFSETS
    f = pl.compile(_scaled)
    x = rng.standard_normal(3)
    np.testing.assert_array_equal(f(x), _scaled(x))
    try:
        SCALE = 3.0
        with caplog.at_level(logging.INFO, logger="pyc_lab.compiler.api"):
            np.testing.assert_array_equal(f(x), _scaled(x))
        assert "global SCALE changed" in caplog.text
        SCALE = 3  # an int is another key than a float
        np.testing.assert_array_equal(f(x), _scaled(x))
        OFFSETS = (5, 2)
        np.testing.assert_array_equal(f(x), _scaled(x))
        assert f.cache_info()["misses"] == 4
        assert any("global SCALE == 3 (int)" in g for g in f.explain(x).guards)
    finally:
        SCALE, OFFSETS = 2.0, (1, 2)


def _indexed(x):
    return x * TABLE[0] + TABLE.sum() + (lambda: TABLE.max())()


def test_global_arrays_are_inputs_read_at_every_call(rng):
    global TABLE
    f = pl.compile(_scaled)
    g = pl.compile(_indexed)
    x = rng.standard_normal(3)
    f(x)
    g(x)
    try:
        TABLE[0] = 100.0  # written in place: seen without a retrace
        np.testing.assert_array_equal(f(x), _scaled(x))
        np.testing.assert_array_equal(g(x), _indexed(x))  # indexing and methods too
        TABLE = np.zeros(3)  # rebound to an array of the same type: still no retrace
        np.testing.assert_array_equal(f(x), _scaled(x))
        assert f.cache_info()["misses"] == 1
        TABLE = np.zeros(4)  # another shape: a new trace (and NumPy's error)
        with pytest.raises(pl.PycLabError, match="broadcast"):
            f(x)
    finally:
        TABLE = np.ones(3)


def test_closures_attributes_and_helpers_are_guarded(rng):
    class Config:
        scale = 2.0

    cfg = Config()
    k = 1.0

    def helper(x):
        return x * cfg.scale

    def f(x):
        return helper(x) + k

    g = pl.compile(f)
    x = rng.standard_normal(3)
    np.testing.assert_array_equal(g(x), f(x))
    cfg.scale = 5.0
    np.testing.assert_array_equal(g(x), f(x))
    k = 2.0  # read by f through its closure
    np.testing.assert_array_equal(g(x), f(x))
    assert g.cache_info()["misses"] == 3


PARAMS = {"w": np.ones(3), "layers": [{"b": np.zeros(3)}], "eps": 0.5}


def _from_params(x):
    key = "w"  # a key the bytecode does not show as a constant
    return x * PARAMS[key] + PARAMS["layers"][0]["b"] + PARAMS["eps"]


def test_arrays_and_values_in_global_containers_are_guarded_item_by_item(rng):
    """``params["W"]`` and ``layers[0]``: each array an input read at every call, each
    plain value guarded by value, the keys guarded; written in place or rebound, the next
    call sees it (a dict of weights updated by a training step)."""
    f = pl.compile(_from_params)
    x = rng.standard_normal(3)
    np.testing.assert_array_equal(f(x), _from_params(x))
    try:
        PARAMS["w"][:] = 4.0  # in place
        np.testing.assert_array_equal(f(x), _from_params(x))
        PARAMS["w"] = np.full(3, 7.0)  # rebound: same type and shape, no retrace
        PARAMS["layers"][0]["b"] = np.full(3, -1.0)  # two levels deep
        np.testing.assert_array_equal(f(x), _from_params(x))
        assert f.cache_info()["misses"] == 1
        PARAMS["eps"] = 2.5  # a plain value: a new trace
        np.testing.assert_array_equal(f(x), _from_params(x))
        PARAMS["extra"] = 1  # the keys changed: a new trace, still right
        np.testing.assert_array_equal(f(x), _from_params(x))
        assert f.cache_info()["misses"] == 3
        assert any("PARAMS['layers'][0]['b'] is a numpy array" in g
                   for g in f.explain(x).guards)
    finally:
        PARAMS.clear()
        PARAMS.update({"w": np.ones(3), "layers": [{"b": np.zeros(3)}], "eps": 0.5})


def test_weights_deep_in_a_models_blocks_are_inputs(rng):
    """``self.blocks[i].attn.qkv.w``: four levels below ``self``, rebound between calls."""
    class Linear:
        def __init__(self):
            self.w = rng.standard_normal((4, 4))

    class Attention:
        def __init__(self):
            self.qkv = Linear()

    class Block:
        def __init__(self):
            self.attn = Attention()

    class Model:
        def __init__(self, depth):
            self.blocks = [Block() for _ in range(depth)]

        def forward(self, x):
            for block in self.blocks:
                x = np.tanh(x @ block.attn.qkv.w)
            return x

    m, x = Model(12), rng.standard_normal((2, 4))
    f = pl.compile(m.forward)
    np.testing.assert_allclose(f(x), m.forward(x), rtol=1e-12)
    m.blocks[7].attn.qkv.w = rng.standard_normal((4, 4))
    m.blocks[2].attn.qkv.w *= 3
    np.testing.assert_allclose(f(x), m.forward(x), rtol=1e-12)
    assert f.cache_info()["misses"] == 1


def test_a_bound_methods_self_is_guarded(rng):
    """``pl.compile(model.forward)``: the weights on ``self``, in its dicts and in the
    objects of its lists are inputs read at every call."""
    class Layer:
        def __init__(self, s):
            self.w = np.full(3, s)

    class Model:
        def __init__(self):
            self.w, self.scale = np.ones(3), 1.5
            self.params = {"b": np.zeros(3)}
            self.layers = [Layer(2.0), Layer(3.0)]

        def forward(self, x):
            for layer in self.layers:
                x = x * layer.w
            return x * self.w * self.scale + self.params["b"]

    m = Model()
    f = pl.compile(m.forward)
    x = rng.standard_normal(3)
    np.testing.assert_array_equal(f(x), m.forward(x))
    m.w[:] = 3.0
    np.testing.assert_array_equal(f(x), m.forward(x))
    m.w = np.full(3, 5.0)
    m.params["b"] = np.full(3, 100.0)
    m.layers[1].w = np.full(3, 10.0)
    np.testing.assert_array_equal(f(x), m.forward(x))
    assert f.cache_info()["misses"] == 1
    m.scale = 0.5
    m.layers.append(Layer(4.0))
    np.testing.assert_array_equal(f(x), m.forward(x))


def test_containers_past_the_budget_are_guarded_by_identity_only(rng, caplog):
    from pyc_lab.compiler.guards import MAX_CONTAINER_ITEMS

    table = [np.ones(2) for _ in range(MAX_CONTAINER_ITEMS + 1)]

    def f(x):
        return x * table[0]

    g = pl.compile(f)
    with caplog.at_level(logging.WARNING, logger="pyc_lab.compiler.guards"):
        np.testing.assert_array_equal(g(np.ones(2)), np.ones(2))
    assert "compiled in as they are now" in caplog.text  # said, not silent
    assert not any("table[0]" in line for line in g.explain(np.ones(2)).guards)
    assert any("closure table is the same object" in line
               for line in g.explain(np.ones(2)).guards)


def test_writes_into_global_arrays_reach_them(rng):
    global TABLE

    def bump(x):
        TABLE[:] += x
        return TABLE.sum()

    try:
        TABLE = np.zeros(3)
        x = rng.standard_normal(3)
        total = pl.compile(bump)(x)
        np.testing.assert_array_equal(TABLE, x)
        np.testing.assert_allclose(total, x.sum())
    finally:
        TABLE = np.ones(3)


def test_random_draws_inside_are_a_clear_error_not_a_frozen_constant(rng):
    """A dropout mask or noise drawn while tracing would be the same at every call."""
    import random

    from numpy.random import rand

    class Noisy:
        def __init__(self):
            self.gen = np.random.default_rng(1)

        def forward(self, x):
            return x + self.gen.standard_normal(x.shape)

    x = rng.standard_normal((4, 4))
    draws = [lambda a: a * (np.random.rand(*a.shape) > 0.5),
             lambda a: a + rng.standard_normal(a.shape),
             lambda a: a * random.random(),
             lambda a: a * rand(4, 4),
             Noisy().forward]
    for fn in draws:
        with pytest.raises(pl.PycLabError, match=r"draws random numbers.*argument"):
            pl.compile(fn)(x)
    mask = np.random.default_rng(2).random(x.shape) > 0.5  # drawn outside: fine
    np.testing.assert_array_equal(pl.compile(lambda a, m: a * m)(x, mask), x * mask)


def test_a_method_decorated_with_compile_is_compiled_per_instance(rng):
    """``@pl.compile`` on a method: read through an instance, the instance's own compiled
    bound method, its ``self`` guarded; a copy of the instance gets its own."""
    import copy

    class Model:
        def __init__(self, s):
            self.w = np.full(3, s)

        @pl.compile
        def forward(self, x):
            return x * self.w

    a, b = Model(1.0), Model(2.0)
    x = rng.standard_normal(3)
    np.testing.assert_array_equal(a.forward(x), x * 1.0)
    np.testing.assert_array_equal(b.forward(x), x * 2.0)
    a.w[:] = 5.0
    b.w = np.full(3, 7.0)
    np.testing.assert_array_equal(a.forward(x), x * 5.0)
    np.testing.assert_array_equal(b.forward(x), x * 7.0)
    assert a.forward is a.forward and a.forward is not b.forward
    assert type(Model.forward).__name__ == "CompiledFunction"  # the class reads it as is
    c = copy.copy(a)
    c.w = np.full(3, 9.0)
    np.testing.assert_array_equal(c.forward(x), x * 9.0)
    np.testing.assert_array_equal(a.forward(x), x * 5.0)


class _Scaler:  # at module level, so that pickle finds it
    def __init__(self, s):
        self.w = np.full(3, s)

    @pl.compile
    def forward(self, x):
        return x * self.w


def test_an_instance_with_a_compiled_method_copies_and_pickles_as_before(rng):
    """The compiled method kept on the instance is a cache: a deep copy or a pickled
    copy drops it and compiles its own, reading its own weights."""
    import copy
    import pickle

    a, x = _Scaler(1.0), rng.standard_normal(3)
    np.testing.assert_array_equal(a.forward(x), x)
    for clone in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        clone.w[:] = 4.0
        np.testing.assert_array_equal(clone.forward(x), x * 4.0)
        np.testing.assert_array_equal(a.forward(x), x)
    f = pl.compile(_square, signature={"x": "f64[3]"}, mode="memory_first")
    g = pickle.loads(pickle.dumps(f))  # a compiled function: its function and options
    np.testing.assert_array_equal(g(x), x * x)
    assert g.mode == "memory_first" and g._signature_text == {"x": "f64[3]"}


def _square(x):
    return x * x


def test_partials_and_callable_objects_compile_with_their_arrays_guarded(rng):
    """``pl.compile(functools.partial(f, params))`` and a model object with ``__call__``:
    the bound arrays are inputs read at every call (a partial's name was missing, and the
    call raised AttributeError)."""
    import functools

    def f(w, x, scale=1.0):
        return x * w * scale

    w, x = np.ones(3), rng.standard_normal(3)
    g = pl.compile(functools.partial(f, w, scale=2.0))
    np.testing.assert_array_equal(g(x), x * 2.0)
    w[:] = 5.0
    np.testing.assert_array_equal(g(x), x * 10.0)
    assert g.fn.__name__ == "f"

    class Model:
        def __init__(self):
            self.w = np.ones(3)

        def __call__(self, v):
            return v * self.w

    m = Model()
    cm = pl.compile(m)
    np.testing.assert_array_equal(cm(x), x)
    m.w = np.full(3, 4.0)
    np.testing.assert_array_equal(cm(x), x * 4.0)
