"""Experiment: where the channels-last ResNet's time goes at large batches, kernel by kernel.

``bench_inference``'s light ResNet-50 (imported channels last, CUDA graphs, its
convolutions tuned with ``pl.autotune_conv`` as the benchmark tunes them) is run at each
batch given: the bound call's median time, then a few calls under the PyTorch profiler
(CUPTI: the kernels inside the CUDA graphs included), whose kernels are summed by name
and by kind (CUTLASS convolution, cuBLAS GEMM, cuDNN, pooling, copies/transposes,
elementwise, other). Per batch: the call's time, the kernels' sum (what the GPU ran),
the gap between them, and the device memory the process held. Writes
``resnet-profile.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result

#: Kernel-name fragments -> kind (the first that matches).
KINDS = (("cutlass", "cutlass"), ("cudnn", "cudnn"), ("fprop", "cudnn"),
         ("convolve", "cudnn"), ("gemm", "cublas"), ("cublas", "cublas"), ("pool", "pooling"),
         ("transpose", "copy/transpose"), ("copy", "copy/transpose"),
         ("memcpy", "copy/transpose"), ("elementwise", "elementwise"),
         ("cupy_", "elementwise"), ("fused", "elementwise"))


def kind_of(name: str) -> str:
    low = name.lower()
    return next((k for frag, k in KINDS if frag in low), "other")


def profile(call: Any, repeats: int) -> dict[str, Any]:
    """Kernels of ``repeats`` calls of ``call`` under the PyTorch profiler (per call)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            call()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        entry = by_name[ev.name]
        entry[0] += 1
        entry[1] += ev.time_range.elapsed_us()  # a kernel's own span on the GPU
    kernels = sorted(({"name": n[:160], "kind": kind_of(n), "calls": c / repeats,
                       "ms": us / repeats / 1e3} for n, (c, us) in by_name.items()),
                     key=lambda r: -r["ms"])
    kinds: dict[str, float] = defaultdict(float)
    for k in kernels:
        kinds[k["kind"]] += k["ms"]
    return {"kernels_ms": sum(k["ms"] for k in kernels), "by_kind_ms": dict(kinds),
            "top": kernels[:40]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", nargs="*", type=int, default=[256, 512, 1024])
    parser.add_argument("--tune-s", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="write resnet-profile.json into this folder")
    args = parser.parse_args()
    # pl.conv's races (each convolution's routes timed at its first call) go to the log
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import bench_inference as bi
    import cupy as cp

    import pyc_lab as pl

    m = bi.shipped_cnn()
    tuning = bi.tune_cnn_convs(m, tuple(args.batches), args.tune_s)
    model = pl.inference.load(m, backend="cupy", cuda_graph=True, layout="channels_last")
    rows = []
    for batch in sorted(args.batches, reverse=True):  # the largest while memory is free
        feeds = bi.cnn_inputs(m, batch, 0)
        run = model.io_binding([cp.asarray(feeds[n]) for n in model.input_names])

        def call(run=run) -> None:
            run()

        for _ in range(3):
            call()
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            call()
            cp.cuda.Device().synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        prof = profile(call, args.repeats)
        free, total = cp.cuda.runtime.memGetInfo()
        row = {"batch": batch, "call_ms": statistics.median(times),
               "device_memory_used_gib": (total - free) / 2**30, **prof}
        row["gap_ms"] = row["call_ms"] - row["kernels_ms"]
        rows.append(row)
        print(f"batch {batch}: call {row['call_ms']:.2f} ms, kernels {row['kernels_ms']:.2f} "
              f"ms, by kind " + ", ".join(f"{k} {v:.2f}" for k, v in
                                          sorted(prof["by_kind_ms"].items(),
                                                 key=lambda kv: -kv[1])), flush=True)
        for k in prof["top"][:12]:
            print(f"   {k['ms']:8.3f} ms  {k['calls']:5.1f}x  {k['kind']:14s} {k['name'][:100]}")
        del run
        cp.get_default_memory_pool().free_all_blocks()
    if args.out:
        path = write_result(args.out, "resnet-profile", {
            "method": "bound call of the channels-last import (CUDA graphs), median of 7; "
                      "kernels from torch.profiler (CUPTI) over --repeats calls, per call",
            "tuning": {"seconds": tuning["seconds"],
                       "tuned_vs_cudnn_median": tuning["tuned_vs_cudnn_median"]},
            "rows": rows})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
