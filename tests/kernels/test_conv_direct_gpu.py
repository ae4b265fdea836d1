"""The direct convolution kernel on the GPU: launched into NaN-poisoned outputs against
float64 (every dtype, tile, activation, 1-D and 2-D, groups, channels-last views, NaN
and infinity), as a candidate of ``pl.conv``'s first-call race, and recorded into the
CUDA graphs of a compiled program where it won (the model zoo's particle CNN too)."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels import conv_direct, conv_gemm
from tests.kernels.test_conv_direct_cpu import _PROBLEMS, _check, _reference

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _launch(x, w, b, stride, pads, dilation, groups, activation, config=None):
    """The kernel (``config``'s build, default the first of ``configs``) on torch tensors
    into a NaN-filled output."""
    geo = conv_direct.geometry(tuple(x.shape), tuple(x.stride()), tuple(w.shape), stride,
                               pads, dilation, groups)
    launch = conv_direct.launcher(conv_direct.KINDS[str(x.dtype)], geo, x.device.index,
                                  activation, config=config or conv_direct.configs(geo)[0])
    shape = (x.shape[0], w.shape[0], *((geo[8],) if x.ndim == 3 else geo[7:9]))
    y = torch.full(shape, float("nan"), dtype=x.dtype, device="cuda")
    launch(x.data_ptr(), w.data_ptr(), 0 if b is None else b.data_ptr(), y.data_ptr(),
           cp.cuda.get_current_stream())
    cp.cuda.get_current_stream().synchronize()
    return y


def _host(t):
    return t.float().cpu().numpy().astype(np.float64)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("xs", "ws", "stride", "pads", "dilation", "groups"), _PROBLEMS)
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
def test_the_kernel_matches_float64(dtype, xs, ws, stride, pads, dilation, groups,
                                    activation):
    g = torch.Generator().manual_seed(hash((xs, ws, dtype)) % 2**31)
    x = (torch.rand(xs, generator=g) * 2 - 1).to(_TORCH[dtype]).cuda()
    w = (torch.rand(ws, generator=g) * 2 - 1).to(_TORCH[dtype]).cuda()
    b = (torch.rand(ws[0], generator=g) * 2 - 1).to(_TORCH[dtype]).cuda()
    want = _reference(_host(x), _host(w), _host(b), stride, pads, dilation, groups,
                      activation)
    geo = conv_direct.geometry(xs, tuple(x.stride()), ws, stride, pads, dilation, groups)
    for config in conv_direct.configs(geo):
        got = _launch(x, w, b, stride, pads, dilation, groups, activation, config)
        _check(_host(got), want, dtype, int(np.prod(ws[1:])))


def test_large_batches_and_every_build():
    """The particle CNN's second layer at batch 4097 (a ragged last block), every build
    (the split ones too, which the race offers only to small batches), NaN and infinity
    in the input, a channels-last view."""
    x = torch.randn(4097, 32, 32, device="cuda")
    x[7, 3, 11] = float("nan")
    x[4000, 0, 0] = float("inf")
    xl = x.transpose(1, 2).contiguous().transpose(1, 2)  # channels-last memory
    w = torch.randn(32, 32, 3, device="cuda") / 8
    b = torch.randn(32, device="cuda")
    want = _reference(_host(x), _host(w), _host(b), (1,), (1,), (1,), 1, "relu")
    for xin in (x, xl):
        geo = conv_direct.geometry(tuple(xin.shape), tuple(xin.stride()), (32, 32, 3), (1,),
                                   (1,), (1,), 1)
        split = (conv_direct.Config(False, 8, 1, 32), conv_direct.Config(False, 8, 1, 8))
        for config in (*conv_direct.configs(geo), *split):
            got = _launch(xin, w, b, (1,), (1,), (1,), 1, "relu", config)
            _check(_host(got), want, "float32", 96)


def test_pl_conv_races_the_direct_kernel():
    """A small problem's first call times the direct kernel beside cuDNN; whatever wins,
    every call answers float64's values."""
    rng = np.random.default_rng()
    x = rng.standard_normal((64, 4, 32)).astype(np.float32)
    w = rng.standard_normal((32, 4, 3)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    want = _reference(x, w, b, (1,), (0,), (1,), 1, "relu")
    for _ in range(3):
        got = cp.asnumpy(pl.conv1d(cp.asarray(x), cp.asarray(w), cp.asarray(b),
                                   activation="relu"))
        _check(got, want, "float32", 12)
    raced = [c for c in conv_gemm.choices().values() if "direct_ms" in c]
    assert raced, "the direct kernel was not a candidate"
    assert all(np.isfinite(c["direct_gpu_ms"]) for c in raced)


def test_a_compiled_program_records_the_direct_conv_into_its_graph(monkeypatch):
    """Where the race chose the direct kernel, the compiled program's replay is one CUDA
    graph (no library call between graphs) and each replay sees the new input."""
    monkeypatch.setattr(conv_gemm, "keeps", lambda cand, lib: True)  # the race keeps it
    monkeypatch.setattr(conv_gemm, "_eligible", lambda *a: False)  # over the GEMM form
    rng = np.random.default_rng()
    w = (rng.standard_normal((16, 6, 3)) / 4).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)

    def block(x, w, b):
        h = np.maximum(pl.conv1d(x * np.float32(2), w, b, padding=1), 0)
        return h.mean(axis=-1)

    f = pl.compile(block, backend="cupy", cuda_graph=True)
    wc, bc = cp.asarray(w), cp.asarray(b)
    xc = cp.empty((5, 6, 41), np.float32)
    for k in range(5):
        x = rng.standard_normal((5, 6, 41)).astype(np.float32)
        if k == 4:
            x[2, 1, 7] = np.nan
        xc.set(x)
        got = cp.asnumpy(f(xc, wc, bc))
        want = _reference(x * 2, w, b, (1,), (1,), (1,), 1, "relu").mean(axis=-1)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
        assert np.isnan(got).any() == (k == 4)
    exe = f._fast.artifact.runner
    assert exe._program is not None
    assert [kind for kind, _ in exe._program.program] == ["graph"]


def test_a_channels_last_conv_of_a_channels_first_input_records_the_direct_kernel(
        monkeypatch):
    """The channels-last import's first convolution reads the model's channels-first
    input through a transposed view: where the direct kernel won that problem's race (it
    reads any strides), the replay is one CUDA graph — the kernel into a scratch array
    copied across into the channels-last output — matching float64, NaN included."""
    monkeypatch.setattr(conv_gemm, "keeps", lambda cand, lib: True)  # the race keeps it
    monkeypatch.setattr(conv_gemm, "_eligible", lambda *a: False)  # over the GEMM form
    monkeypatch.setattr(conv_gemm, "_tuned", lambda *a, **k: (None, "not in this test"))
    rng = np.random.default_rng()
    w = (rng.standard_normal((8, 3, 3, 3)) / 4).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)

    def block(x, w, b):
        y = pl.conv2d(x.transpose(0, 2, 3, 1), w, b, stride=2, padding=1,
                      layout="channels_last", activation="relu")
        return y + np.float32(1)

    f = pl.compile(block, backend="cupy", cuda_graph=True)
    wc, bc = cp.asarray(w), cp.asarray(b)
    xc = cp.empty((2, 3, 19, 21), np.float32)
    for k in range(5):
        x = rng.standard_normal(xc.shape).astype(np.float32)
        if k == 4:
            x[1, 2, 9, 9] = np.nan
        xc.set(x)
        got = cp.asnumpy(f(xc, wc, bc)).transpose(0, 3, 1, 2)
        want = _reference(x, w, b, (2, 2), (1, 1), (1, 1), 1, "relu") + 1
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
        assert np.isnan(got).any() == (k == 4)
    assert [c["impl"] for c in conv_gemm.choices().values()
            if c.get("direct_gpu_ms") is not None][-1] == "direct"
    exe = f._fast.artifact.runner
    assert exe._program is not None
    assert [kind for kind, _ in exe._program.program] == ["graph"]


def test_the_zoo_particle_cnn_races_its_convolutions():
    """The particle CNN imported from ONNX: its small convolutions are pl.conv nodes,
    each raced with the direct kernel at the first call, and the model answers as on
    NumPy whichever won."""
    from pyc_lab.inference import zoo

    model = pl.inference.load(zoo.build("particle_cnn"), backend="cupy", cuda_graph=True)
    feeds = zoo.example_inputs("particle_cnn", batch=256)
    ref = pl.inference.load(zoo.build("particle_cnn"), backend="numpy")
    want = ref.run(list(feeds.values()))
    for _ in range(3):
        got = model.run([cp.asarray(v) for v in feeds.values()])
        for g_, w_ in zip(got, want, strict=True):
            np.testing.assert_allclose(cp.asnumpy(g_), w_, rtol=1e-4, atol=1e-5)
    shapes = {(k[2], k[4]) for k, c in conv_gemm.choices().items() if "direct_ms" in c}
    assert {((256, 4, 32), (32, 4, 3)), ((256, 32, 32), (32, 32, 3))} <= shapes
