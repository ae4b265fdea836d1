"""pyc_lab's CUTLASS 3 convolutions on a GPU: built kernels against the convolution in
float32 (odd sizes, strides, dilation, 1-D, bias and activations, NaN), poisoned outputs,
re-bound pointers, ``autotune_conv`` end to end and ``pl.conv`` racing the winner.

The kernels go to the session's kernel cache (``$PYC_LAB_TEST_KERNEL_CACHE`` when set):
``python tests/kernels/cutlass/test_cutlass_conv_gpu.py DIR`` builds them there without a
GPU, so that the GPU lane can carry them instead of spending device minutes in nvcc.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels.cache import KernelCache
from pyc_lab.kernels.cutlass.conv import (
    ConvConfig,
    ConvGeometry,
    ConvKernel,
    CutlassConv,
    build_conv,
    build_conv_many,
    conv_configs,
)
from pyc_lab.kernels.tuning.conv_tune import conv_geometry_of

torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")
pytest.importorskip("cutlass_library")
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

SMS = 132
#: One kernel per case: (config, kernel).
KERNELS = {
    "f16_bias_relu": (ConvConfig((128, 128, 64), (1, 1)), ConvKernel("f16", 2, True, "relu")),
    "bf16_plain": (ConvConfig((128, 64, 64), (1, 2)), ConvKernel("bf16", 2)),
    "tf32_bias": (ConvConfig((128, 128, 32), (1, 1)), ConvKernel("tf32", 2, True)),
    "f16_1d_bias_gelu": (ConvConfig((64, 64, 64), (1, 1)),
                         ConvKernel("f16", 1, True, "gelu")),
}
#: What the autotune test tunes: (x shape, w shape, padding), plain f16, two candidates.
TUNED = ((8, 64, 20, 20), (64, 64, 3, 3), 1)


def tuned_candidates() -> list[ConvConfig]:
    """The configurations ``autotune_conv`` below builds (ranked for the H200's SMs)."""
    g = conv_geometry_of(TUNED[0], TUNED[1], padding=TUNED[2])
    return [c for c in conv_configs(g, ConvKernel("f16", 2), SMS) if c.cluster == (1, 1)][:2]


def planned_builds() -> list[tuple[ConvConfig, ConvKernel]]:
    return [*KERNELS.values(), *((c, ConvKernel("f16", 2)) for c in tuned_candidates())]


def prebuild(directory: str) -> None:
    """Build :func:`planned_builds` into ``directory`` (no GPU needed)."""
    import concurrent.futures as cf

    cache = KernelCache(directory)
    jobs = list(dict.fromkeys(planned_builds()))
    with cf.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 2))) as pool:
        for (cfg, kern), res in zip(jobs, pool.map(lambda j: build_conv(*j, cache=cache),
                                                   jobs), strict=True):
            print(res.status, kern.op, kern.dtype, cfg.id, res.message[:200], flush=True)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    cache = KernelCache(os.environ.get("PYC_LAB_TEST_KERNEL_CACHE")
                        or tmp_path_factory.mktemp("kernels"))
    futures = {name: build_conv_many([cfg], kern, cache=cache, workers=1)[cfg]
               for name, (cfg, kern) in KERNELS.items()}  # in parallel where not cached
    out = {}
    for name, fut in futures.items():
        res = fut.result()
        assert res.ok, res.message
        out[name] = CutlassConv(res.library, res.config, KERNELS[name][1])
    return out


def _reference(x, w, b, stride, pad, dil, activation):
    """The convolution in float64 on the CPU (NaN propagates as the kernel's should),
    channels first in, channels last out."""
    import torch.nn.functional as F

    nd = x.ndim - 2
    fn = F.conv1d if nd == 1 else F.conv2d
    y = fn(x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu(),
           stride=stride, padding=pad, dilation=dil)
    if activation == "relu":
        y = torch.relu(y)
    elif activation == "gelu":
        y = F.gelu(y, approximate="tanh")
    return y.permute(0, *range(2, nd + 2), 1).numpy()


