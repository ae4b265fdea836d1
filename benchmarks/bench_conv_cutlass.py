"""pyc_lab's own CUTLASS convolutions, tuned per problem, against cuDNN on the
convolution issue's ResNet-50 layers.

For each layer of the issue's table at batch 128, float16 and bfloat16, channels last,
no bias (as in the network):

1. ``pl.autotune_conv`` builds (or takes from the kernel cache) the CUTLASS candidates
   of :data:`BENCH_TILES` x clusters (1, 1) and (2, 1) that the problem's ranking keeps
   (Hopper kernels), or for the stem, whose three channels TMA cannot load, the first
   :data:`BENCH_2X` CUTLASS 2 configurations ``conv2x_configs`` ranks (with its padded
   candidates first), checks each against the convolution in float32 and times it with
   the tuner's timing (CUDA events, L2 flushed); cuDNN (torch, benchmark mode) is timed
   the same way in the same run. The row keeps the best CUTLASS time, cuDNN's, and their
   ratio.
2. ``pl.conv2d`` on fresh channels-last tensors: its first call races cuDNN, the GEMM
   form and the tuned CUTLASS kernel on the caller's tensors (the choice is recorded),
   then pl.conv and ``F.conv2d`` are timed in interleaved rounds of CUDA-event medians
   (:func:`common.gpu_time`) — the never-slower rule measured from the user's side.

A layer no kernel can take is recorded with the reason and runs cuDNN or the GEMM form
in ``pl.conv``. TFLOP/s count ``2 N K P Q C R S``. Writes ``conv-cutlass.json`` to
``--out``.

    python benchmarks/bench_conv_cutlass.py --out benchmarks/results/h200
    python benchmarks/bench_conv_cutlass.py --prebuild .kcache    # nvcc only, no GPU
    python benchmarks/bench_conv_cutlass.py --prebuild .kcache --family 2x  # the stem's
    python benchmarks/bench_conv_cutlass.py --dtypes f32 --out $OUT  # float32, 3xTF32
    python benchmarks/bench_conv_cutlass.py --prebuild .kconv32 --family f32

``--dtypes f32`` runs the layers in float32 at float32's accuracy: the CUTLASS 2 family's
3xTF32 kernels (every configuration ``conv2x_configs`` offers the layer) against cuDNN
with TF32 off (``torch.backends.cudnn.allow_tf32 = False``), and ``pl.conv2d`` under the
same setting, which then races the tuned f32 kernel.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_conv import median_rounds
from common import cupy_and_torch, write_result

import pyc_lab as pl
from pyc_lab.kernels.cutlass.conv import TILES, ConvConfig, ConvKernel
from pyc_lab.kernels.cutlass.conv_2x import Conv2xConfig, conv2x_configs

#: The issue's ResNet-50 layers: (C, K, H (= W), kernel, stride); padding kernel // 2.
LAYERS = ((64, 64, 56, 3, 1), (128, 128, 28, 3, 1), (256, 256, 14, 3, 1),
          (512, 512, 7, 3, 1), (256, 64, 56, 1, 1), (64, 256, 56, 1, 1), (3, 64, 224, 7, 2),
          (1024, 2048, 14, 1, 2))
BATCH = 128
#: The stem is tuned at batch 32 too (the issue's other batch), so that ``bench_conv``,
#: run after this in the GPU lane, finds its kernels at both batches.
EXTRA = (((3, 64, 224, 7, 2), 32),)
DTYPES = (("f16", "float16"), ("bf16", "bfloat16"))
#: Every dtype ``--dtypes`` may ask for: ``f32`` is float32 at its own accuracy (3xTF32
#: CUTLASS 2 kernels, every configuration ``conv2x_configs`` offers; cuDNN and pl.conv
#: with TF32 off).
ALL_DTYPES = {**dict(DTYPES), "f32": "float32"}
BENCH_TILES = TILES
BENCH_CLUSTERS = ((1, 1), (2, 1))
#: CUTLASS 2 candidates per problem: the first this many that ``conv2x_configs`` ranks
#: (nvcc takes one to two minutes each on two cores; the prebuild carries them).
BENCH_2X = 4


@functools.cache
def stem_2x_configs(dtype: str) -> tuple[Conv2xConfig, ...]:
    """The CUTLASS 2 configurations the benchmark tunes the stem over."""
    return tuple(conv2x_configs(ConvKernel(dtype, 2), 3, 64)[:BENCH_2X])


def f32_jobs(batch: int = BATCH) -> list[tuple[Conv2xConfig, ConvKernel, int, int]]:
    """``(config, kernel, channels, out_channels)`` of every 3xTF32 kernel the f32 rows
    tune over (each layer's ``conv2x_configs``; layers share most libraries)."""
    kern = ConvKernel("f32", 2)
    return [(cfg, kern, c, k) for c, k, *_ in LAYERS for cfg in conv2x_configs(kern, c, k)]


def in_bench_space(cfg: ConvConfig | Conv2xConfig) -> bool:
    """The configurations this benchmark tunes over in f16 and bf16 (what ``--prebuild``
    builds)."""
    if isinstance(cfg, Conv2xConfig):
        return any(cfg in stem_2x_configs(dt) for dt, _ in DTYPES)
    return cfg.tile[:2] in BENCH_TILES and cfg.cluster in BENCH_CLUSTERS


def prebuild(directory: str, family: str = "all") -> None:
    """Build every configuration of the benchmark's space for both dtypes into
    ``directory`` (no GPU needed; the GPU lane carries it as ``.kcache``): the Hopper
    kernels (``family="3x"``), the stem's CUTLASS 2 ones (``"2x"``) or both; ``"f32"``:
    the 3xTF32 kernels of the f32 rows (:func:`f32_jobs`)."""
    import concurrent.futures as cf
    import os

    from pyc_lab.kernels.cache import KernelCache
    from pyc_lab.kernels.cutlass.conv import build_conv
    from pyc_lab.kernels.cutlass.conv_2x import build_conv2x, conv2x_widths

    cache = KernelCache(directory)
    jobs = [(ConvConfig((m, n, 64), cl), ConvKernel(dt, 2))
            for dt, _ in DTYPES for m, n in BENCH_TILES for cl in BENCH_CLUSTERS]
    jobs += [(cfg, ConvKernel(dt, 2)) for dt, _ in DTYPES for cfg in stem_2x_configs(dt)]

    def build(job: tuple[Any, ConvKernel]) -> Any:
        cfg, kern = job
        if isinstance(cfg, ConvConfig):
            return build_conv(cfg, kern, cache=cache)
        c, k = widths.get((cfg, kern), (3, 64))
        align, align_out = conv2x_widths(cfg, kern, c, k)
        return build_conv2x(cfg, kern, align, cache=cache, align_out=align_out)

    widths: dict[tuple, tuple[int, int]] = {}
    if family == "f32":
        jobs = []
        for cfg, kern, c, k in f32_jobs():
            key = (cfg, kern, *conv2x_widths(cfg, kern, c, k))
            if key not in widths:  # one build per library
                widths[key] = (c, k)
                jobs.append((cfg, kern))
                widths[(cfg, kern)] = (c, k)
    elif family != "all":
        jobs = [j for j in jobs if isinstance(j[0], Conv2xConfig) == (family == "2x")]
    with cf.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 2))) as pool:
        for (cfg, kern), res in zip(jobs, pool.map(build, jobs), strict=True):
            print(res.status, kern.op, kern.dtype, cfg.id, f"{res.seconds:.0f} s",
                  res.message[:200], flush=True)


