"""``pyc_div_by`` (native/reduce.cuh): the row kernels' division by a row-wide value.

Softmax divides by the row's sum and layer norm by its deviation: one reciprocal per row
and a Markstein correction per element instead of an IEEE division. The helper claims
the correctly rounded quotient, so it is checked bit for bit against NumPy's float32
division, on the CPU (g++, the emulator's prelude), over random bit patterns, the ranges
the row kernels divide in, and every special value.
"""

from __future__ import annotations

import ctypes

import numpy as np

from pyc_lab.compiler.codegen import cuda_types as ct
from pyc_lab.compiler.codegen.cuda_types import KernelSource
from tests.compiler.emulate import emulate_threads, needs_gxx

_KERNEL = r"""
extern "C" __global__ void
divide_rows(const float* a, const float* b, float* y, long long n) {
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        y[i] = pyc_div_by(a[i], b[i], pyc_row_reciprocal(b[i]));
    }
}
"""


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    src = KernelSource("divide_rows", "rows", ct.helper("reduce") + _KERNEL, ("divide",), "")
    y = np.full(a.shape, np.nan, dtype=np.float32)  # poisoned
    emulate_threads(src, "divide_rows", [a, b, y, ctypes.c_longlong(a.size)], (1, 1), 32)
    return y


def _random_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    return bits.view(np.float32)


@needs_gxx
def test_row_division_is_ieee_division_bit_for_bit():
    rng = np.random.default_rng()
    n = 400_000
    a = _random_floats(rng, n)
    b = _random_floats(rng, n)
    # the ranges the kernels divide in: softmax (exp in [0, 1] by a sum >= 1) and layer
    # norm (deviations by a standard deviation), and near every threshold of the helper
    a[:50_000] = rng.random(50_000, dtype=np.float32)
    b[:50_000] = rng.uniform(1, 70_000, 50_000).astype(np.float32)
    a[50_000:100_000] = rng.standard_normal(50_000).astype(np.float32) * 60
    b[50_000:100_000] = rng.uniform(3e-3, 300, 50_000).astype(np.float32)
    edges = np.float32([2.0**-100, 2.0**-126, 1e-37, 1e37, 3e38, 2.0**-149])
    m = 100_000
    for e in edges:
        k = 10_000
        near = (e * rng.uniform(0.5, 2.0, k)).astype(np.float32)
        a[m:m + k], b[m:m + k] = near, rng.uniform(0.25, 4, k).astype(np.float32)
        m += k
        a[m:m + k], b[m:m + k] = rng.uniform(0.25, 4, k).astype(np.float32), near
        m += k
    specials = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0**-149,
                           np.finfo(np.float32).max, np.finfo(np.float32).tiny])
    sa, sb = np.meshgrid(specials, specials)
    a[m:m + sa.size], b[m:m + sb.size] = sa.ravel(), sb.ravel()
    got = _divide(a, b)
    with np.errstate(all="ignore"):
        want = a / b
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@needs_gxx
def test_a_broken_correction_is_caught():
    rng = np.random.default_rng()
    # the check above can fail: a * (1 / b) alone differs from a / b on random inputs
    a = rng.random(100_000, dtype=np.float32) + 0.5
    b = rng.random(100_000, dtype=np.float32) + 0.5
    approx = a * (np.float32(1) / b)
    assert (approx.view(np.uint32) != (a / b).view(np.uint32)).any()
    assert (_divide(a, b).view(np.uint32) == (a / b).view(np.uint32)).all()
