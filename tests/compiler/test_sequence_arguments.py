"""A list or tuple of arrays as one argument (an optimiser's parameters), or a dict of
arrays (parameters by name): each array is an input of the compiled function, in order;
writes into them reach the caller's arrays; the container's kind, length or keys and
arrays are part of what selects a compiled signature. Containers and objects holding
arrays among other values are refused (compiled in as constants, they would go unseen
when they change); a config object is keyed by its attributes' values."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl

SHAPES = [(64, 32), (32,), (10, 3, 4)]


def _tensors(rng, positive=False):
    out = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    return [np.abs(a) + np.float32(0.1) for a in out] if positive else out


def adam(params, grads, ms, vs, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    for p, g, m, v in zip(params, grads, ms, vs, strict=True):
        m[...] = b1 * m + (1 - b1) * g
        v[...] = b2 * v + (1 - b2) * g * g
        p -= lr * m / (np.sqrt(v) + eps)
    return params


def test_an_adam_step_over_many_tensors_updates_them_in_place():
    rng = np.random.default_rng(0)
    state = [_tensors(rng), _tensors(rng), _tensors(rng), _tensors(rng, positive=True)]
    mirror = [[a.copy() for a in group] for group in state]
    step = pl.compile(adam)
    for _ in range(3):
        got = step(*state)
        adam(*mirror)
        for group, want in zip(state, mirror, strict=True):
            for a, b in zip(group, want, strict=True):
                np.testing.assert_array_equal(a, b)
        assert all(g is p for g, p in zip(got, state[0], strict=True))
    assert step.cache_info()["misses"] == 1
    text = str(step.explain(*state))
    assert "graph breaks: 0" in text and "params[2]" in str(step.explain(*state).ir_before)


def test_a_functional_step_returns_new_arrays_and_tuples_work_too():
    rng = np.random.default_rng(1)
    params, grads = _tensors(rng), _tensors(rng)

    def sgd(ps, gs, lr=1e-2):
        return [p - lr * g for p, g in zip(ps, gs, strict=True)]

    step = pl.compile(sgd)
    for got, want in zip(step(params, grads), sgd(params, grads), strict=True):
        np.testing.assert_array_equal(got, want)
    total = pl.compile(lambda xs: xs[0] + xs[1])
    np.testing.assert_array_equal(total((params[1], grads[1])), params[1] + grads[1])


def test_the_sequence_length_and_shapes_select_the_signature():
    rng = np.random.default_rng(2)
    params, grads = _tensors(rng), _tensors(rng)
    step = pl.compile(lambda ps, gs: [p * g for p, g in zip(ps, gs, strict=True)])
    step(params, grads)
    step(params[:2], grads[:2])
    step([p.astype(np.float64) for p in params], grads)
    assert step.cache_info()["signatures"] == 3
    out = step(params[:2], grads[:2])
    assert len(out) == 2


def test_a_sequence_mixing_arrays_and_numbers_is_a_clear_error():
    x = np.ones(3)
    with pytest.raises(pl.PycLabError, match="mixing arrays and other values"):
        pl.compile(lambda xs: xs[0] * xs[1])([x, 3.0])


def mlp(params, x):
    h = np.maximum(x @ params["w1"] + params["b1"], 0)
    return h @ params["w2"] + params["b2"]


def _params(rng):
    return {"w1": rng.standard_normal((8, 16)), "b1": rng.standard_normal(16),
            "w2": rng.standard_normal((16, 4)), "b2": rng.standard_normal(4)}


def test_a_dict_of_arrays_is_an_input_per_array_read_at_every_call():
    """Parameters by name (``forward(params, x)``): each array an input, in the dict's
    order; updated in place or rebound, the next call sees it; the keys and the arrays'
    kinds select the signature."""
    rng = np.random.default_rng(1)
    params, x = _params(rng), rng.standard_normal((5, 8))
    f = pl.compile(mlp)
    np.testing.assert_allclose(f(params, x), mlp(params, x), rtol=1e-12)
    params["w1"] *= 2  # in place
    params["b2"] = rng.standard_normal(4)  # rebound
    np.testing.assert_allclose(f(params, x), mlp(params, x), rtol=1e-12)
    assert f.cache_info()["misses"] == 1
    params["w2"] = rng.standard_normal((16, 4)).astype(np.float32)  # another dtype
    np.testing.assert_allclose(f(params, x), mlp(params, x), rtol=1e-6)
    assert f.cache_info()["misses"] == 2
    assert "params['w1']" in f.explain(params, x).ir_before


def test_writes_into_a_dict_of_arrays_reach_the_callers_arrays():
    def sgd(params, grads, lr=0.1):
        for k in params:
            params[k] -= lr * grads[k]
        return params

    rng = np.random.default_rng(2)
    params, grads = _params(rng), _params(rng)
    mirror = {k: v.copy() for k, v in params.items()}
    got = pl.compile(sgd)(params, grads)
    sgd(mirror, grads)
    assert type(got) is dict and list(got) == list(params)
    for k in params:
        np.testing.assert_array_equal(params[k], mirror[k])
        assert got[k] is params[k]  # returned as NumPy returns them: the caller's arrays


def test_containers_and_objects_holding_arrays_among_other_values_are_refused():
    """Compiled in as constants, their arrays would go unseen when they change."""
    class Model:
        def __init__(self):
            self.w = np.ones(3)

        def forward(self, x):
            return x * self.w

    x = np.ones(3)
    with pytest.raises(pl.PycLabError, match="dict holding arrays"):
        pl.compile(lambda p, x: x * p["w"])({"w": np.ones(3), "sub": {"eps": 1e-5}}, x)
    with pytest.raises(pl.PycLabError, match="tuple mixing arrays"):
        pl.compile(lambda p, x: x * p[0])((np.ones(3), "relu"), x)
    with pytest.raises(pl.PycLabError, match=r"bound method.*model\.forward"):
        pl.compile(Model.forward)(Model(), x)
    m = Model()
    np.testing.assert_array_equal(pl.compile(m.forward)(x), x)  # the bound method: fine


def test_a_dict_of_arrays_and_numbers_keys_its_numbers_by_value():
    """``{"w": w, "eps": 1e-5}``: the arrays inputs, the numbers and strings static."""
    def layer(p, x):
        return x * p["w"] + p["eps"] if p["act"] == "none" else np.tanh(x * p["w"])

    f, x = pl.compile(layer), np.arange(3.0)
    p = {"w": np.ones(3), "eps": 0.5, "act": "none"}
    np.testing.assert_array_equal(f(p, x), layer(p, x))
    p["w"][:] = 2.0  # an array: read at every call, no new trace
    np.testing.assert_array_equal(f(p, x), layer(p, x))
    assert f.cache_info()["misses"] == 1
    p["eps"] = 1.5  # a number: part of the key
    np.testing.assert_array_equal(f(p, x), layer(p, x))
    p["act"] = "tanh"
    np.testing.assert_array_equal(f(p, x), layer(p, x))
    assert f.cache_info()["misses"] == 3


def test_a_config_object_is_part_of_the_key_by_its_values():
    class Config:
        def __init__(self, scale):
            self.scale, self.name = scale, "cfg"

    def scaled(x, cfg):
        return x * cfg.scale

    f, x, cfg = pl.compile(scaled), np.arange(3.0), Config(2.0)
    np.testing.assert_array_equal(f(x, cfg), x * 2)
    cfg.scale = 3.0  # the same object, changed: a new trace
    np.testing.assert_array_equal(f(x, cfg), x * 3)
    np.testing.assert_array_equal(f(x, Config(3.0)), x * 3)  # equal values: the same
    assert f.cache_info()["misses"] == 2
