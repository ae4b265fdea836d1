"""Experiment: pyc_lab's direct convolution kernel, build by build, against cuDNN.

For small convolutions a user brings — the zoo's particle CNN layers at batch 1 to 4096,
an image stem, a 1x1 layer over few channels, a depthwise layer — times every build of
``pyc_lab.kernels.conv_direct`` (the row kernel and the generic one, each tile) and
cuDNN through ``torch.nn.functional.conv1d/conv2d`` (benchmark mode, float32 without
TF32, as onnxruntime runs) on the same tensors: CUDA events, the host's launch gaps kept
out (``pyc_lab.profiling.benchmark``), median of 20 calls per round, the median of 3
interleaved rounds. Each result is checked against cuDNN first. It also records the
problem's first-call race as ``pl.conv`` runs it (``conv_gemm.choices()``: the cost,
GPU and host times of each candidate) and whether a CUDA graph records the direct
kernel for it (``records_direct``). Writes ``conv-direct.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cupy_and_torch, write_result

#: (name, x shape, w shape, stride, padding, dilation, groups)
PROBLEMS = [
    *[(f"particle conv1 @{n}", (n, 4, 32), (32, 4, 3), (1,), (1,), (1,), 1)
      for n in (1, 64, 1024, 4096)],
    *[(f"particle conv2 @{n}", (n, 32, 32), (32, 32, 3), (1,), (1,), (1,), 1)
      for n in (1, 64, 1024, 4096)],
    ("stem 7x7/2 3->64 @8", (8, 3, 224, 224), (64, 3, 7, 7), (2, 2), (3, 3), (1, 1), 1),
    ("1x1 64->64 56^2 @32", (32, 64, 56, 56), (64, 64, 1, 1), (1, 1), (0, 0), (1, 1), 1),
    ("depthwise 3x3 64ch 56^2 @8", (8, 64, 56, 56), (64, 1, 3, 3), (1, 1), (1, 1), (1, 1), 64),
    ("conv1d 16->64 k5 @256", (256, 16, 128), (64, 16, 5), (1,), (2,), (1,), 1),
]
ROUNDS = 3


def measure(cp: Any, torch: Any, sms: int, name: str, xs: tuple, ws: tuple, st: tuple,
            pd: tuple, dl: tuple, groups: int) -> dict[str, Any]:
    """One problem: every build and cuDNN timed, the race and the graph's choice."""
    import pyc_lab as pl
    from pyc_lab.kernels import conv_direct, conv_gemm
    from pyc_lab.kernels.arrays import torch_stream
    from pyc_lab.profiling import benchmark

    stream = torch_stream(0)
    x = torch.randn(xs, device="cuda")
    w = torch.randn(ws, device="cuda") / (ws[1] * ws[-1]) ** 0.5
    b = torch.randn(ws[0], device="cuda")
    f = torch.nn.functional.conv1d if len(xs) == 3 else torch.nn.functional.conv2d
    args = {"stride": st, "padding": pd, "dilation": dl, "groups": groups}
    want = f(x, w, b, **args)
    geo = conv_direct.geometry(xs, tuple(x.stride()), ws, st, pd, dl, groups)
    runs = {"cudnn": lambda: f(x, w, b, **args)}
    y = torch.empty_like(want)
    for config in conv_direct.configs(geo, sms):
        launch = conv_direct.launcher(2, geo, 0, None, sms, config)
        launch(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), stream)
        err = float((y - want).abs().max() / want.abs().max())
        label = config.label
        if err > 1e-4:
            print(f"{name}: {label} wrong by {err:.1e}; not timed")
            continue
        runs[label] = (lambda launch=launch: launch(x.data_ptr(), w.data_ptr(),
                                                    b.data_ptr(), y.data_ptr(), stream))
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(ROUNDS):
        for label, fn in runs.items():
            times[label].append(benchmark(fn, repeats=20, warmup=3, gpu=True,
                                          stream=stream).median_s * 1e6)
    us = {k: statistics.median(v) for k, v in times.items()}
    best = min((k for k in us if k != "cudnn"), key=us.get)
    # the race pl.conv runs on CuPy arrays (its choice, and a graph's)
    xc, wc, bc = (cp.from_dlpack(t) for t in (x, w, b))
    pl.conv(xc, wc, bc, **args)
    choice = conv_gemm.choice_for_cupy(xc, wc, bc, st, pd, dl, groups)
    row = {"problem": name, "x": xs, "w": ws, **args, "gpu_us": us, "best_direct": best,
           "best_direct_vs_cudnn": us["cudnn"] / us[best], "race": choice,
           "graph_records_direct": None if choice is None
           else conv_gemm.records_direct(choice)}
    print(f"{name}: cuDNN {us['cudnn']:.1f} us, {best} {us[best]:.1f} us "
          f"({row['best_direct_vs_cudnn']:.2f}x); race "
          f"{None if choice is None else choice['impl']}, graph records direct: "
          f"{row['graph_records_direct']}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write conv-direct.json into this folder")
    args = parser.parse_args(argv)
    found = cupy_and_torch("exp_conv_direct")
    if found is None:
        return 0
    cp, torch = found
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    from pyc_lab.kernels import conv_direct

    sms = conv_direct.sm_count(0)
    rows = [measure(cp, torch, sms, *problem) for problem in PROBLEMS]
    if args.out:
        path = write_result(args.out, "conv-direct", {
            "method": "CUDA events (pyc_lab.profiling.benchmark: spin kernel ahead), median "
                      f"of 20 calls per round, median of {ROUNDS} interleaved rounds; "
                      "float32, cuDNN in benchmark mode without TF32",
            "rows": rows})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
