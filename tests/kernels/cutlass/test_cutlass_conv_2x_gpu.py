"""pyc_lab's CUTLASS 2 (Ampere-class) convolutions on a GPU: a network stem's three input
channels, which TMA cannot load, and an aligned layer, against the convolution in
float64 (odd sizes, strides, padding, bias + relu, NaN), with poisoned outputs and
re-bound pointers; float32 at its own accuracy (3xTF32) against TF32; and the stem
tuned over this family (its channels padded to 4 as a candidate) and raced by
``pl.conv``.

The kernels go to the session's kernel cache (``$PYC_LAB_TEST_KERNEL_CACHE`` when set);
``python tests/kernels/cutlass/test_cutlass_conv_2x_gpu.py DIR`` builds them there
without a GPU.
"""

from __future__ import annotations

import os
import sys
from math import prod

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels.cache import KernelCache
from pyc_lab.kernels.cutlass.conv import ConvGeometry, ConvKernel
from pyc_lab.kernels.cutlass.conv_2x import (
    CutlassConv2x,
    build_conv2x,
    conv2x_align,
    conv2x_configs,
)

#: name -> (kernel, input channels, output channels): each runs the first configuration
#: conv2x_configs ranks for its channels as given (no padding).
KERNELS = {
    "f16_stem_bias_relu": (ConvKernel("f16", 2, True, "relu"), 3, 64),
    "bf16_stem": (ConvKernel("bf16", 2), 3, 64),
    "f16_aligned": (ConvKernel("f16", 2), 64, 64),
    # the stem with its channels padded to 4: the fixed-channels iterator, 8-byte cp.async
    "f16_stem4_bias_relu": (ConvKernel("f16", 2, True, "relu"), 4, 64),
    "bf16_stem4": (ConvKernel("bf16", 2), 4, 64),
    # float32: at its own accuracy (3xTF32), and as TF32 for contrast
    "f32_bias_relu": (ConvKernel("f32", 2, True, "relu"), 64, 64),
    "tf32": (ConvKernel("tf32", 2), 64, 64),
    # a residual block's sum in the epilogue: relu(conv + bias + r), and without relu
    "f32_bias_res_relu": (ConvKernel("f32", 2, True, "relu", residual=True), 64, 64),
    "f16_bias_res": (ConvKernel("f16", 2, True, residual=True), 64, 64),
}


def planned_builds() -> list[tuple]:
    """(config, kernel, align) of every kernel the tests use."""
    return [(next(cfg for cfg in conv2x_configs(k, c, o) if not cfg.pad_to), k,
             conv2x_align(k.dtype, c)) for k, c, o in KERNELS.values()]


def prebuild(directory: str) -> None:
    """Build :func:`planned_builds` into ``directory`` (no GPU needed)."""
    cache = KernelCache(directory)
    for cfg, kern, align in planned_builds():
        res = build_conv2x(cfg, kern, align, cache=cache)
        print(res.status, kern.op, kern.dtype, cfg.id, res.message[:200], flush=True)


if __name__ == "__main__":  # the prebuild needs nvcc, not torch or a GPU
    prebuild(sys.argv[1] if len(sys.argv) > 1 else ".kcache")
    sys.exit(0)

torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    cache = KernelCache(os.environ.get("PYC_LAB_TEST_KERNEL_CACHE")
                        or tmp_path_factory.mktemp("kernels"))
    out = {}
    for name, (cfg, kern, align) in zip(KERNELS, planned_builds(), strict=True):
        res = build_conv2x(cfg, kern, align, cache=cache)
        assert res.ok, res.message
        out[name] = CutlassConv2x(res.library, cfg, kern, align=align)
    return out


def _reference(x, w, b, stride, pad, activation):
    """The convolution in float64 on the CPU, channels first in, channels last out."""
    import torch.nn.functional as F

    y = F.conv2d(x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu(),
                 stride=stride, padding=pad)
    if activation == "relu":
        y = torch.relu(y)
    return y.permute(0, 2, 3, 1).numpy()


def _run(conv, x, w, b, stride, pad, r=None, in_place=False):
    """Run ``conv`` on channels-first tensors into a NaN-poisoned output (``r``: a
    residual kernel's residual, channels last; ``in_place``: the output written over
    a copy of it)."""
    g = ConvGeometry.from_channels_first(x.shape, w.shape, stride, pad, (1, 1))
    xl = x.permute(0, 2, 3, 1).contiguous()
    wl = w.permute(0, 2, 3, 1).contiguous()
    y = r.clone() if in_place else \
        torch.full(g.out_shape, float("nan"), device="cuda", dtype=x.dtype)
    rp = None if r is None else (y if in_place else r).data_ptr()
    conv.run(g, xl.data_ptr(), wl.data_ptr(), None if b is None else b.data_ptr(),
             y.data_ptr(), torch.cuda.current_stream().cuda_stream, rp)
    torch.cuda.synchronize()
    return y.float().cpu().numpy()


TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2}
CASES = [  # name, x shape (channels first), w shape, stride, padding
    ("f16_stem_bias_relu", (2, 3, 37, 45), (64, 3, 7, 7), (2, 2), (3, 3)),
    ("f16_stem_bias_relu", (3, 3, 16, 9), (8, 3, 3, 3), (1, 1), (1, 1)),
    ("bf16_stem", (2, 3, 33, 31), (64, 3, 7, 7), (2, 2), (3, 3)),
    ("bf16_stem", (1, 3, 11, 13), (24, 3, 5, 3), (1, 2), (2, 0)),
    ("f16_aligned", (2, 64, 15, 13), (64, 64, 3, 3), (1, 1), (1, 1)),
    ("f16_aligned", (3, 64, 9, 9), (72, 64, 1, 1), (2, 2), (0, 0)),
    ("f16_stem4_bias_relu", (2, 4, 37, 45), (64, 4, 7, 7), (2, 2), (3, 3)),
    ("bf16_stem4", (3, 4, 19, 17), (32, 4, 3, 5), (1, 2), (1, 2)),
]


@pytest.mark.parametrize(("name", "xs", "ws", "stride", "pad"), CASES)
def test_kernels_match_float64(kernels, name, xs, ws, stride, pad):
    conv = kernels[name]
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[conv.kernel.dtype]  # 16-bit cases
    x = (torch.rand(xs, device="cuda") * 2 - 1).to(dt)
    w = (torch.rand(ws, device="cuda") * 2 - 1).div(np.sqrt(np.prod(ws[1:]))).to(dt)
    b = (torch.rand(ws[0], device="cuda") * 2 - 1).to(dt) if conv.kernel.bias else None
    got = _run(conv, x, w, b, stride, pad)
    want = _reference(x, w, b, stride, pad, conv.kernel.activation)
    assert got.shape == want.shape and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=TOL[dt], atol=TOL[dt] * np.abs(want).max())


@pytest.mark.parametrize(("xs", "ws", "stride", "pad"), [
    ((2, 64, 15, 13), (64, 64, 3, 3), (1, 1), (1, 1)),
    ((3, 64, 9, 7), (72, 64, 1, 1), (2, 2), (0, 0)),
    ((1, 64, 12, 17), (64, 64, 5, 3), (2, 1), (2, 0)),
])
def test_f32_kernels_keep_float32_accuracy_where_tf32_ones_do_not(kernels, xs, ws, stride,
                                                                  pad):
    """The 3xTF32 kernel (bias + relu) is within float32 rounding of the float64
    convolution — 2e-5 of the largest output over reductions of 64 to 960 terms — on
    inputs that are not TF32 values, NaN-poisoned output first; the TF32 kernel of the
    same tiles misses that bound by its 10-bit mantissa on the same inputs."""
    exact, tf32 = kernels["f32_bias_relu"], kernels["tf32"]
    assert exact.kernel.dtype == "f32"
    x = torch.rand(xs, device="cuda") * 2 - 1
    w = (torch.rand(ws, device="cuda") * 2 - 1) / np.sqrt(np.prod(ws[1:]))
    b = torch.rand(ws[0], device="cuda") * 2 - 1
    got = _run(exact, x, w, b, stride, pad)
    want = _reference(x, w, b, stride, pad, "relu")
    assert got.shape == want.shape and np.isfinite(got).all()
    scale = np.abs(want).max()
    err = np.abs(got - want).max() / scale
    assert err <= 2e-5, err
    loose = _run(tf32, x, w, None, stride, pad)
    plain = _reference(x, w, None, stride, pad, None)
    tf32_err = np.abs(loose - plain).max() / np.abs(plain).max()
    assert tf32_err > 2e-5 and tf32_err > 10 * err, (tf32_err, err)


