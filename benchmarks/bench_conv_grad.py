"""pyc_lab's CUTLASS convolution gradients (dgrad, wgrad) tuned against cuDNN on ResNet-50.

For every distinct ResNet-50 convolution at batch 32 in bfloat16, channels last (the
stem's wgrad included; its dgrad is never needed, the image takes no gradient), and for
each gradient:

1. ``pl.autotune_conv(..., direction=...)`` tunes the gradient over the benchmark's
   space (the Hopper kernels' tiles with no cluster where they take the problem, the
   CUTLASS 2 kernels — strided dgrad, split-K wgrad — at most ``MAX_CANDIDATES``
   interleaved) with cuDNN's ``convolution_backward`` of that gradient timed in the same
   run (the tuner's timing: CUDA events, L2 flushed);
2. the layer's backward pass as ``pl.conv`` runs it (:func:`pyc_lab.kernels.
   conv_grad_route.conv_grads`: each gradient by the tuned kernel where it wins the
   first call's race, else cuDNN) is timed against torch's backward (cuDNN's dgrad and
   wgrad; the stem's wgrad alone) in ``--rounds`` interleaved rounds of CUDA-event
   medians, its results checked against cuDNN's.

Usage::

    python benchmarks/bench_conv_grad.py --out benchmarks/results/h200
    python benchmarks/bench_conv_grad.py --prebuild .kcache    # nvcc only, no GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_conv import median_rounds
from bench_conv_cutlass import LAYERS
from common import cupy_and_torch, write_result

import pyc_lab as pl
from pyc_lab.kernels.cutlass.conv import ConvConfig, ConvKernel
from pyc_lab.kernels.cutlass.conv_2x import Conv2xConfig

BATCH = 32
DTYPE, TORCH_DTYPE = "bf16", "bfloat16"
DIRECTIONS = ("dgrad", "wgrad")
#: Candidates per gradient (the two families interleaved, best-ranked first).
MAX_CANDIDATES = 4
#: The Hopper tiles the benchmark tunes over (no clusters: fewer builds to carry).
GRAD_TILES = ((128, 128), (128, 64), (64, 128), (64, 64))


def in_grad_space(cfg: ConvConfig | Conv2xConfig) -> bool:
    """The configurations this benchmark tunes over (what ``--prebuild`` builds): every
    CUTLASS 2 gradient candidate, the Hopper ones of :data:`GRAD_TILES` without a
    cluster."""
    if isinstance(cfg, Conv2xConfig):
        return True
    return cfg.tile[:2] in GRAD_TILES and cfg.cluster == (1, 1)


def problems() -> list[tuple[tuple[int, ...], tuple[int, ...], int, int, str]]:
    """``(x shape, w shape, stride, padding, direction)`` of every gradient benchmarked."""
    out = []
    for c, k, size, r, s in LAYERS:
        for direction in DIRECTIONS:
            if c == 3 and direction == "dgrad":
                continue  # the image takes no gradient
            out.append(((BATCH, c, size, size), (k, c, r, r), s, r // 2, direction))
    return out


def candidates(xs: tuple[int, ...], ws: tuple[int, ...], stride: int, pad: int,
               direction: str, sm_count: int = 132) -> list[Any]:
    """What ``autotune_conv`` tunes for one gradient here."""
    from pyc_lab.kernels.tuning.conv_runner import gradient_candidates
    from pyc_lab.kernels.tuning.conv_tune import conv_geometry_of

    g = conv_geometry_of(xs, ws, stride=stride, padding=pad)
    kernel = ConvKernel(DTYPE, 2, direction=direction)
    return gradient_candidates(g, kernel, sm_count, in_grad_space)[:MAX_CANDIDATES]


def prebuild(directory: str) -> None:
    """Build every candidate of the benchmark into ``directory`` (no GPU needed)."""
    import concurrent.futures as cf
    import os

    from pyc_lab.kernels.cache import KernelCache
    from pyc_lab.kernels.cutlass.conv import build_conv
    from pyc_lab.kernels.cutlass.conv_2x import build_conv2x, conv2x_widths

    cache = KernelCache(directory)
    jobs: dict[tuple, None] = {}
    for xs, ws, s, p, direction in problems():
        kernel = ConvKernel(DTYPE, 2, direction=direction)
        for cfg in candidates(xs, ws, s, p, direction):
            widths = conv2x_widths(cfg, kernel, xs[1], ws[0]) \
                if isinstance(cfg, Conv2xConfig) else None
            jobs[(cfg, kernel, widths)] = None

    def build(job: tuple) -> Any:
        cfg, kernel, widths = job
        if widths is None:
            return build_conv(cfg, kernel, cache=cache)
        return build_conv2x(cfg, kernel, widths[0], cache=cache, align_out=widths[1])

    with cf.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 2))) as pool:
        for (cfg, kern, _), res in zip(jobs, pool.map(build, jobs), strict=True):
            print(res.status, kern.op, cfg.id, f"{res.seconds:.0f} s", res.message[:200],
                  flush=True)


def tune(xs: tuple[int, ...], ws: tuple[int, ...], stride: int, pad: int, direction: str,
         flop: int, repeats: int, budget_s: float) -> dict[str, Any]:
    """One gradient tuned over the benchmark's space, with cuDNN in the same run."""
    allowed = set(candidates(xs, ws, stride, pad, direction))
    try:
        res = pl.autotune_conv(xs, ws, stride=stride, padding=pad, dtype=DTYPE,
                               direction=direction, restrict=lambda cfg: cfg in allowed,
                               max_candidates=MAX_CANDIDATES, repeats=repeats,
                               budget_s=budget_s)
    except pl.PycLabError as exc:
        return {"not_taken": str(exc)}
    best = res.best
    out = {"seconds": res.seconds, "stopped_by": res.stopped_by,
           "cudnn_ms": res.baselines["cudnn"],
           "best": best.config if best is not None else None,
           "best_ms": best.time_ms if best is not None and best.ok else None,
           "candidates": res.table.to_dict("records")
           if hasattr(res.table, "to_dict") else res.table,
           "cudnn_tflops": flop / res.baselines["cudnn"] / 1e9}
    if best is not None and best.ok:
        out["cutlass_vs_cudnn"] = res.baselines["cudnn"] / best.time_ms
        out["cutlass_tflops"] = flop / best.time_ms / 1e9
    return out


