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


def _race_won_by(monkeypatch, form):
    """The race times cuDNN and ``form`` (``"gemm"`` or ``"direct"``) only, ``form``
    cheaper by the race's rules (its GPU time and host time both below cuDNN's)."""
    monkeypatch.setattr(conv_gemm, "_CHOICES", {})
    monkeypatch.setattr(conv_gemm, "_RUNNERS", {})
    monkeypatch.setattr(conv_gemm, "_tuned", lambda *a, **k: (None, "not in this test"))
    other = "_direct_eligible" if form == "gemm" else "_eligible"
    monkeypatch.setattr(conv_gemm, other, lambda *a: False)
    timed = [(0.10, 0.10, 0.06), (0.05, 0.05, 0.04)]  # cuDNN, the form
    monkeypatch.setattr(conv_gemm, "time_calls", lambda runs, device: timed[:len(runs)])


@pytest.fixture
def gemm_wins(monkeypatch):
    _race_won_by(monkeypatch, "gemm")


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


@pytest.mark.parametrize("form", ["gemm", "direct", "cudnn"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_a_residual_block_in_a_graph_matches_float64(monkeypatch, form, dtype, activation):
    """``act(conv(x) + b + r)`` folded into one conv node: recorded as the GEMM form or
    the direct kernel followed by one ``act(y + r)`` kernel in the same graph (cuDNN:
    between graphs, the residual and activation added by torch), on fresh inputs and
    residuals each replay (NaN and -inf in the residual included), against float64."""
    if form == "cudnn":  # no other candidate: cuDNN, called between graphs
        monkeypatch.setattr(conv_gemm, "_CHOICES", {})
        monkeypatch.setattr(conv_gemm, "_RUNNERS", {})
        monkeypatch.setattr(conv_gemm, "_tuned", lambda *a, **k: (None, "not in this test"))
        monkeypatch.setattr(conv_gemm, "_eligible", lambda *a: False)
        monkeypatch.setattr(conv_gemm, "_direct_eligible", lambda *a: False)
    else:
        _race_won_by(monkeypatch, form)
    rng = np.random.default_rng()
    t = np.dtype(dtype)
    xs, ws, stride, pad = (2, 16, 11, 9), (24, 16, 3, 3), 1, 1
    w = (rng.uniform(-1, 1, ws) / np.sqrt(np.prod(ws[1:]))).astype(t)
    b = rng.uniform(-1, 1, ws[0]).astype(t)

    def block(x, w, b, r):
        y = pl.conv2d(x, w, b, stride=stride, padding=pad, layout="channels_last")
        y = y + r
        return np.maximum(y, t.type(0)) if activation == "relu" else y

    f = pl.compile(block, backend="cupy", cuda_graph=True)
    wc, bc = cp.asarray(w), cp.asarray(b)
    for k in range(4):
        x = rng.uniform(-1, 1, (xs[0], *xs[2:], xs[1])).astype(t)
        r = rng.uniform(-1, 1, (xs[0], *xs[2:], ws[0])).astype(t)
        if k == 2:
            r[0, 1, 2, 3], r[1, 0, 0, 0] = np.nan, -np.inf
        got = cp.asnumpy(f(cp.asarray(x), wc, bc, cp.asarray(r))).transpose(0, 3, 1, 2)
        want = _reference(x.transpose(0, 3, 1, 2), w, b, (stride,) * 2, (pad,) * 2, (1, 1),
                          1, None) + r.transpose(0, 3, 1, 2).astype(np.float64)
        if activation == "relu":
            want = np.where(np.isnan(want), want, np.maximum(want, 0))
        _check(got, want, dtype, int(np.prod(ws[1:])))
    (node,) = [n for n in f.explain(cp.asarray(x), wc, bc, cp.asarray(r)).graph.nodes.values()
               if n.op == "conv"]
    assert node.attrs.get("residual") is True
    assert [c["impl"] for c in conv_gemm.choices().values()] == ([] if form == "cudnn"
                                                                 else [form])
    kinds = [kind for kind, _ in f._fast.artifact.runner._program.program]
    if form == "cudnn":
        assert kinds != ["graph"]  # cuDNN is called between graphs
    else:
        assert kinds == ["graph"]


@pytest.mark.parametrize("kind", ["cupy", "torch"])
def test_pl_conv_with_a_residual_on_the_gpu_is_the_cpus(kind):
    """Eager ``pl.conv(..., residual=r, activation="relu")`` on CuPy arrays and torch
    tensors, channels first and last: the CPU's answer within float32 rounding; a torch
    residual that requires gradients gets ``dy`` masked by the relu."""
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 8, 12, 10)).astype(np.float32)
    w = (rng.standard_normal((16, 8, 3, 3)) / 9).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    r = rng.standard_normal((2, 16, 12, 10)).astype(np.float32)
    want = pl.conv(x, w, b, padding=1, residual=r, activation="relu")
    to = cp.asarray if kind == "cupy" else (lambda a: torch.from_numpy(a).cuda())
    back = cp.asnumpy if kind == "cupy" else (lambda a: a.detach().cpu().numpy())
    got = back(pl.conv(to(x), to(w), to(b), padding=1, residual=to(r), activation="relu",
                       tf32=False))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    last = back(pl.conv(to(np.ascontiguousarray(x.transpose(0, 2, 3, 1))), to(w), to(b),
                        padding=1, residual=to(np.ascontiguousarray(r.transpose(0, 2, 3, 1))),
                        activation="relu", layout="channels_last", tf32=False))
    np.testing.assert_allclose(last.transpose(0, 3, 1, 2), want, rtol=1e-5, atol=1e-5)
    if kind == "torch":
        rt = torch.from_numpy(r).cuda().requires_grad_()
        y = pl.conv(to(x), to(w), to(b), padding=1, residual=rt, activation="relu",
                    tf32=False)
        y.sum().backward()
        np.testing.assert_array_equal(rt.grad.cpu().numpy(), (want > 0).astype(np.float32))
