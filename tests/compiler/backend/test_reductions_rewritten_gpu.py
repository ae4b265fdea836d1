"""Reductions the passes rewrite into generated kernels, on the GPU: ``np.any``/``np.all``
as the maximum/minimum of booleans, ``np.var``/``np.std`` with ``ddof=`` as row
programs, a reduction with ``dtype=`` (``np.einsum("ij,ij->i", a, b)``) as a row kernel,
a phase wrap with ``%`` as one elementwise kernel, and integer ``//``, ``%``, ``<<`` and
``>>`` with NumPy's rules, full maxima and minima (two stages past one block's reach),
``np.nanvar``/``np.nanstd`` — compiled for CuPy arrays, against NumPy on fresh random
data with NaN, into a poisoned memory pool. The CPU side:
``tests/compiler/test_fuzz_emulated.py``, ``test_row_fusion.py``,
``test_reduction_dtype.py`` and ``test_emulated_kernels.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from tests.compiler.backend.support import compiled_result, poison_pool

cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

PROGRAMS = {
    "any_rows": lambda x: np.any(x > 1.5, axis=1),
    "all_cols": lambda x: np.all(np.isfinite(x), axis=0),
    "any_nan": lambda x: np.isnan(x).any(),
    "max_all": lambda x: (x * 2).max(),
    "nanstd_rows": lambda x: np.nanstd(x, axis=-1),
    "nanvar_cols_ddof": lambda x: np.nanvar(x, axis=0, ddof=1),
    "min_abs_keepdims": lambda x: np.abs(x).min(keepdims=True),
    "std_ddof_cols": lambda x: x.std(axis=0, ddof=1),
    "var_ddof_rows": lambda x: x.var(axis=-1, ddof=1),
    "row_dot": lambda x: np.einsum("ij,ij->i", x, x),
    "sum_f64": lambda x: x.sum(axis=1, dtype=np.float64),
    "phase_wrap": lambda x: (x * 3 + np.pi) % (2 * np.pi) - np.pi,
    "floor_div": lambda x: x // 0.25,
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(1000, 37), (33, 4097)])
def test_rewritten_reductions_on_the_gpu_match_numpy(rng, name, dtype, shape):
    fn = PROGRAMS[name]
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    x.reshape(-1)[rng.choice(x.size, 5, replace=False)] = np.nan
    f, got = compiled_result(fn, x)
    with np.errstate(all="ignore"):
        want = np.asarray(fn(x))
        if dtype == np.float16 and name.startswith("nan"):
            # NumPy's np.nanvar sums float16 in float16 (1.4 % off the exact answer over
            # 1000 values down a column); the GPU sums in float32: compare both with the
            # exact answer instead
            want = np.asarray(fn(x.astype(np.float64))).astype(np.float16)
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.kind == "b" or name in ("phase_wrap", "floor_div"):  # bit for bit
        np.testing.assert_array_equal(got, want)
    else:
        tol = {"float16": 1e-2, "float32": 1e-4, "float64": 1e-10}[np.dtype(dtype).name]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)
    kinds = [k["impl"] for k in f.explain(cp.asarray(x)).kernels]
    if not (dtype == np.float16 and "ddof" in name):  # a float16 np.var keeps CuPy's
        assert "cupy" not in kinds, kinds


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_division_remainder_and_shifts_on_the_gpu_are_numpys(rng, dtype):
    """Generated with NumPy's own rules (zero divisors, the smallest value over -1,
    shifts past the bit width): the same integers as NumPy."""
    info = np.iinfo(dtype)
    a = np.concatenate([rng.integers(-1000, 1000, 5000),
                        [info.min, info.max, 0, -1, 7]]).astype(dtype)
    b = np.concatenate([rng.integers(-70, 70, 5000), [-1, 0, 0, 3, info.bits]]).astype(dtype)

    def program(x, y):
        return x // y, x % y, x << (y % info.bits), x >> y

    f = pl.compile(program, backend="cupy")
    poison_pool()
    got = [cp.asnumpy(g) for g in f(cp.asarray(a), cp.asarray(b))]
    with np.errstate(all="ignore"):
        want = program(a, b)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    kinds = [k["impl"] for k in f.explain(cp.asarray(a), cp.asarray(b)).kernels]
    assert "cupy" not in kinds, kinds