def _run(conv, x, w, b, stride, pad, dil):
    """Run ``conv`` on channels-first torch tensors; the channels-last result as NumPy."""
    nd = x.ndim - 2
    g = ConvGeometry.from_channels_first(x.shape, w.shape, stride, pad, dil)
    xl = x.permute(0, *range(2, nd + 2), 1).contiguous()
    wl = w.permute(0, *range(2, nd + 2), 1).contiguous()
    y = torch.full(g.out_shape, float("nan"), device="cuda", dtype=x.dtype)  # poisoned
    conv.run(g, xl.data_ptr(), wl.data_ptr(), None if b is None else b.data_ptr(),
             y.data_ptr(), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return y.float().cpu().numpy()


TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 5e-3}
CASES = [  # name, x shape (channels first), w shape, stride, padding, dilation
    ("f16_bias_relu", (3, 24, 13, 17), (40, 24, 3, 3), (1, 1), (1, 1), (1, 1)),
    ("f16_bias_relu", (2, 16, 31, 29), (72, 16, 5, 3), (2, 1), (2, 0), (1, 2)),
    ("bf16_plain", (5, 32, 9, 11), (24, 32, 1, 1), (2, 2), (0, 0), (1, 1)),
    ("bf16_plain", (1, 64, 7, 7), (8, 64, 3, 3), (1, 1), (1, 1), (1, 1)),
    ("tf32_bias", (3, 12, 15, 15), (20, 12, 3, 3), (1, 1), (1, 1), (2, 2)),
    ("f16_1d_bias_gelu", (7, 32, 129), (48, 32, 3), (1,), (1,), (1,)),
    ("f16_1d_bias_gelu", (2, 8, 40), (16, 8, 5), (2,), (2,), (2,)),
]


@pytest.mark.parametrize(("name", "xs", "ws", "stride", "pad", "dil"), CASES)
def test_kernels_match_float64_on_odd_problems(kernels, name, xs, ws, stride, pad, dil):
    conv = kernels[name]
    dt = {"f16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}[
        conv.kernel.dtype]
    x = (torch.rand(xs, device="cuda") * 2 - 1).to(dt)
    w = (torch.rand(ws, device="cuda") * 2 - 1).div(np.sqrt(np.prod(ws[1:]))).to(dt)
    b = (torch.rand(ws[0], device="cuda") * 2 - 1).to(dt) if conv.kernel.bias else None
    got = _run(conv, x, w, b, stride, pad, dil)
    want = _reference(x, w, b, stride, pad, dil, conv.kernel.activation)
    assert got.shape == want.shape and np.isfinite(got).all()
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=TOL[dt], atol=TOL[dt] * scale)


def test_nan_and_infinity_reach_exactly_the_outputs_that_read_them(kernels):
    conv = kernels["bf16_plain"]
    x = (torch.rand((2, 16, 10, 12), device="cuda") * 2 - 1).to(torch.bfloat16)
    w = (torch.rand((16, 16, 3, 3), device="cuda") * 2 - 1).to(torch.bfloat16) / 12
    x[0, 3, 4, 5] = float("nan")
    x[1, 0, 0, 0] = float("inf")
    got = _run(conv, x, w, None, (1, 1), (1, 1), (1, 1))
    want = _reference(x, w, None, (1, 1), (1, 1), (1, 1), None)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    assert np.isnan(got).any() and (~np.isfinite(got)).sum() > np.isnan(got).sum()


