"""pl.attention on the GPU: CuPy arrays and torch tensors through torch's SDPA, the
blocked path on CuPy, and a compiled hand-written attention (with CUDA graphs), against
a float64 reference on fresh random inputs; outputs poisoned where the test allocates.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels.arrays import bf16_dtype
from pyc_lab.kernels.attention import attention_route
from tests.kernels.test_attention import reference

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

TOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-4}


def _dtype(name):
    return bf16_dtype() if name == "bfloat16" else np.dtype(name)


def _rand(rng, shape, dtype):
    return (rng.standard_normal(shape) * 1.5).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize(("hq", "hk", "sq", "sk", "d"), [(8, 8, 129, 129, 64),
                                                         (8, 2, 1, 517, 128),
                                                         (4, 1, 300, 77, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_cupy_arrays_match_float64(dtype, hq, hk, sq, sk, d, causal):
    rng = np.random.default_rng()
    dt = _dtype(dtype)
    q, k, v = (_rand(rng, (2, h, s, d), dt) for h, s in ((hq, sq), (hk, sk), (hk, sk)))
    cp.get_default_memory_pool().free_all_blocks()
    out = pl.attention(*(cp.asarray(x) for x in (q, k, v)), causal=causal)
    assert isinstance(out, cp.ndarray) and out.dtype == dt and out.shape == (2, hq, sq, d)
    want, _ = reference(q, k, v, causal=causal)
    np.testing.assert_allclose(cp.asnumpy(out).astype(np.float64), want, rtol=TOL[dtype],
                               atol=TOL[dtype])


def test_cupy_masks_and_a_fully_masked_row():
    rng = np.random.default_rng()
    q, k, v = (_rand(rng, (1, 4, 40, 64), np.float16) for _ in range(3))
    mask = _rand(rng, (1, 1, 40, 40), np.float16)
    mask[..., 7, :] = -np.inf
    out = cp.asnumpy(pl.attention(*(cp.asarray(x) for x in (q, k, v)), mask=cp.asarray(mask)))
    want, _ = reference(q, k, v, mask=mask.astype(np.float64))
    assert np.isnan(out[:, :, 7]).all()
    ok = np.arange(40) != 7
    np.testing.assert_allclose(out[:, :, ok].astype(np.float64), want[:, :, ok], rtol=2e-3,
                               atol=2e-3)


def test_blocked_path_on_cupy_with_the_log_sum_exp():
    rng = np.random.default_rng()
    q, k, v = (_rand(rng, (2, 4, 200, 64), np.float32) for _ in range(3))
    dq = [cp.asarray(x) for x in (q, k, v)]
    assert attention_route(dq[0], return_lse=True) == "blocked"
    out, lse = pl.attention(*dq, causal=True, return_lse=True)
    want, want_lse = reference(q, k, v, causal=True)
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(cp.asnumpy(lse), want_lse, rtol=1e-5, atol=1e-5)


def test_torch_tensors_stay_torch_on_their_device():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    q, k, v = (_rand(rng, (2, 33, 4, 64), np.float16) for _ in range(3))  # bshd
    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
    assert attention_route(tq) == "torch-sdpa"
    out = pl.attention(tq, tk, tv, layout="bshd", causal=True)
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.shape == (2, 33, 4, 64)
    want, _ = reference(*(x.swapaxes(1, 2) for x in (q, k, v)), causal=True)
    np.testing.assert_allclose(out.transpose(1, 2).float().cpu().numpy(), want, rtol=2e-3,
                               atol=2e-3)


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_compiled_hand_written_attention_runs_as_one_library_call(cuda_graph):
    rng = np.random.default_rng()

    def fn(q, k, v):
        s = q @ np.swapaxes(k, -1, -2) * np.float16(0.125)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return (p / p.sum(axis=-1, keepdims=True)) @ v

    f = pl.compile(fn, backend="cupy", cuda_graph=cuda_graph)
    for _ in range(3):  # first call, capture, replays on new values
        q, k, v = (_rand(rng, (2, 8, 256, 64), np.float16) for _ in range(3))
        got = cp.asnumpy(f(*(cp.asarray(x) for x in (q, k, v))))
        want = fn(*(x.astype(np.float64) for x in (q, k, v)))
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)
    kinds = [kk["impl"] for kk in f.explain(*(cp.asarray(x) for x in (q, k, v))).kernels]
    assert kinds == ["attention"], kinds
