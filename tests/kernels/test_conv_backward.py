"""Gradients of pl.conv on the host: ``pl.conv_backward`` on NumPy arrays checked by the
adjoint identity (the convolution is linear in ``x`` and in ``w``, so
``sum(dy * conv(x, w)) == sum(x * dx) == sum(w * dw)`` exactly, at any size), by central
differences (bias and every fused activation), and in 16-bit dtypes against float64;
both layouts, 1-D/2-D/3-D, stride, padding, dilation and groups; torch's autograd
through ``pl.conv`` on CPU tensors (``gradcheck`` in float64, and torch's own conv
autograd); every refusal.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError

CASES = [  # n, c, o, spatial, kernel, stride, padding, dilation, groups
    (2, 4, 6, (9, 11), (3, 2), (2, 1), (1, 0), (1, 2), 2),
    (3, 3, 5, (13,), (3,), (1,), (1,), (1,), 1),
    (2, 6, 6, (7, 8), (3, 3), (1, 1), (1, 1), (1, 1), 6),          # depthwise
    (1, 2, 3, (5, 5, 5), (2, 2, 2), (2, 2, 1), (0, 1, 0), (1, 1, 2), 1),  # 3-D
    (2, 5, 7, (1, 17), (1, 4), (1, 3), (0, 2), (1, 1), 1),        # height 1, odd sizes
]


def _problem(rng, case, dtype=np.float64):
    n, c, o, sp, k, s, p, d, g = case
    x = rng.standard_normal((n, c, *sp)).astype(dtype)
    w = rng.standard_normal((o, c // g, *k)).astype(dtype)
    args = {"stride": s, "padding": p, "dilation": d, "groups": g}
    return x, w, args


@pytest.mark.parametrize("case", CASES)
def test_gradients_are_the_adjoint_of_the_convolution(case):
    rng = np.random.default_rng()
    x, w, args = _problem(rng, case)
    y = pl.conv(x, w, **args)
    dy = rng.standard_normal(y.shape)
    dx, dw, db = pl.conv_backward(x, w, dy, **args)
    assert dx.shape == x.shape and dw.shape == w.shape and db is None
    inner = float((dy * y).sum())
    np.testing.assert_allclose(float((x * dx).sum()), inner, rtol=1e-10)
    np.testing.assert_allclose(float((w * dw).sum()), inner, rtol=1e-10)
    # and each entry: a second, random direction
    hx = rng.standard_normal(x.shape)
    np.testing.assert_allclose(float((dy * pl.conv(hx, w, **args)).sum()),
                               float((hx * dx).sum()), rtol=1e-10)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
def test_central_differences_with_a_bias_and_an_activation(activation):
    rng = np.random.default_rng()
    x, w, args = _problem(rng, (1, 2, 3, (5, 4), (2, 3), (1, 2), (1, 1), (1, 1), 1))
    b = rng.standard_normal(3)
    y = pl.conv(x, w, b, activation=activation, **args)
    dy = rng.standard_normal(y.shape)
    grads = pl.conv_backward(x, w, dy, b, activation=activation, **args)

    def loss(xx, ww, bb):
        return float((pl.conv(xx, ww, bb, activation=activation, **args) * dy).sum())

    h = 1e-6
    for which, (a, g) in enumerate(zip((x, w, b), grads, strict=True)):
        for idx in list(np.ndindex(a.shape))[::3]:
            old = a[idx]
            a[idx] = old + h
            up = loss(x, w, b)
            a[idx] = old - h
            down = loss(x, w, b)
            a[idx] = old
            if activation == "relu" and abs(up + down - 2 * loss(x, w, b)) > 1e-7:
                continue  # a kink of relu between the two points
            assert g[idx] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-7), \
                (which, idx)


def test_sixteen_bit_and_float32_within_their_rounding():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng()
    x64, w64, args = _problem(rng, CASES[0])
    dy64 = rng.standard_normal(pl.conv(x64, w64, **args).shape)
    want = pl.conv_backward(x64, w64, dy64, **args)
    for dtype, tol in ((np.float32, 1e-5), (np.float16, 4e-3),
                       (np.dtype(ml_dtypes.bfloat16), 3e-2)):
        got = pl.conv_backward(x64.astype(dtype), w64.astype(dtype), dy64.astype(dtype),
                               **args)
        for g, ref in zip(got[:2], want[:2], strict=True):
            assert g.dtype == dtype
            np.testing.assert_allclose(g.astype(np.float64), ref, rtol=tol,
                                       atol=tol * np.abs(ref).max())


def test_channels_last_is_the_transposed_problem():
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 9, 10, 4)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    y = pl.conv2d(x, w, b, padding=1, layout="channels_last")
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, dw, db = pl.conv_backward(x, w, dy, b, padding=1, layout="channels_last")
    first = pl.conv_backward(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), w,
                             np.ascontiguousarray(dy.transpose(0, 3, 1, 2)), b, padding=1)
    assert dx.shape == x.shape
    np.testing.assert_array_equal(dx, first[0].transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(dw, first[1])
    np.testing.assert_allclose(db, dy.sum(axis=(0, 1, 2)), rtol=1e-5)


def test_bad_gradients_are_refused():
    rng = np.random.default_rng()
    x, w, args = _problem(rng, CASES[1])
    with pytest.raises(PycLabError, match="dy must be"):
        pl.conv_backward(x, w, np.zeros((3, 5, 99)), **args)
    with pytest.raises(PycLabError, match="dy must be"):
        pl.conv_backward(x, w, [[0.0]], **args)
    with pytest.raises(PycLabError, match="activation"):
        pl.conv_backward(x, w, np.zeros((3, 5, 13)), activation="tanh", **args)
    with pytest.raises(PycLabError, match="groups"):
        pl.conv_backward(x, w, np.zeros((3, 5, 13)), stride=1, groups=2)


# --- torch's autograd through pl.conv (CPU tensors) --------------------------------------

def test_autograd_gradcheck_float64():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(int(np.random.default_rng().integers(2**31)))
    x = torch.randn(2, 4, 6, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(6, 2, 3, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, c, d: pl.conv2d(a, c, d, stride=(2, 1), padding=1, groups=2,
                                  activation="silu"), (x, w, b))


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_autograd_matches_torch(layout, activation):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = torch.randn(2, 3, 12, 10, requires_grad=True)
    w = torch.randn(8, 3, 3, 3, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    xin = x.permute(0, 2, 3, 1) if layout == "channels_last" else x
    out = pl.conv2d(xin, w, b, stride=2, padding=1, layout=layout, activation=activation)
    ref = F.conv2d(x, w, b, stride=2, padding=1)
    ref = F.gelu(ref, approximate="tanh") if activation else ref
    ref = ref.permute(0, 2, 3, 1) if layout == "channels_last" else ref
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    dy = torch.randn_like(ref)
    got = torch.autograd.grad(out, (x, w, b), dy)
    want = torch.autograd.grad(ref, (x, w, b), dy)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def test_autograd_with_frozen_weights_and_tensors_through_conv_backward():
    torch = pytest.importorskip("torch")
    x = torch.randn(1, 2, 9, requires_grad=True)
    w = torch.randn(4, 2, 3)  # frozen
    pl.conv1d(x, w, padding=1).sum().backward()
    assert x.grad is not None and w.grad is None
    dy = torch.ones(1, 4, 9)
    dx, dw, db = pl.conv_backward(x.detach(), w, dy, padding=1)
    torch.testing.assert_close(dx, x.grad)
    assert isinstance(dw, torch.Tensor) and db is None
