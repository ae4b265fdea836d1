"""Training through pl.conv2d against torch's conv2d, on the convolution issue's
ResNet-50 layers.

For the eight layers of ``bench_conv_cutlass`` (batch 32, channels last, float16 and
bfloat16): a training step's convolution — the forward, then the gradients of the
input, the weights and the bias — through ``pl.conv2d`` on tensors that require them,
and through ``torch.nn.functional.conv2d`` (cuDNN in benchmark mode) in the same run;
and the backward alone of each. Every pl.conv gradient is first checked against torch's
on the same inputs. Times are CUDA-event medians (:func:`common.gpu_time`) of three
interleaved rounds. Writes ``conv_backward.json`` to ``--out``.

    python benchmarks/bench_conv_backward.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_conv_cutlass import LAYERS
from common import cupy_and_torch, gpu_time, write_result

import pyc_lab as pl

BATCH = 32
ROUNDS = 3
TOL = {"float16": 2e-2, "bfloat16": 8e-2}  # of the largest gradient


def one_layer(torch: Any, layer: tuple[int, ...], dtype: str, repeats: int) -> dict:
    """pl.conv2d's and torch's training step (and backward) on one layer."""
    F = torch.nn.functional
    c, k, size, r, s = layer
    pad = r // 2
    tdt = getattr(torch, dtype)
    x = torch.randn(BATCH, c, size, size, device="cuda", dtype=tdt).to(
        memory_format=torch.channels_last).requires_grad_()
    w = (torch.randn(k, c, r, r, device="cuda") / (c * r * r) ** 0.5).to(tdt).to(
        memory_format=torch.channels_last).requires_grad_()
    b = torch.randn(k, device="cuda", dtype=tdt).requires_grad_()
    fwd = {"pl.conv2d": lambda: pl.conv2d(x, w, b, stride=s, padding=pad),
           "torch conv2d": lambda: F.conv2d(x, w, b, stride=s, padding=pad)}
    dy = torch.randn_like(fwd["torch conv2d"]())
    want = torch.autograd.grad(fwd["torch conv2d"](), (x, w, b), dy)
    row: dict[str, Any] = {"layer": f"resnet50 {c}->{k} {size}x{size} {r}x{r} s{s}",
                           "dtype": dtype, "batch": BATCH}
    got = torch.autograd.grad(fwd["pl.conv2d"](), (x, w, b), dy)
    err = max(float((g.float() - r_.float()).abs().max() / r_.float().abs().max())
              for g, r_ in zip(got, want, strict=True))
    row["rel_err_vs_torch"] = err
    if not err <= TOL[dtype]:
        row["error"] = f"gradients differ from torch's by {err:.3g} of the largest"
        return row
    kept = {n: f() for n, f in fwd.items()}
    runs = {}
    for name, f in fwd.items():
        runs[f"{name} step"] = lambda f=f: torch.autograd.grad(f(), (x, w, b), dy)
        runs[f"{name} backward"] = lambda y=kept[name]: torch.autograd.grad(
            y, (x, w, b), dy, retain_graph=True)
    times: dict[str, list[float]] = {n: [] for n in runs}
    for _ in range(ROUNDS):
        for name, fn in runs.items():
            times[name].append(gpu_time(fn, repeats=repeats) * 1e3)
    ms = {n: statistics.median(t) for n, t in times.items()}
    row["ms"] = ms
    row["step_ratio_vs_torch"] = ms["torch conv2d step"] / ms["pl.conv2d step"]
    row["backward_ratio_vs_torch"] = ms["torch conv2d backward"] / ms["pl.conv2d backward"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    libs = cupy_and_torch("bench_conv_backward")
    if libs is None:
        return 0
    _, torch = libs
    torch.backends.cudnn.benchmark = True
    t0 = time.perf_counter()
    results = []
    for dtype in ("float16", "bfloat16"):
        for layer in LAYERS:
            row = one_layer(torch, layer, dtype, args.repeats)
            results.append(row)
            print(row["layer"], dtype, row.get("step_ratio_vs_torch"),
                  row.get("backward_ratio_vs_torch"), row.get("error", ""), flush=True)
    steps = [r["step_ratio_vs_torch"] for r in results if "step_ratio_vs_torch" in r]
    backs = [r["backward_ratio_vs_torch"] for r in results if "backward_ratio_vs_torch" in r]
    summary = {"layers": len(results),
               "step_median_vs_torch": statistics.median(steps) if steps else None,
               "step_min_vs_torch": min(steps) if steps else None,
               "backward_median_vs_torch": statistics.median(backs) if backs else None,
               "backward_min_vs_torch": min(backs) if backs else None,
               "failed": [[r["layer"], r["dtype"]] for r in results if "error" in r]}
    write_result(args.out, "conv_backward", {
        "method": "batch 32, channels last; gradients checked against torch's first; "
                  "step: forward then torch.autograd.grad; backward: autograd.grad on a "
                  "kept graph; CUDA-event medians (common.gpu_time) of --repeats, 3 "
                  "interleaved rounds, the median round reported",
        "results": results, "summary": summary, "wall_s": time.perf_counter() - t0})
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
