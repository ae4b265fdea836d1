"""The GEMM form of a convolution (kernels/conv_gemm.py) on torch's CPU tensors in
float64: the same formulation the GPU races against cuDNN, checked exactly enough to
catch a wrong patch order, stride, dilation, padding or layout (where torch is
installed; the GPU tests in test_conv_gemm_gpu.py check it on the device)."""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.kernels import conv_gemm
from tests.kernels.test_conv import reference
from tests.kernels.test_conv_gemm_gpu import CASES

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize(("xs", "ws", "stride", "padding", "dilation"), CASES)
def test_the_gemm_form_in_float64(xs, ws, stride, padding, dilation, last):
    rng = np.random.default_rng()
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    x[0, -1, 0] = -0.0
    xt, wt, bt = (torch.from_numpy(a) for a in (x, w, b))
    if last and xt.ndim == 4:
        xt = xt.contiguous(memory_format=torch.channels_last)
    elif last:  # (N, L, C) in memory, as pl.conv1d's channels_last gives
        xt = xt.transpose(1, 2).contiguous().transpose(1, 2)
    nd = len(ws) - 2
    per = (lambda v: (v,) * nd if np.isscalar(v) else tuple(v))  # noqa: E731
    for bias in (None, bt):
        y = conv_gemm.gemm_conv(xt, wt, bias, per(stride), per(padding), per(dilation))
        want = reference(x, w, None if bias is None else b, stride, padding, dilation)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-12, atol=1e-12)
        if last and nd == 2:
            assert y.is_contiguous(memory_format=torch.channels_last)


def test_patch_bytes_counts_the_patch_matrix():
    x = torch.empty(2, 3, 31, 29, dtype=torch.float16)
    w = torch.empty(16, 3, 7, 7, dtype=torch.float16)
    # out 16 x 15 at stride 2, padding 3: 2 * 16 * 15 rows of 3 * 49 values
    assert conv_gemm.patch_bytes(x, w, (2, 2), (3, 3), (1, 1)) == 2 * 16 * 15 * 147 * 2
    assert conv_gemm.patch_bytes(x, torch.empty(8, 3, 1, 1), (2, 2), (0, 0), (1, 1)) == 0


def test_a_kept_plan_never_serves_a_different_call():
    """On the CPU, torch tensors take im2col through the same kept checks: a call that
    differs in shape, stride, padding or bias is checked and answered anew."""
    import pyc_lab as pl
    from pyc_lab.errors import PycLabError

    rng = np.random.default_rng()
    w, b = torch.from_numpy(rng.standard_normal((6, 4, 3, 3))), torch.from_numpy(
        rng.standard_normal(6))
    for shape, stride, padding in [((2, 4, 9, 9), 1, 1), ((2, 4, 9, 9), 1, 1),
                                   ((3, 4, 11, 7), 1, 1), ((2, 4, 9, 9), 2, 1),
                                   ((2, 4, 9, 9), 1, 0)]:
        x = torch.from_numpy(rng.standard_normal(shape))
        y = pl.conv2d(x, w, b, stride=stride, padding=padding)
        want = reference(x.numpy(), w.numpy(), b.numpy(), stride, padding)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-10, atol=1e-10)
    with pytest.raises(PycLabError, match="bias has shape"):
        pl.conv2d(x, w, b[:5], padding=1)
    with pytest.raises(PycLabError, match="fit"):
        pl.conv2d(x[:, :3], w, b, padding=1)
    with pytest.raises(PycLabError, match="different devices"):
        pl.conv2d(x, w.to("meta"), padding=1)


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize(("xs", "ws", "stride", "padding", "dilation"), CASES)
def test_the_runner_a_problem_keeps_computes_the_same(xs, ws, stride, padding, dilation,
                                                      last):
    """What a problem that chose the GEMM form runs from then on (a 1x1 filter on a
    channels-last input has its own shapes worked out once; the rest is gemm_conv)."""
    rng = np.random.default_rng()
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    xt, wt, bt = (torch.from_numpy(a) for a in (x, w, b))
    if last and xt.ndim == 4:
        xt = xt.contiguous(memory_format=torch.channels_last)
    nd = len(ws) - 2
    per = (lambda v: (v,) * nd if np.isscalar(v) else tuple(v))  # noqa: E731
    run = conv_gemm._gemm_runner(xt, wt, per(stride), per(padding), per(dilation))
    for bias in (None, bt):
        y = run(xt, wt, bias)
        want = reference(x, w, None if bias is None else b, stride, padding, dilation)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-12, atol=1e-12)