def one_layer(torch: Any, xs: tuple[int, ...], ws: tuple[int, ...], stride: int, pad: int,
              directions: tuple[str, ...], rounds: int, repeats: int,
              budget_s: float) -> dict[str, Any]:
    """Tune the layer's gradients, then time its backward as ``pl.conv`` runs it
    against torch's (the gradients a training step needs: no dgrad for the stem)."""
    from pyc_lab.kernels import conv_grad_route
    from pyc_lab.kernels.conv_grad import torch_conv_backward

    n, c, size, _ = xs
    k, _, r, _ = ws
    row: dict[str, Any] = {"layer": f"resnet50 {c}->{k} {size}x{size} {r}x{r} s{stride}",
                           "dtype": TORCH_DTYPE, "n": n, "directions": list(directions)}
    out = (size + 2 * pad - r) // stride + 1
    flop = 2 * n * k * out * out * c * r * r
    row["tune"] = {d: tune(xs, ws, stride, pad, d, flop, repeats, budget_s)
                   for d in directions}
    tdt = getattr(torch, TORCH_DTYPE)
    gen = torch.Generator(device="cuda").manual_seed(0)
    last = torch.channels_last
    x = torch.randn(xs, device="cuda", dtype=tdt, generator=gen).contiguous(memory_format=last)
    w = (torch.randn(ws, device="cuda", dtype=tdt, generator=gen) / (c * r * r) ** 0.5
         ).contiguous(memory_format=last)
    dy = torch.randn((n, k, out, out), device="cuda", dtype=tdt, generator=gen).contiguous(
        memory_format=last)
    geo = {"stride": (stride, stride), "pads": (pad, pad), "dilation": (1, 1), "groups": 1}
    needs = ("dgrad" in directions, "wgrad" in directions)

    def lib() -> Any:
        return torch_conv_backward(x, w, dy, bias=False, needs=(*needs, False), **geo)

    def ours() -> Any:
        return conv_grad_route.conv_grads(x, w, dy, has_bias=False, needs=needs, **geo)

    want, got = lib(), ours()  # ours: the race of each tuned gradient against cuDNN
    errs = [float((g.float() - t.float()).abs().max() / (t.float().abs().max() + 1e-30))
            for g, t in zip(got[:2], want[:2], strict=True) if t is not None]
    row["rel_err_vs_cudnn"] = max(errs)
    if not max(errs) <= 8e-2:
        row["error"] = f"pl.conv's backward differs from cuDNN: {max(errs):.3g}"
        return row
    made = conv_grad_route.choices()
    row["choices"] = {kk[0]: v for kk, v in made.items()
                      if kk[3] == tuple(xs) and kk[5] == tuple(ws)}
    ms = median_rounds({"cudnn": lib, "pl.conv": ours}, rounds, repeats)
    row["backward_ms"] = ms
    row["ratio_vs_cudnn"] = ms["cudnn"] / ms["pl.conv"]
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for direction in DIRECTIONS:
        tuned = [r["tune"][direction]["cutlass_vs_cudnn"] for r in rows
                 if "cutlass_vs_cudnn" in r.get("tune", {}).get(direction, {})]
        out[direction] = {"cutlass_vs_cudnn": {
            "problems": len(tuned), "median": statistics.median(tuned) if tuned else None,
            "max": max(tuned) if tuned else None, "wins": sum(t > 1.0 for t in tuned)},
            "cutlass_chosen": [r["layer"] for r in rows
                               if (r.get("choices", {}).get(direction) or {}).get("impl")
                               == "cutlass"]}
    ratios = [r["ratio_vs_cudnn"] for r in rows if "ratio_vs_cudnn" in r]
    out["backward_pl_conv_vs_cudnn"] = {
        "layers": len(ratios), "median": statistics.median(ratios) if ratios else None,
        "min": min(ratios) if ratios else None, "max": max(ratios) if ratios else None}
    out["errors"] = [f"{r['layer']}: {r['error']}" for r in rows if "error" in r]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tune-budget-s", type=float, default=90.0,
                        help="per gradient: stop starting candidates (and waiting for "
                             "builds) after this many seconds")
    parser.add_argument("--budget-s", type=float, default=360.0,
                        help="stop starting new problems after this many seconds")
    parser.add_argument("--prebuild", metavar="DIR",
                        help="only build the kernels into DIR (no GPU needed)")
    args = parser.parse_args(argv)
    if args.prebuild:
        prebuild(args.prebuild)
        return 0
    libs = cupy_and_torch("bench_conv_grad")
    if libs is None:
        return 0
    _, torch = libs
    torch.backends.cudnn.benchmark = True
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    not_run: list[str] = []

    def save() -> None:
        write_result(args.out, "conv-grad", {
            "method": "per ResNet-50 layer (batch 32, bf16, channels last): each "
                      "gradient tuned by pl.autotune_conv(direction=...) over the "
                      "benchmark's CUTLASS space with cuDNN's convolution_backward of that "
                      "gradient timed in the same run; then the layer's backward as "
                      "pl.conv's computes it (its first call races each tuned kernel "
                      "against cuDNN) against torch's convolution_backward (dx and dw; "
                      "the stem's dw alone) in --rounds interleaved rounds of CUDA-event "
                      "medians",
            "results": rows, "not_run": not_run, "summary": summarise(rows),
            "wall_s": time.perf_counter() - t0})

    layers: dict[tuple, list[str]] = {}
    for xs, ws, s, p, direction in problems():
        layers.setdefault((xs, ws, s, p), []).append(direction)
    for (xs, ws, s, p), directions in layers.items():
        if time.perf_counter() - t0 > args.budget_s:
            not_run.append(f"{xs} {ws} s{s}")
            continue
        try:
            row = one_layer(torch, xs, ws, s, p, tuple(directions), args.rounds,
                            args.repeats, args.tune_budget_s)
        except Exception as exc:  # one failing problem must not end the run
            row = {"layer": f"{xs} {ws} s{s}",
                   "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rows.append(row)
        print(row["layer"], {d: t.get("cutlass_vs_cudnn") for d, t in
                             row.get("tune", {}).items()},
              row.get("ratio_vs_cudnn"),
              {d: c.get("impl") for d, c in row.get("choices", {}).items()},
              row.get("error", ""), flush=True)
        torch.cuda.empty_cache()
        save()
    save()
    print(summarise(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
