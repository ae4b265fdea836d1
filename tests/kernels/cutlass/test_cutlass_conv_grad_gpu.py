"""pyc_lab's CUTLASS convolution gradients on a GPU: dgrad and wgrad kernels of both
families against float64 (odd sizes, strides, padding, dilation, 1-D, split-K) into
poisoned outputs, ``autotune_conv(direction=...)`` end to end, and ``pl.conv``'s backward
racing the tuned kernels against cuDNN.

The kernels go to the session's kernel cache (``$PYC_LAB_TEST_KERNEL_CACHE`` when set):
``python tests/kernels/cutlass/test_cutlass_conv_grad_gpu.py DIR`` builds them there
without a GPU.
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
)
from pyc_lab.kernels.cutlass.conv_2x import Conv2xConfig, CutlassConv2x, build_conv2x

torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")
pytest.importorskip("cutlass_library")
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

#: One kernel per case: (config, kernel, (align, align_out) for the CUTLASS 2 ones).
KERNELS = {
    "hopper_dgrad_f16": (ConvConfig((128, 128, 64), (1, 1)),
                         ConvKernel("f16", 2, direction="dgrad"), None),
    "hopper_wgrad_bf16": (ConvConfig((128, 128, 64), (1, 1)),
                          ConvKernel("bf16", 2, direction="wgrad"), None),
    "hopper_wgrad_f16_1d": (ConvConfig((64, 64, 64), (1, 1)),
                            ConvKernel("f16", 1, direction="wgrad"), None),
    "ampere_dgrad_bf16": (Conv2xConfig((128, 128, 32), (64, 64, 32), 3, "optimized"),
                          ConvKernel("bf16", 2, direction="dgrad"), (8, 8)),
    "ampere_wgrad_f16_k4": (Conv2xConfig((128, 64, 32), (64, 32, 32), 3, "optimized", 0, 4),
                            ConvKernel("f16", 2, direction="wgrad"), (8, 8)),
}


def _build(cfg, kern, widths, cache):
    if widths is None:
        return build_conv(cfg, kern, cache=cache)
    return build_conv2x(cfg, kern, widths[0], cache=cache, align_out=widths[1])


def prebuild(directory: str) -> None:
    """Build :data:`KERNELS` into ``directory`` (no GPU needed)."""
    import concurrent.futures as cf

    cache = KernelCache(directory)
    jobs = list(KERNELS.values())
    with cf.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 2))) as pool:
        for (cfg, kern, _), res in zip(jobs, pool.map(lambda j: _build(*j, cache), jobs),
                                       strict=True):
            print(res.status, kern.op, kern.dtype, cfg.id, res.message[:200], flush=True)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    import concurrent.futures as cf

    cache = KernelCache(os.environ.get("PYC_LAB_TEST_KERNEL_CACHE")
                        or tmp_path_factory.mktemp("kernels"))
    with cf.ThreadPoolExecutor(len(KERNELS)) as pool:
        built = dict(zip(KERNELS, pool.map(lambda j: _build(*j, cache), KERNELS.values()),
                         strict=True))
    out = {}
    for name, res in built.items():
        assert res.ok, res.message
        cfg, kern, widths = KERNELS[name]
        out[name] = CutlassConv(res.library, cfg, kern) if widths is None else \
            CutlassConv2x(res.library, cfg, kern, align=widths[0], align_out=widths[1])
    return out


def _reference(x, w, dy, stride, pad, dil, direction):
    """The gradient in float64 on the CPU, channels last."""
    nd = x.ndim - 2
    dx, dw, _ = torch.ops.aten.convolution_backward(
        dy.double().cpu(), x.double().cpu(), w.double().cpu(), None, list(stride), list(pad),
        list(dil), False, [0] * nd, 1, [direction == "dgrad", direction == "wgrad", False])
    out = dx if direction == "dgrad" else dw
    return out.permute(0, *range(2, nd + 2), 1).numpy()


def _run(conv, x, w, dy, stride, pad, dil):
    """Run a gradient kernel on channels-first tensors into a NaN-poisoned output; the
    channels-last result as NumPy."""
    nd = x.ndim - 2
    g = ConvGeometry.from_channels_first(x.shape, w.shape, stride, pad, dil)
    last = (0, *range(2, nd + 2), 1)
    wgrad = conv.kernel.direction == "wgrad"
    a = dy.permute(*last).contiguous()
    b = (x if wgrad else w).permute(*last).contiguous()
    out = torch.full(g.flt if wgrad else g.act, float("nan"), device="cuda", dtype=x.dtype)
    assert conv.can_implement(g)
    conv.run(g, a.data_ptr(), b.data_ptr(), None, out.data_ptr(),
             torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return out.float().cpu().numpy()


def _operands(xs, ws, stride, pad, dil, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(xs, device="cuda", dtype=dtype, generator=gen)
    w = torch.randn(ws, device="cuda", dtype=dtype, generator=gen) / np.sqrt(np.prod(ws[1:]))
    g = ConvGeometry.from_channels_first(xs, ws, stride, pad, dil)
    dy_shape = (xs[0], ws[0], *g.out)
    dy = torch.randn(dy_shape, device="cuda", dtype=dtype, generator=gen)
    return x, w, dy


TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2}
CASES = [  # name, x shape (channels first), w shape, stride, padding, dilation
    ("hopper_dgrad_f16", (3, 24, 13, 17), (40, 24, 3, 3), (1, 1), (1, 1), (1, 1)),
    ("hopper_dgrad_f16", (2, 16, 31, 29), (72, 16, 5, 3), (1, 1), (2, 0), (1, 1)),
    ("hopper_dgrad_f16", (5, 32, 9, 11), (24, 32, 1, 1), (1, 1), (0, 0), (1, 1)),
    ("hopper_wgrad_bf16", (3, 24, 13, 17), (40, 24, 3, 3), (1, 1), (1, 1), (1, 1)),
    ("hopper_wgrad_bf16", (2, 16, 31, 29), (72, 16, 5, 3), (2, 1), (2, 0), (1, 2)),
    ("hopper_wgrad_f16_1d", (7, 32, 129), (48, 32, 3), (1,), (1,), (1,)),
    ("hopper_wgrad_f16_1d", (2, 8, 40), (16, 8, 5), (2,), (2,), (2,)),
    ("ampere_dgrad_bf16", (2, 16, 31, 29), (24, 16, 3, 3), (2, 2), (1, 1), (1, 1)),
    ("ampere_dgrad_bf16", (5, 32, 9, 11), (24, 32, 1, 1), (2, 2), (0, 0), (1, 1)),
    ("ampere_dgrad_bf16", (3, 24, 13, 17), (40, 24, 3, 3), (1, 1), (1, 1), (1, 1)),
    ("ampere_wgrad_f16_k4", (8, 64, 20, 20), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1)),
    ("ampere_wgrad_f16_k4", (4, 32, 15, 15), (32, 32, 3, 3), (2, 2), (1, 1), (1, 1)),
]


@pytest.mark.parametrize(("name", "xs", "ws", "stride", "pad", "dil"), CASES)
def test_gradient_kernels_match_float64(kernels, name, xs, ws, stride, pad, dil):
    conv = kernels[name]
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[conv.kernel.dtype]
    x, w, dy = _operands(xs, ws, stride, pad, dil, dtype, seed=len(name) + xs[0])
    got = _run(conv, x, w, dy, stride, pad, dil)
    want = _reference(x, w, dy, stride, pad, dil, conv.kernel.direction)
    assert np.isfinite(got).all()  # every poisoned element written
    tol = TOL[dtype] * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=tol)


def test_a_strided_dgrad_is_refused_by_the_hopper_kernel(kernels):
    g = ConvGeometry.from_channels_first((2, 16, 31, 29), (24, 16, 3, 3), (2, 2), (1, 1),
                                         (1, 1))
    assert not kernels["hopper_dgrad_f16"].can_implement(g)
    assert "unit strides" in g.issue(kernels["hopper_dgrad_f16"].kernel)


def test_autotune_gradients_and_the_backward_races_them(monkeypatch, fresh_conv_state):
    """dgrad and wgrad of one layer tuned over the test kernels, each against cuDNN's
    backward in the same run; a training step through ``pl.conv2d`` then races each
    winner against cuDNN (the margins opened so the kernel is kept) and its gradients
    match float64."""
    from pyc_lab.kernels import conv_gemm, conv_grad_route

    # tuned into the user's kernel cache, where pl.conv looks (the lane copies the
    # carried kernels there)
    xs, ws = (8, 128, 20, 20), (64, 128, 3, 3)
    wanted = {"dgrad": KERNELS["hopper_dgrad_f16"][0],
              "wgrad": KERNELS["ampere_wgrad_f16_k4"][0]}
    for direction, cfg in wanted.items():
        res = pl.autotune_conv(xs, ws, padding=1, dtype="f16", direction=direction,
                               restrict=lambda c, cfg=cfg: c == cfg, repeats=5)
        assert res.problem.op == f"conv2d_{direction}"
        assert res.recorded and res.best is not None and res.best.ok, res.table
        assert res.baselines["cudnn"] > 0 and len(res.table) == 1
    monkeypatch.setattr(conv_gemm, "MARGIN", -1e9)  # any candidate beats cuDNN
    monkeypatch.setattr(conv_gemm, "GPU_SLACK", 1e9)
    x, w, dy = _operands(xs, ws, (1, 1), (1, 1), (1, 1), torch.float16, seed=7)
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    w = w.contiguous(memory_format=torch.channels_last).requires_grad_()
    for _ in range(2):  # the race, then the kept choice
        x.grad = w.grad = None
        y = pl.conv2d(x, w, padding=1)
        y.backward(dy)
        for direction, got in (("dgrad", x.grad), ("wgrad", w.grad)):
            want = _reference(x.detach(), w.detach(), dy, (1, 1), (1, 1), (1, 1), direction)
            got = got.permute(0, 2, 3, 1).float().cpu().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-2,
                                       atol=1e-2 * float(np.abs(want).max()))
    made = conv_grad_route.choices()
    assert sorted(k[0] for k in made) == ["dgrad", "wgrad"]
    for key, choice in made.items():
        assert choice["impl"] == "cutlass" and wanted[key[0]].id in choice["cutlass_kernel"]
        assert choice["cudnn_ms"] > 0 and choice["cutlass_ms"] > 0


if __name__ == "__main__":
    prebuild(sys.argv[1])