def test_rebinding_new_pointers_and_refusing_what_it_cannot_take(kernels):
    conv = kernels["f16_bias_relu"]
    for _ in range(2):  # new tensors every call: the problem is bound again each time
        x = torch.randn((2, 8, 6, 6), device="cuda", dtype=torch.float16)
        w = torch.randn((8, 8, 3, 3), device="cuda", dtype=torch.float16) / 9
        b = torch.randn(8, device="cuda", dtype=torch.float16)
        got = _run(conv, x, w, b, (1, 1), (1, 1), (1, 1))
        want = _reference(x, w, b, (1, 1), (1, 1), (1, 1), "relu")
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    g = ConvGeometry.from_channels_first((2, 12, 6, 6), (8, 12, 3, 3), (1, 1), (1, 1),
                                         (1, 1))
    assert not conv.can_implement(g)  # 12 channels: not 16-byte rows
    with pytest.raises(pl.PycLabError, match="multiples of 8"):
        conv.run(g, 1, 1, 1, 1, 0)
    with pytest.raises(pl.PycLabError, match="bias is needed"):
        conv.run(g, 1, 1, None, 1, 0)


def test_autotune_records_a_checked_winner_and_pl_conv_races_it(monkeypatch,
                                                                fresh_conv_state):
    from pyc_lab.kernels import conv_gemm

    # tuned into the user's kernel cache, where pl.conv looks (the lane copies the
    # carried kernels there)
    xs, ws, pad = TUNED
    res = pl.autotune_conv(xs, ws, padding=pad, dtype="f16", max_candidates=2,
                           restrict=lambda c: c.cluster == (1, 1), repeats=5)
    assert res.recorded and res.best is not None and res.best.ok, res.table
    assert res.baselines["cudnn"] > 0 and len(res.table) == 2
    assert {row["status"] for row in res.table.to_dict("records")} <= {"ok"}
    # pl.conv on channels-last tensors: the first call races the tuned kernel too
    monkeypatch.setattr(conv_gemm, "MARGIN", -1e9)  # any candidate beats cuDNN
    monkeypatch.setattr(conv_gemm, "GPU_SLACK", 1e9)
    x = torch.randn(xs, device="cuda", dtype=torch.float16).contiguous(
        memory_format=torch.channels_last)
    w = (torch.randn(ws, device="cuda", dtype=torch.float16) / 24).contiguous(
        memory_format=torch.channels_last)
    for _ in range(2):  # the race, then the kept choice
        y = pl.conv2d(x, w, padding=pad)
        want = _reference(x, w, None, (1, 1), (pad, pad), (1, 1), None)
        got = y.permute(0, 2, 3, 1).float().cpu().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    (choice,) = conv_gemm.choices().values()
    assert choice["cutlass_ms"] > 0 and "tuned conv_t" in choice["cutlass_kernel"]
    assert choice["impl"] in ("cutlass", "gemm")  # the faster of the two non-cuDNN ones
    assert y.is_contiguous(memory_format=torch.channels_last)

    # a bias and a relu: the tuned kernel has both in its epilogue, and pl.conv's race
    # offers it with the activation fused (the test kernel f16_bias_relu's configuration)
    cfg, _ = KERNELS["f16_bias_relu"]
    xs, ws = (4, 32, 12, 12), (128, 32, 3, 3)
    fused = pl.autotune_conv(xs, ws, padding=1, dtype="f16", bias=True, activation="relu",
                             restrict=lambda c: c == cfg, repeats=5)
    assert fused.best is not None and fused.best.ok and fused.problem.op == \
        "conv2d_fprop_bias_relu"
    x = torch.randn(xs, device="cuda", dtype=torch.float16).contiguous(
        memory_format=torch.channels_last)
    w = (torch.randn(ws, device="cuda", dtype=torch.float16) / 17).contiguous(
        memory_format=torch.channels_last)
    b = torch.randn(ws[0], device="cuda", dtype=torch.float16)
    for _ in range(2):
        y = pl.conv2d(x, w, b, padding=1, activation="relu")
        want = _reference(x, w, b, (1, 1), (1, 1), (1, 1), "relu")
        got = y.permute(0, 2, 3, 1).float().cpu().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    choice = conv_gemm.choice_for(x, w, b, (1, 1), (1, 1), (1, 1), 1, "relu")
    assert choice is not None and cfg.id in choice["cutlass_kernel"]


if __name__ == "__main__":
    prebuild(sys.argv[1])
