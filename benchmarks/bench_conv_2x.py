"""pyc_lab's CUTLASS 2 (Ampere-class) convolution on the layers TMA cannot load, against
cuDNN and ``pl.conv``.

The ResNet-50 stem (3 -> 64 channels, 224 x 224, 7 x 7, stride 2, padding 3) at batch 32
and 128, channels last: float16 with the bias and relu fused (against ``F.conv2d`` with
its bias, then ``relu``) and bfloat16 without (against ``F.conv2d``), cuDNN in benchmark
mode. Two kernels each: the first configuration ``conv2x_configs`` ranks for 3 channels
(few-channels iterator, one-element accesses, two stages) and for the input padded to 4
channels with a zero filter channel (fixed-channels iterator, 8-byte ``cp.async``, three
stages; the padding copy is timed with it), taken from the kernel cache (the tests'
prebuild: ``python tests/kernels/cutlass/test_cutlass_conv_2x_gpu.py .kcache``). Its
output is checked against cuDNN's first; then the kernel, cuDNN and ``pl.conv2d`` (its
race: cuDNN or the GEMM form) are timed in interleaved rounds of CUDA-event medians
(``bench_conv.median_rounds``). TFLOP/s count ``2 N K P Q C R S``. Writes
``conv-2x.json`` to ``--out``.

    python benchmarks/bench_conv_2x.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_conv import median_rounds
from common import cupy_and_torch, write_result

import pyc_lab as pl

BATCHES = (32, 128)


def one(torch: Any, conv: Any, n: int, bias: bool, rounds: int, repeats: int
        ) -> dict[str, Any]:
    """Check, then time, the kernel, cuDNN and pl.conv on the stem at batch ``n``."""
    import torch.nn.functional as F

    from pyc_lab.kernels.cutlass.conv import ConvGeometry

    tdt = torch.float16 if conv.kernel.dtype == "f16" else torch.bfloat16
    x = torch.randn(n, 3, 224, 224, device="cuda", dtype=tdt).contiguous(
        memory_format=torch.channels_last)
    w = (torch.randn(64, 3, 7, 7, device="cuda", dtype=tdt) / 12).contiguous(
        memory_format=torch.channels_last)
    b = torch.randn(64, device="cuda", dtype=tdt) if bias else None
    channels = conv.align if conv.config.iterator == "fixed_channels" else 3
    xp = torch.zeros(n, 224, 224, channels, device="cuda", dtype=tdt)  # NHWC, padded
    wp = torch.zeros(64, 7, 7, channels, device="cuda", dtype=tdt)
    wp[..., :3] = w.permute(0, 2, 3, 1)
    g = ConvGeometry.from_channels_first((n, channels, 224, 224), (64, channels, 7, 7),
                                         (2, 2), (3, 3), (1, 1))
    y = torch.empty((n, 64, 112, 112), device="cuda", dtype=tdt).contiguous(
        memory_format=torch.channels_last)
    stream = torch.cuda.current_stream().cuda_stream

    def kernel() -> None:
        if channels == 3:  # channels-last x is already (N, H, W, 3) in memory
            ptr = x.data_ptr()
        else:
            xp[..., :3].copy_(x.permute(0, 2, 3, 1))
            ptr = xp.data_ptr()
        conv.run(g, ptr, (w.permute(0, 2, 3, 1) if channels == 3 else wp).data_ptr(),
                 None if b is None else b.data_ptr(), y.data_ptr(), stream)

    def cudnn() -> Any:
        out = F.conv2d(x, w, b, stride=2, padding=3)
        return torch.relu(out) if bias else out

    def pl_conv() -> Any:
        out = pl.conv2d(x, w, b, stride=2, padding=3, activation="relu" if bias else None)
        return out

    y.fill_(float("nan"))
    kernel()
    want = cudnn().float()
    err = float((y.float() - want).abs().max() / want.abs().max())
    row: dict[str, Any] = {"batch": n, "dtype": conv.kernel.dtype, "bias_relu": bias,
                           "channels": channels, "config": conv.config.id,
                           "max_rel_err_vs_cudnn": err}
    if not err <= 2e-2:
        row["error"] = f"max relative error {err:.3g} against cuDNN"
        return row
    pl_conv()  # the race happens on the first call
    ms = median_rounds({"cutlass2x": kernel, "cudnn": cudnn, "pl.conv": pl_conv}, rounds,
                       repeats)
    flop = 2 * n * 64 * 112 * 112 * 3 * 7 * 7
    row.update({"ms": ms, "tflops": {k: flop / v / 1e9 for k, v in ms.items()},
                "kernel_vs_cudnn": ms["cudnn"] / ms["cutlass2x"],
                "pl_conv_vs_cudnn": ms["cudnn"] / ms["pl.conv"]})
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    libs = cupy_and_torch("bench_conv_2x")
    if libs is None:
        return 0
    _cp, torch = libs
    torch.backends.cudnn.benchmark = True
    from pyc_lab.kernels.cache import KernelCache
    from pyc_lab.kernels.cutlass.conv_2x import CutlassConv2x, build_conv2x

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels" /
                           "cutlass"))
    from test_cutlass_conv_2x_gpu import KERNELS, planned_builds

    cache_dir = os.environ.get("PYC_LAB_TEST_KERNEL_CACHE")
    cache = KernelCache(cache_dir) if cache_dir else None
    rows = []
    for name, (cfg, kern, align) in zip(KERNELS, planned_builds(), strict=True):
        if "stem" not in name:
            continue
        res = build_conv2x(cfg, kern, align, cache=cache)
        if not res.ok:
            rows.append({"kernel": name, "error": res.message[:300]})
            continue
        conv = CutlassConv2x(res.library, cfg, kern, align=align)
        for n in BATCHES:
            row = one(torch, conv, n, kern.bias, args.rounds, args.repeats)
            rows.append({"kernel": name, **row})
            print(row, flush=True)
    ratios = [r["kernel_vs_cudnn"] for r in rows if "kernel_vs_cudnn" in r]
    write_result(args.out, "conv-2x", {
        "method": "the stem at batch 32 and 128, channels last; the kernel checked against "
                  f"cuDNN, then timed with cuDNN and pl.conv2d in {args.rounds} interleaved "
                  f"rounds of CUDA-event medians ({args.repeats} repeats each)",
        "results": rows,
        "summary": {"kernel_vs_cudnn": ratios,
                    "failed": [r["kernel"] for r in rows if "error" in r]}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
