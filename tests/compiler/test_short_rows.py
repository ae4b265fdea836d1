"""Row programs over rows of a few values along memory (a softmax over 4 classes, the
normalisation of 3-D vectors, a layer norm over 8 features): a thread per row, lanes
taking neighbouring rows (``codegen.row_program.short_row_config``), instead of a warp
per row that left most of it idle.

On the CPU: which programs take that layout (rows of up to ``SHORT_ROW`` values; 17 get
a warp), lone softmax/layer norm/variance over short rows as programs of their own, the
generated kernels run by the CPU emulator with real threads per block against float64
NumPy, with NaN/Inf/-0.0, rows not a multiple of the block, into poisoned outputs. On
the GPU (marked ``gpu``): each program against NumPy through the cupy backend, one
kernel.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler import trace
from pyc_lab.compiler.codegen import generate, supports
from pyc_lab.compiler.codegen.row_program import SHORT_ROW
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.policy import choose
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_codegen import compile_ptx, needs_nvcc
from tests.compiler.test_fuzz_emulated import _check_program

PROGRAMS = {
    "softmax": "def f(x):\n    e = np.exp(x - x.max(-1, keepdims=True))\n"
               "    return e / e.sum(-1, keepdims=True)\n",
    "log_softmax": "def f(x):\n    m = x.max(-1, keepdims=True)\n"
                   "    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))\n",
    "normalise": "def f(x):\n    return x / np.sqrt((x * x).sum(-1, keepdims=True))\n",
    "layer_norm": "def f(x):\n    m = x.mean(-1, keepdims=True)\n"
                  "    v = ((x - m) ** 2).mean(-1, keepdims=True)\n"
                  "    return (x - m) / np.sqrt(v + 1e-5)\n",
    "std_ddof": "def f(x):\n    return x.std(-1, ddof=1)\n",
    "centred_max": "def f(x):\n    return np.abs(x - x.mean(-1, keepdims=True)).max(-1)\n",
}


def _fn(source):
    scope = {"np": np}
    exec(source, scope)
    return scope["f"]


def _launch(fn, x):
    graph, _ = trace(fn, (x,))
    g = PassManager().run(graph).graph
    kernels = [d for d in choose(g, "cupy", "balanced", supports)
               if d.choice in ("fused_kernel", "reduction_kernel")]
    assert len(kernels) == 1, g.text()
    node = g.node(kernels[0].node)
    assert node.op == "fused_rows"
    return generate(node, g).launch


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("cols", [2, 3, 4, 10, 16])
def test_short_rows_are_a_thread_each(name, cols):
    launch = _launch(_fn(PROGRAMS[name]), np.ones((1000, cols), np.float32))
    assert launch["mode"] == "column" and launch["threads_per_row"] == 1
    assert launch["rows_per_block"] == launch["block"] == 256


def test_longer_rows_keep_a_warp_each():
    launch = _launch(_fn(PROGRAMS["normalise"]), np.ones((1000, SHORT_ROW + 1), np.float32))
    assert launch["mode"] == "warp"
    graph, _ = trace(_fn(PROGRAMS["softmax"]), (np.ones((1000, SHORT_ROW + 1), np.float32),))
    ops = [n.op for n in PassManager().run(graph).graph if n.op not in ("input",)]
    assert ops == ["softmax"]  # a lone softmax keeps its own row kernel there


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_short_rows_give_numpys_answer(name, dtype):
    fn = _fn(PROGRAMS[name])
    rng = np.random.default_rng()
    x = rng.standard_normal((333, 5)).astype(dtype)
    x[3, 1], x[7, 0], x[9] = np.nan, np.inf, -0.0
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        got = np.asarray(pl.compile(fn)(x))
        exact = np.asarray(fn(x.astype(np.float64)))
    assert got.dtype == np.asarray(fn(x[:2])).dtype
    tol = {np.float16: 5e-3, np.float32: 2e-6, np.float64: 1e-12}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=tol, atol=tol,
                               equal_nan=True)


@needs_gxx
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("shape, dtype", [((301, 3), np.float32), ((257, 16), np.float32),
                                          ((70, 7), np.float16), ((33, 9), np.float64)])
def test_the_kernels_on_the_emulator_into_poisoned_outputs(name, shape, dtype, special):
    assert _check_program(PROGRAMS[name], [(shape, np.dtype(dtype))], special, 13) == 1


@needs_nvcc
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_the_kernels_compile_for_hopper(tmp_path, dtype):
    for source in PROGRAMS.values():
        graph, _ = trace(_fn(source), (np.ones((1000, 5), dtype),))
        g = PassManager().run(graph).graph
        (node,) = [g.node(d.node) for d in choose(g, "cupy", "balanced", supports)
                   if d.choice == "reduction_kernel"]
        compile_ptx(tmp_path, generate(node, g), cubin=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_on_the_gpu_short_rows_give_numpys_answer_in_one_kernel(name, dtype):
    cp = pytest.importorskip("cupy")
    fn = _fn(PROGRAMS[name])
    rng = np.random.default_rng()
    x = rng.standard_normal((100_003, 6)).astype(dtype)
    x[3, 1], x[7, 0] = np.nan, np.inf
    f = pl.compile(fn, backend="cupy")
    got = cp.asnumpy(f(cp.asarray(x))).astype(np.float64)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        exact = np.asarray(fn(x.astype(np.float64)))
    tol = {np.float16: 5e-3, np.float32: 2e-6}[dtype]
    np.testing.assert_allclose(got, exact, rtol=tol, atol=tol, equal_nan=True)
    assert len(f.explain(cp.asarray(x)).kernels) == 1
