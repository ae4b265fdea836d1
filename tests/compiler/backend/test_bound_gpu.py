"""``CompiledFunction.bind`` on the GPU: with CUDA graphs a run launches the captured
program on the bound arrays in place and returns its own output arrays; new values
written into the bound arrays are what the next run reads (NaN included); a model's
``io_binding`` matches its ``run``."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.inference import zoo

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def block(x, w, b):
    return np.tanh(x @ w + b) * np.float32(0.5) + x[:, :1]


def test_a_bound_call_replays_in_place_without_copies():
    rng = np.random.default_rng()
    xs = rng.standard_normal((33, 20)).astype(np.float32)
    ws = (rng.standard_normal((20, 17)) / 4).astype(np.float32)
    bs = rng.standard_normal(17).astype(np.float32)
    x, w, b = (cp.asarray(a) for a in (xs, ws, bs))
    f = pl.compile(block, backend="cupy", cuda_graph=True)
    bound = f.bind(x, w, b)
    assert bound.zero_copy, bound.why
    for _ in range(3):
        xs = rng.standard_normal(xs.shape).astype(np.float32)
        xs[4, 2] = np.nan
        x[...] = cp.asarray(xs)  # new values into the bound array
        y = bound()
        want = block(xs.astype(np.float64), ws.astype(np.float64), bs.astype(np.float64))
        got = cp.asnumpy(y)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, equal_nan=True)
    assert bound().data.ptr == y.data.ptr  # the program's own output array, each run
    fresh = f(x, w, b)  # an ordinary call still returns a fresh array with the same values
    assert fresh.data.ptr != y.data.ptr
    np.testing.assert_array_equal(cp.asnumpy(fresh), cp.asnumpy(bound()))


def test_a_bound_call_of_a_moved_argument_is_the_ordinary_call():
    x = cp.random.standard_normal((8, 4), dtype=cp.float32)
    w = cp.random.standard_normal((4, 4), dtype=cp.float32)
    b = cp.random.standard_normal(4, dtype=cp.float32)
    f = pl.compile(block, backend="cupy", cuda_graph=False)
    bound = f.bind(x, w, b)
    assert not bound.zero_copy and bound.why
    np.testing.assert_allclose(cp.asnumpy(bound()), cp.asnumpy(block(x, w, b)), rtol=1e-5)


@pytest.mark.parametrize("name", ["astro_mlp", "materials_vae"])
def test_a_model_binding_on_the_gpu_matches_its_run(name):
    model = pl.inference.load(zoo.build(name), backend="cupy", cuda_graph=True)
    inputs = [cp.asarray(a) for a in model.example(batch=5, seed=2)]
    run = model.io_binding(inputs)
    assert run.bound.zero_copy, run.bound.why
    for seed in (3, 4):
        for dst, src in zip(inputs, model.example(batch=5, seed=seed), strict=True):
            dst[...] = cp.asarray(src)
        got = [cp.asnumpy(o) for o in run()]
        want = [cp.asnumpy(o) for o in model.run([a.copy() for a in inputs])]
        for g, w_ in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w_, rtol=1e-5, atol=1e-6)


def test_binding_leaves_what_the_function_reads_in_place_alone():
    """A binding on other arrays captures its own program; the function's calls on their
    arrays keep replaying theirs with every input read in place."""
    mk = lambda *s: cp.random.standard_normal(s, dtype=cp.float32)  # noqa: E731
    own = [mk(16, 8), mk(8, 8), mk(8)]
    f = pl.compile(block, backend="cupy", cuda_graph=True)
    for _ in range(3):
        f(*own)
    exe = f._fast.artifact.runner
    assert exe._program.reads_in_place(own) and exe.captures == 1
    other = [mk(16, 8), mk(8, 8), mk(8)]
    bound = f.bind(*other)
    assert bound.zero_copy and exe.captures == 2
    assert exe._program.reads_in_place(own)  # untouched by the binding
    np.testing.assert_allclose(cp.asnumpy(f(*own)), cp.asnumpy(block(*own)), rtol=1e-5,
                               atol=1e-6)  # tanh(.) * 0.5 + x may cancel
    np.testing.assert_allclose(cp.asnumpy(bound()), cp.asnumpy(block(*other)), rtol=1e-5)
    assert exe.captures == 2
