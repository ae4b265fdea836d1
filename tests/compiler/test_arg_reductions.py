"""argmax/argmin of floats over one axis rewritten as a max and a min of indices
(``passes/arg_reductions.py``), which row fusion makes one kernel: NumPy's answer exactly
— first index on ties, the first NaN where a row has one, ``-0.0 == 0.0``, rows of
infinities — on the NumPy backend and in the generated kernel (the g++ emulator, every
entry, outputs poisoned), over the last axis, a column and a middle axis, in float16,
float32 and float64; fused with what reads the index; and left alone where row fusion
would not take it."""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.compiler.codegen import generate, supports
from pyc_lab.compiler.ops import run_graph
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.tracer import trace
from tests.compiler.emulate import emulate_threads, needs_gxx
from tests.compiler.test_emulated_reductions import _aligned

F16, F32, F64 = np.float16, np.float32, np.float64


def _hard(rng, shape, dtype, axis):
    """Values with ties at the maximum and minimum, NaNs, infinities and signed zeros
    along ``axis``: small integers, so that ties are common."""
    x = rng.integers(-3, 4, shape).astype(np.float64)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, max(4, flat.size // 20), replace=False)
    flat[picks] = rng.choice([np.nan, np.inf, -np.inf, -0.0, 0.0], picks.size)
    x = x.astype(dtype)
    # one line along the axis of NaN only, one of -inf only, one of signed zeros
    lines = np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])
    if len(lines) >= 3:
        lines[0], lines[1] = np.nan, -np.inf
        lines[2] = np.where(np.arange(lines.shape[1]) % 2, -0.0, 0.0)
    return np.moveaxis(lines.reshape(np.moveaxis(x, axis, -1).shape), -1, axis).copy()


def _optimised(fn, args):
    graph, _ = trace(fn, tuple(args))
    res = PassManager().run(graph)
    return res.graph, [n for n in res.graph if n.op not in ("input", "constant", "reshape")]


CASES = [((70, 33), -1), ((64, 70), 0), ((5, 40, 9), 1), ((300,), None)]


@pytest.fixture
def rng():
    return np.random.default_rng()


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("shape, axis", CASES)
@pytest.mark.parametrize("dtype", [F16, F32, F64])
@pytest.mark.parametrize("keepdims", [False, True])
def test_the_rewrite_keeps_numpys_index(rng, op, shape, axis, dtype, keepdims):
    x = _hard(rng, shape, dtype, 0 if axis is None else axis)

    def fn(x):
        return getattr(x, op)(axis=axis, keepdims=keepdims)

    graph, computed = _optimised(fn, [x])
    assert [n.op for n in computed] == ["fused_rows"], graph.text()
    assert supports(computed[0], graph) == (True, "")
    got = run_graph(graph, [x], np)[0]
    want = fn(x)
    assert got.dtype == want.dtype == np.int64 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_what_reads_the_index_joins_the_kernel(rng):
    def accuracy(x, y):
        return (np.argmax(x / np.float32(0.7), axis=-1) == y).mean()

    x, y = _hard(rng, (128, 10), F32, 1), rng.integers(0, 10, 128)
    graph, computed = _optimised(accuracy, [x, y])
    # one row kernel computes the index and compares it; the mean of the booleans after
    # (a count: a float32 sum, divided in float64 as NumPy divides)
    assert [n.op for n in computed] == ["fused_rows", "fused_rows"], graph.text()
    assert {"divide", "max", "min", "equal"} <= set(computed[0].attrs["ops"])
    assert {"astype", "sum", "divide"} <= set(computed[1].attrs["ops"])
    np.testing.assert_array_equal(run_graph(graph, [x, y], np)[0], accuracy(x, y))


@pytest.mark.parametrize("fn, args", [
    (lambda x: x.argmax(), [np.ones((8, 8), F32)]),            # over every axis of 2-D
    (lambda x: x.argmax(-1), [np.ones((8, 8), np.int32)]),      # integers
    (lambda x: x.argmax(-1), [np.ones((2, 1 << 17), F32)]),     # two long rows: CuPy's
    (lambda x: x.argmin(0), [np.ones((1, 8), F32)]),            # one value a column
])
def test_what_row_fusion_would_not_take_is_left_alone(fn, args):
    graph, computed = _optimised(fn, args)
    assert [n.op for n in computed] in (["argmax"], ["argmin"]), graph.text()


@needs_gxx
@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("shape, axis", CASES[:3])
@pytest.mark.parametrize("dtype", [F16, F32])
def test_the_kernel_finds_numpys_index(op, shape, axis, dtype):
    rng = np.random.default_rng(len(shape) * 7 + (axis or 0))
    x = _hard(rng, shape, dtype, axis)

    def fn(x):
        return getattr(x, op)(axis=axis)

    graph, computed = _optimised(fn, [x])
    (node,) = computed
    src = generate(node, graph)
    # the kernel's inputs: x and the indices along the axis (a constant of the graph)
    ins = [x if i == graph.inputs[0] else np.asarray(graph.nodes[i].attrs["value"])
           for i in node.inputs]
    launch = src.launch
    grid = -(-launch["rows"] // launch["rows_per_block"])
    for entry in src.entries:
        out = np.full(node.shape, -7, dtype=np.int64)  # poisoned
        emulate_threads(src, entry, [*(_aligned(a) for a in ins), out], (grid, 1),
                        launch["block"])
        np.testing.assert_array_equal(out, fn(x))
