"""pl.conv on the GPU: CuPy arrays and torch tensors through cuDNN (torch), against the
float64 reference of the CPU tests, on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels.conv import conv_route
from tests.kernels.test_conv import reference

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize(("xs", "ws", "kw"), [
    ((4, 16, 28, 28), (32, 16, 3, 3), {"padding": 1}),
    ((2, 32, 15, 17), (32, 1, 3, 3), {"groups": 32, "padding": 1, "stride": 2}),
    ((8, 4, 129), (32, 4, 3), {}),
])
def test_cupy_arrays_through_cudnn(dtype, xs, ws, kw):
    rng = np.random.default_rng()
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    xd = cp.asarray(x)
    if conv_route(xd) != "cudnn":
        pytest.skip("torch is not installed: the im2col path runs (tested on the CPU)")
    y = pl.conv(xd, cp.asarray(w), cp.asarray(b), **kw)
    assert isinstance(y, cp.ndarray) and y.dtype == np.dtype(dtype)
    want = reference(x, w, b, kw.get("stride", 1), kw.get("padding", 0), 1,
                     kw.get("groups", 1))
    tol = 2e-2 if dtype == "float16" else 1e-3  # cuDNN may take TF32 for float32
    np.testing.assert_allclose(cp.asnumpy(y).astype(np.float64), want, rtol=tol, atol=tol)


def test_torch_tensors_channels_last():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 14, 14, 8)).astype(np.float16)       # (N, H, W, C)
    w = (rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float16)
    y = pl.conv2d(torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda(), padding=1,
                  layout="channels_last")
    assert isinstance(y, torch.Tensor) and y.is_cuda and tuple(y.shape) == (2, 14, 14, 16)
    want = reference(x.transpose(0, 3, 1, 2), w, padding=1).transpose(0, 2, 3, 1)
    np.testing.assert_allclose(y.float().cpu().numpy(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_activation_on_cupy_arrays_and_torch_tensors(activation):
    torch = pytest.importorskip("torch")
    from tests.kernels.test_conv import _act64

    rng = np.random.default_rng()
    x = rng.standard_normal((3, 5, 17, 16)).astype(np.float32)
    w = (rng.standard_normal((7, 5, 3, 3)) / 7).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    x[0, 0, 3, 3] = np.nan
    want = _act64(activation, reference(x, w, b, 2, 1))
    got = cp.asnumpy(pl.conv2d(cp.asarray(x), cp.asarray(w), cp.asarray(b), stride=2,
                               padding=1, activation=activation))
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3, equal_nan=True)
    xt, wt, bt = (torch.from_numpy(a).cuda() for a in (x, w, b))
    got_t = pl.conv2d(xt, wt, bt, stride=2, padding=1, activation=activation)
    np.testing.assert_allclose(got_t.cpu().numpy(), want, rtol=2e-3, atol=2e-3,
                               equal_nan=True)


@pytest.mark.parametrize("kind", ["cupy", "torch"])
def test_tf32_false_is_exact_float32_and_leaves_the_users_setting(kind):
    """A 3x3 layer over 64 channels (576 terms a sum): with ``tf32=False`` cuDNN's
    result is float32's (TF32's 10-bit mantissas would be off by about 5e-4), and
    torch's own setting is as it was before the call."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 64, 20, 20)).astype(np.float32)
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    want = reference(x, w, b, 1, 1)
    put = torch.backends.cudnn.allow_tf32
    try:
        for user in (True, False):
            torch.backends.cudnn.allow_tf32 = user
            if kind == "cupy":
                y = cp.asnumpy(pl.conv2d(cp.asarray(x), cp.asarray(w), cp.asarray(b),
                                         padding=1, tf32=False))
            else:
                y = pl.conv2d(*(torch.from_numpy(a).cuda() for a in (x, w, b)), padding=1,
                              tf32=False).cpu().numpy()
            assert torch.backends.cudnn.allow_tf32 is user
            err = np.abs(y.astype(np.float64) - want).max() / np.abs(want).max()
            assert err < 2e-5, err  # float32 over 576 terms; TF32 is ~5e-4
    finally:
        torch.backends.cudnn.allow_tf32 = put
