"""Row programs that write row values besides their result: statistics a program returns
or reads elsewhere (a layer norm's mean and inverse deviation, a softmax's log-sum-exp,
a batch norm's batch statistics, the row maximum a cross-entropy picks against) are
computed by the one row kernel and written as its extra outputs, instead of a kernel per
reader reading the rows again. An elementwise result beside row statistics of the same
input (an activation returned with its row sums) is one of those kernels too.

Checked: the pass (one ``fused_rows`` node and ``fused_extra`` nodes, the graph in a
valid order, NumPy's answers op for op on the NumPy backend), what it must leave apart
(two full results, a value that leaves the program and comes back), and the generated
kernel on the CPU (the g++ emulator, every entry, outputs poisoned with NaN) against
NumPy in float64, with NaN, Inf and -0.0 among the inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyc_lab as pl
from pyc_lab.compiler.codegen import generate, supports
from pyc_lab.compiler.ops import run_graph
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.tracer import trace
from tests.compiler.emulate import emulate_threads, needs_gxx
from tests.compiler.test_codegen import compile_ptx, needs_nvcc
from tests.compiler.test_emulated_reductions import _TOL, _aligned

F16, F32, F64 = np.float16, np.float32, np.float64


def layer_norm_stats(x):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(var + x.dtype.type(1e-5))
    return (x - mu) * rstd, mu, rstd


def softmax_lse(x):
    m = x.max(-1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(-1, keepdims=True)
    return e / s, m + np.log(s)


def rms_norm_ms(x):
    ms = (x * x).mean(-1, keepdims=True)
    return x / np.sqrt(ms + x.dtype.type(1e-6)), ms


def batch_norm_train(x):
    mu = x.mean(axis=(0, 2, 3), keepdims=True)
    var = ((x - mu) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    y = (x - mu) / np.sqrt(var + x.dtype.type(1e-5))
    return y, mu.ravel(), var.ravel()


def channel_stats(x):  # a column program: statistics over the channels of NCHW
    mu = x.mean(1, keepdims=True)
    d = x - mu
    return d / np.sqrt((d * d).mean(1, keepdims=True) + x.dtype.type(1e-5)), mu


def statistics_only(x):  # no full result: two row values
    return x.sum(-1), (x * x).sum(-1)


def activation_and_sums(x):  # an elementwise result beside row sums of its input
    return np.maximum(x, 0) * x.dtype.type(2), x.sum(-1), (x * x).mean(-1)


PROGRAMS = {  # name: (function, shape, extra outputs)
    "layer_norm_stats": (layer_norm_stats, (37, 300), 2),
    "softmax_lse": (softmax_lse, (64, 129), 1),
    "rms_norm_ms": (rms_norm_ms, (20, 1000), 1),
    "batch_norm_train": (batch_norm_train, (5, 6, 7, 9), 2),
    "channel_stats": (channel_stats, (3, 24, 5, 11), 1),
    "statistics_only": (statistics_only, (30, 77), 1),
    "activation_and_sums": (activation_and_sums, (33, 260), 2),
}


def _data(rng, shape, dtype, specials=True):
    x = rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    if specials and x.size > 8:
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, 4, replace=False)] = [np.nan, np.inf, -np.inf, -0.0]
    return x.astype(dtype)


def _optimised(fn, args):
    graph, _ = trace(fn, tuple(args))
    res = PassManager().run(graph)
    return res.graph, [n for n in res.graph if n.op not in ("input", "constant", "reshape")]


@pytest.fixture
def rng():
    return np.random.default_rng()


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F64, F16])
def test_statistics_come_from_the_one_row_kernel(rng, name, dtype):
    fn, shape, extras = PROGRAMS[name]
    x = _data(rng, shape, dtype)
    graph, computed = _optimised(fn, [x])
    graph.verify()  # every node after its inputs
    assert [n.op for n in computed] == ["fused_rows"] + ["fused_extra"] * extras, graph.text()
    (node,) = [n for n in computed if n.op == "fused_rows"]
    assert len(node.attrs["body"].outputs) == 1 + extras
    assert supports(node, graph) == (True, "")
    unfused, _ = trace(fn, (x,))
    with np.errstate(all="ignore"):
        got, want = run_graph(graph, [x], np), run_graph(unfused, [x], np)
    for g, w in zip(got, want, strict=True):  # the same ops in the same order
        np.testing.assert_array_equal(g, w)


def test_cross_entropy_reads_the_rows_once_for_its_maximum_and_sum(rng):
    def cross_entropy(x, y):
        z = x - x.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        return -logp[np.arange(x.shape[0]), y].mean()

    x, y = _data(rng, (40, 33), F32), rng.integers(0, 33, 40)
    graph, computed = _optimised(cross_entropy, [x, y])
    graph.verify()
    rows = [n for n in computed if n.op == "fused_rows" and n.inputs == (graph.inputs[0],)]
    assert len(rows) == 1, graph.text()  # one kernel reads x along its rows
    assert {"max", "sum"} <= set(rows[0].attrs["ops"])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(run_graph(graph, [x, y], np)[0], cross_entropy(x, y))


def test_a_reader_of_a_statistic_placed_before_the_result_is_moved_after_it(rng):
    def fn(x, w):
        mu = x.mean(-1, keepdims=True)
        scored = mu.reshape(-1) @ w  # read before the normalised rows are computed
        d = x - mu
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + np.float32(1e-5)), scored

    x, w = _data(rng, (16, 50), F32, specials=False), _data(rng, (16, 3), F32, False)
    graph, computed = _optimised(fn, [x, w])
    graph.verify()
    assert [n.op for n in computed][:2] == ["fused_rows", "fused_extra"], graph.text()
    with np.errstate(all="ignore"):
        for g, w_ in zip(run_graph(graph, [x, w], np), fn(x, w), strict=True):
            np.testing.assert_allclose(g, w_, rtol=1e-6)


def test_what_leaves_and_comes_back_or_two_full_results_stay_apart(rng):
    def round_trip(x, w):  # mu -> matmul -> back into the program: no single kernel
        mu = x.mean(-1, keepdims=True)
        t = (mu.reshape(-1) @ w).reshape(-1, 1)
        return np.exp(x - mu) * t

    def two_full(x):
        mu = x.mean(-1, keepdims=True)
        return x - mu, (x - mu) * 2

    x, w = _data(rng, (16, 16), F32, specials=False), _data(rng, (16, 16), F32, False)
    graph, _ = _optimised(round_trip, [x, w])
    graph.verify()
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(run_graph(graph, [x, w], np)[0], round_trip(x, w),
                                   rtol=1e-6)
    graph, computed = _optimised(two_full, [x])
    graph.verify()
    assert not any(n.op == "fused_rows" and len(n.attrs["body"].outputs) > 1 for n in computed)
    for g, w_ in zip(run_graph(graph, [x], np), two_full(x), strict=True):
        np.testing.assert_allclose(g, w_, rtol=1e-6)


def _emulated(fn, x):
    graph, computed = _optimised(fn, [x])
    (node,) = [n for n in computed if n.op == "fused_rows"]
    body = node.attrs["body"]
    src = generate(node, graph)
    assert src.launch["outputs"] == len(body.outputs)
    runs = []
    for entry in src.entries:
        outs = [np.full(body.node(o).shape, np.nan, dtype=body.node(o).dtype)  # poisoned
                for o in body.outputs]
        launch = src.launch
        grid = -(-launch["rows"] // launch["rows_per_block"])
        emulate_threads(src, entry, [_aligned(x), *outs], (grid, 1), launch["block"])
        runs.append(outs)
    return graph, body, runs


@needs_gxx
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F64, F16])
def test_the_kernel_writes_every_output_as_numpy_computes_it(name, dtype):
    rng = np.random.default_rng(len(name) + np.dtype(dtype).itemsize)
    fn, shape, _ = PROGRAMS[name]
    x = _data(rng, shape, dtype)
    _, body, runs = _emulated(fn, x)
    with np.errstate(all="ignore"):
        want = run_graph(body, [x.astype(F64)], np)  # the body's outputs in float64
    rtol, atol = _TOL[np.dtype(dtype).name]
    for outs in runs:
        for got, ref in zip(outs, want, strict=True):
            assert np.array_equal(np.isnan(got), np.isnan(ref))  # every value written
            np.testing.assert_allclose(got.astype(F64), ref, rtol=rtol, atol=atol)


# -- random programs returning their statistics ----------------------------------------------
_RED = ["sum", "mean", "max", "min"]
_AXES = {2: [-1, 0], 3: [-1, 1, (0, 2)]}


def _returning(red, red2, which, axes):
    """A reduction of a prologue, broadcast back, a second reduction; returning the
    result and the statistics ``which`` picks (through a reshape or a matmul reader)."""
    def fn(x, y):
        v = x * y + x
        r = getattr(v, _RED[red])(axis=axes, keepdims=True)
        w = (v - r) * np.tanh(r)
        s = getattr(w * w, _RED[red2])(axis=axes, keepdims=True)
        out = [w / (s + 1)]
        if which & 1:
            out.append(r.ravel())
        if which & 2:
            out.append(s * 2)
        if which & 4:
            out.append(r + s)
        return tuple(out)
    return fn


@settings(max_examples=120, deadline=None)
@given(red=st.integers(0, 3), red2=st.integers(0, 3), which=st.integers(0, 7),
       ndim=st.sampled_from([2, 3]), pick=st.integers(0, 2),
       dtype=st.sampled_from([F16, F32, F64]), seed=st.integers(0, 2**31))
def test_random_programs_returning_statistics_keep_numpys_answers(red, red2, which, ndim,
                                                                  pick, dtype, seed):
    r = np.random.default_rng(seed)
    axes = _AXES[ndim][pick % len(_AXES[ndim])]
    shape = (6, 33) if ndim == 2 else (4, 9, 7)
    x, y = _data(r, shape, dtype, specials=False), _data(r, shape, dtype, specials=False)
    fn = _returning(red, red2, which, axes)
    graph, computed = _optimised(fn, [x, y])
    graph.verify()
    for node in computed:
        if node.op == "fused_rows":
            assert supports(node, graph) == (True, "")
            generate(node, graph)  # every program the pass makes is generated
    unfused, _ = trace(fn, (x, y))
    with np.errstate(all="ignore"):
        got, want = run_graph(graph, [x, y], np), run_graph(unfused, [x, y], np)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@needs_gxx
@pytest.mark.parametrize("ndim, axes", [(2, -1), (2, 0), (3, -1), (3, 1), (3, (0, 2))])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_extra_outputs_over_any_axes_on_the_cpu(ndim, axes, dtype):
    rng = np.random.default_rng(ndim * 10 + np.dtype(dtype).itemsize)
    shape = (6, 33) if ndim == 2 else (4, 9, 7)
    x, y = _data(rng, shape, dtype), _data(rng, shape, dtype)
    fn = _returning(1, 2, 7, axes)
    graph, computed = _optimised(fn, [x, y])
    (node,) = [n for n in computed if n.op == "fused_rows"]
    body = node.attrs["body"]
    assert len(body.outputs) == 4
    src = generate(node, graph)
    by_id = dict(zip(graph.inputs, (x, y), strict=True))
    ins = [by_id[i] for i in node.inputs]
    with np.errstate(all="ignore"):
        want = run_graph(body, [a.astype(F64) for a in ins], np)
    rtol, atol = _TOL[np.dtype(dtype).name]
    launch = src.launch
    grid = -(-launch["rows"] // launch["rows_per_block"])
    for entry in src.entries:
        outs = [np.full(body.node(o).shape, np.nan, dtype=body.node(o).dtype)
                for o in body.outputs]
        emulate_threads(src, entry, [*(_aligned(a) for a in ins), *outs], (grid, 1),
                        launch["block"])
        for got, ref in zip(outs, want, strict=True):
            assert np.array_equal(np.isnan(got), np.isnan(ref))
            np.testing.assert_allclose(got.astype(F64), ref, rtol=rtol, atol=atol)


@needs_nvcc
@pytest.mark.parametrize("name", ["layer_norm_stats", "channel_stats", "batch_norm_train"])
def test_kernels_with_extra_outputs_compile_for_sm_90(tmp_path, rng, name):
    fn, shape, extras = PROGRAMS[name]
    graph, computed = _optimised(fn, [_data(rng, shape, F16)])
    (node,) = [n for n in computed if n.op == "fused_rows"]
    ptx = compile_ptx(tmp_path, generate(node, graph))
    params = ptx[ptx.index(".entry"):ptx.index(")")]
    assert params.count(".param") == 2 + extras  # x, the result, its statistics


@needs_gxx
@pytest.mark.parametrize("shape", [(4096,), (48, 40)])
def test_a_statistic_of_the_whole_array_read_back_is_one_program(shape):
    # the 0-d mean broadcasts back like a keepdims one: (x - x.mean()) ** 2 ... one row
    def variance(x):
        return ((x - x.mean()) ** 2).mean()

    x = _data(np.random.default_rng(len(shape)), shape, F32, specials=False)
    graph, computed = _optimised(variance, [x])
    assert [n.op for n in computed] == ["fused_rows"], graph.text()
    np.testing.assert_array_equal(run_graph(graph, [x], np)[0], variance(x))
    _, _, runs = _emulated(variance, x)
    for (got,) in runs:
        np.testing.assert_allclose(float(got), variance(x.astype(F64)), rtol=1e-5)


def test_an_extra_output_survives_the_output_fusion_of_a_kernel_it_reads(rng):
    # the row program reads -(y + x); output fusion later computes y + x (written back
    # into y) inside that kernel: the row program's extra output (the sum) must stay
    def fn(x, y):
        s = y.sum()
        y += x
        n = -y
        return s + n, s, n

    x, y = rng.random((3, 4)) < 0.5, _data(rng, (3, 4), F16, specials=False)
    graph, _ = _optimised(fn, [x, y.copy()])
    graph.verify()
    want_y, got_y = y.copy(), y.copy()
    want = fn(x, want_y)
    got = pl.compile(fn, backend="numpy")(x, got_y)
    for g, w in zip(got, want, strict=True):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got_y, want_y)