def test_nan_reaches_the_outputs_that_read_it_and_kernel_call_keeps_it_there(kernels):
    """The aligned kernel (optimized iterator) puts NaN and infinity exactly where the
    float64 convolution does. The few-channels stem kernel folds the window into a
    reduction rounded up to the K tile and reads the pixels of those extra taps (their
    filter values masked to zero): a NaN at row 14 turns output row 5 (window rows
    7-13, extra tap row 14) NaN as well. kernel_call, what pl.conv runs, wraps it in
    conv_guard's check and fix-up, so the caller sees exactly the reference's NaN."""
    from pyc_lab.kernels.conv_cutlass import kernel_call

    aligned = kernels["f16_aligned"]
    x = (torch.rand((2, 64, 13, 11), device="cuda") * 2 - 1).half()
    w = ((torch.rand((64, 64, 3, 3), device="cuda") * 2 - 1) / 24).half()
    x[0, 5, 6, 4] = float("nan")
    x[1, 60, 0, 10] = float("inf")
    got = _run(aligned, x, w, None, (1, 1), (1, 1))
    want = _reference(x, w, None, (1, 1), (1, 1), None)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    assert np.isnan(got).any() and not aligned.config.reads_outside_window

    stem = kernels["bf16_stem"]
    assert stem.config.reads_outside_window
    x = (torch.rand((2, 3, 29, 31), device="cuda") * 2 - 1).to(torch.bfloat16)
    w = ((torch.rand((64, 3, 7, 7), device="cuda") * 2 - 1) / 12).to(torch.bfloat16)
    x[1, 2, 14, 3] = float("nan")
    want = _reference(x, w, None, (2, 2), (3, 3), None)
    raw = _run(stem, x, w, None, (2, 2), (3, 3))
    assert (np.isnan(raw) >= np.isnan(want)).all()  # every output that reads it
    assert np.isnan(raw[1, 5]).any() and not np.isnan(want[1, 5]).any()  # and more
    g = ConvGeometry.from_channels_first(x.shape, w.shape, (2, 2), (3, 3), (1, 1))
    xc = x.contiguous(memory_format=torch.channels_last)
    got = kernel_call(stem, g)(xc, w, None).permute(0, 2, 3, 1).float().cpu().numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2 * np.nanmax(np.abs(want)))


@pytest.mark.parametrize(("name", "xs", "ws", "stride", "pad"), [
    ("f32_bias_res_relu", (3, 64, 14, 14), (64, 64, 1, 1), (1, 1), (0, 0)),
    ("f32_bias_res_relu", (2, 64, 15, 13), (72, 64, 3, 3), (2, 1), (1, 1)),
    ("f16_bias_res", (2, 64, 9, 11), (64, 64, 3, 3), (1, 1), (1, 1)),
])
def test_a_residual_kernel_adds_the_residual_after_the_bias(kernels, name, xs, ws, stride,
                                                            pad):
    """``act(conv + bias + r)`` in the epilogue, against float64 (the sum before the
    relu): NaN-poisoned output, NaN, +-inf and -0.0 in the residual where the reference
    has them; the same answer written over the residual itself (each element read
    before it is written), and through slices of the batch; refused without its
    residual."""
    conv = kernels[name]
    dt = torch.float32 if conv.kernel.dtype == "f32" else torch.float16
    tol = 2e-5 if dt == torch.float32 else 1e-2
    x = (torch.rand(xs, device="cuda") * 2 - 1).to(dt)
    w = ((torch.rand(ws, device="cuda") * 2 - 1) / np.sqrt(np.prod(ws[1:]))).to(dt)
    b = (torch.rand(ws[0], device="cuda") * 2 - 1).to(dt)
    g = ConvGeometry.from_channels_first(xs, ws, stride, pad, (1, 1))
    r = (torch.rand(g.out_shape, device="cuda") * 2 - 1).to(dt)  # channels last
    flat = r.view(-1)
    flat[[5, 77, 150, 301]] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0],
                                           device="cuda", dtype=dt)
    want = _reference(x, w, b, stride, pad, None) + r.double().cpu().numpy()
    if conv.kernel.activation == "relu":
        want = np.where(np.isnan(want), want, np.maximum(want, 0))
    got = _run(conv, x, w, b, stride, pad, r)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    scale = np.abs(want[finite]).max()
    assert np.abs(got[finite] - want[finite]).max() <= tol * scale
    assert np.isnan(got).sum() == 1  # only the NaN's own output
    np.testing.assert_array_equal(_run(conv, x, w, b, stride, pad, r, in_place=True), got)
    conv.max_tensor_bytes = max(prod(g.act[1:]), prod(g.out_shape[1:])) * r.element_size()
    try:
        assert len(conv.slices(g)) == xs[0]
        np.testing.assert_array_equal(_run(conv, x, w, b, stride, pad, r), got)
    finally:
        del conv.max_tensor_bytes
    with pytest.raises(pl.PycLabError, match="a residual is needed"):
        _run(conv, x, w, b, stride, pad)


def test_rebinding_and_refusals(kernels):
    conv = kernels["f16_stem_bias_relu"]
    for _ in range(2):  # new tensors each call: the problem is bound again
        x = torch.randn((2, 3, 12, 12), device="cuda", dtype=torch.float16)
        w = torch.randn((64, 3, 3, 3), device="cuda", dtype=torch.float16) / 5
        b = torch.randn(64, device="cuda", dtype=torch.float16)
        got = _run(conv, x, w, b, (1, 1), (1, 1))
        want = _reference(x, w, b, (1, 1), (1, 1), "relu")
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    odd_k = ConvGeometry.from_channels_first((2, 3, 8, 8), (12, 3, 3, 3), (1, 1), (1, 1),
                                             (1, 1))
    assert not conv.can_implement(odd_k)  # K = 12: not a multiple of the 8-wide stores
    with pytest.raises(pl.PycLabError, match="align_out"):
        conv.run(odd_k, 1, 1, 1, 1, 0)
    assert not kernels["f16_aligned"].can_implement(
        ConvGeometry.from_channels_first((2, 3, 8, 8), (64, 3, 3, 3), (1, 1), (1, 1), (1, 1)))


