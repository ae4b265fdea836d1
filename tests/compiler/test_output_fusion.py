"""Output fusion: a fused kernel whose value escapes is computed inside its reader.

On the CPU: what merges (an Adam step becomes one kernel with three outputs) and what
does not (a reader before the kernel, another shape, a view), answers bit for bit
against NumPy on the numpy backend, the lowering's steps and the memory plan, the
generated source (one pointer and one store per output), nvcc compiles, and random
multi-output programs (hypothesis). On the GPU (marked ``gpu``): against float64 NumPy
in every mode, with and without CUDA graphs, aligned and misaligned, mixed output
dtypes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyc_lab as pl
from pyc_lab.compiler.codegen import generate, supports
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.passes.output_fusion import MAX_OUTPUTS
from pyc_lab.compiler.tracer import trace
from tests.compiler.test_codegen import compile_ptx, needs_nvcc

F16, F32, F64 = np.float16, np.float32, np.float64


@pytest.fixture
def rng():
    return np.random.default_rng()


def adam_step(p, g, m, v):
    m2 = np.float32(0.9) * m + np.float32(0.1) * g
    v2 = np.float32(0.999) * v + np.float32(0.001) * g * g
    return p - np.float32(1e-3) * (m2 / np.float32(0.1)) / (
        np.sqrt(v2 / np.float32(0.001)) + np.float32(1e-8)), m2, v2


def momentum(w, g, buf):
    buf2 = buf * 0.9 + g
    return w - 0.01 * buf2, buf2


def gated(x, y):
    mask = x > y
    return np.where(mask, x - y, 0) * 2, mask


def _rand(rng, shape, dtype):
    return (rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def _graph(fn, args):
    graph, _ = trace(fn, tuple(args))
    return PassManager().run(graph)


def _ops(graph):
    return [n.op for n in graph if n.op not in ("input", "constant")]


def test_an_adam_step_is_one_kernel_writing_three_arrays(rng):
    args = [_rand(rng, (1000,), F32) for _ in range(3)] + [np.abs(_rand(rng, (1000,), F32))]
    res = _graph(adam_step, args)
    assert _ops(res.graph) == ["fused", "fused_extra", "fused_extra"]
    notes = [n for rec in res.log if rec.name == "output_fusion" for n in rec.notes]
    assert len(notes) == 2 and all("is also a result" in n for n in notes)
    (fused,) = [n for n in res.graph if n.op == "fused"]
    assert len(fused.attrs["body"].outputs) == 3
    got = pl.compile(adam_step)(*args)
    for g, w in zip(got, adam_step(*args), strict=True):
        assert g.dtype == w.dtype and np.array_equal(g, w)


def test_the_kernel_source_has_a_pointer_and_a_store_per_output(rng):
    args = [_rand(rng, (1000,), F32) for _ in range(3)] + [np.abs(_rand(rng, (1000,), F32))]
    graph = _graph(adam_step, args).graph
    (fused,) = [n for n in graph if n.op == "fused"]
    assert supports(fused, graph) == (True, "")
    src = generate(fused, graph)
    assert src.launch["outputs"] == 3
    assert "float* __restrict__ out1" in src.source and "float* __restrict__ out2" in src.source
    assert set(src.launch["align_bytes"]) >= {"out", "out1", "out2"}


def test_mixed_output_dtypes(rng):
    x, y = _rand(rng, (7, 33), F32), _rand(rng, (7, 33), F32)
    graph = _graph(gated, [x, y]).graph
    assert _ops(graph) == ["fused", "fused_extra"]
    got = pl.compile(gated)(x, y)
    assert got[1].dtype == np.bool_ and np.array_equal(got[1], x > y)
    assert np.array_equal(got[0], gated(x, y)[0])


def test_a_value_read_twice_is_computed_in_its_first_reader(rng):
    def fn(x, y):
        a = x * 2 + 1
        early = np.tanh(a) * y      # the first reader: a is computed in its kernel
        later = a * y - 3           # a later reader reads that kernel's second output
        return early, later

    x, y = _rand(rng, (64, 8), F32), _rand(rng, (64, 8), F32)
    graph = _graph(fn, [x, y]).graph
    assert _ops(graph) == ["fused", "fused_extra", "fused"]
    first, extra, second = (n for n in graph if n.op not in ("input", "constant"))
    assert extra.inputs[0] == first.id and extra.id in second.inputs
    assert first.attrs["ops"] == ("multiply", "add", "tanh", "multiply")
    for g, w in zip(pl.compile(fn)(x, y), fn(x, y), strict=True):
        assert np.array_equal(g, w)


def test_other_shapes_and_views_do_not_merge(rng):
    def broadcast(x, y):
        a = x * 2              # (8,), read by a (4, 8) kernel: not element for element
        return a, a + y

    def viewed(x):
        a = np.exp(x)
        return a, a[::-1] + 1  # read through a view

    x, y = _rand(rng, (8,), F32), _rand(rng, (4, 8), F32)
    assert "fused_extra" not in _ops(_graph(broadcast, [x, y]).graph)
    assert "fused_extra" not in _ops(_graph(viewed, [x]).graph)
    for fn, args in ((broadcast, [x, y]), (viewed, [x])):
        for g, w in zip(pl.compile(fn)(*args), fn(*args), strict=True):
            assert np.array_equal(g, w)


def test_at_most_max_outputs_per_kernel(rng):
    def chain(x):
        outs, cur = [], x
        for k in range(12):
            cur = cur * 1.5 + k
            outs.append(cur)
        return tuple(outs)

    x = _rand(rng, (16,), F32)
    graph = _graph(chain, [x]).graph
    for n in graph:
        if n.op == "fused":
            assert len(n.attrs["body"].outputs) <= MAX_OUTPUTS
    for g, w in zip(pl.compile(chain)(x), chain(x), strict=True):
        assert np.array_equal(g, w)


def test_lowering_writes_the_extras_from_the_fused_step(rng):
    from pyc_lab.compiler.backend.executable import CupyExecutable
    from pyc_lab.compiler.memory import plan_memory
    from pyc_lab.compiler.policy import choose

    args = [_rand(rng, (1000,), F32) for _ in range(3)] + [np.abs(_rand(rng, (1000,), F32))]
    graph = _graph(adam_step, args).graph
    decisions = choose(graph, "cupy", supports=supports)
    assert [d.reason for d in decisions if d.op.startswith("output")] == ["FUSED_OUTPUT"] * 2
    exe = CupyExecutable(graph, {d.node: d.choice for d in decisions},
                         plan_memory(graph, "memory_first"))
    steps = [type(s).__name__ for s in exe._steps]
    assert steps == ["_KernelStep", "_WrittenStep", "_WrittenStep"]
    (kernel,) = exe.kernels
    assert "also writing" in kernel["implementation"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["add", "mul", "tanh", "sub"]), min_size=2, max_size=6),
       st.lists(st.booleans(), min_size=6, max_size=6), st.sampled_from([F32, F16]))
def test_random_multi_output_chains_match_numpy(ops, keep, dtype):
    rng = np.random.default_rng(len(ops))
    x, y = _rand(rng, (5, 9), dtype), _rand(rng, (5, 9), dtype)

    def fn(x, y):
        cur, outs = x, []
        for op, kept in zip(ops, keep, strict=False):
            cur = {"add": lambda c: c + y, "mul": lambda c: c * y,
                   "tanh": np.tanh, "sub": lambda c: y - c}[op](cur)
            if kept:
                outs.append(cur)
        return (*outs, cur * 2)

    for g, w in zip(pl.compile(fn)(x, y), fn(x, y), strict=True):
        assert g.dtype == w.dtype and np.array_equal(g, w)


@needs_nvcc
@pytest.mark.parametrize("fn, dtype", [(adam_step, F32), (momentum, F16), (gated, F64)])
def test_multi_output_sources_compile(tmp_path, rng, fn, dtype):
    n = 3 if fn is not gated else 2
    args = [np.abs(_rand(rng, (37, 5), dtype)) for _ in range(4 if fn is adam_step else n)]
    graph = _graph(fn, args).graph
    (fused,) = [n for n in graph if n.op == "fused"]
    compile_ptx(tmp_path, generate(fused, graph))


# -- on the GPU ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["balanced", "memory_first", "utilization_first"])
@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("n", [1, 1001, 1 << 16])
def test_adam_step_on_the_gpu(rng, mode, cuda_graph, n):
    import cupy as cp

    from tests.compiler.backend.support import poison_pool

    f = pl.compile(adam_step, backend="cupy", mode=mode, cuda_graph=cuda_graph)
    for _ in range(3):  # first call, capture, replay
        args = [_rand(rng, (n,), F32) for _ in range(3)] + [np.abs(_rand(rng, (n,), F32))]
        poison_pool()
        got = [cp.asnumpy(o) for o in f(*[cp.asarray(a) for a in args])]
        want = adam_step(*[a.astype(F64) for a in args])
        for g, w in zip(got, want, strict=True):
            assert g.dtype == F32
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-7)
    assert [k["name"] for k in f.explain(*[cp.asarray(a) for a in args]).kernels] == ["fused_2"]


@pytest.mark.gpu
@pytest.mark.parametrize("aligned", [True, False])
def test_multi_output_kernel_aligned_and_misaligned(rng, aligned):
    import cupy as cp

    x, y = _rand(rng, (4097,), F32), _rand(rng, (4097,), F32)
    buf = cp.empty(2 * 4097 + 1, dtype=F32)
    dx = buf[:4097] if aligned else buf[1:4098]
    dx[...] = cp.asarray(x)
    f = pl.compile(gated, backend="cupy")
    out, mask = f(dx, cp.asarray(y))
    np.testing.assert_array_equal(cp.asnumpy(mask), x > y)
    np.testing.assert_allclose(cp.asnumpy(out), gated(x.astype(F64), y.astype(F64))[0],
                               rtol=1e-6)


@pytest.mark.gpu
def test_momentum_in_float16_with_an_intermediate_input(rng):
    import cupy as cp

    def fn(x, w, g, buf):
        h = x @ w                      # a planned intermediate the kernel reads
        buf2 = buf * 0.9 + h * g
        return (w - 0.01 * buf2) @ w, buf2

    x, w = _rand(rng, (64, 64), F16), _rand(rng, (64, 64), F16) / 8
    g, buf = _rand(rng, (64, 64), F16), _rand(rng, (64, 64), F16)
    f = pl.compile(fn, backend="cupy", mode="memory_first")
    got = [cp.asnumpy(o) for o in f(*[cp.asarray(a) for a in (x, w, g, buf)])]
    want = fn(*[a.astype(F64) for a in (x, w, g, buf)])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.astype(F64), b, rtol=3e-2, atol=3e-2)


def test_the_numpy_backend_computes_the_shared_body_once(rng, monkeypatch):
    from pyc_lab.compiler import ops

    seen = []
    evaluate = ops.evaluate

    def counting(op, *args, **kwargs):
        seen.append(op)
        return evaluate(op, *args, **kwargs)

    monkeypatch.setattr(ops, "evaluate", counting)
    args = [_rand(rng, (100,), F32) for _ in range(3)] + [np.abs(_rand(rng, (100,), F32))]
    got = pl.compile(adam_step)(*args)
    assert "fused_extra" not in seen  # its values come from the fused node's one pass
    for g, w in zip(got, adam_step(*args), strict=True):
        assert np.array_equal(g, w)
