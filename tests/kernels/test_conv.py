"""pl.conv / conv1d / conv2d on NumPy arrays (im2col) against a float64 direct reference.

Fresh random inputs; odd sizes, strides, dilations, padding (numbers, "same", "valid"),
groups and depthwise, bias, channels-last, 1-D/2-D/3-D, float16/bfloat16, NaN
propagation, and every refusal.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError
from pyc_lab.kernels.conv import conv_route


def reference(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """float64 cross-correlation by explicit loops over the kernel offsets."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    nd = w.ndim - 2
    st = (stride,) * nd if np.isscalar(stride) else tuple(stride)
    pd = (padding,) * nd if np.isscalar(padding) else tuple(padding)
    dl = (dilation,) * nd if np.isscalar(dilation) else tuple(dilation)
    x = np.pad(x, [(0, 0), (0, 0), *[(p, p) for p in pd]])
    n = x.shape[0]
    o, cg = w.shape[:2]
    og = o // groups
    kernel = w.shape[2:]
    out = tuple((s - d * (k - 1) - 1) // t + 1
                for s, k, t, d in zip(x.shape[2:], kernel, st, dl, strict=True))
    y = np.zeros((n, o, *out))
    for g in range(groups):
        xg = x[:, g * cg:(g + 1) * cg]
        wg = w[g * og:(g + 1) * og]
        for offs in itertools.product(*[range(k) for k in kernel]):
            idx = tuple(slice(f * d, f * d + t * (m - 1) + 1, t)
                        for f, d, t, m in zip(offs, dl, st, out, strict=True))
            patch = xg[(slice(None), slice(None), *idx)]  # (N, cg, *out)
            y[:, g * og:(g + 1) * og] += np.einsum("nc...,oc->no...", patch,
                                                   wg[(slice(None), slice(None), *offs)])
    if b is not None:
        y += np.asarray(b, np.float64).reshape(1, -1, *([1] * nd))
    return y


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize(("xs", "ws", "kw"), [
    ((2, 3, 17, 19), (5, 3, 3, 3), {}),
    ((2, 4, 16, 15), (6, 4, 3, 5), {"stride": 2, "padding": (1, 2)}),
    ((1, 3, 20, 20), (4, 3, 3, 3), {"dilation": 2, "padding": "same"}),
    ((2, 6, 11, 13), (6, 1, 3, 3), {"groups": 6, "padding": 1}),           # depthwise
    ((2, 8, 9, 9), (4, 4, 1, 1), {"groups": 2}),                           # 1x1, grouped
    ((3, 4, 33), (8, 4, 3), {"stride": 1}),                                # conv1d
    ((2, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"stride": (1, 2, 1), "padding": 1}),   # 3-D
])
@pytest.mark.parametrize("bias", [False, True])
def test_float32_against_float64(xs, ws, kw, bias):
    rng = np.random.default_rng()
    x, w = rand(rng, xs), rand(rng, ws)
    b = rand(rng, (ws[0],)) if bias else None
    y = pl.conv(x, w, b, **kw)
    pad = kw.get("padding", 0)
    if pad == "same":
        pad = tuple(kw.get("dilation", 1) * (k - 1) // 2 for k in ws[2:])
    want = reference(x, w, b, kw.get("stride", 1), pad, kw.get("dilation", 1),
                     kw.get("groups", 1))
    assert y.dtype == np.float32 and y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_conv1d_and_conv2d_check_their_rank():
    rng = np.random.default_rng()
    x, w = rand(rng, (2, 4, 30)), rand(rng, (8, 4, 3))
    np.testing.assert_allclose(pl.conv1d(x, w, padding=1), reference(x, w, padding=1),
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(PycLabError, match="conv2d"):
        pl.conv2d(x, w)
    with pytest.raises(PycLabError, match="conv1d"):
        pl.conv1d(rand(rng, (1, 4, 8, 8)), rand(rng, (2, 4, 3, 3)))


def test_channels_last_is_the_transposed_problem():
    rng = np.random.default_rng()
    x, w = rand(rng, (2, 13, 11, 5)), rand(rng, (7, 5, 3, 3))   # (N, H, W, C)
    y = pl.conv2d(x, w, padding=1, layout="channels_last")
    want = reference(x.transpose(0, 3, 1, 2), w, padding=1).transpose(0, 2, 3, 1)
    assert y.shape == (2, 13, 11, 7)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_16_bit_inputs_within_their_rounding_and_nan_propagates():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng()
    for dtype, tol in ((np.float16, 1e-2), (np.dtype(ml_dtypes.bfloat16), 6e-2)):
        x, w = rand(rng, (2, 8, 12, 12), dtype), rand(rng, (4, 8, 3, 3), dtype)
        y = pl.conv2d(x, w, padding=1)
        assert y.dtype == dtype
        np.testing.assert_allclose(y.astype(np.float64), reference(x, w, padding=1),
                                   rtol=tol, atol=tol)
    x, w = rand(rng, (1, 1, 8, 8)), rand(rng, (1, 1, 3, 3))
    x[0, 0, 4, 4] = np.nan
    y = pl.conv2d(x, w)
    nan = np.isnan(y[0, 0])
    assert nan[2:5, 2:5].all() and nan.sum() == 9  # exactly the windows holding it


def test_routes():
    assert conv_route(np.zeros((1, 1, 4))) == "im2col"


@pytest.mark.parametrize(("xs", "ws", "kw", "match"), [
    ((1, 3, 8, 8), (4, 3, 3, 3), {"layout": "nhwc"}, "layout"),
    ((1, 3, 8, 8), (4, 2, 3, 3), {}, "do not fit"),
    ((1, 4, 8, 8), (4, 2, 3, 3), {"groups": 3}, "do not fit"),
    ((1, 3, 8), (4, 3, 3, 3), {}, "spatial axes"),
    ((1, 3, 2, 2), (4, 3, 3, 3), {}, "does not fit"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"stride": (1, 2, 3)}, "entries"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"padding": "full"}, "padding"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"padding": "same", "stride": 2}, "stride 1"),
    ((1, 3, 8, 8), (4, 3, 2, 2), {"padding": "same"}, "unequal ends"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"stride": 0}, "positive"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"stride": "a"}, "stride must be a whole number"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"stride": 1.5}, "stride must be a whole number"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"dilation": (1, 1.0)}, "dilation must be a whole number"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"padding": True}, "padding must be a whole number"),
    ((1, 4, 8, 8), (4, 2, 3, 3), {"groups": "2"}, "groups must be a whole number"),
])
def test_bad_requests_are_refused(xs, ws, kw, match):
    rng = np.random.default_rng()
    with pytest.raises(PycLabError, match=match):
        pl.conv(rand(rng, xs), rand(rng, ws), **kw)


