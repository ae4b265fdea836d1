"""NumPy's helper functions compiled for CuPy arrays (``tests/compiler/test_numpy_helpers.py``
is the CPU side): diagonals and traces, ``np.rot90``, covariances and correlations (a
float64 matrix product between fused kernels), weighted means, ``np.select``,
``np.sinc``, ``np.fix``, ``np.angle``, ``np.cross``, ``np.add.accumulate``, ``np.isin``,
``np.digitize``, ``np.searchsorted``, ``np.interp``, ``np.nancumsum`` and masked updates
(``y[y > t] -= 1``) — against
NumPy on fresh random data with NaN, infinities and -0.0, into a poisoned memory pool.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.compiler.backend.support import compiled_result

cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

def _masked_update(x):
    y = x * 2
    y[y > 0.5] -= 1
    m = y < -1
    y[m] = np.sqrt(-y[m])
    return y


#: name -> (program, bit for bit)
PROGRAMS = {
    "masked_update": (_masked_update, True),
    "masked_mean": (lambda x: x[x > 0.5].mean() + x[x < 0].sum(), False),
    "diagonal": (lambda x: np.diagonal(x[:, :300]) * 2, True),
    "diagonal_offset": (lambda x: x[:, :300].diagonal(-3) + 1, True),
    "trace": (lambda x: np.trace(x[:, :300]), False),
    "diag_vector": (lambda x: np.diag(x[0, :50], 2) - 1, True),
    "rot90": (lambda x: np.rot90(x * 2, 3), True),
    "cov": (lambda x: np.cov(x[:16]), False),
    "corrcoef_columns": (lambda x: np.corrcoef(x[:, :24], rowvar=False), False),
    "average_weights": (lambda x: np.average(x, axis=1, weights=np.arange(1.0, 1025.0)),
                        False),
    "select": (lambda x: np.select([x < -1, x > 1], [x * 2, 3.5], default=x), True),
    "fix": (lambda x: np.fix(x * 3) - 1, True),
    "sinc": (lambda x: np.sinc(x), False),  # CUDA's sin and NumPy's differ by an ulp
    "angle": (lambda x: np.angle(x, deg=True), False),
    "cross": (lambda x: np.cross(x[:, :3], x[:, 3:6] * 2), True),
    "accumulate": (lambda x: np.add.accumulate(x, axis=1), False),
    "isin": (lambda x: np.isin(np.floor(x * 2), [0.0, 1.0, -3.0]), True),
    "digitize": (lambda x: np.digitize(x, [-1.0, 0.0, 0.5, 2.0], right=True), True),
    "searchsorted": (lambda x: np.searchsorted([-2.0, 0.0, 1.0, np.nan], x, side="right"),
                     True),
    "nancumsum": (lambda x: np.nancumsum(x, axis=1), False),
    "interp": (lambda x: np.interp(x, [-2.0, -1.0, 0.0, 1.0, 2.0], [4.0, 1.0, 0.0, 1.0, 4.0]),
               True),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_helpers_on_the_gpu_match_numpy(rng, name, dtype):
    fn, exact = PROGRAMS[name]
    x = (rng.standard_normal((333, 1024)) * 2).astype(dtype)
    if name not in ("cov", "corrcoef_columns", "average_weights", "trace", "accumulate",
                    "masked_mean"):
        x.reshape(-1)[rng.choice(x.size, 4, replace=False)] = [np.nan, np.inf, -0.0, 0.0]
    f, got = compiled_result(fn, x)
    with np.errstate(all="ignore"):
        want = np.asarray(fn(x))
    assert got.dtype == want.dtype and got.shape == want.shape
    if exact:
        np.testing.assert_array_equal(got, want)
    else:  # sums and matrix products add in another order on the GPU; libm's ulps
        tol = 1e-4 if dtype == np.float32 else 1e-10
        finite = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(got), finite)
        scale = np.abs(want[finite]).max() if finite.any() else 1.0
        np.testing.assert_allclose(got[finite], want[finite], rtol=tol, atol=tol * scale)
    assert not f.explain(cp.asarray(x)).graph_breaks
