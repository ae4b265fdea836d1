"""Sibling fusion: independent same-shape kernels that read one array become one kernel.

On the CPU: what joins (``sin``/``cos``, ``//``/``%``, polar to Cartesian, a broadcast
operand, mixed result dtypes, kernels that already had extra outputs) and what does not
(another shape, no shared input, one reading the other, no place to stand), answers
against NumPy on the numpy backend with NaN/Inf/-0.0, every generated kernel on the
CPU emulator into poisoned outputs, the output limit, and nvcc. On the GPU (marked
``gpu``): against float64 NumPy, with and without CUDA graphs.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.codegen import generate
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.passes.output_fusion import MAX_OUTPUTS
from pyc_lab.compiler.tracer import trace
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_codegen import compile_ptx, needs_nvcc
from tests.compiler.test_fuzz_emulated import _check_program

F16, F32, F64 = np.float16, np.float32, np.float64


@pytest.fixture
def rng():
    return np.random.default_rng()


def _data(rng, shape, dtype=F32, special=True):
    x = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    if special:
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, size=8, replace=False)
        flat[picks] = [np.nan, np.inf, -np.inf, -0.0, 0.0, np.nan, 1.0, -1.0]
    return x.astype(dtype)


def _graph(fn, args):
    graph, _ = trace(fn, tuple(args))
    return PassManager().run(graph)


def _kernels(graph):
    return [n.op for n in graph if n.op in ("fused", "fused_extra")]


def _notes(res):
    return [n for rec in res.log if rec.name == "sibling_fusion" for n in rec.notes]


#: (source of f(x, y), dtype, y's shape given x's): programs whose results are siblings.
SIBLINGS = {
    "sincos": ("def f(x, y):\n    return np.sin(x), np.cos(x)\n", F32, None),
    "divmod": ("def f(x, y):\n    return x // y, x % y\n", F32, "same"),
    "divmod_int": ("def f(x, y):\n    return x // y, x % y\n", np.int32, "same"),
    "polar": ("def f(x, y):\n    return x * np.cos(y), x * np.sin(y)\n", F32, "same"),
    "bias": ("def f(x, y):\n    return x + y, x * y, np.maximum(x, y)\n", F32, "row"),
    "mixed": ("def f(x, y):\n    return x > y, x * y, (x - y).astype(np.float16)\n", F64,
              "same"),
    "half": ("def f(x, y):\n    return np.tanh(x) * y, np.exp(-x) + y\n", F16, "same"),
}


def _args(rng, dtype, y_shape, shape=(37, 66), special=True):
    if np.dtype(dtype).kind == "i":
        x = rng.integers(-50, 50, shape).astype(dtype)
        y = rng.integers(1, 9, shape).astype(dtype) * rng.choice([-1, 1], shape).astype(dtype)
        return x, y
    x = _data(rng, shape, dtype, special)
    y = _data(rng, shape if y_shape in (None, "same") else shape[-1:], dtype, special)
    return x, y


def _fn(source):
    scope = {"np": np}
    exec(source, scope)
    return scope["f"]


@pytest.mark.parametrize("name", sorted(SIBLINGS))
def test_sibling_results_are_one_kernel_matching_numpy(rng, name):
    source, dtype, y_shape = SIBLINGS[name]
    fn = _fn(source)
    x, y = _args(rng, dtype, y_shape)
    with np.errstate(all="ignore"):
        got, want = pl.compile(fn)(x, y), fn(x, y)
    res = _graph(fn, (x, y))
    kernels = _kernels(res.graph)
    assert kernels.count("fused") == 1 and len(kernels) == len(want), kernels
    assert _notes(res) and all("neither reads the other" in n for n in _notes(res))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)  # the numpy backend: bit for bit, NaN in place


@needs_gxx
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("name", sorted(SIBLINGS))
def test_the_joined_kernel_writes_every_output_on_the_emulator(name, special):
    """Every entry of the generated kernel, launched as the backend launches it into
    poisoned outputs, against NumPy's value of each output."""
    source, dtype, y_shape = SIBLINGS[name]
    shapes = [((37, 66), np.dtype(dtype)),
              ((37, 66) if y_shape in (None, "same") else (66,), np.dtype(dtype))]
    assert _check_program(source, shapes, special, seed=7) == 1


def test_different_shapes_or_no_shared_input_stay_apart(rng):
    x, y = _data(rng, (16, 8)), _data(rng, (16, 8))
    res = _graph(lambda x, y: (np.sin(x), np.cos(y)), (x, y))
    assert _kernels(res.graph) == ["fused", "fused"] and not _notes(res)
    res = _graph(lambda x: (np.sin(x), np.cos(x[:, :4])), (x,))
    assert _kernels(res.graph).count("fused") == 2 and not _notes(res)


def test_a_kernel_reading_the_other_is_output_fusions_case(rng):
    x = _data(rng, (16, 8))
    res = _graph(lambda x: (np.sin(x), np.sin(x) * np.cos(x)), (x,))
    assert _kernels(res.graph) == ["fused", "fused_extra"]
    assert not _notes(res)  # one kernel already: output fusion (or CSE) made it


