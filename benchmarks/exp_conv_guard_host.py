"""Experiment: where the host time of a guarded CUTLASS 2 stem convolution goes (GPU lane).

``pl.conv``'s race keeps a kernel by the larger of its GPU time and the host's time to
issue it. The bfloat16 stem at batch 32 (3 -> 64, 7x7, stride 2) runs the CUTLASS 2
fixed-channels kernel with its input padded to 4 channels inside
:mod:`pyc_lab.kernels.conv_guard`'s check and fix-up; this measures each step of one
call (:func:`pyc_lab.kernels.conv_cutlass.kernel_call`) on the host: the views, the
padding check, the filter, the output's allocation, CUTLASS's bind and launch, the
fix-up, and the whole call beside cuDNN's — median microseconds of ``--calls`` calls,
the GPU drained between rounds — and the call's functions by their own time under
``cProfile``; then what ``pl.conv2d``'s race chooses for the stem at batch 32 and 128
with that kernel tuned, and its speed against ``F.conv2d``.

    python benchmarks/exp_conv_guard_host.py --out $OUT
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cupy_and_torch, write_result

import pyc_lab as pl

STEM = ((32, 3, 224, 224), (64, 3, 7, 7), 2, 3)


def host_us(fn: Any, calls: int, torch: Any) -> float:
    """Median host microseconds per call of ``fn`` over rounds of 10 calls."""
    torch.cuda.synchronize()
    per = []
    for _ in range(max(1, calls // 10)):
        t0 = time.perf_counter()
        for _ in range(10):
            fn()
        per.append((time.perf_counter() - t0) / 10 * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    libs = cupy_and_torch("exp_conv_guard_host")
    if libs is None:
        return 0
    _, torch = libs
    import torch.nn.functional as F

    from pyc_lab.kernels import conv_guard
    from pyc_lab.kernels.conv_cutlass import _PaddedFilters, tuned_runner
    from pyc_lab.kernels.cutlass.conv_2x import Conv2xConfig

    torch.backends.cudnn.benchmark = True
    xs, ws, s, p = STEM
    res = pl.autotune_conv(xs, ws, stride=s, padding=p, dtype="bf16", repeats=5,
                           restrict=lambda c: isinstance(c, Conv2xConfig)
                           and c.pad_to == 4 and c.iterator == "fixed_channels",
                           max_candidates=2)
    x = torch.randn(xs, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    w = torch.randn(ws, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    call, why = tuned_runner(x, w, None, (s, s), (p, p), (1, 1))
    out: dict[str, Any] = {"tuned": why, "best": res.best.config if res.best else None}
    if call is None:
        write_result(args.out, "conv-guard-host", out)
        return 0
    from pyc_lab.kernels.conv_cutlass import _find
    from pyc_lab.kernels.cutlass.conv import ConvGeometry, ConvKernel
    from pyc_lab.kernels.cutlass.conv_2x import padded_geometry

    g = ConvGeometry.from_channels_first(xs, ws, (s, s), (p, p), (1, 1))
    kern, _ = _find(g, ConvKernel("bf16", 2), 0)
    read = padded_geometry(g, 4)
    filters = _PaddedFilters()
    xl, wl = x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1)
    flag, padded = conv_guard.pad_check(xl, 4)
    wp = filters.get(w, wl, 1)
    y = torch.empty(g.out_shape, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.current_stream().cuda_stream
    steps = {
        "views (two permutes)": lambda: (x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1)),
        "pad_check (flag zeroed, padded copy, NaN check)": lambda: conv_guard.pad_check(xl, 4),
        "padded filter (kept)": lambda: filters.get(w, wl, 1),
        "torch.empty (output)": lambda: torch.empty(g.out_shape, device="cuda",
                                                    dtype=torch.bfloat16),
        "CUTLASS run, same pointers": lambda: kern.run(read, padded.data_ptr(),
                                                       wp.data_ptr(), None, y.data_ptr(),
                                                       stream),
        "CUTLASS run, new output pointer (bind + launch)": None,
        "fixup (flag clear)": lambda: conv_guard.fixup(flag, padded, wp, None, y, read, None),
        "whole guarded call": lambda: call(x, w, None),
        "cuDNN F.conv2d": lambda: F.conv2d(x, w, stride=s, padding=p),
    }
    ys = [torch.empty(g.out_shape, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    flip = [0]

    def rebind() -> None:
        flip[0] ^= 1
        kern.run(read, padded.data_ptr(), wp.data_ptr(), None, ys[flip[0]].data_ptr(), stream)

    steps["CUTLASS run, new output pointer (bind + launch)"] = rebind
    for fn in steps.values():  # warm
        fn()
    out["host_us"] = {name: host_us(fn, args.calls, torch) for name, fn in steps.items()}
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        call(x, w, None)
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:25]  # own time
    out["profile_top_own_time"] = [
        {"function": f"{Path(f).name}:{line} {name}", "calls": cc,
         "own_us_per_call": tt / args.calls * 1e6, "cumulative_us_per_call": ct / args.calls * 1e6}
        for (f, line, name), (_cc, cc, tt, ct, _callers) in top]
    out["pl_conv"] = [race(torch, batch) for batch in (32, 128)]
    write_result(args.out, "conv-guard-host", out)
    for name, us in out["host_us"].items():
        print(f"{us:9.1f} us  {name}")
    for r in out["pl_conv"]:
        print(r["batch"], (r["choice"] or {}).get("impl"), r["ratio_vs_cudnn"])
    return 0


def race(torch: Any, batch: int) -> dict[str, Any]:
    """The stem at ``batch`` tuned over the padded fixed-channels kernels, then
    ``pl.conv2d`` (its first call races cuDNN, the GEMM form and the tuned kernel)
    against ``F.conv2d`` in interleaved rounds of CUDA-event medians."""
    import torch.nn.functional as F
    from bench_conv import median_rounds

    from pyc_lab.kernels import conv_gemm
    from pyc_lab.kernels.cutlass.conv_2x import Conv2xConfig

    (_, c, h, w), ws, s, p = STEM
    xs = (batch, c, h, w)
    pl.autotune_conv(xs, ws, stride=s, padding=p, dtype="bf16", repeats=5,
                     restrict=lambda cfg: isinstance(cfg, Conv2xConfig)
                     and cfg.pad_to == 4 and cfg.iterator == "fixed_channels",
                     max_candidates=2)
    x = torch.randn(xs, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    wt = (torch.randn(ws, device="cuda", dtype=torch.bfloat16) / 12).contiguous(
        memory_format=torch.channels_last)
    want = F.conv2d(x, wt, stride=s, padding=p).float()
    got = pl.conv2d(x, wt, stride=s, padding=p).float()
    err = float((got - want).abs().max() / want.abs().max())
    ms = median_rounds({"cudnn": lambda: F.conv2d(x, wt, stride=s, padding=p),
                        "pl.conv": lambda: pl.conv2d(x, wt, stride=s, padding=p)}, 5, 10)
    return {"batch": batch, "rel_err_vs_cudnn": err, "ms": ms,
            "ratio_vs_cudnn": ms["cudnn"] / ms["pl.conv"],
            "choice": conv_gemm.choice_for(x, wt, None, (s, s), (p, p), (1, 1))}


if __name__ == "__main__":
    raise SystemExit(main())