def test_a_batch_in_slices_is_the_batch_run_whole(kernels):
    """A batch run in slices (here under a small byte limit, set on the instance) gives
    exactly what one launch over the whole batch gives: each image's pointers moved by
    whole images, the slices' geometries bound in turn."""
    conv = kernels["f32_bias_relu"]
    x = torch.rand((7, 64, 11, 9), device="cuda") * 2 - 1
    w = (torch.rand((64, 64, 3, 3), device="cuda") * 2 - 1) / 24
    b = torch.rand(64, device="cuda") * 2 - 1
    whole = _run(conv, x, w, b, (2, 1), (1, 1))
    conv.max_tensor_bytes = 3 * 11 * 9 * 64 * 4  # three images a launch
    try:
        g = ConvGeometry.from_channels_first(x.shape, w.shape, (2, 1), (1, 1), (1, 1))
        assert [p.act[0] for _, p in conv.slices(g)] == [3, 3, 1]
        sliced = _run(conv, x, w, b, (2, 1), (1, 1))
    finally:
        del conv.max_tensor_bytes
    assert np.isfinite(sliced).all()
    np.testing.assert_array_equal(sliced, whole)


def test_a_batch_over_two_gib_matches_exact_cudnn(kernels):
    """float32 activations of more than 2^31 bytes (9 x 1000 x 1000 x 64: 2.3 GB), which
    the family's 32-bit offsets cannot address in one launch: run in two slices, every
    output written (NaN-poisoned first) and within float32 rounding of cuDNN with TF32
    off."""
    import torch.nn.functional as F

    conv = kernels["f32_bias_relu"]
    x = torch.rand((9, 64, 1000, 1000), device="cuda").mul_(2).sub_(1)
    w = (torch.rand((64, 64, 3, 3), device="cuda") * 2 - 1) / 24
    b = torch.rand(64, device="cuda") * 2 - 1
    g = ConvGeometry.from_channels_first(x.shape, w.shape, (1, 1), (1, 1), (1, 1))
    assert prod(g.act) * 4 >= 2**31 and len(conv.slices(g)) == 2
    xl = x.permute(0, 2, 3, 1).contiguous()
    wl = w.permute(0, 2, 3, 1).contiguous()
    y = torch.full(g.out_shape, float("nan"), device="cuda")
    conv.run(g, xl.data_ptr(), wl.data_ptr(), b.data_ptr(), y.data_ptr(),
             torch.cuda.current_stream().cuda_stream)
    del xl
    was = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        want = torch.relu(F.conv2d(x, w, b, padding=1)).permute(0, 2, 3, 1)
    finally:
        torch.backends.cudnn.allow_tf32 = was
    assert not torch.isnan(y).any().item()
    err = float((y - want).abs().max()) / float(want.abs().max())
    assert err <= 2e-5, err


