"""Shared by the CuPy backend's GPU tests: random inputs, poisoned memory, references.

Inputs are fresh random values on every run (never zeros); output memory is poisoned
with NaN (0xFF bytes) before calls wherever the test controls allocation, so a kernel
that skips an element cannot pass by accident.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.compiler import Graph
from pyc_lab.compiler.codegen import supports
from pyc_lab.compiler.ops import run_graph
from pyc_lab.compiler.tracer import trace

cp = pytest.importorskip("cupy")

F16, F32, F64 = np.float16, np.float32, np.float64
I32, I64, BOOL = np.int32, np.int64, np.bool_

TOL = {  # (rtol, atol) against a float64 reference, by result dtype
    "float16": (1e-2, 1e-2),
    "float32": (5e-5, 5e-6),
    "float64": (1e-11, 1e-12),
}
TIGHT = {  # against NumPy in the same dtype (same roundings, different libm)
    "float16": (2e-3, 5e-3),
    "float32": (1e-5, 3e-6),
    "float64": (1e-12, 1e-13),
}


def rand(rng, shape, dtype, low=0.1, high=3.0, signed=True):
    """Random values of ``dtype``, never zero (bool: random True/False)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        mag = rng.integers(1, 50, size=shape)
        sign = rng.choice([-1, 1], size=shape) if signed else 1
        return np.asarray(mag * sign, dtype=dtype)
    mag = rng.uniform(low, high, size=shape)
    sign = rng.choice([-1.0, 1.0], size=shape) if signed else 1.0
    return np.asarray(mag * sign, dtype=dtype)


def poison_pool(nbytes=256 << 20):
    """Fill a large pool block with 0xFF (NaN) and free it: fresh allocations reuse it."""
    block = cp.empty(nbytes, dtype=cp.uint8)
    block.fill(255)
    del block


def compiled_result(fn, x):
    """``pl.compile(fn, backend="cupy")`` and its result for ``x`` moved to the GPU,
    computed into a poisoned pool and brought back as a NumPy array."""
    import pyc_lab as pl

    f = pl.compile(fn, backend="cupy")
    poison_pool()
    got = f(cp.asarray(x))
    return f, cp.asnumpy(got) if isinstance(got, cp.ndarray) else np.asarray(got)


def poison_buffers(exe):
    exe._prepare()
    for b in exe._buffers:
        b.fill(255)


def auto_impl(graph):
    """The policy's choice, here by hand: generated where supported, else CuPy."""
    impl = {}
    for n in graph:
        if n.op in ("input", "constant"):
            impl[n.id] = "source"
        elif n.op == "matmul":
            impl[n.id] = "cublas"
        elif n.op == "eager":
            impl[n.id] = "eager"
        elif supports(n, graph)[0] and n.op not in ("reshape", "transpose", "slice"):
            impl[n.id] = "fused_kernel" if n.op == "fused" else "reduction_kernel"
        else:
            impl[n.id] = "cupy"
    return impl


def run(exe, arrays):
    poison_pool()
    outs = exe([cp.asarray(a) for a in arrays])
    return [cp.asnumpy(o) for o in outs]


def numpy_ref(graph, arrays):
    with np.errstate(all="ignore"):
        return run_graph(graph, [np.asarray(a) for a in arrays], np)


def f64(arrays):
    return [a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]


def assert_close(got, want, dtype, table=TOL):
    dtype = np.dtype(dtype)
    assert got.dtype == dtype, (got.dtype, dtype)
    assert got.shape == np.shape(want)
    if dtype.kind == "f":
        rtol, atol = table[dtype.name]
        np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64),
                                   rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, np.asarray(want).astype(dtype))


def mix(x, y):
    return np.tanh(x * 2.0 + y) - np.maximum(x, y) / (1 + np.exp(-y))


def block_graph(m=64, k=96, n=128):
    """gelu(x @ w + b) * 2 + x2, tanh - 0.5 (fused), softmax, layer_norm(gamma),
    transpose, square (fused), reshape, sum."""
    g = Graph(name="block")
    x = g.add("input", shape=(m, k), dtype=F32, name="x")
    w = g.add("input", shape=(k, n), dtype=F32, name="w")
    b = g.add("input", shape=(n,), dtype=F32, name="b")
    x2 = g.add("input", shape=(m, n), dtype=F32, name="x2")
    gamma = g.add("input", shape=(n,), dtype=F32, name="gamma")
    mm = g.add("matmul", [x.id, w.id, b.id], {"activation": "gelu"})
    body, _ = trace(lambda h, y: h * 2.0 + y, [np.zeros((m, n), F32)] * 2)
    f1 = g.add("fused", [mm.id, x2.id], {"body": body, "ops": ("multiply", "add"),
                                         "name": "fused_1"})
    body2, _ = trace(lambda h: np.tanh(h) - 0.5, [np.zeros((m, n), F32)])
    f2 = g.add("fused", [f1.id], {"body": body2, "ops": ("tanh", "subtract"),
                                  "name": "fused_2"})
    sm = g.add("softmax", [f2.id], {"axis": -1})
    ln = g.add("layer_norm", [sm.id, gamma.id], {"eps": 1e-5})
    tr = g.add("transpose", [ln.id], {"axes": (1, 0)})
    body3, _ = trace(lambda t: t * t, [np.zeros((n, m), F32)])
    f3 = g.add("fused", [tr.id], {"body": body3, "ops": ("multiply",), "name": "fused_3"})
    rs = g.add("reshape", [f3.id], {"shape": (n * m // 8, 8)})
    s = g.add("sum", [rs.id], {"axis": (1,), "keepdims": False})
    g.outputs = [s.id, ln.id, f2.id]
    g.verify()
    return g


def block_inputs(rng, g):
    return [rand(rng, g.node(i).shape, g.node(i).dtype, high=1.0) for i in g.inputs]


def check_block(g, got, arrays):
    """Against NumPy (float64 inputs; run_graph keeps every node's float32 dtype)."""
    want = run_graph(g, f64(arrays), np)
    for out, ref, oid in zip(got, want, g.outputs, strict=True):
        assert_close(out, ref, g.node(oid).dtype, {"float32": (2e-4, 2e-5)})