def test_a_pair_with_no_place_to_stand_stays_two_kernels_and_is_right(rng):
    """``a``'s value is read (by a matmul) before ``b``, and ``b`` reads a value made
    after ``a``: the joined kernel could stand at neither place."""
    def fn(x, y, w):
        a = np.sin(x)
        t = a @ w
        s = y @ w
        return np.cos(x) + s, t

    x, y = (_data(rng, (16, 8), special=False) for _ in range(2))
    w = _data(rng, (8, 8), special=False)
    res = _graph(fn, (x, y, w))
    assert _kernels(res.graph) == ["fused", "fused"] and not _notes(res)
    for g, want in zip(pl.compile(fn)(x, y, w), fn(x, y, w), strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


def test_the_earlier_place_is_taken_when_the_later_one_is_read_too_late(rng):
    """``a`` is read before ``b``, but ``b`` reads only arrays made before ``a``: the
    joined kernel stands where ``a`` was."""
    def fn(x, w):
        a = np.sin(x)
        t = a @ w
        return np.cos(x) * 2, t

    x, w = _data(rng, (16, 8), special=False), _data(rng, (8, 8), special=False)
    res = _graph(fn, (x, w))
    assert _kernels(res.graph) == ["fused", "fused_extra"] and len(_notes(res)) == 1
    ops = [n.op for n in res.graph if n.op not in ("input", "constant")]
    assert ops.index("fused") < ops.index("matmul")
    for g, want in zip(pl.compile(fn)(x, w), fn(x, w), strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


def test_at_most_max_outputs_per_kernel(rng):
    n = MAX_OUTPUTS + 3

    def fn(x):
        return tuple(x * np.float32(k + 1) + np.float32(k) for k in range(n))

    x = _data(rng, (40,))
    res = _graph(fn, (x,))
    fused = [k for k in res.graph if k.op == "fused"]
    assert len(fused) == 2
    assert all(len(k.attrs["body"].outputs) <= MAX_OUTPUTS for k in fused)
    assert sum(len(k.attrs["body"].outputs) for k in fused) == n
    for g, w in zip(pl.compile(fn)(x), fn(x), strict=True):
        np.testing.assert_array_equal(g, w)


def test_kernels_with_extra_outputs_join_with_their_outputs_in_order(rng):
    """Two momentum updates of one gradient (each a kernel with an extra output already)
    become one kernel of four outputs, each returned where NumPy returns it."""
    def fn(g, w1, b1, w2, b2):
        n1 = b1 * np.float32(0.9) + g
        n2 = b2 * np.float32(0.5) + g
        return w1 - np.float32(0.1) * n1, n1, w2 - np.float32(0.2) * n2, n2

    args = [_data(rng, (64,), special=False) for _ in range(5)]
    res = _graph(fn, args)
    assert _kernels(res.graph) == ["fused", "fused_extra", "fused_extra", "fused_extra"]
    for g, w in zip(pl.compile(fn)(*args), fn(*args), strict=True):
        np.testing.assert_array_equal(g, w)


@needs_nvcc
@pytest.mark.parametrize("name", ["sincos", "mixed", "half"])
def test_joined_sources_compile(tmp_path, rng, name):
    source, dtype, y_shape = SIBLINGS[name]
    x, y = _args(rng, dtype, y_shape)
    graph = _graph(_fn(source), (x, y)).graph
    (fused,) = [n for n in graph if n.op == "fused"]
    compile_ptx(tmp_path, generate(fused, graph))


# -- on the GPU ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("name", ["sincos", "divmod", "polar", "bias", "mixed", "half"])
@pytest.mark.parametrize("n", [37, 4099])
def test_joined_kernels_on_the_gpu(rng, name, cuda_graph, n):
    import cupy as cp

    from tests.compiler.backend.support import poison_pool

    source, dtype, y_shape = SIBLINGS[name]
    fn = _fn(source)
    f = pl.compile(fn, backend="cupy", cuda_graph=cuda_graph)
    for _ in range(3):  # first call, capture, replay
        x, y = _args(rng, dtype, y_shape, shape=(3, n), special=False)
        poison_pool()
        got = [cp.asnumpy(o) for o in f(cp.asarray(x), cp.asarray(y))]
        with np.errstate(all="ignore"):
            want = fn(x, y)                                     # dtypes
            exact = fn(x.astype(F64), y.astype(F64))            # values
        for g, w, e in zip(got, want, exact, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            if g.dtype.kind in "biu":
                np.testing.assert_array_equal(g, w)
            else:
                tol = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-12}[g.dtype.name]
                if name == "divmod":  # a quotient next to an integer may floor either way
                    np.testing.assert_array_equal(g, w)
                else:
                    np.testing.assert_allclose(g.astype(F64), np.asarray(e, F64)
                                               .astype(g.dtype).astype(F64),
                                               rtol=tol, atol=tol)
    kernels = f.explain(cp.asarray(x), cp.asarray(y)).kernels
    assert len(kernels) == 1, kernels
