"""Views and concatenations inside fused elementwise kernels.

A basic slice or transpose of a fused group's input is read in place at its strides
(never copied), and a concatenation at a group's root writes each operand straight into
its region of the output (``pyc_lab.compiler.views``). On the CPU: what fuses and what
does not, the loads' geometry, answers bit for bit against NumPy on the numpy backend,
in-place writes never over a viewed input, and every source compiled by ``nvcc``. On the
GPU (marked ``gpu``): each program against float64 NumPy at odd sizes, aligned and
misaligned inputs, poisoned outputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyc_lab as pl
from pyc_lab.compiler.codegen import generate, supports
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.tracer import trace
from pyc_lab.compiler.views import analyse, same_position_inputs, view_geometry
from tests.compiler.test_codegen import compile_ptx, needs_nvcc

F16, F32, F64 = np.float16, np.float32, np.float64


@pytest.fixture
def rng():
    return np.random.default_rng()


def rotary(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def glu(h):
    n = h.shape[-1] // 2
    return h[..., :n] / (1 + np.exp(-h[..., n:]))


def transposed(x, y):
    return x.T * y + 1


def reversed_sum(x):
    return x[::-1] + x


def strided_pick(x, y):
    return x[1::2, 3] * y


def concat_inputs(a, b):
    return np.concatenate([a, b], axis=0)


def uneven_pieces(a, b):
    return np.concatenate([np.tanh(a[:, ::-1]), b * 2, b[:, 1:3]], axis=1)


def time_embedding(t, freqs):
    """A value both pieces read (the outer product): computed in each, never stored."""
    arg = t[:, None] * freqs[None, :]
    return np.concatenate([np.sin(arg), np.cos(arg)], axis=-1)


def shared_uneven(a, b):
    """A broadcast value read by two pieces of different shapes."""
    s = np.exp(a[:, :1]) * 0.5
    return np.concatenate([a * s, b - s, s + 1], axis=1)


PROGRAMS = {
    "rotary": (rotary, lambda r, d, n: [_rand(r, (2, n, 3, 2 * 40), d), _rand(r, (n, 1, 40), d),
                                       _rand(r, (n, 1, 40), d)]),
    "glu": (glu, lambda r, d, n: [_rand(r, (n, 2 * 37), d)]),
    "transposed": (transposed, lambda r, d, n: [_rand(r, (n, 9), d), _rand(r, (9, n), d)]),
    "reversed_sum": (reversed_sum, lambda r, d, n: [_rand(r, (n, 5), d)]),
    "strided_pick": (strided_pick, lambda r, d, n: [_rand(r, (2 * n, 7), d),
                                                    _rand(r, (n,), d)]),
    "concat_inputs": (concat_inputs, lambda r, d, n: [_rand(r, (n, 6), d),
                                                      _rand(r, (3, 6), d)]),
    "uneven_pieces": (uneven_pieces, lambda r, d, n: [_rand(r, (n, 7), d),
                                                      _rand(r, (n, 9), d)]),
    "time_embedding": (time_embedding, lambda r, d, n: [_rand(r, (n,), d) * 2,
                                                        _rand(r, (12,), d)]),
    "shared_uneven": (shared_uneven, lambda r, d, n: [_rand(r, (n, 7), d),
                                                      _rand(r, (n, 9), d)]),
}


def _rand(rng, shape, dtype):
    return (rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def _optimised(fn, args):
    graph, _ = trace(fn, tuple(args))
    return PassManager().run(graph).graph


def _fused(graph):
    return [n for n in graph if n.op == "fused"]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_each_program_is_one_kernel_and_exact_on_the_cpu(rng, name, dtype):
    fn, make = PROGRAMS[name]
    args = make(rng, dtype, 11)
    graph = _optimised(fn, args)
    (node,) = _fused(graph)
    assert not [n for n in graph if n.op in ("slice", "transpose", "concatenate")]
    assert supports(node, graph) == (True, "")
    got = pl.compile(fn)(*args)
    want = fn(*args)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_rotary_loads_read_both_halves_in_place():
    x, c = np.zeros((2, 8, 3, 64), F16), np.zeros((8, 1, 32), F16)
    (node,) = _fused(_optimised(rotary, [x, c, c]))
    pieces = analyse(node.attrs["body"])
    assert [p.out_offset for p in pieces] == [0, 32] and {p.shape for p in pieces} == {
        (2, 8, 3, 32)}
    offsets = sorted({ld.offset for p in pieces for ld in p.loads if ld.param == 0})
    assert offsets == [0, 32]
    src = generate(node, _optimised(rotary, [x, c, c]))
    assert "in0 + 32u" in src.source and src.launch["vec"] == 8
    assert same_position_inputs(node.attrs["body"]) == set()


def test_view_geometry_follows_numpy():
    base = np.arange(4 * 5 * 6).reshape(4, 5, 6)
    for index in [np.s_[::-1, 1:4, ::2], np.s_[2, :, -1], np.s_[..., 3:], np.s_[None, 1]]:
        view = base[index]
        trace_graph, _ = trace(lambda a, index=index: a[index] + 0, (base,))
        chain = [n for n in trace_graph if n.op in ("slice", "transpose")]
        shape, strides, offset = view_geometry(base.shape, chain)
        assert shape == view.shape
        elems = np.lib.stride_tricks.as_strided(base.ravel()[offset:], shape,
                                                [s * base.itemsize for s in strides])
        np.testing.assert_array_equal(elems, view)


def test_a_view_of_a_computed_value_reads_it_from_the_kernel_before(rng):
    def fn(a, b, c):
        return (a * b)[:, :3] * c

    args = [_rand(rng, (5, 8), F32), _rand(rng, (5, 8), F32), _rand(rng, (5, 3), F32)]
    graph = _optimised(fn, args)
    first, second = _fused(graph)  # a * b is computed whole, then read through the view
    assert first.attrs["ops"] == ("multiply",) and second.inputs[0] == first.id
    assert second.attrs["ops"] == ("slice", "multiply")
    assert not [n for n in graph if n.op == "slice"]
    assert np.array_equal(pl.compile(fn)(*args), fn(*args))


def test_a_value_shared_by_two_pieces_is_computed_in_each(rng):
    def fn(a):
        t = np.exp(a)
        return np.concatenate([t + 1, t * 2], axis=-1)

    a = _rand(rng, (4, 6), F32)
    graph = _optimised(fn, [a])
    (node,) = _fused(graph)  # exp is computed in both pieces: never written out
    assert node.attrs["ops"] == ("exp", "add", "multiply", "concatenate")
    pieces = analyse(node.attrs["body"])
    assert len(pieces) == 2 and all(len(p.loads) == 1 for p in pieces)
    assert np.array_equal(pl.compile(fn)(a), fn(a))


def test_a_value_read_by_many_pieces_is_computed_once_past_the_budget(rng):
    """Past MAX_RECOMPUTED_OPS extra evaluations the shared value gets a kernel."""
    from pyc_lab.compiler.passes.elementwise_fusion import MAX_RECOMPUTED_OPS

    def fn(a, k):
        t = np.exp(a)
        return np.concatenate([t * (j + 1) for j in range(k)], axis=-1)

    a = _rand(rng, (3, 4), F32)
    for k, kernels in [(MAX_RECOMPUTED_OPS + 1, 1), (MAX_RECOMPUTED_OPS + 2, 2)]:
        graph = _optimised(lambda x, k=k: fn(x, k), [a])
        assert len(_fused(graph)) == kernels
        assert np.array_equal(pl.compile(lambda x, k=k: fn(x, k))(a), fn(a, k))


def _flipped(x, w):
    y = x @ w
    return (y[::-1] + y) @ w  # y dies at the add: its kernel must not write over it


def _doubled(x, w):
    y = x @ w
    return (np.tanh(y) * 2 + y) @ w  # the control: each element read at its position


def test_in_place_writes_never_go_over_a_viewed_input(rng):
    x, w = _rand(rng, (64, 5), F32), _rand(rng, (5, 5), F32)
    control = pl.compile(_doubled, mode="memory_first").explain(x, w)
    assert "in-place" in set(control.memory["reuse"])
    f = pl.compile(_flipped, mode="memory_first")
    assert "in-place" not in set(f.explain(x, w).memory["reuse"])
    assert np.array_equal(f(x, w), _flipped(x, w))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(-3, 3).filter(bool),
       st.integers(0, 4), st.booleans(), st.sampled_from([F32, F16]))
def test_random_slices_fused_match_numpy(rows, cols, step, start, flip, dtype):
    rng = np.random.default_rng(rows * 131 + cols)
    x = _rand(rng, (rows, cols + start), dtype)

    def fn(a):
        v = a[:, start:][::step]
        v = v.T if flip else v
        return np.concatenate([v * 2, np.abs(v) - 1], axis=0)

    assert np.array_equal(pl.compile(fn)(x), fn(x))


@needs_nvcc
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F16, F64])
def test_view_sources_compile(tmp_path, rng, name, dtype):
    fn, make = PROGRAMS[name]
    args = make(rng, dtype, 13)
    graph = _optimised(fn, args)
    (node,) = _fused(graph)
    compile_ptx(tmp_path, generate(node, graph))


# -- on the GPU ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("n", [1, 13, 1000])
def test_view_kernels_match_float64_numpy(rng, name, dtype, n):
    import cupy as cp

    from tests.compiler.backend.support import poison_pool

    fn, make = PROGRAMS[name]
    args = make(rng, dtype, n)
    f = pl.compile(fn, backend="cupy")
    dev = [cp.asarray(a) for a in args]
    assert [k["kind"] for k in f.explain(*dev).kernels] == ["elementwise"]
    poison_pool()
    got = cp.asnumpy(f(*dev))
    want = fn(*[a.astype(F64) for a in args])
    same = fn(*args)
    assert got.dtype == same.dtype and got.shape == same.shape
    tol = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-12}[got.dtype.name]
    np.testing.assert_allclose(got.astype(F64), want, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("aligned", [True, False])
def test_rotary_kernel_aligned_and_misaligned_into_poisoned_output(rng, aligned):
    import cupy as cp

    from pyc_lab.compiler.backend.launch import launch_elementwise
    from pyc_lab.compiler.codegen.cache import compile_kernel

    x, c, s = PROGRAMS["rotary"][1](rng, F16, 257)
    graph = _optimised(rotary, [x, c, s])
    (node,) = _fused(graph)
    src = generate(node, graph)
    kernels = {e: compile_kernel(src, e) for e in src.entries}
    buf = cp.empty(x.size + 1, dtype=F16)
    dx = (buf[:x.size] if aligned else buf[1:]).reshape(x.shape)
    dx[...] = cp.asarray(x)
    out = cp.full(x.shape, cp.nan, dtype=F16)
    entry = launch_elementwise(132, kernels, src, [dx, cp.asarray(c), cp.asarray(s)], out)
    assert entry == (src.name + "_vec" if aligned else src.name)
    want = rotary(x.astype(F64), c.astype(F64), s.astype(F64))
    np.testing.assert_allclose(cp.asnumpy(out).astype(F64), want, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_in_place_memory_plan_with_views_on_the_gpu(rng):
    import cupy as cp

    x, w = _rand(rng, (4097, 5), F32), _rand(rng, (5, 5), F32)
    f = pl.compile(_flipped, backend="cupy", mode="memory_first")
    got = cp.asnumpy(f(cp.asarray(x), cp.asarray(w)))
    np.testing.assert_allclose(got, _flipped(x.astype(F64), w.astype(F64)), rtol=1e-4,
                               atol=1e-5)
