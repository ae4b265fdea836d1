"""Row programs writing their statistics too, on the GPU: a layer norm returning its mean
and inverse deviation, a softmax and its log-sum-exp, a training batch norm and its batch
statistics, compiled for CuPy arrays, run as one generated kernel (the statistics its
extra outputs) and matching float64 NumPy on fresh random data with NaN and infinities,
in float32, float16 and float64, from fresh memory poisoned with NaN. The CPU side:
``tests/compiler/test_row_outputs.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from tests.compiler.backend.support import poison_pool
from tests.compiler.test_row_outputs import PROGRAMS, _data

cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

_TOL = {np.float32: 2e-5, np.float16: 1e-2, np.float64: 1e-11}
_SIZES = {"layer_norm_stats": (8193, 1000), "softmax_lse": (4096, 1024),
          "rms_norm_ms": (100, 4097), "batch_norm_train": (32, 64, 14, 14),
          "channel_stats": (16, 96, 28, 28), "statistics_only": (3000, 77)}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("small", [True, False])
def test_programs_returning_statistics_on_the_gpu_match_numpy(name, dtype, small):
    fn, shape, extras = PROGRAMS[name]
    rng = np.random.default_rng()
    x = _data(rng, shape if small else _SIZES[name], dtype)
    f = pl.compile(fn, backend="cupy")
    dx = cp.asarray(x)
    poison_pool()
    got = [cp.asnumpy(g) for g in f(dx)]
    with np.errstate(all="ignore"):
        want = [np.asarray(w) for w in fn(x.astype(np.float64))]
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == np.dtype(dtype)
        assert np.array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=_TOL[dtype], atol=_TOL[dtype])
    kernels = f.explain(dx).kernels
    assert [k["impl"] for k in kernels] == ["reduction_kernel"], kernels
    assert "also writing" in kernels[0]["implementation"] or extras == 0
