"""``pl.conv`` inside ``pl.compile`` on the CuPy backend: the ``conv`` node runs as
pl.conv's call (cuDNN or the GEMM form through torch between the generated kernels, or
the direct kernel recorded among them), against the float64 loops of
tests/kernels/test_conv.py, with and without CUDA-graph replay of the rest."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from tests.kernels.test_conv import reference

cp = pytest.importorskip("cupy")
pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cuda_graph", ["auto", False])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_a_compiled_conv_block_on_the_gpu(dtype, cuda_graph):
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 3, 29, 31)).astype(dtype)
    w = (rng.standard_normal((8, 3, 7, 7)) / 12).astype(dtype)
    b = rng.standard_normal(8).astype(dtype)

    def block(x, w, b):
        return np.maximum(pl.conv2d(x, w, b, stride=2, padding=3), 0) * dtype(2)

    f = pl.compile(block, backend="cupy", cuda_graph=cuda_graph)
    args = [cp.asarray(a) for a in (x, w, b)]
    want = np.maximum(reference(x, w, b, 2, 3), 0) * 2
    for _ in range(3):  # the first call traces and races; later ones replay
        got = cp.asnumpy(f(*args))
        assert got.dtype == dtype and got.shape == want.shape
        tol = 2e-2 if dtype == np.float16 else 1e-3
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    ex = f.explain(*args)
    assert "conv" in set(ex.decisions["choice"])


@pytest.mark.parametrize("nd", [1, 2])
def test_replayed_conv_is_bound_once_and_sees_new_inputs(nd, monkeypatch):
    """With CUDA graphs forced, the conv between the graphs is a bound call (its torch
    views made once; pl.conv is not called again) that computes each replay's new
    input, never the captured one."""
    from pyc_lab.kernels import conv as kconv
    from pyc_lab.kernels import conv_gemm

    # a library's path (the direct kernel is recorded into the graph instead: see
    # tests/kernels/test_conv_direct_gpu.py)
    monkeypatch.setattr(conv_gemm, "_direct_eligible", lambda *a: False)
    calls = {"conv": 0, "bound": []}
    conv, bound_conv = kconv.conv, kconv.bound_conv

    def counting_conv(*a, **k):
        calls["conv"] += 1
        return conv(*a, **k)

    def recording_bound_conv(*a, **k):
        out = bound_conv(*a, **k)
        calls["bound"].append(out)
        return out

    monkeypatch.setattr(kconv, "conv", counting_conv)
    monkeypatch.setattr(kconv, "bound_conv", recording_bound_conv)
    rng = np.random.default_rng()
    shape = (3, 5, 37) if nd == 1 else (2, 5, 19, 23)
    w = (rng.standard_normal((7, 5, *(3,) * nd)) / 6).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)

    def block(x, w, b):
        return np.tanh(pl.conv(x * np.float32(0.5), w, b, padding=1)) + np.float32(1)

    f = pl.compile(block, backend="cupy", cuda_graph=True)
    wc, bc = cp.asarray(w), cp.asarray(b)
    xc = cp.empty(shape, np.float32)  # one address: read in place, never a re-capture
    seen = []
    for k in range(5):
        x = rng.standard_normal(shape).astype(np.float32)
        if k == 4:
            x[0, 0, 0] = np.nan  # flows through the conv's windows, as in float64
        xc.set(x)
        got = cp.asnumpy(f(xc, wc, bc))
        want = np.tanh(reference(x * 0.5, w, b, 1, 1)) + 1
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
        assert np.isnan(got).any() == (k == 4)
        seen.append(calls["conv"])
    assert len(calls["bound"]) == 1 and calls["bound"][0] is not None
    assert seen[2] == seen[3] == seen[4], "a replay called pl.conv instead of the bound call"


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("cuda_graph", [True, False])
def test_a_folded_activation_runs_in_the_conv_call(activation, cuda_graph):
    """conv -> activation is one conv node on the GPU too (the library call applies it),
    with and without the replayed graphs around it."""
    from pyc_lab.compiler import gelu, relu, silu
    from tests.kernels.test_conv import _act64

    tail = {"relu": relu, "gelu": gelu, "silu": silu}[activation]
    rng = np.random.default_rng()
    w = (rng.standard_normal((8, 4, 3, 3)) / 6).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)

    def block(x, w, b):
        return tail(pl.conv2d(x, w, b, padding=1)) + np.float32(0.5)

    f = pl.compile(block, backend="cupy", cuda_graph=cuda_graph)
    wc, bc = cp.asarray(w), cp.asarray(b)
    xc = cp.empty((2, 4, 21, 19), np.float32)
    for k in range(4):
        x = rng.standard_normal((2, 4, 21, 19)).astype(np.float32)
        if k == 3:
            x[1, 2, 4, 4] = np.nan
        xc.set(x)
        got = cp.asnumpy(f(xc, wc, bc))
        want = _act64(activation, reference(x, w, b, 1, 1)) + 0.5
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3, equal_nan=True)
        assert np.isnan(got).any() == (k == 3)
    ex = f.explain(xc, wc, bc)
    assert any(f"folded {activation}" in note for note in ex.notes)


@pytest.mark.parametrize("cuda_graph", ["auto", False])
def test_a_compiled_float32_conv_is_exact_whatever_torch_allows(cuda_graph):
    """Inside ``pl.compile`` a float32 convolution is float32's even where torch lets
    cuDNN use TF32 (its default): 576-term sums within float32 rounding of float64."""
    import torch

    rng = np.random.default_rng()
    x = rng.standard_normal((4, 64, 20, 20)).astype(np.float32)
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
    want = np.maximum(reference(x, w, None, 1, 1), 0)
    put = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        f = pl.compile(lambda x, w: np.maximum(pl.conv2d(x, w, padding=1), 0),
                       backend="cupy", cuda_graph=cuda_graph)
        args = [cp.asarray(a) for a in (x, w)]
        for _ in range(3):
            got = cp.asnumpy(f(*args)).astype(np.float64)
            assert np.abs(got - want).max() / np.abs(want).max() < 2e-5
        assert torch.backends.cudnn.allow_tf32 is True
    finally:
        torch.backends.cudnn.allow_tf32 = put