def test_the_stem_is_tuned_over_this_family_and_pl_conv_runs_the_winner(monkeypatch,
                                                                         fresh_conv_state):
    """autotune_conv on a 3-channel problem (which the Hopper kernels refuse) checks and
    times CUTLASS 2 candidates — one reading the channels as given, one reading them
    zero-padded to 4 — against cuDNN and records the winner; pl.conv's lookup returns a
    call of it whose answer (padding done per call) matches float64, NaN included, and
    its race offers it. These kernels read pixels outside the window: a NaN input gets
    the guard's exact answer (conv_guard's fix-up), a finite one the kernel's."""
    from pyc_lab.kernels import conv_cutlass, conv_gemm

    # tuned into the user's kernel cache, where pl.conv looks (the lane copies the
    # carried kernels there)
    kern = ConvKernel("f16", 2, True, "relu")
    ranked = conv2x_configs(kern, 3, 64)
    plain = next(c for c in ranked if not c.pad_to)
    padded = ranked[0]
    assert padded.pad_to == 4 and padded.iterator == "fixed_channels"
    xs, ws = (3, 3, 29, 31), (64, 3, 7, 7)
    res = pl.autotune_conv(xs, ws, stride=2, padding=3, dtype="f16", bias=True,
                           activation="relu", restrict=lambda c: c in (plain, padded),
                           repeats=5)
    assert res.recorded and res.best is not None and res.best.ok, res.table
    rows = {r["config"]: r for r in res.table.to_dict("records")}
    assert set(rows) == {plain.id, padded.id}
    assert {r["status"] for r in rows.values()} == {"ok"}, rows
    assert res.baselines["cudnn"] > 0
    x = (torch.rand(xs, device="cuda") * 2 - 1).half().contiguous(
        memory_format=torch.channels_last)
    w = ((torch.rand(ws, device="cuda") * 2 - 1) / 12).half().contiguous(
        memory_format=torch.channels_last)
    b = (torch.rand(64, device="cuda") * 2 - 1).half()
    x[1, 2, 14, 3] = float("nan")
    for cfg in (plain, padded):  # each candidate as pl.conv would call it
        _pin(res, cfg)
        monkeypatch.setattr(conv_cutlass, "_MEMO", {})
        fn, why = conv_cutlass.tuned_runner(x, w, b, (2, 2), (3, 3), (1, 1), "relu")
        assert fn is not None and cfg.id in why, why
        y = fn(x, w, b)
        torch.cuda.synchronize()
        want = _reference(x, w, b, (2, 2), (3, 3), "relu")
        got = y.permute(0, 2, 3, 1).float().cpu().numpy()
        assert y.is_contiguous(memory_format=torch.channels_last)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))  # the fix-up's
        assert np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.nanmax(np.abs(want)))
        # a finite input: the kernel's answer
        xf = torch.nan_to_num(x)
        y = fn(xf, w, b)
        torch.cuda.synchronize()
        want = _reference(xf, w, b, (2, 2), (3, 3), "relu")
        got = y.permute(0, 2, 3, 1).float().cpu().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
        # the filter written in place (an optimiser step): the next call reads the new one
        w2 = w.clone().mul_(-0.5)
        w.copy_(w2)
        y = fn(xf, w, b)
        torch.cuda.synchronize()
        want = _reference(xf, w2, b, (2, 2), (3, 3), "relu")
        got = y.permute(0, 2, 3, 1).float().cpu().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    # pl.conv's race offers the tuned winner beside cuDNN and the GEMM form
    _pin(res, conv_cutlass.conv_config_of(res.best.config))
    monkeypatch.setattr(conv_cutlass, "_MEMO", {})
    y = pl.conv2d(x, w, b, stride=2, padding=3, activation="relu")
    choice = conv_gemm.choice_for(x, w, b, (2, 2), (3, 3), (1, 1), 1, "relu")
    assert choice is not None and choice["cutlass_ms"] > 0
    assert res.best.config == conv_cutlass.conv_config_of(res.best.config).to_dict()
    assert conv_cutlass.conv_config_of(res.best.config).id in choice["cutlass_kernel"]
    got = y.permute(0, 2, 3, 1).float().cpu().numpy()
    want = _reference(x, w, b, (2, 2), (3, 3), "relu")
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.nanmax(np.abs(want)))


def test_f32_is_tuned_against_exact_cudnn_and_raced_by_an_exact_pl_conv(monkeypatch,
                                                                        fresh_conv_state):
    """autotune_conv in ``f32`` times its 3xTF32 candidates against cuDNN with TF32 off
    (whatever torch's setting) and checks them within float32's accuracy; pl.conv with
    ``tf32=False`` finds the winner, races it, and answers within float32 rounding of
    float64; with TF32 allowed the lookup is the ``tf32`` one and finds nothing."""
    from pyc_lab.kernels import conv_cutlass, conv_gemm

    kern = ConvKernel("f32", 2, True, "relu")
    first = conv2x_configs(kern, 64, 64)[0]
    xs, ws = (4, 64, 21, 19), (64, 64, 3, 3)
    torch.backends.cudnn.allow_tf32 = True  # torch's default: the baseline turns it off
    res = pl.autotune_conv(xs, ws, stride=1, padding=1, dtype="f32", bias=True,
                           activation="relu", restrict=lambda c: c == first, repeats=5)
    assert res.recorded and res.best is not None and res.best.ok, res.table
    rows = res.table.to_dict("records")
    assert rows[0]["status"] == "ok" and rows[0]["error"] <= 1e-4, rows
    assert torch.backends.cudnn.allow_tf32  # the user's setting is back
    x = (torch.rand(xs, device="cuda") * 2 - 1).contiguous(memory_format=torch.channels_last)
    w = ((torch.rand(ws, device="cuda") * 2 - 1) / 24).contiguous(
        memory_format=torch.channels_last)
    b = torch.rand(64, device="cuda") * 2 - 1
    fn, why = conv_cutlass.tuned_runner(x, w, b, (1, 1), (1, 1), (1, 1), "relu")
    assert fn is None and "no tuned tf32" in why  # TF32 allowed: a tf32 kernel is asked
    y = pl.conv2d(x, w, b, stride=1, padding=1, activation="relu", tf32=False)
    choice = conv_gemm.choice_for(x, w, b, (1, 1), (1, 1), (1, 1), 1, "relu")
    # the key carries the TF32 settings the race ran under: read it under the same
    assert choice is None
    from pyc_lab.kernels.conv_library import tf32_allowed

    with tf32_allowed(False):
        choice = conv_gemm.choice_for(x, w, b, (1, 1), (1, 1), (1, 1), 1, "relu")
    assert choice is not None and choice["cutlass_ms"] > 0, choice
    assert first.id in choice["cutlass_kernel"]
    got = y.permute(0, 2, 3, 1).float().cpu().numpy()
    want = _reference(x, w, b, (1, 1), (1, 1), "relu")
    assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()


