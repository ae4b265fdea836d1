"""The math-library ops' generated kernels on a GPU, against NumPy.

Each op runs as a generated kernel (``fused_kernel``) on special values (NaN, both
infinities, both zeros, domain edges) and 100,003 random ones, into NaN-poisoned memory.
NaN positions, infinities and signed zeros must be NumPy's exactly; exact ops (rounding,
sign, predicates, copysign, fmax/fmin, fmod) bit for bit; the others within the error
CUDA documents for them plus NumPy's own (float32 2e-6 relative, float64 4e-15;
float16 and bfloat16: one ulp of the result). CPU-side, the
same kernels are checked with the CPU's libm in ``tests/compiler/test_math_ops.py``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pyc_lab.compiler.backend.executable import CupyExecutable
from tests.compiler.backend.support import run
from tests.compiler.graphs import op_graph
from tests.compiler.test_math_ops import BINARY, EXACT, SPECIAL, UNARY, _has_loop

pytestmark = pytest.mark.gpu

#: CUDA documents these functions within 1-4 ulp, NumPy's (libm's) within about 1: the
#: sum of both, with room for composed ones (logaddexp: exp then log1p).
TOL = {"float32": 2e-6, "float64": 4e-15, "float16": 1e-3, "bfloat16": 8e-3}


def _dtypes():
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), bf16,
            np.dtype(np.int32), np.dtype(np.int64)]


def _inputs(dtype, rng, n=100_003):
    if dtype.kind in "iu":
        return np.concatenate([[0, 1, -1, 2**20], rng.integers(-1000, 1000, n)]).astype(dtype)
    rand = rng.uniform(-8, 8, n) * 10.0 ** rng.integers(-4, 3, n)
    with np.errstate(over="ignore"):
        return np.concatenate([SPECIAL, rand]).astype(dtype)


def _check(got, want, exact, skip_zero_sign=None, scale=None):
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(w)), "NaN positions differ"
    inf = np.isinf(w)
    np.testing.assert_array_equal(g[inf], w[inf])
    zero = (w == 0) if skip_zero_sign is None else (w == 0) & ~skip_zero_sign
    assert np.array_equal(np.signbit(g[zero]), np.signbit(w[zero])), "signed zeros differ"
    fin = np.isfinite(w)
    if exact:
        np.testing.assert_array_equal(g[fin], w[fin])
    else:
        # below the smallest normal number an ulp is absolute: both libraries' results
        # may differ there by one
        tiny = np.finfo(np.float32 if got.dtype.itemsize <= 4 else np.float64).tiny
        if scale is None:
            np.testing.assert_allclose(g[fin], w[fin], rtol=TOL[got.dtype.name], atol=tiny)
        else:  # an error relative to the operands' size (a sum that cancels)
            bound = TOL[got.dtype.name] * np.maximum(np.abs(w), scale)[fin] + tiny
            err = np.abs(g[fin] - w[fin])
            assert (err <= bound).all(), (err / bound).max()


@pytest.mark.parametrize("op", UNARY)
def test_unary_math_kernels_on_the_gpu(rng, op):
    for dtype in _dtypes():
        if not _has_loop(op, dtype):
            continue
        x = _inputs(dtype, rng)
        g, node = op_graph(op, [((x.size,), dtype)])
        exe = CupyExecutable(g, {node.id: "fused_kernel"})
        (got,) = run(exe, [x])
        with np.errstate(all="ignore"):
            want = getattr(np, op)(x)
        _check(got, want, op in EXACT)


@pytest.mark.parametrize("op", BINARY)
def test_binary_math_kernels_on_the_gpu(rng, op):
    for dtype in _dtypes():
        if not _has_loop(op, dtype, dtype) or (op == "fmod" and dtype.kind in "iu"):
            continue
        v = _inputs(dtype, rng, n=300)
        a, b = (np.array(p, dtype=dtype) for p in zip(*itertools.product(v, v), strict=True))
        g, node = op_graph(op, [((a.size,), dtype), ((b.size,), dtype)])
        exe = CupyExecutable(g, {node.id: "fused_kernel"})
        (got,) = run(exe, [a, b])
        with np.errstate(all="ignore"):
            want = getattr(np, op)(a, b)
        # logaddexp is x + log1p(exp(y - x)): when that sum cancels (x < 0, small
        # result) both libraries' error is a few ulp of |x|, not of the result
        size = [np.where(np.isfinite(o), np.abs(o.astype(np.float64)), 0.0) for o in (a, b)]
        scale = np.maximum(*size) if op == "logaddexp" else None
        _check(got, want, op in EXACT,
               skip_zero_sign=(a == b) if op in ("fmax", "fmin") else None, scale=scale)
