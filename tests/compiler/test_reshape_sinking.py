"""Reshape sinking: elementwise work on a reshaped value runs in the value's shape (a
group norm's scale and shift join the kernel that normalises). The axis grouping of a
reshape, NumPy's values after the rewrite on random data (NaN included), what is left
alone (an operand varying along part of a split axis, reshapes of inputs, axes of
length one), the generated kernel on the CPU emulator, and a group norm on the GPU."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler import trace
from pyc_lab.compiler.codegen import supports
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.passes.reshape_sinking import _groups
from pyc_lab.compiler.policy import choose
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_fuzz_emulated import _check_program


@pytest.mark.parametrize("r, v, want", [
    ((4, 32, 8, 8), (4, 8, 4, 8, 8), [([0], [0]), ([1], [1, 2]), ([2], [3]), ([3], [4])]),
    ((4, 6), (24,), [([0, 1], [0])]),
    ((4, 1, 6), (4, 6), [([0], [0]), ([1, 2], [1])]),
    ((4, 6), (4, 6, 1), [([0], [0]), ([1], [1, 2])]),
    ((6, 4), (4, 6), [([0, 1], [0, 1])]),  # one run of both
    ((0, 3), (3, 0), None),
    ((6, 5), (4, 6), None),  # not a reshape
])
def test_a_reshape_s_axes_group_into_runs_of_equal_product(r, v, want):
    assert _groups(r, v) == want


def _group_norm(x, g, b):
    n, c, h, w = x.shape
    xg = x.reshape(n, 4, c // 4, h, w)
    mu = xg.mean(axis=(2, 3, 4), keepdims=True)
    var = xg.var(axis=(2, 3, 4), keepdims=True)
    y = ((xg - mu) / np.sqrt(var + np.float32(1e-5))).reshape(n, c, h, w)
    return y * g[None, :, None, None] + b[None, :, None, None]


def _heads(x, s):
    q = x.reshape(x.shape[0], 4, -1)  # heads split from the features
    return np.exp(q - q.max(-1, keepdims=True)).reshape(x.shape) * s


def _part_of_a_split_axis(x, s):
    y = np.tanh(x).reshape(x.shape[0], 4, -1)
    return y.reshape(x.shape) * s[None, : x.shape[1]]  # s varies along the whole axis


def _kernels(fn, *args):
    graph, _ = trace(fn, args)
    res = PassManager().run(graph)
    return [res.graph.node(d.node).op for d in choose(res.graph, "cupy", "balanced", supports)
            if d.choice in ("fused_kernel", "reduction_kernel")]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_a_group_norm_is_one_kernel_with_numpys_values(dtype):
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 16, 5, 7)).astype(dtype)
    x[0, 0, 0, :2] = [np.nan, -0.0]
    g, b = (rng.standard_normal(16).astype(dtype) for _ in range(2))
    if dtype != np.float16:  # (a float16 variance stays CuPy's)
        assert _kernels(_group_norm, x, g, b) == ["fused_rows"]
        graph, _ = trace(_group_norm, (x, g, b))
        res = PassManager().run(graph)
        views = [res.graph.node(d.node).op for d in choose(res.graph, "cupy", "balanced",
                                                             supports)
                 if d.choice == "cupy"]
        assert views == ["reshape"] * 4, views  # g and b reshaped once each, no slices
    want = _group_norm(x, g, b)
    got = pl.compile(_group_norm)(x, g, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)


def test_elementwise_work_after_a_head_split_joins_its_row_program():
    rng = np.random.default_rng()
    x, s = rng.standard_normal((8, 64)).astype(np.float32), rng.random(64).astype(np.float32)
    assert _kernels(_heads, x, s) == ["fused_rows"]
    np.testing.assert_allclose(pl.compile(_heads)(x, s), _heads(x, s), rtol=1e-6)


def test_an_operand_varying_along_part_of_a_split_axis_stays_after_the_reshape():
    rng = np.random.default_rng()
    x, s = rng.standard_normal((8, 64)).astype(np.float32), rng.random(64).astype(np.float32)
    np.testing.assert_allclose(pl.compile(_part_of_a_split_axis)(x, s),
                               _part_of_a_split_axis(x, s), rtol=1e-6)
    graph, _ = trace(lambda a: a.reshape(4, -1) * 2, (x,))  # a reshape of an input
    notes = [n for r in PassManager(["reshape_sinking"]).run(graph).log for n in r.notes]
    assert notes == []


def test_a_reshape_that_only_drops_axes_of_length_one_is_left_alone():
    """A cross-entropy's picked log-probabilities, ``(n, 1)`` values read as ``(n,)``:
    both shapes fuse alike, and sinking would only split the mean's program."""
    rng = np.random.default_rng()
    x, y = rng.standard_normal((64, 33)).astype(np.float32), rng.integers(0, 33, 64)

    def loss(a, labels):
        z = a - a.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        return -logp[np.arange(a.shape[0]), labels].mean()

    graph, _ = trace(loss, (x, y))
    notes = [n for r in PassManager().run(graph).log for n in r.notes
             if n.startswith("reshape_sinking")]
    assert notes == []
    np.testing.assert_allclose(pl.compile(loss)(x, y), loss(x, y), rtol=1e-6)


@needs_gxx
def test_the_generated_kernel_computes_numpys_values():
    source = ("def f(x, y, m):\n"
              "    z = np.tanh(x).reshape(37, 13, 10)\n"
              "    z = z - z.mean(-1, keepdims=True)\n"
              "    return z.reshape(37, 130) * y + 1\n")
    specs = [((37, 130), np.dtype(np.float32)), ((130,), np.dtype(np.float32)),
             ((37, 130), np.dtype(bool))]
    assert _check_program(source, specs, True, 5) >= 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_group_norm_on_the_gpu_is_one_kernel_with_numpys_values(dtype):
    cp = pytest.importorskip("cupy")
    from tests.compiler.backend.support import poison_pool

    rng = np.random.default_rng()
    x = rng.standard_normal((4, 32, 17, 9)).astype(dtype)
    x[0, 0, 0, :2] = [np.nan, -0.0]
    g, b = (rng.standard_normal(32).astype(dtype) for _ in range(2))
    f = pl.compile(_group_norm, backend="cupy")
    args = [cp.asarray(a) for a in (x, g, b)]
    kernels = f.explain(*args).kernels  # the scale and shift inside the normalising kernel
    assert any({"mean", "sqrt", "multiply", "add"} <= set(k["ops"]) for k in kernels), kernels
    poison_pool()
    got = cp.asnumpy(f(*args))
    want = _group_norm(x, g, b)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)
    assert np.isnan(got[0, 0]).all() and not np.isnan(got[0, 8:]).any()