def test_bad_dtypes_bias_and_kinds_are_refused():
    rng = np.random.default_rng()
    x, w = rand(rng, (1, 3, 8, 8)), rand(rng, (4, 3, 3, 3))
    with pytest.raises(PycLabError, match="dtypes"):
        pl.conv(x, w.astype(np.float16))
    with pytest.raises(PycLabError, match="dtypes"):
        pl.conv(x.astype(np.int32), w.astype(np.int32))
    with pytest.raises(PycLabError, match="bias has shape"):
        pl.conv(x, w, rand(rng, (3,)))
    with pytest.raises(PycLabError, match="not an array"):
        pl.conv([[1.0]], w)


def _act64(name, y):
    if name == "relu":
        return np.where(np.isnan(y), y, np.maximum(y, 0))
    if name == "silu":
        return y / (1 + np.exp(-y))
    return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
@pytest.mark.parametrize(("dtype", "tol"), [(np.float32, 1e-5), (np.float16, 4e-3)])
def test_activation_after_the_bias_rounded_once(activation, dtype, tol):
    rng = np.random.default_rng()
    for xs, ws, kw in [((2, 3, 13, 11), (5, 3, 3, 3), {"padding": 1, "stride": (2, 1)}),
                       ((3, 4, 21), (6, 4, 5), {"padding": 2, "dilation": 2})]:
        x = rng.standard_normal(xs).astype(dtype)
        w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
        b = rng.standard_normal(ws[0]).astype(dtype)
        x.flat[5] = np.nan
        got = pl.conv(x, w, b, activation=activation, **kw)
        want = _act64(activation, reference(x, w, b, kw.get("stride", 1), kw["padding"],
                                            kw.get("dilation", 1)))
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol,
                                   equal_nan=True)
        # the same numbers as the activation applied after the plain call, in float32
        plain = pl.conv(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32),
                        **kw)
        assert not np.array_equal(got, pl.conv(x, w, b, **kw), equal_nan=True)
        np.testing.assert_allclose(got.astype(np.float32), _act64(activation, plain),
                                   rtol=tol, atol=tol, equal_nan=True)


