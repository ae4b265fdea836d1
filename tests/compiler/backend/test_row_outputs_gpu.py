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
          "channel_stats": (16, 96, 28, 28), "statistics_only": (3000, 77),
          "activation_and_sums": (4099, 1030)}


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


def test_repeated_calls_take_the_trusted_entry_and_return_fresh_outputs():
    """Calls like the last one run the executable's trusted entry (no argument checks):
    every call's statistics are right for its own data, in arrays of its own."""
    fn = PROGRAMS["layer_norm_stats"][0]
    rng = np.random.default_rng()
    f = pl.compile(fn, backend="cupy")
    kept = []
    for call in range(4):
        x = _data(rng, _SIZES["layer_norm_stats"], np.float32)
        poison_pool()
        got = f(cp.asarray(x))
        if call:
            assert f._fast is not None and f._fast.run == f._fast.artifact.runner._run
        with np.errstate(all="ignore"):
            want = fn(x.astype(np.float64))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(cp.asnumpy(g), w, rtol=2e-5, atol=2e-5)
        kept.append((got, want))
    pointers = {g.data.ptr for got, _ in kept for g in got}
    assert len(pointers) == 4 * len(kept[0][0])  # no call wrote over another's results
    for got, want in kept:  # nor later: each result still holds its own call's values
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(cp.asnumpy(g), w, rtol=2e-5, atol=2e-5)
    x = _data(rng, _SIZES["layer_norm_stats"], np.float32)
    wide = cp.asfortranarray(cp.asarray(x))  # another kind: checked on the full path
    for g, w in zip(f(wide), fn(x.astype(np.float64)), strict=True):
        np.testing.assert_allclose(cp.asnumpy(g), w, rtol=2e-5, atol=2e-5)
