"""Experiment: how an imported model's convolutions should run on a GPU (GPU lane).

An ONNX ``Conv`` can stay im2col inside the compiled program (recorded by its CUDA
graph) or call ``pl.conv`` (cuDNN or the GEMM form, a library call between graphs).
This measures both routes, and ``"auto"`` (``pl.inference.load(conv=...)``), on the zoo's
1-D CNN and the ``light_resnet50`` shipped inside the onnx package, at several batches:
host wall time per call including the device synchronisation (as ``bench_inference``),
median of the repeats, each result checked against onnxruntime (CPU) first. For the
ResNet at batch 1 on the im2col route it also lists the GPU kernels that take the time
(torch's profiler, which sees CuPy's kernels too), and for every model the FLOPs of each
convolution at batch 1 (the size ``"auto"`` decides by).

    python benchmarks/exp_onnx_conv.py --out $OUT
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_inference import cnn_inputs, shipped_cnn
from common import write_result

log = logging.getLogger("exp_onnx_conv")


def conv_sizes(m: Any) -> list[dict[str, Any]]:
    """Each Conv's FLOPs at batch 1 (shapes from onnx's shape inference)."""
    import onnx

    from pyc_lab.inference.onnx_ops import conv_flops

    inferred = onnx.shape_inference.infer_shapes(m)
    shapes = {v.name: [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.input, *inferred.graph.value_info]}
    inits = {t.name: list(t.dims) for t in m.graph.initializer}
    out = []
    for n in m.graph.node:
        if n.op_type != "Conv" or n.input[0] not in shapes or n.input[1] not in inits:
            continue
        a = {x.name: list(x.ints) or x.i for x in n.attribute}
        w = inits[n.input[1]]
        nd = len(w) - 2
        x = [1, *shapes[n.input[0]][1:]]
        out.append({"node": n.name, "x": x, "w": w,
                    "flops": conv_flops(x, w, a.get("strides", [1] * nd),
                                        a.get("pads", [0] * 2 * nd),
                                        a.get("dilations", [1] * nd))})
    return out


def time_route(m: Any, inputs: Any, route: str, batches: tuple[int, ...],
               repeats: int) -> list[dict[str, Any]]:
    import cupy as cp
    import onnxruntime as ort

    import pyc_lab as pl
    from pyc_lab.profiling import benchmark

    model = pl.inference.load(m, backend="cupy", cuda_graph=True, conv=route,
                              layout="channels_first")  # the routes, as the graph has them
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rows = []
    for batch in batches:
        feeds = inputs(m, batch, batch)
        state = [cp.asarray(feeds[n]) for n in model.input_names]

        def call(state=state):
            outs = model.run(state)
            cp.cuda.Device().synchronize()
            return outs

        got = [cp.asnumpy(o) for o in call()]
        want = ref.run(None, feeds)
        err = max(float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-12))
                  for g, w in zip(got, want, strict=True))
        t = benchmark(call, (), repeats=repeats, warmup=3, gpu=False, min_time_s=0.3,
                      name=route)
        med = statistics.median(t.cpu_s)
        rows.append({"route": route, "batch": batch, "median_ms": med * 1e3,
                     "p99_ms": float(np.percentile(t.cpu_s, 99)) * 1e3,
                     "rows_per_s": batch / med, "max_rel_error": err,
                     "graph": str(getattr(model.compiled, "graph_decision", ""))[:200]})
        log.info("%s %s batch %d: %.3f ms (error %.1e)", m.graph.name, route, batch,
                 med * 1e3, err)
    return rows


def top_kernels(m: Any, inputs: Any, route: str, batch: int) -> list[dict[str, Any]]:
    """The GPU kernels of ten calls, by total time (torch's profiler)."""
    import cupy as cp
    import torch
    from torch.profiler import ProfilerActivity, profile

    import pyc_lab as pl

    model = pl.inference.load(m, backend="cupy", cuda_graph=True, conv=route,
                              layout="channels_first")  # the routes, as the graph has them
    feeds = inputs(m, batch, 1)
    state = [cp.asarray(feeds[n]) for n in model.input_names]
    for _ in range(3):
        model.run(state)
    cp.cuda.Device().synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            model.run(state)
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        dev = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if dev:
            rows.append({"name": e.key[:160], "calls": e.count, "device_us_total": dev})
    rows.sort(key=lambda r: -r["device_us_total"])
    return rows[:25]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write onnx-conv.json into this folder")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--models", nargs="*", help="particle_cnn and/or resnet50_light")
    parser.add_argument("--routes", nargs="*", default=["im2col", "library", "auto"])
    parser.add_argument("--no-profile", action="store_true", help="skip the kernel list")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from pyc_lab.inference import zoo

    cnn = shipped_cnn()
    models = {
        "particle_cnn": (zoo.build("particle_cnn"),
                         lambda m, b, s: zoo.example_inputs("particle_cnn", b, s),
                         (1, 64, 1024, 4096)),
        "resnet50_light": (cnn, cnn_inputs, (1, 8, 32)),
    }
    payload: dict[str, Any] = {"method": "host wall time per call incl. device sync, "
                                         "median; pl.inference.load(cupy, cuda_graph=True)",
                               "models": {}}
    for name, (m, inputs, batches) in models.items():
        if args.models and name not in args.models:
            continue
        entry: dict[str, Any] = {"convs": conv_sizes(m), "rows": []}
        payload["models"][name] = entry
        for route in args.routes:
            try:
                entry["rows"] += time_route(m, inputs, route, batches, args.repeats)
            except Exception as exc:  # keep the other routes' figures
                log.exception("%s %s failed", name, route)
                entry["rows"].append({"route": route, "error": f"{type(exc).__name__}: {exc}"})
        if args.out:
            write_result(args.out, "onnx-conv", payload)
    if args.no_profile:
        return 0
    try:
        payload["resnet_batch1_im2col_kernels"] = top_kernels(cnn, cnn_inputs, "im2col", 1)
    except Exception as exc:
        payload["resnet_batch1_im2col_kernels"] = f"{type(exc).__name__}: {exc}"
    if args.out:
        write_result(args.out, "onnx-conv", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