def test_an_unknown_activation_is_refused():
    x = np.ones((1, 2, 5, 5), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    with pytest.raises(PycLabError, match="activation 'tanh' is not one of"):
        pl.conv(x, w, activation="tanh")



@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # gelu of an infinity
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize(("dtype", "tol"), [(np.float32, 1e-5), (np.float16, 4e-3)])
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_a_residual_is_added_after_the_bias_and_before_the_activation(activation, dtype,
                                                                      tol, layout):
    """``act(conv + bias + residual)``: against the float64 loops, with NaN, +-inf and
    -0.0 in the residual and an odd-sized problem; the sum (and activation) in float32
    rounded once, as a fused epilogue computes it."""
    rng = np.random.default_rng()
    xs, ws, kw = (3, 5, 13, 11), (7, 5, 3, 3), {"padding": 1, "stride": (2, 1)}
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    y64 = reference(x, w, b, kw["stride"], kw["padding"])
    r = rng.standard_normal(y64.shape).astype(dtype)
    r.flat[[3, 40, 77, 101]] = [np.nan, np.inf, -np.inf, -0.0]
    want = y64 + r.astype(np.float64)
    if activation is not None:
        want = _act64(activation, want)
    last = layout == "channels_last"
    xl = x.transpose(0, 2, 3, 1).copy() if last else x
    rl = r.transpose(0, 2, 3, 1).copy() if last else r
    got = pl.conv(xl, w, b, activation=activation, residual=rl, layout=layout, **kw)
    if last:
        got = got.transpose(0, 3, 1, 2)
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol,
                               equal_nan=True)
    # the plain call in float32, the residual and activation after it: the same numbers
    plain = pl.conv(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32), **kw)
    after = plain + r.astype(np.float32)
    after = after if activation is None else _act64(activation, after)
    np.testing.assert_allclose(got.astype(np.float32), after, rtol=tol, atol=tol,
                               equal_nan=True)


def test_a_residual_of_another_shape_kind_or_dtype_is_refused():
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    with pytest.raises(PycLabError, match=r"residual has shape \(2, 4, 1, 6\).*\(2, 4, 6, 6\)"):
        pl.conv(x, w, residual=np.ones((2, 4, 1, 6), np.float32))
    with pytest.raises(PycLabError, match=r"residual has shape"):
        pl.conv(x, w, residual=np.ones((2, 6, 6, 4), np.float32))  # channels-first call
    with pytest.raises(PycLabError, match="dtypes"):
        pl.conv(x, w, residual=np.ones((2, 4, 6, 6), np.float64))
    with pytest.raises(PycLabError, match="residual is a list"):
        pl.conv(x, w, residual=[[1.0]])


def test_then_keeps_a_kernels_launch_only_where_nothing_runs_around_it():
    """``_then`` without an activation or residual calls ``fn`` alone and keeps its
    ``launch`` (a tuned kernel a CUDA graph may record); with either after it, the
    wrapper has none (the graph would miss what runs after the launch)."""
    from pyc_lab.kernels.conv_gemm import _then

    seen = []

    def fn(x, w, b):
        seen.append((x, w, b))
        return "y"

    fn.launch = ("kernel", "geometry")
    plain = _then(fn, None)
    assert plain(1, 2, 3, "r ignored") == "y" and seen == [(1, 2, 3)]
    assert plain.launch == ("kernel", "geometry")
    for wrapped in (_then(fn, "relu"), _then(fn, None, True),
                    _then(fn, "relu", fused_residual=True)):
        assert getattr(wrapped, "launch", None) is None
    assert _then(lambda x, w, b: "z", None).launch is None
