"""The small GEMM on a GPU: the generated kernel (forced on, and forced off) against NumPy
eagerly and replayed from CUDA graphs, the first call's race, and ``pl.compile`` of a
linear layer at small batch.

Every test is marked ``gpu`` (skipped, with the reason, where no CUDA device is usable).
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.backend.executable import CupyExecutable
from tests.compiler.backend.support import auto_impl, cp, poison_pool
from tests.compiler.test_small_gemm import (
    BATCHED,
    TOL,
    _batched_graph,
    _epilogue,
    _graph,
    _reference,
    _values,
)

pytestmark = pytest.mark.gpu

F16, F32, F64 = np.float16, np.float32, np.float64

CASES = [  # (m, n, k, dtype, bias dtype or None, activation, w stored as N x K)
    (1, 256, 400, F32, F32, "relu", True),
    (4, 37, 33, F32, F32, "gelu", True),
    (13, 64, 96, F32, None, None, False),
    (64, 40, 128, F32, F32, "sigmoid", True),
    (1000, 128, 6, F32, F32, "relu", True),
    (4096, 32, 64, F32, F32, None, False),
    (300, 70, 33, F16, F16, "gelu", True),
    (3, 24, 1, F32, F32, "tanh", True),
    (7, 48, 64, F64, F64, "silu", False),
    (5, 72, 80, F16, F16, "relu", True),
    (2, 33, 16, F16, F32, None, False),
]


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("force", [True, False], ids=["small", "library"])
@pytest.mark.parametrize(("m", "n", "k", "dtype", "bias_dtype", "act", "transpose_b"), CASES)
def test_both_paths_match_numpy(rng, m, n, k, dtype, bias_dtype, act, transpose_b, force,
                                cuda_graph):
    bias_spec = ((n,), bias_dtype) if bias_dtype is not None else None
    g, node = _graph(m, n, k, dtype, bias=bias_spec, act=act, transpose_b=transpose_b)
    exe = CupyExecutable(g, auto_impl(g), cuda_graph=cuda_graph)
    exe._prepare()
    (step,) = exe._steps
    assert step.small is not None and step.small.kernels
    step.small.use = force
    # forced on: the form the race would time first for this layout
    step.small.choice = step.small.src.entries[0 if transpose_b or m > 64 else -2] \
        if force else None
    for call in range(4):  # the second call captures; later ones replay
        x = _values(rng, (m, k), dtype, special=call % 2 == 1)
        w = _values(rng, (n, k) if transpose_b else (k, n), dtype)
        args = [x, w] + ([_values(rng, (n,), bias_dtype)] if bias_dtype is not None else [])
        poison_pool()
        (got,) = exe([cp.asarray(a) for a in args])
        want = _reference(x, w.T if transpose_b else w, args[2] if len(args) == 3 else None,
                          act, node.dtype, dtype)
        rtol, atol = TOL[np.dtype(dtype).name]
        got = cp.asnumpy(got)
        assert got.dtype == node.dtype
        np.testing.assert_allclose(got.astype(F64), want.astype(F64), rtol=rtol, atol=atol,
                                   equal_nan=True)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        if force:
            assert step.last_entry == step.small.choice, step.last_entry
    if cuda_graph:
        assert exe.graph_captured, exe.graph_capture_error


def test_first_call_races_and_keeps_one_path(rng):
    g, _ = _graph(2, 256, 256, F32, bias=((256,), F32), act="relu")
    exe = CupyExecutable(g, auto_impl(g), cuda_graph=True)
    x, w, b = (_values(rng, s, F32) for s in ((2, 256), (256, 256), (256,)))
    for _ in range(3):
        (got,) = exe([cp.asarray(a) for a in (x, w, b)])
    (step,) = exe._steps
    small = step.small
    assert small.use in (True, False)
    assert set(small.measured) == {"library_ms", *small.src.entries} - {
        f"{small.src.name}_n"}  # w.T: the row-major weight's form does not take it
    assert all(np.isfinite(t) for t in small.measured.values())
    best = min(t for e, t in small.measured.items() if e != "library_ms")
    assert small.use == (best <= small.measured["library_ms"] * 0.98)
    assert small.choice == (min((t, e) for e, t in small.measured.items()
                                if e != "library_ms")[1] if small.use else None)
    assert ("small GEMM ran" if small.use else "small GEMM not used") in step.describe["notes"]
    np.testing.assert_allclose(cp.asnumpy(got), _reference(x, w.T, b, "relu", F32, F32),
                               rtol=1e-5, atol=1e-5)


def test_compiled_linear_layer_at_small_batch(rng):
    @pl.compile(backend="cupy")
    def layer(x, w, b):
        return np.maximum(x @ w.T + b, 0)

    for m, k in ((1, 96), (5, 96), (64, 96), (3000, 96), (4096, 1024)):  # the last too big
        x, w, b = _values(rng, (m, k), F32), _values(rng, (48, k), F32), \
            _values(rng, (48,), F32)
        got = cp.asnumpy(layer(*(cp.asarray(a) for a in (x, w, b))))
        np.testing.assert_allclose(got, _reference(x, w.T, b, "relu", F32, F32), rtol=1e-5,
                                   atol=1e-6 * k)  # float32 sums of k terms of up to 4
        kernels = layer.explain(*(cp.asarray(a) for a in (x, w, b))).kernels
        offered = [k for k in kernels if "small GEMM" in k.get("implementation", "")]
        assert bool(offered) == (k < 1024), kernels


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("force", [True, False], ids=["small", "library"])
@pytest.mark.parametrize(("a_shape", "b_shape", "transpose_b", "with_bias", "act", "batch"),
                         BATCHED)
def test_stacks_and_batches_match_numpy(rng, a_shape, b_shape, transpose_b, with_bias, act,
                                        batch, force, cuda_graph):
    n = b_shape[-2] if transpose_b else b_shape[-1]
    g, _ = _batched_graph(a_shape, b_shape, F32, transpose_b=transpose_b,
                          bias_n=n if with_bias else None, act=act)
    exe = CupyExecutable(g, auto_impl(g), cuda_graph=cuda_graph)
    exe._prepare()
    (step,) = exe._steps
    assert step.small is not None and step.small.src.launch["batch"] == batch
    step.small.use = force
    step.small.choice = step.small.src.entries[-1] if force else None  # the tiled form
    for call in range(3):
        args = [_values(rng, a_shape, F32, special=call == 1), _values(rng, b_shape, F32)]
        if with_bias:
            args.append(_values(rng, (1, n), F32))
        poison_pool()
        (got,) = exe([cp.asarray(a) for a in args])
        w = args[1].swapaxes(-1, -2) if transpose_b else args[1]
        with np.errstate(all="ignore"):
            p = np.matmul(args[0].astype(F64), w.astype(F64)).astype(F32).astype(F64)
        want = _epilogue(p, args[2] if with_bias else None, act).astype(F32)
        got = cp.asnumpy(got)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        if force:
            assert step.last_entry == step.small.choice
