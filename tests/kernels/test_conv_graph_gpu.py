"""Convolutions recorded into a compiled program's CUDA graphs in their GEMM form
(:mod:`pyc_lab.kernels.conv_graph`): where the race chose the GEMM form for a
channels-last problem, the replay is CUDA graphs alone — the pixels read in place or
the patches gathered, cuBLAS onto the broadcast bias, the activation in place — and
matches float64 on fresh inputs (NaN included), a filter written in place seen by the
next replay."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels import conv_gemm
from tests.kernels.test_conv_direct_cpu import _check, _reference

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

#: (input NCHW, filter, stride, padding): the pixels in place (1x1 at stride 1), the
#: gather at a 1x1 stride 2, a padded 3x3 with rows padded to 16 bytes (C = 6).
_PROBLEMS = [((2, 32, 9, 7), (24, 32, 1, 1), 1, 0),
             ((3, 16, 11, 9), (40, 16, 1, 1), 2, 0),
             ((2, 6, 13, 10), (16, 6, 3, 3), 1, 1),
             ((1, 64, 7, 7), (64, 64, 3, 3), 2, 1)]


@pytest.fixture
def gemm_wins(monkeypatch):
    """The race times cuDNN and the GEMM form only, the GEMM form cheaper by the race's
    rules (its GPU time and host time both below cuDNN's)."""
    monkeypatch.setattr(conv_gemm, "_CHOICES", {})
    monkeypatch.setattr(conv_gemm, "_RUNNERS", {})
    monkeypatch.setattr(conv_gemm, "_tuned", lambda *a, **k: (None, "not in this test"))
    monkeypatch.setattr(conv_gemm, "_direct_eligible", lambda *a: False)
    timed = [(0.10, 0.10, 0.06), (0.05, 0.05, 0.04)]  # cuDNN, the GEMM form
    monkeypatch.setattr(conv_gemm, "time_calls", lambda runs, device: timed[:len(runs)])


@pytest.mark.parametrize(("dtype", "held_last"), [("float32", False), ("float32", True),
                                                  ("float16", True)])
@pytest.mark.parametrize(("xs", "ws", "stride", "pad"), _PROBLEMS)
@pytest.mark.parametrize(("bias", "activation"), [(True, "relu"), (False, None),
                                                  (True, "gelu"), (True, "silu")])
def test_the_gemm_form_is_recorded_and_matches_float64(gemm_wins, dtype, xs, ws, stride,
                                                       pad, bias, activation, held_last):
    """``held_last``: the filter held ``(O, KH, KW, C)`` and viewed ``(O, C, KH, KW)``
    in the program, as the channels-last ONNX import holds it (read in place)."""
    rng = np.random.default_rng()
    t = np.dtype(dtype)
    w = (rng.uniform(-1, 1, ws) / np.sqrt(np.prod(ws[1:]))).astype(t)
    b = rng.uniform(-1, 1, ws[0]).astype(t) if bias else None

    def held(w):
        return np.ascontiguousarray(w.transpose(0, 2, 3, 1)) if held_last else w

    def with_bias(x, w, b):
        w = w.transpose(0, 3, 1, 2) if held_last else w
        return pl.conv2d(x, w, b, stride=stride, padding=pad, layout="channels_last",
                         activation=activation)

    def without(x, w):  # every parameter given: the compiled call's fast path
        w = w.transpose(0, 3, 1, 2) if held_last else w
        return pl.conv2d(x, w, None, stride=stride, padding=pad, layout="channels_last",
                         activation=activation)

    f = pl.compile(with_bias if bias else without, backend="cupy", cuda_graph=True)
    wc = cp.asarray(held(w))
    args = (wc,) if b is None else (wc, cp.asarray(b))
    xc = cp.empty((xs[0], *xs[2:], xs[1]), t)
    for k in range(5):
        x = rng.uniform(-1, 1, xc.shape).astype(t)
        if k == 3:
            x[0, 1, 2, 3] = np.nan
        if k == 4:  # a filter written in place: the replay reads it
            w = (rng.uniform(-1, 1, ws) / np.sqrt(np.prod(ws[1:]))).astype(t)
            wc.set(held(w))
        xc.set(x)
        got = cp.asnumpy(f(xc, *args)).transpose(0, 3, 1, 2)
        want = _reference(x.transpose(0, 3, 1, 2), w, b, (stride,) * 2, (pad,) * 2, (1, 1),
                          1, activation)
        _check(got, want, dtype, int(np.prod(ws[1:])))
    assert [c["impl"] for c in conv_gemm.choices().values()] == ["gemm"]
    exe = f._fast.artifact.runner
    assert exe._program is not None
    assert [kind for kind, _ in exe._program.program] == ["graph"]
