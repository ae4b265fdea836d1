"""``CompiledFunction.bind`` without a GPU: the full call on what the arrays hold now."""

from __future__ import annotations

import numpy as np

import pyc_lab as pl
from pyc_lab.inference import zoo


def mlp(x, w):
    return np.maximum(x @ w, 0) * np.float32(2)


def test_numpy_binding_runs_on_the_current_contents():
    rng = np.random.default_rng()
    x = rng.standard_normal((5, 7)).astype(np.float32)
    w = rng.standard_normal((7, 3)).astype(np.float32)
    f = pl.compile(mlp, backend="numpy")
    bound = f.bind(x, w)
    assert not bound.zero_copy and "numpy backend" in bound.why
    assert "full calls" in repr(bound)
    first = bound()
    np.testing.assert_allclose(first, mlp(x, w), rtol=1e-6)
    x[...] = rng.standard_normal(x.shape).astype(np.float32)  # new values, same array
    x[0, 0] = np.nan
    second = bound()
    np.testing.assert_allclose(second, mlp(x, w), rtol=1e-6)
    assert np.isnan(second[0]).all() and not np.isnan(first).any()


def test_a_model_binding_matches_its_run():
    model = pl.inference.load(zoo.build("astro_mlp"), backend="numpy")
    inputs = model.example(batch=3, seed=1)
    run = model.io_binding(inputs)
    want = model.run(inputs)
    got = run()
    assert len(got) == len(want) and not run.bound.zero_copy
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    inputs[0][...] = 2 * inputs[0]
    np.testing.assert_allclose(run()[0], model.run(inputs)[0], rtol=1e-6)
