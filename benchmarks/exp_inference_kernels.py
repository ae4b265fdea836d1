"""Experiment: the GPU work of one inference call, pyc_lab against onnxruntime (GPU lane).

For each zoo model at a small and a large batch, the GPU kernels and copies that one call
of each implementation of ``bench_inference`` issues (pyc_lab's compiled model with CUDA
graphs, onnxruntime's CUDA provider with and without its CUDA graphs), from torch's
profiler (CUPTI sees every library's kernels in the process): per call, how many kernels
and copies, their summed GPU time, and the host wall time of the profiled calls. It says
where a call's time goes when pyc_lab is slower: more launches, slower kernels, or host.

    python benchmarks/exp_inference_kernels.py --out $OUT
    python benchmarks/exp_inference_kernels.py --models --cnn --out $OUT   # the ResNet alone
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_inference import implementations
from common import write_result

log = logging.getLogger("exp_inference_kernels")

CALLS = 20


def profile_calls(call: Any, state: Any) -> dict[str, Any]:
    """Kernels and copies of :data:`CALLS` calls, per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        call(state)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call(state)
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / CALLS
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        dev = getattr(e, "device_type", None)
        if dev is None or "CUDA" not in str(dev):
            continue
        k = kernels.setdefault(e.name[:120], [0, 0.0])
        k[0] += 1
        k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    rows = sorted(({"name": n, "per_call": c / CALLS, "us_per_call": t / CALLS}
                   for n, (c, t) in kernels.items()), key=lambda r: -r["us_per_call"])
    return {"wall_us_per_call": wall * 1e6,
            "launches_per_call": sum(r["per_call"] for r in rows),
            "gpu_us_per_call": sum(r["us_per_call"] for r in rows), "kernels": rows[:20]}


def host_profile(call: Any, state: Any, top: int = 25) -> list[dict[str, Any]]:
    """Where the host time of :data:`CALLS` calls goes (cProfile, the functions with the
    most time of their own, per call): what runs between a call's CUDA graphs."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(CALLS):
        call(state)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = [{"function": f"{Path(f).name}:{line}:{fn}", "calls_per_call": nc / CALLS,
             "own_us_per_call": tt / CALLS * 1e6, "cum_us_per_call": ct / CALLS * 1e6}
            for (f, line, fn), (_, nc, tt, ct, _) in stats.items()]
    return sorted(rows, key=lambda r: -r["own_us_per_call"])[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write inference-kernels.json into this folder")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 1024])
    parser.add_argument("--models", nargs="*", help="zoo model names (default: all)")
    parser.add_argument("--cnn", action="store_true",
                        help="also bench_inference's shipped ResNet-50 (its batches: "
                             "--cnn-batches)")
    parser.add_argument("--cnn-batches", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--impls", nargs="*",
                        default=["pyc_lab", "onnxruntime_cuda", "onnxruntime_cuda_graph"],
                        help="bench_inference's implementations to profile "
                             "(pyc_lab_channels_last: the channels-last import)")
    parser.add_argument("--host-profile", action="store_true",
                        help="also where each call's host time goes (cProfile)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from bench_inference import cnn_inputs, shipped_cnn

    from pyc_lab.inference import zoo

    payload: dict[str, Any] = {"calls_profiled": CALLS, "models": {}}
    runs = [(name, zoo.build(name), args.batches,
             lambda m, batch, seed, name=name: zoo.example_inputs(name, batch, seed))
            for name in (zoo.names() if args.models is None else args.models)]
    if args.cnn:
        runs.append(("resnet50_light", shipped_cnn(), args.cnn_batches, cnn_inputs))
    for name, m, batches, make_inputs in runs:
        impls = implementations(m, gpu=True,
                                channels_last="pyc_lab_channels_last" in args.impls,
                                only=set(args.impls))
        entry = payload["models"][name] = {}
        for batch in batches:
            feeds = make_inputs(m, batch, batch)
            for impl, (prep, call, _, _) in impls.items():
                try:
                    entry[f"{impl}@{batch}"] = profile_calls(call, prep(feeds))
                except Exception as exc:  # keep the others
                    entry[f"{impl}@{batch}"] = {"error": f"{type(exc).__name__}: {exc}"}
                r = entry[f"{impl}@{batch}"]
                if args.host_profile and "error" not in r:
                    r["host"] = host_profile(call, prep(feeds))
                log.info("%s %s batch %d: %s launches, %.1f us GPU, %.1f us wall", name, impl,
                         batch, r.get("launches_per_call"), r.get("gpu_us_per_call", 0),
                         r.get("wall_us_per_call", 0))
        # what each convolution's first-call race chose, with every candidate's time
        from pyc_lab.kernels import conv_gemm

        entry["conv_choices"] = [{"problem": repr(k), **v}
                                 for k, v in conv_gemm.choices().items()]
        if args.out:
            write_result(args.out, "inference-kernels", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