def test_a_compiled_channels_last_conv_records_the_tuned_kernel(monkeypatch,
                                                                fresh_conv_state):
    """Where the race chose the tuned 3xTF32 kernel for a channels-last ``pl.conv`` in
    a compiled program, the replay is CUDA graphs alone (the kernel's launch and its
    filter's copy recorded, no call between graphs), each replay sees the new input and
    a filter written in place, within float32 rounding of float64; between graphs
    (``bound_conv``), the channels-last call is bound once too."""
    from pyc_lab.kernels import conv as kconv

    xs, ws = (3, 64, 17, 23), (64, 64, 3, 3)
    _tune_and_keep(monkeypatch, xs, ws)
    rng = np.random.default_rng()
    w = (rng.standard_normal(ws) / 24).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)

    def block(x, w, b):
        y = pl.conv2d(x * np.float32(0.5), w, b, padding=1, layout="channels_last",
                      activation="relu")
        return y * np.float32(2) + np.float32(1)

    f = pl.compile(block, backend="cupy", cuda_graph=True)
    wc, bc = cp.asarray(w), cp.asarray(b)
    xc = cp.empty((xs[0], *xs[2:], xs[1]), np.float32)  # (N, H, W, C): read in place
    for k in range(5):
        x = rng.standard_normal(xc.shape).astype(np.float32)
        if k == 4:  # a filter written in place (an optimiser step): the replay reads it
            w = (rng.standard_normal(ws) / 24).astype(np.float32)
            wc.set(w)
        xc.set(x)
        got = cp.asnumpy(f(xc, wc, bc))
        x_first = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
        want = _reference(x_first * 0.5, torch.from_numpy(w), torch.from_numpy(b), (1, 1),
                          (1, 1), "relu") * 2 + 1
        assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max(), k
    exe = f._fast.artifact.runner
    assert exe._program is not None
    assert [kind for kind, _ in exe._program.program] == ["graph"]
    # the same problem between graphs: bound once, the answer into the given array
    out = cp.full((xs[0], *xs[2:], 64), np.nan, np.float32)
    xh = cp.asarray(rng.standard_normal(xc.shape).astype(np.float32))
    call = kconv.bound_conv(xh, wc, bc, out, padding=1, layout="channels_last",
                            activation="relu", tf32=False)
    assert call is not None
    call()
    want = _reference(torch.from_numpy(cp.asnumpy(xh).transpose(0, 3, 1, 2).copy()),
                      torch.from_numpy(w), torch.from_numpy(b), (1, 1), (1, 1), "relu")
    got = cp.asnumpy(out)
    assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()


def test_a_compiled_residual_block_records_the_tuned_residual_kernel(monkeypatch,
                                                                     fresh_conv_state):
    """``relu(conv(x) + r)`` in a compiled channels-last program folds into one conv
    node; tuned with ``residual=True`` (its candidates checked against exact cuDNN plus
    torch's add), the race offers the residual kernel and the replay records it: one
    CUDA graph, the residual read in the epilogue, within float32 rounding of float64
    on new inputs each replay."""
    from pyc_lab.kernels import conv_gemm

    xs, ws = (3, 64, 17, 23), (64, 64, 3, 3)
    res, first = _tune_and_keep(monkeypatch, xs, ws, residual=True)
    assert res.problem.op == "conv2d_fprop_bias_res_relu"
    rng = np.random.default_rng()
    w = (rng.standard_normal(ws) / 24).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)

    def block(x, w, b, r):
        y = pl.conv2d(x, w, b, padding=1, layout="channels_last")
        return np.maximum(y + r, np.float32(0))

    f = pl.compile(block, backend="cupy", cuda_graph=True)
    wc, bc = cp.asarray(w), cp.asarray(b)
    shape_x, shape_y = (xs[0], *xs[2:], xs[1]), (xs[0], *xs[2:], ws[0])
    for k in range(4):
        x = rng.standard_normal(shape_x).astype(np.float32)
        r = rng.standard_normal(shape_y).astype(np.float32)
        got = cp.asnumpy(f(cp.asarray(x), wc, bc, cp.asarray(r)))
        y64 = _reference(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()),
                         torch.from_numpy(w), torch.from_numpy(b), (1, 1), (1, 1), None)
        want = np.maximum(y64 + r, 0)
        assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max(), k
    convs = [n for n in f.explain(cp.asarray(x), wc, bc, cp.asarray(r)).graph.nodes.values()
             if n.op == "conv"]
    assert len(convs) == 1 and convs[0].attrs.get("residual") is True
    from pyc_lab.kernels.conv_library import tf32_allowed

    with tf32_allowed(False):
        choice = conv_gemm.choice_for_cupy(
            cp.empty(shape_x, np.float32).transpose(0, 3, 1, 2), wc, bc, (1, 1), (1, 1),
            (1, 1), 1, "relu", True)
    assert choice is not None and choice["impl"] == "cutlass", choice
    assert first.id in choice["cutlass_kernel"]
    exe = f._fast.artifact.runner
    assert exe._program is not None
    assert [kind for kind, _ in exe._program.program] == ["graph"]


