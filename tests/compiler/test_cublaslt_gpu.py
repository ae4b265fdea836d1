"""cuBLASLt GEMMs with fused epilogues (nvmath-python) on a GPU, against float64 NumPy.

Covers :class:`pyc_lab.kernels.cublaslt.FusedGemm` directly (every epilogue, both
dtypes, transposed views, re-bound operands, misaligned pointers, autotuning) and the
compiler's ``cublaslt`` implementation inside compiled functions and CUDA graphs.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.functions import gelu

cp = pytest.importorskip("cupy")
pytest.importorskip("nvmath")

pytestmark = pytest.mark.gpu

TOL = {"float16": (2e-2, 2e-2), "float32": (1e-4, 1e-5)}


def gelu64(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def reference(a, b, bias, act):
    y = a.astype(np.float64) @ b.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)
    if act == "relu":
        y = np.maximum(y, 0.0)
    elif act == "gelu":
        y = gelu64(y)
    return y


def check(got, want, dtype):
    rtol, atol = TOL[np.dtype(dtype).name]
    got = cp.asnumpy(got)
    assert got.dtype == np.dtype(dtype)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


@pytest.fixture
def rng():
    return np.random.default_rng()


def uniform(rng, shape, dtype):
    return rng.uniform(-1.0, 1.0, shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("has_bias, act", [(True, None), (True, "relu"), (True, "gelu"),
                                           (False, "relu"), (False, "gelu")])
def test_fused_gemm_every_epilogue(rng, dtype, has_bias, act):
    from pyc_lab.kernels.cublaslt import FusedGemm

    m, k, n = 96, 64, 80
    a, b = uniform(rng, (m, k), dtype), uniform(rng, (k, n), dtype)
    bias = uniform(rng, (n,), dtype) if has_bias else None
    out = cp.full((m, n), cp.nan, dtype=dtype)  # poisoned: every element must be written
    gemm = FusedGemm(act, has_bias=has_bias)
    gemm(cp.asarray(a), cp.asarray(b), out, cp.asarray(bias) if has_bias else None)
    check(out, reference(a, b, bias, act), dtype)


@pytest.mark.parametrize("ta, tb", [(True, False), (False, True), (True, True)])
def test_fused_gemm_takes_transposed_views(rng, ta, tb):
    from pyc_lab.kernels.cublaslt import FusedGemm

    m, k, n = 64, 48, 40
    a = uniform(rng, (k, m) if ta else (m, k), np.float32)
    b = uniform(rng, (n, k) if tb else (k, n), np.float32)
    bias = uniform(rng, (n,), np.float32)
    ga, gb = cp.asarray(a), cp.asarray(b)
    out = cp.full((m, n), cp.nan, dtype=np.float32)
    FusedGemm("gelu")(ga.T if ta else ga, gb.T if tb else gb, out, cp.asarray(bias))
    check(out, reference(a.T if ta else a, b.T if tb else b, bias, "gelu"), np.float32)


def test_fused_gemm_rebinds_new_operands_and_misaligned_ones(rng):
    from pyc_lab.kernels.cublaslt import FusedGemm

    m, k, n = 128, 64, 96
    gemm = FusedGemm("relu")
    b = cp.asarray(uniform(rng, (k, n), np.float16))
    bias = cp.asarray(uniform(rng, (n,), np.float16))
    for _ in range(3):  # new a every call: operands re-bound, same plan
        a = uniform(rng, (m, k), np.float16)
        out = cp.full((m, n), cp.nan, dtype=np.float16)
        gemm(cp.asarray(a), b, out, bias)
        check(out, reference(a, cp.asnumpy(b), cp.asnumpy(bias), "relu"), np.float16)
    assert len(gemm._plans) == 1
    # a misaligned (2 bytes past 16) operand gets a plan of its own and the right answer
    a = uniform(rng, (m, k), np.float16)
    base = cp.empty(m * k + 1, dtype=np.float16)
    ga = base[1:].reshape(m, k)
    ga[...] = cp.asarray(a)
    assert ga.data.ptr % 16 != 0
    out = cp.full((m, n), cp.nan, dtype=np.float16)
    gemm(ga, b, out, bias)
    check(out, reference(a, cp.asnumpy(b), cp.asnumpy(bias), "relu"), np.float16)
    assert len(gemm._plans) == 2
    gemm.free()


def test_fused_gemm_autotune_measures_and_stays_correct(rng):
    from pyc_lab.kernels.cublaslt import FusedGemm

    a, b = uniform(rng, (256, 128), np.float16), uniform(rng, (128, 192), np.float16)
    bias = uniform(rng, (192,), np.float16)
    gemm = FusedGemm("gelu", autotune=True)
    out = cp.full((256, 192), cp.nan, dtype=np.float16)
    gemm(cp.asarray(a), cp.asarray(b), out, cp.asarray(bias))
    assert gemm.autotune_s > 0
    check(out, reference(a, b, bias, "gelu"), np.float16)


def mlp(x, w1, b1, w2, b2):
    return gelu(x @ w1 + b1) @ w2 + b2


@pytest.mark.parametrize("mode", ["balanced", "memory_first", "utilization_first"])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_compiled_mlp_runs_cublaslt_epilogues(rng, mode, cuda_graph):
    m, d, h = 64, 96, 128
    args = [uniform(rng, s, np.float16) for s in [(m, d), (d, h), (h,), (h, d), (d,)]]
    f = pl.compile(mlp, backend="cupy", mode=mode, cuda_graph=cuda_graph)
    ex = f.explain(*[cp.asarray(a) for a in args])
    chosen = ex.decisions.set_index("node")["choice"]
    assert list(chosen[chosen.str.startswith("cublas")]) == ["cublaslt", "cublaslt"]
    implementations = {k["implementation"] for k in ex.kernels if k["ops"][0] == "matmul"}
    if cuda_graph:  # outputs this small join the CUDA graph: cuBLAS + generated epilogue
        assert len(implementations) == 2  # (each names its own small GEMM candidate)
        for text in implementations:
            assert text.startswith("library GEMM (pl.matmul's path: cuBLAS, or cuBLASLt "
                                   "where it is faster) + generated epilogue; or the "
                                   "generated small GEMM"), text
            assert text.endswith("recorded into the CUDA graph (cuBLASLt's fused epilogue "
                                 "would be a library call between graphs)"), text
    else:
        assert implementations == {"cuBLASLt (nvmath-python), epilogue GELU_BIAS",
                                   "cuBLASLt (nvmath-python), epilogue BIAS"}
    for _ in range(3):  # the first, the capture (with cuda_graph) and a replay
        xs = [uniform(rng, (m, d), np.float16), *args[1:]]
        hidden = reference(*xs[:3], "gelu").astype(np.float16)
        want = reference(hidden, xs[3], xs[4], None)
        got = cp.asnumpy(f(*[cp.asarray(a) for a in xs]))
        assert got.dtype == np.float16 and np.isfinite(got).all()
        # the hidden layer is rounded to float16 on both sides, from GELUs computed in
        # float32 here and float64 there: each hidden value may differ by one float16
        # ulp (2**-10 relative), weighted by |w2|, plus the output's own rounding
        scale = np.abs(hidden.astype(np.float64)) @ np.abs(xs[3].astype(np.float64))
        bound = 2.0**-10 * (scale + np.abs(want)) + 1e-3
        assert np.all(np.abs(got.astype(np.float64) - want) <= bound)


def relu_mlp(x, w1, b1, w2, b2):
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def test_compiled_bfloat16_mlp_runs_cublaslt_epilogues(rng):
    """A bfloat16 ReLU MLP written with np.maximum(..., 0): both GEMMs take their bias
    (and the ReLU) inside cuBLASLt, as in float16; float64's answer within bfloat16's
    roundings (8 bits), by the error's norm."""
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    m, d, h = 64, 96, 128
    args = [uniform(rng, s, np.float32).astype(bf16)
            for s in [(m, d), (d, h), (h,), (h, d), (d,)]]
    f = pl.compile(relu_mlp, backend="cupy", cuda_graph=False)  # (graphs: cuBLAS + epilogue)
    dev = [cp.asarray(a) for a in args]
    ex = f.explain(*dev)
    implementations = {k["implementation"] for k in ex.kernels if k["ops"][0] == "matmul"}
    assert implementations == {"cuBLASLt (nvmath-python), epilogue RELU_BIAS",
                               "cuBLASLt (nvmath-python), epilogue BIAS"}
    want = relu_mlp(*[a.astype(np.float64) for a in args])
    for _ in range(3):
        got = cp.asnumpy(f(*dev))
        assert got.dtype == bf16
        err = got.astype(np.float64) - want
        assert np.isfinite(err).all() and np.linalg.norm(err) < 2e-2 * np.linalg.norm(want)


def test_silu_epilogue_stays_with_the_generated_kernel(rng):
    def fn(x, w, b):
        return pl.compiler.functions.silu(x @ w + b)

    args = [uniform(rng, s, np.float32) for s in [(32, 16), (16, 24), (24,)]]
    f = pl.compile(fn, backend="cupy")
    ex = f.explain(*[cp.asarray(a) for a in args])
    row = ex.decisions[ex.decisions.choice.str.startswith("cublas")].iloc[0]
    assert row.choice == "cublas" and "cuBLASLt has no silu epilogue" in row.detail
    y = args[0].astype(np.float64) @ args[1] + args[2]
    check(f(*[cp.asarray(a) for a in args]), y / (1 + np.exp(-y)), np.float32)
