"""Training through pl.conv on the GPU: dgrad, wgrad and the bias' gradient of CUDA
tensors (cuDNN's backward convolutions) against float64 autograd of torch's convolution
on the host, on fresh random inputs: float16, bfloat16 and float32, channels first and
channels last, strides, padding, dilation, groups, 1-D and 2-D, fused activations; CuPy
arrays through ``pl.conv_backward``; the forward's route untouched by the backward."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
TOL = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 2e-3}  # of the largest gradient


def _reference(x, w, b, dy, kw, activation, y_device):
    """float64 gradients on the host by torch's autograd. relu's derivative is a step:
    it is taken where the device's own result is positive (a pre-activation within
    16-bit rounding of zero may have either sign), so only the convolution is compared."""
    F = torch.nn.functional
    leaves = [a.detach().double().cpu().requires_grad_() for a in (x, w, b)]
    conv = {3: F.conv1d, 4: F.conv2d}[x.ndim]
    y = conv(*leaves, **kw)
    dy = dy.double().cpu()
    if activation == "relu":
        dy = dy * (y_device.detach().cpu() > 0)
    elif activation == "gelu":
        y = F.gelu(y, approximate="tanh")
    return torch.autograd.grad(y, leaves, dy)


def _close(got, want, dtype):
    for name, g, r in zip(("dx", "dw", "db"), got, want, strict=True):
        assert g.dtype == DTYPES[dtype] and g.is_cuda, name
        err = float((g.double().cpu() - r).abs().max()) / float(r.abs().max())
        assert err <= TOL[dtype], f"{name}: {err:.3g} of the largest gradient"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize(("xs", "ws", "kw", "layout", "activation"), [
    ((4, 16, 28, 28), (32, 16, 3, 3), {"padding": 1}, "channels_last", "relu"),
    ((2, 32, 15, 17), (32, 1, 3, 3), {"groups": 32, "padding": 1, "stride": 2},
     "channels_first", None),
    ((3, 8, 21, 19), (16, 8, 3, 3), {"dilation": 2, "stride": (1, 2)}, "channels_first",
     "gelu"),
    ((8, 4, 129), (32, 4, 3), {"padding": 1}, "channels_first", None),
])
def test_training_through_pl_conv_matches_float64(dtype, xs, ws, kw, layout, activation):
    gen = torch.Generator(device="cuda").manual_seed(int(np.prod(xs)) % 2**31)
    x = torch.randn(xs, generator=gen, device="cuda").to(DTYPES[dtype])
    w = (torch.randn(ws, generator=gen, device="cuda") / np.sqrt(np.prod(ws[1:]))).to(
        DTYPES[dtype])
    b = torch.randn(ws[0], generator=gen, device="cuda").to(DTYPES[dtype])
    leaves = [a.clone().requires_grad_() for a in (x, w, b)]
    xin = leaves[0]
    if layout == "channels_last":
        xin = xin.permute(0, 2, 3, 1)
    y = pl.conv(xin, leaves[1], leaves[2], layout=layout, activation=activation, **kw)
    dy = torch.randn(y.shape, generator=gen, device="cuda").to(DTYPES[dtype])
    y.backward(dy)
    def first(a):
        return a.permute(0, 3, 1, 2) if layout == "channels_last" else a

    _close([a.grad for a in leaves],
           _reference(x, w, b, first(dy), kw, activation, first(y)), dtype)


def test_cupy_arrays_through_conv_backward():
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 8, 20, 20)).astype(np.float32)
    w = (rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    y = pl.conv2d(cp.asarray(x), cp.asarray(w), cp.asarray(b), padding=1, activation="silu")
    dy = rng.standard_normal(y.shape).astype(np.float32)
    grads = pl.conv_backward(cp.asarray(x), cp.asarray(w), cp.asarray(dy), cp.asarray(b),
                             padding=1, activation="silu")
    assert all(isinstance(g, cp.ndarray) for g in grads)
    want = pl.conv_backward(x.astype(np.float64), w.astype(np.float64),
                            dy.astype(np.float64), b.astype(np.float64), padding=1,
                            activation="silu")
    for g, r in zip(grads, want, strict=True):
        np.testing.assert_allclose(cp.asnumpy(g), r, rtol=2e-3, atol=2e-3 * np.abs(r).max())
