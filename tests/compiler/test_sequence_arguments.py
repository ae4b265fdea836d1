"""A list or tuple of arrays as one argument (an optimiser's parameters): each array is
an input of the compiled function, in order; writes into them reach the caller's arrays;
the sequence's kind, length and arrays are part of what selects a compiled signature."""

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
