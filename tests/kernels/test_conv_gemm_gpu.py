"""The GEMM form of a convolution (kernels/conv_gemm.py) and the race that picks it or
cuDNN per problem: against the float64 reference of the CPU tests, on fresh random
inputs with odd sizes, both memory layouts, bias, NaN and infinity."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels import conv_gemm
from tests.kernels.test_conv import reference

torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

CASES = [  # x shape, w shape, stride, padding, dilation
    ((3, 5, 17, 13), (7, 5, 3, 3), 1, 1, 1),
    ((2, 3, 31, 29), (16, 3, 7, 7), 2, 3, 1),          # a stem: three input channels
    ((4, 12, 9, 11), (8, 12, 1, 1), 1, 0, 1),          # 1x1
    ((2, 16, 15, 15), (24, 16, 1, 1), 2, 0, 1),        # 1x1, stride 2
    ((2, 6, 19, 14), (5, 6, 3, 2), (2, 1), (1, 0), (2, 1)),
    ((5, 4, 129), (32, 4, 3), 1, 0, 1),                # conv1d (the HEP model's)
    ((3, 9, 40), (6, 9, 5), 2, 2, 2),
]
TOL = {"float16": 2e-2, "bfloat16": 8e-2, "float32": 1e-4}


def _tensor(a, dtype, last):
    t = torch.from_numpy(a).cuda().to(getattr(torch, dtype))
    if last and t.ndim == 4:
        t = t.contiguous(memory_format=torch.channels_last)
    elif last and t.ndim == 3:  # (N, L, C) in memory, as pl.conv1d's channels_last gives
        t = t.transpose(1, 2).contiguous().transpose(1, 2)
    return t


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize(("xs", "ws", "stride", "padding", "dilation"), CASES)
def test_the_gemm_form_matches_the_reference(xs, ws, stride, padding, dilation, last, dtype):
    rng = np.random.default_rng()
    x = rng.standard_normal(xs)
    w = rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))
    b = rng.standard_normal(ws[0])
    x[0, 0, 1], x[-1, -1, -1] = np.nan, np.inf  # both spread to the outputs they touch
    xd, wd, bd = (_tensor(a, dtype, last) for a in (x, w, b))
    # the reference sees the values the GPU sees (rounded to the dtype)
    xr, wr, br = (t.float().cpu().numpy().astype(np.float64) for t in (xd, wd, bd))
    nd = len(ws) - 2
    per = (lambda v: (v,) * nd if np.isscalar(v) else tuple(v))  # noqa: E731
    kept = conv_gemm._gemm_runner(xd, wd, per(stride), per(padding), per(dilation))
    for bias, form in ((None, "gemm_conv"), (bd, "gemm_conv"), (None, "kept"), (bd, "kept")):
        y = kept(xd, wd, bias) if form == "kept" else \
            conv_gemm.gemm_conv(xd, wd, bias, per(stride), per(padding), per(dilation))
        want = reference(xr, wr, None if bias is None else br, stride, padding, dilation)
        got = y.float().cpu().numpy().astype(np.float64)
        assert y.dtype == xd.dtype and tuple(y.shape) == want.shape
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
        finite = np.isfinite(want)
        scale = np.abs(want[finite]).max()
        np.testing.assert_allclose(got[finite], want[finite], rtol=TOL[dtype],
                                   atol=TOL[dtype] * scale)
    if last and nd == 2:  # channels last in, channels last out (as cuDNN answers)
        assert y.is_contiguous(memory_format=torch.channels_last)


@pytest.fixture
def fresh_choices(monkeypatch):
    """No problem raced and no call kept yet; the direct kernel left out of the race
    (these tests are of cuDNN and the GEMM form; tests/kernels/test_conv_direct_gpu.py
    races it)."""
    from pyc_lab.kernels import conv

    monkeypatch.setattr(conv_gemm, "_CHOICES", {})
    monkeypatch.setattr(conv, "_PLANS", {})
    monkeypatch.setattr(conv_gemm, "_direct_eligible", lambda *a: False)


@pytest.mark.parametrize(("margin", "impl"), [(-1e9, "gemm"), (0.999, "cudnn")])
def test_pl_conv_runs_what_the_race_chose(fresh_choices, monkeypatch, margin, impl):
    """A margin no GEMM can miss, then one none can meet: pl.conv runs the recorded
    choice, and its answer is right either way."""
    monkeypatch.setattr(conv_gemm, "MARGIN", margin)
    monkeypatch.setattr(conv_gemm, "GPU_SLACK", 1e9 if margin < 0 else 0.0)
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 3, 37, 41)).astype(np.float16)
    w = (rng.standard_normal((16, 3, 7, 7)) / 12).astype(np.float16)
    b = rng.standard_normal(16).astype(np.float16)
    args = [torch.from_numpy(a).cuda() for a in (x, w, b)]
    for _ in range(2):  # the first call races; the second runs the choice
        y = pl.conv2d(*args, stride=2, padding=3)
        want = reference(x, w, b, 2, 3)
        np.testing.assert_allclose(y.float().cpu().numpy(), want, rtol=2e-2, atol=2e-2)
    (choice,) = conv_gemm.choices().values()
    assert choice["impl"] == impl
    for impl_ in ("cudnn", "gemm"):  # a call costs the slower of its GPU and host time
        assert choice[f"{impl_}_ms"] == max(choice[f"{impl_}_gpu_ms"],
                                            choice[f"{impl_}_host_ms"]) > 0


def test_what_the_gemm_form_cannot_take_goes_to_cudnn(fresh_choices):
    rng = np.random.default_rng()
    x = torch.from_numpy(rng.standard_normal((2, 8, 12, 12)).astype(np.float32)).cuda()
    w = torch.from_numpy(rng.standard_normal((8, 1, 3, 3)).astype(np.float32)).cuda()
    y = pl.conv2d(x, w, padding=1, groups=8)  # depthwise: groups > 1
    want = reference(x.cpu().numpy(), w.cpu().numpy(), padding=1, groups=8)
    np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-3, atol=1e-3)
    assert not conv_gemm.choices()


def test_an_undecided_problem_inside_a_capture_runs_cudnn_and_stays_undecided(
        fresh_choices):
    rng = np.random.default_rng()
    x = torch.from_numpy(rng.standard_normal((2, 4, 16, 16)).astype(np.float32)).cuda()
    w = torch.from_numpy(rng.standard_normal((8, 4, 3, 3)).astype(np.float32)).cuda()
    torch.nn.functional.conv2d(x, w, padding=1)  # cuDNN's own set-up before the capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        y = pl.conv2d(x, w, padding=1)
    graph.replay()
    torch.cuda.synchronize()
    assert not conv_gemm.choices()
    want = reference(x.cpu().numpy(), w.cpu().numpy(), padding=1)
    np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-3, atol=1e-3)


def test_a_kept_plan_never_serves_a_different_call():
    """pl.conv keeps each GPU call's checks and choice by its operands' metadata and
    arguments: calls that differ in any of them are checked and answered anew."""
    from pyc_lab.errors import PycLabError

    rng = np.random.default_rng()
    w = torch.from_numpy(rng.standard_normal((6, 4, 3, 3)).astype(np.float32)).cuda()
    b = torch.from_numpy(rng.standard_normal(6).astype(np.float32)).cuda()
    for shape, kw in [((2, 4, 9, 9), {"padding": 1}), ((2, 4, 9, 9), {"padding": 1}),
                      ((3, 4, 11, 7), {"padding": 1}), ((2, 4, 9, 9), {"stride": 2}),
                      ((2, 4, 9, 9), {"padding": [1, 0]})]:  # a list: not kept, still right
        x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).cuda()
        y = pl.conv2d(x, w, b, **kw)
        pad = kw.get("padding", 0)
        want = reference(x.cpu().numpy(), w.cpu().numpy(), b.cpu().numpy(),
                         kw.get("stride", 1), tuple(pad) if isinstance(pad, list) else pad)
        np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-3, atol=1e-3)
    with pytest.raises(PycLabError, match="bias has shape"):
        pl.conv2d(x, w, b[:5], padding=1)
    with pytest.raises(PycLabError, match="different devices"):
        pl.conv2d(x, w.cpu(), padding=1)
    with pytest.raises(PycLabError, match="different array types"):
        pl.conv2d(cp.asarray(x), w, padding=1)