def test_a_graph_records_the_tuned_kernel_where_it_is_cheaper_there(monkeypatch,
                                                                   fresh_conv_state):
    """The race kept cuDNN (its calls cheaper back to back), but in a CUDA graph cuDNN
    runs between graphs and costs its GPU time plus its host time, the tuned kernel its
    GPU time alone: the compiled channels-last conv records the tuned kernel, and the
    replay, one graph, matches float64 (the race's timings are given, the kernel's
    answers are the GPU's)."""
    from pyc_lab.kernels import conv_gemm

    kern = ConvKernel("f32", 2, True, "relu")
    first = conv2x_configs(kern, 64, 64)[0]  # the build of the test above
    xs, ws = (2, 64, 13, 11), (64, 64, 3, 3)
    res = pl.autotune_conv(xs, ws, stride=1, padding=1, dtype="f32", bias=True,
                           activation="relu", restrict=lambda c: c == first, repeats=5)
    assert res.recorded and res.best is not None and res.best.ok, res.table
    _pin(res, first)
    monkeypatch.setattr(conv_gemm, "keeps", lambda cand, lib: False)  # cuDNN wins
    monkeypatch.setattr(conv_gemm, "_eligible", lambda *a: False)
    timed = [(0.10, 0.05, 0.10), (0.11, 0.06, 0.11)]  # cuDNN, the tuned kernel
    monkeypatch.setattr(conv_gemm, "time_calls", lambda runs, device: timed[:len(runs)])
    rng = np.random.default_rng()
    w = (rng.standard_normal(ws) / 24).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)

    def block(x, w, b):
        return pl.conv2d(x, w, b, padding=1, layout="channels_last", activation="relu")

    f = pl.compile(block, backend="cupy", cuda_graph=True)
    wc, bc = cp.asarray(w), cp.asarray(b)
    xc = cp.empty((xs[0], *xs[2:], xs[1]), np.float32)
    for k in range(4):
        x = rng.standard_normal(xc.shape).astype(np.float32)
        xc.set(x)
        got = cp.asnumpy(f(xc, wc, bc))
        want = _reference(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()),
                          torch.from_numpy(w), torch.from_numpy(b), (1, 1), (1, 1), "relu")
        assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max(), k
    raced = [c for c in conv_gemm.choices().values() if "cutlass_gpu_ms" in c]
    assert raced and raced[-1]["impl"] == "cudnn"
    exe = f._fast.artifact.runner
    assert exe._program is not None
    assert [kind for kind, _ in exe._program.program] == ["graph"]


def _tune_and_keep(monkeypatch, xs, ws, residual=False):
    """Tune the f32 bias + relu problem (``residual``: with it) over the first
    configuration the fixture built, pin it as the winner and make ``pl.conv``'s race
    keep it over cuDNN and the GEMM form; ``(result, config)``."""
    from pyc_lab.kernels import conv_gemm

    first = conv2x_configs(ConvKernel("f32", 2, True, "relu", residual=residual),
                           xs[1], ws[0])[0]
    res = pl.autotune_conv(xs, ws, stride=1, padding=1, dtype="f32", bias=True,
                           activation="relu", residual=residual,
                           restrict=lambda c: c == first, repeats=5)
    assert res.recorded and res.best is not None and res.best.ok, res.table
    _pin(res, first)
    monkeypatch.setattr(conv_gemm, "keeps", lambda cand, lib: True)  # the race keeps it
    monkeypatch.setattr(conv_gemm, "_eligible", lambda *a: False)  # over the GEMM form
    return res, first


