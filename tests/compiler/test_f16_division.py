"""float16 division in the generated kernels (``pyc_div_f16``, ``native/f16.cuh``) gives
NumPy's float16 quotient bit for bit.

The kernel divides with an approximate reciprocal and one Markstein correction instead
of IEEE float32 division. The claim is that, rounded to float16, it is NumPy's answer
for every pair of float16 operands, specials included. The CPU emulator runs the
generated kernel with the reciprocal rounded correctly and moved one float32 ulp down or
up (the hardware's documented error is within one ulp), on every float16 dividend
against hundreds of divisors: ties, subnormals, zeros of both signs, infinities, NaN and
random bit patterns. NaN is compared as NaN (its payload is not NumPy's contract); every
other result, -0.0 included, by its bits. The GPU runs the same pairs in
tests/compiler/backend/test_cupy_backend_gpu.py. Skipped, with the reason, without g++.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.compiler.codegen import generate
from pyc_lab.compiler.codegen.cuda_types import divide
from tests.compiler.emulate import emulate, needs_gxx
from tests.compiler.graphs import fused_graph

F16 = np.float16

#: Divisors with something to say: signed zeros and infinities, NaN, the smallest and
#: largest subnormals and normals, powers of two, 1 +- an ulp, values whose reciprocal
#: is inexact, the largest finite value.
SPECIAL_DIVISORS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 2**-24, -(2**-24), 2**-14 - 2**-24, 2**-14,
     1.0, -1.0, 2.0, 0.5, 1 + 2**-10, 1 - 2**-11, 3.0, -3.0, 7.0, 0.1, 0.3, 10.0, 65504.0,
     -65504.0, 1.5, 1.75, 1.875, 3e-5, 6.1e-5, 2047.0, 2049.0, 4095.0],
    dtype=F16)


def _divisors(rng: np.random.Generator) -> np.ndarray:
    random_bits = rng.integers(0, 1 << 16, 200, dtype=np.uint32).astype(np.uint16)
    return np.concatenate([SPECIAL_DIVISORS, random_bits.view(F16)])


def _all_dividends() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(F16)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bad = np.flatnonzero(got.view(np.uint16)[~nan] != want.view(np.uint16)[~nan])
    assert bad.size == 0, (f"{bad.size} quotients differ, first: "
                           f"{got[~nan][bad[:5]]} against NumPy's {want[~nan][bad[:5]]}")


def test_divide_expression_by_dtype():
    assert divide("a", "b", F16) == "pyc_div_f16(a, b)"
    assert divide("a", "b", np.float32) == "(a / b)"
    assert divide("a", "b", np.float64) == "(a / b)"


@needs_gxx
@pytest.mark.parametrize("toward", [None, "0.0f", "INFINITY"])
def test_float16_division_is_numpy_bit_for_bit(toward):
    divisors = _divisors(np.random.default_rng())
    x = np.tile(_all_dividends(), divisors.size)
    y = np.repeat(divisors, 1 << 16)
    g, node = fused_graph(lambda p, q: p / q, [(x.shape, F16), (y.shape, F16)])
    src = generate(node, g)
    assert "pyc_div_f16" in src.source
    out = np.full(x.shape, np.nan, F16)  # poisoned
    defines = f"#define PYC_RCP_TOWARD {toward}\n" if toward else ""
    emulate(src, src.name, [x, y, out], grid=1, block=1, defines=defines)
    with np.errstate(all="ignore"):
        want = x / y
    _same(out, want)