def one_layer(torch: Any, layer: tuple[int, ...], dtype: str, tname: str, rounds: int,
              repeats: int, budget_s: float, batch: int = BATCH) -> dict[str, Any]:
    import torch.nn.functional as F

    from pyc_lab.kernels import conv_gemm

    c, k, size, r, s = layer
    pad = r // 2
    row: dict[str, Any] = {"layer": f"resnet50 {c}->{k} {size}x{size} {r}x{r} s{s}",
                           "dtype": tname, "n": batch, "c": c, "k": k, "size": size,
                           "kernel": r, "stride": s}
    out = (size + 2 * pad - r) // s + 1
    flop = 2 * batch * k * out * out * c * r * r
    try:
        res = pl.autotune_conv((batch, c, size, size), (k, c, r, r), stride=s, padding=pad,
                               dtype=dtype, max_candidates=None,
                               restrict=None if dtype == "f32" else in_bench_space,
                               repeats=repeats, budget_s=budget_s)
        best = res.best
        row["tune"] = {"seconds": res.seconds, "stopped_by": res.stopped_by,
                       "cudnn_ms": res.baselines["cudnn"],
                       "best": best.config if best is not None else None,
                       "best_ms": best.time_ms if best is not None and best.ok else None,
                       "candidates": res.table.to_dict("records")
                       if hasattr(res.table, "to_dict") else res.table}
        if best is not None and best.ok:
            row["tune"]["cutlass_vs_cudnn"] = res.baselines["cudnn"] / best.time_ms
            row["tune"]["cutlass_tflops"] = flop / best.time_ms / 1e9
        row["tune"]["cudnn_tflops"] = flop / res.baselines["cudnn"] / 1e9
    except pl.PycLabError as exc:
        row["tune"] = {"not_taken": str(exc)}
    tdt = getattr(torch, tname)
    x = torch.randn(batch, c, size, size, device="cuda", dtype=tdt).contiguous(
        memory_format=torch.channels_last)
    w = (torch.randn(k, c, r, r, device="cuda", dtype=tdt) / (c * r * r) ** 0.5
         ).contiguous(memory_format=torch.channels_last)
    lib = lambda: F.conv2d(x, w, stride=s, padding=pad)  # noqa: E731
    ours = lambda: pl.conv2d(x, w, stride=s, padding=pad)  # noqa: E731
    want = lib().float()
    got = ours()  # the race: cuDNN, the GEMM form and the tuned kernel
    err = float((got.float() - want).abs().max() / (want.abs().max() + 1e-30))
    row["rel_err_vs_cudnn"] = err
    if not err <= (1e-4 if dtype == "f32" else 2e-2 * (4 if dtype == "bf16" else 1)):
        row["error"] = f"pl.conv differs from cuDNN: {err:.3g} of the largest value"
        return row
    row["choice"] = conv_gemm.choice_for(x, w, None, (s, s), (pad, pad), (1, 1))
    ms = median_rounds({"cudnn": lib, "pl.conv": ours}, rounds, repeats)
    row["ms"] = ms
    row["tflops"] = {name: flop / t / 1e9 for name, t in ms.items()}
    row["ratio_vs_cudnn"] = ms["cudnn"] / ms["pl.conv"]
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tuned = [r["tune"]["cutlass_vs_cudnn"] for r in rows
             if "cutlass_vs_cudnn" in r.get("tune", {})]
    ratios = [r["ratio_vs_cudnn"] for r in rows if "ratio_vs_cudnn" in r]
    return {
        "cutlass_vs_cudnn": {"problems": len(tuned),
                             "median": statistics.median(tuned) if tuned else None,
                             "max": max(tuned) if tuned else None,
                             "wins": sum(t > 1.0 for t in tuned)},
        "pl_conv_vs_cudnn": {"problems": len(ratios),
                             "median": statistics.median(ratios) if ratios else None,
                             "min": min(ratios) if ratios else None},
        "cutlass_chosen": [f"{r['layer']} {r['dtype']}" for r in rows
                           if (r.get("choice") or {}).get("impl") == "cutlass"],
        "errors": [f"{r['layer']} {r['dtype']}: {r['error']}" for r in rows if "error" in r]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tune-budget-s", type=float, default=120.0,
                        help="per problem: stop starting candidates (and waiting for "
                             "builds) after this many seconds")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="stop starting new problems after this many seconds")
    parser.add_argument("--family", choices=("all", "3x", "2x", "f32"), default="all",
                        help="with --prebuild: which kernel family to build")
    parser.add_argument("--dtypes", nargs="*", choices=sorted(ALL_DTYPES),
                        default=[d for d, _ in DTYPES],
                        help="f32: float32 at its own accuracy (3xTF32 kernels against "
                             "cuDNN with TF32 off; the layers only, at --batch)")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--prebuild", metavar="DIR",
                        help="only build the kernels into DIR (no GPU needed)")
    args = parser.parse_args(argv)
    if args.prebuild:
        prebuild(args.prebuild, args.family)
        return 0
    libs = cupy_and_torch("bench_conv_cutlass")
    if libs is None:
        return 0
    _, torch = libs
    torch.backends.cudnn.benchmark = True
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    not_run: list[str] = []

    def save() -> None:
        write_result(args.out, "conv-cutlass", {
            "method": "per layer: pl.autotune_conv over the benchmark's CUTLASS space "
                      "(tuner timing: CUDA events, L2 flushed, --repeats) with cuDNN timed "
                      "in the same run; then pl.conv2d (its first call races cuDNN, the "
                      "GEMM form and the tuned kernel) against F.conv2d in --rounds "
                      "interleaved rounds of CUDA-event medians; channels last, batch 128 "
                      "(the stem at 32 too)",
            "results": rows, "not_run": not_run, "summary": summarise(rows),
            "wall_s": time.perf_counter() - t0})

    for dtype in args.dtypes:
        tname = ALL_DTYPES[dtype]
        # float32 rows as a user who wants float32's accuracy runs them: TF32 off
        torch.backends.cudnn.allow_tf32 = dtype != "f32"
        torch.backends.cuda.matmul.allow_tf32 = False if dtype == "f32" else \
            torch.backends.cuda.matmul.allow_tf32
        extra = () if dtype == "f32" or args.batch != BATCH else EXTRA
        for layer, batch in (*((lay, args.batch) for lay in LAYERS), *extra):
            if time.perf_counter() - t0 > args.budget_s:
                not_run.append(f"{layer} batch {batch} {tname}")
                continue
            try:
                row = one_layer(torch, layer, dtype, tname, args.rounds, args.repeats,
                                args.tune_budget_s, batch)
            except Exception as exc:  # one failing problem must not end the run
                row = {"layer": str(layer), "dtype": tname,
                       "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            rows.append(row)
            print(row["layer"], batch, tname, row.get("tune", {}).get("cutlass_vs_cudnn"),
                  row.get("ratio_vs_cudnn"), (row.get("choice") or {}).get("impl"),
                  row.get("error", ""), flush=True)
            torch.cuda.empty_cache()
            save()
    save()
    print(summarise(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