def _pin(res, config):
    """Make ``config`` (a candidate measured correct) the problem's winner in the test's
    tuning database, as a user's ``set_winner`` would."""
    from pyc_lab.kernels.tuning import database
    from pyc_lab.kernels.tuning.keys import Measurement

    with database.TuningDB() as db:
        db.set_winner(res.device, res.problem,
                      Measurement(config.to_dict(), "skipped").config_id)


GUARD_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dtype", GUARD_DTYPES)
def test_the_guard_copies_bits_and_flags_exactly_the_non_finite_inputs(dtype):
    """pad_check copies a channels-last input (strided, odd sizes) bit for bit into the
    padded channels with zeros after them, -0.0 included, and sets its flag on a NaN or
    an infinity, and on nothing else; with as many channels as given it only checks."""
    from pyc_lab.kernels import conv_guard

    x = (torch.rand((3, 5, 9, 7), device="cuda") * 2 - 1).to(dtype).contiguous(
        memory_format=torch.channels_last)[:, :3]  # 3 of 5 channels: a strided view
    x[0, 1, 2, 3] = -0.0
    xl = x.permute(0, 2, 3, 1)
    flag, padded = conv_guard.pad_check(xl, 4)
    torch.cuda.synchronize()
    assert int(flag) == 0 and padded.shape == (3, 9, 7, 4) and padded.is_contiguous()
    bits = {torch.float16: torch.int16, torch.bfloat16: torch.int16,
            torch.float32: torch.int32}[dtype]
    assert torch.equal(padded[..., :3].view(bits), xl.contiguous().view(bits))
    assert not padded[..., 3].view(bits).any()
    flag, none = conv_guard.pad_check(xl, 3)  # the check alone
    assert none is None and int(flag) == 0
    for bad in (float("nan"), float("inf"), float("-inf")):
        y = x.clone()
        y[2, 2, 8, 6] = bad  # the last pixel of the last image
        flag, _ = conv_guard.pad_check(y.permute(0, 2, 3, 1), 4)
        assert int(flag) == 1, bad
        flag, _ = conv_guard.pad_check(y.permute(0, 2, 3, 1), 3)
        assert int(flag) == 1, bad
    big = torch.full((2, 4, 3, 3), torch.finfo(dtype).max, device="cuda", dtype=dtype)
    flag, _ = conv_guard.pad_check(big.permute(0, 2, 3, 1), 4)  # finite, however large
    assert int(flag) == 0


@pytest.mark.parametrize("dtype", GUARD_DTYPES)
@pytest.mark.parametrize("one_d", [False, True])
def test_the_fix_up_leaves_a_clear_flag_alone_and_otherwise_recomputes_exactly(dtype,
                                                                                one_d):
    """With the flag clear the fix-up writes nothing (a poisoned output stays
    poisoned); with it set it recomputes every output directly — bias, relu (NaN kept),
    stride, padding, dilation, 1-D — matching float64, NaN and infinity exactly where
    the reference has them."""
    from pyc_lab.kernels import conv_guard

    if one_d:
        xs, ws, stride, pad, dil = (2, 4, 23), (8, 4, 5), (2,), (1,), (2,)
    else:
        xs, ws, stride, pad, dil = (2, 4, 11, 13), (8, 4, 3, 5), (2, 1), (1, 2), (1, 2)
    x = (torch.rand(xs, device="cuda") * 2 - 1).to(dtype)
    w = ((torch.rand(ws, device="cuda") * 2 - 1) / 6).to(dtype).abs()  # positive
    b = (torch.rand(ws[0], device="cuda") * 2 - 1).to(dtype)
    x[(0, 1, 5) if one_d else (0, 1, 3, 4)] = float("nan")  # read by some window
    x[(1, 2, 9) if one_d else (1, 2, 7, 9)] = float("inf")
    g = ConvGeometry.from_channels_first(xs, ws, stride, pad, dil)
    to_last = (0, *range(2, x.ndim), 1)
    xl, wl = x.permute(*to_last).contiguous(), w.permute(*to_last).contiguous()
    y = torch.full(g.out_shape, 7.0, device="cuda", dtype=dtype)
    clear = torch.zeros(1, dtype=torch.int32, device="cuda")
    conv_guard.fixup(clear, xl, wl, b, y, g, "relu")
    torch.cuda.synchronize()
    assert bool((y == 7.0).all())
    conv_guard.fixup(clear + 1, xl, wl, b, y, g, "relu")
    torch.cuda.synchronize()
    import torch.nn.functional as F

    fn = F.conv1d if one_d else F.conv2d
    want = torch.relu(fn(x.double().cpu(), w.double().cpu(), b.double().cpu(),
                         stride=stride, padding=pad, dilation=dil))
    want = want.permute(*to_last).numpy()
    got = y.double().cpu().numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    assert np.isnan(got).any() and np.isposinf(got).any()
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5}[dtype]
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=tol, atol=tol)

