"""pl.conv2d / pl.conv1d against cuDNN (its best algorithm, benchmark mode), on the
convolution issue's problems.

Every distinct convolution layer of ResNet-50 (torchvision's v1.5: the stride on the
3x3; 23 layers) at batch 32 and 128, in float16 and bfloat16, channels-last, without
bias (as in the network); and the particle-physics model's two Conv1d layers (4 -> 32
and 32 -> 32, kernel 3, padding 1, length 32, with bias) at serving batches 1, 64, 1024
and 4096 in float32 (as served), float16 and bfloat16.

Per problem, on the same torch tensors: ``torch.nn.functional.conv2d``/``conv1d`` with
``torch.backends.cudnn.benchmark = True`` (the baseline a user would call), ``pl.conv``
(cuDNN or the GEMM form, whichever its first call raced faster: ``pl.conv``'s own
choice, recorded), and the GEMM form alone. ``pl.conv``'s answer is first checked
against cuDNN's in float32. GPU times are medians over interleaved rounds of CUDA-event
medians (:func:`common.gpu_time`), so clock drift falls on every candidate alike;
host microseconds per call (:func:`common.host_us`) are recorded too, for the small
problems where the host is what a caller waits for. TFLOP/s count
``2 N K P Q C R S``. Writes ``conv.json`` to ``--out``.

    python benchmarks/bench_conv.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cupy_and_torch, gpu_time, host_us, write_result

import pyc_lab as pl

#: ResNet-50's distinct convolutions: (C, K, H (= W), kernel, stride); padding is
#: kernel // 2.
RESNET50 = (
    (3, 64, 224, 7, 2),
    (64, 64, 56, 1, 1), (64, 64, 56, 3, 1), (64, 256, 56, 1, 1), (256, 64, 56, 1, 1),
    (256, 128, 56, 1, 1), (128, 128, 56, 3, 2), (128, 512, 28, 1, 1), (256, 512, 56, 1, 2),
    (512, 128, 28, 1, 1), (128, 128, 28, 3, 1),
    (512, 256, 28, 1, 1), (256, 256, 28, 3, 2), (256, 1024, 14, 1, 1), (512, 1024, 28, 1, 2),
    (1024, 256, 14, 1, 1), (256, 256, 14, 3, 1),
    (1024, 512, 14, 1, 1), (512, 512, 14, 3, 2), (512, 2048, 7, 1, 1), (1024, 2048, 14, 1, 2),
    (2048, 512, 7, 1, 1), (512, 512, 7, 3, 1),
)
RESNET_BATCHES = (32, 128)
#: The particle-physics model's Conv1d layers: (C, K, length, kernel).
HEP = ((4, 32, 32, 3), (32, 32, 32, 3))
HEP_BATCHES = (1, 64, 1024, 4096)
TOL = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 2e-3}


def median_rounds(fns: dict[str, Any], rounds: int, repeats: int) -> dict[str, float]:
    """Median milliseconds of each of ``fns`` over interleaved rounds."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(gpu_time(fn, repeats=repeats, warmup=1) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def one_problem(cp: Any, torch: Any, problem: dict[str, Any], rounds: int,
                repeats: int) -> dict[str, Any]:
    """Time cuDNN, pl.conv and the GEMM form on one problem."""
    import torch.nn.functional as F

    from pyc_lab.kernels import conv_gemm

    n, c, k, size, r, s = (problem[x] for x in ("n", "c", "k", "size", "kernel", "stride"))
    pad = r // 2
    tdt = getattr(torch, problem["dtype"])
    one_d = problem["layer"].startswith("hep")
    if one_d:
        x = torch.randn(n, c, size, device="cuda", dtype=tdt)
        w = torch.randn(k, c, r, device="cuda", dtype=tdt) / (c * r) ** 0.5
        b = torch.randn(k, device="cuda", dtype=tdt)
        lib = lambda: F.conv1d(x, w, b, stride=s, padding=pad)  # noqa: E731
        ours = lambda: pl.conv1d(x, w, b, stride=s, padding=pad)  # noqa: E731
        gemm = lambda: conv_gemm.gemm_conv(x, w, b, (s,), (pad,), (1,))  # noqa: E731
        out = (size + 2 * pad - r) // s + 1
        flop = 2 * n * k * out * c * r
    else:
        x = torch.randn(n, c, size, size, device="cuda", dtype=tdt).contiguous(
            memory_format=torch.channels_last)
        w = (torch.randn(k, c, r, r, device="cuda", dtype=tdt) / (c * r * r) ** 0.5
             ).contiguous(memory_format=torch.channels_last)
        lib = lambda: F.conv2d(x, w, stride=s, padding=pad)  # noqa: E731
        ours = lambda: pl.conv2d(x, w, stride=s, padding=pad)  # noqa: E731
        gemm = lambda: conv_gemm.gemm_conv(x, w, None, (s, s), (pad, pad), (1, 1))  # noqa: E731
        out = (size + 2 * pad - r) // s + 1
        flop = 2 * n * k * out * out * c * r * r
    row: dict[str, Any] = dict(problem)
    want = lib().float()
    got = ours()  # the first call races cuDNN against the GEMM form
    err = float((got.float() - want).abs().max() / (want.abs().max() + 1e-30))
    row["rel_err_vs_cudnn"] = err
    if not err <= TOL[problem["dtype"]]:
        row["error"] = f"pl.conv differs from cuDNN: {err:.3g} of the largest value"
        return row
    nd = 1 if one_d else 2
    geometry = ((s,) * nd, (pad,) * nd, (1,) * nd)
    row["choice"] = conv_gemm.choice_for(x, w, b if one_d else None, *geometry)
    fns = {"cudnn": lib, "pl.conv": ours}
    if conv_gemm.patch_bytes(x, w, *geometry) <= conv_gemm.MAX_PATCH_BYTES:
        fns["gemm form"] = gemm
    ms = median_rounds(fns, rounds, repeats)
    row["ms"] = ms
    row["tflops"] = {name: flop / t / 1e9 for name, t in ms.items()}
    row["ratio_vs_cudnn"] = ms["cudnn"] / ms["pl.conv"]
    if n * c * size <= 4096 * 32 * 32 or one_d:  # small: the host is what callers wait for
        row["host_us"] = {"cudnn": host_us(cp, lib, calls=100, rounds=5),
                          "pl.conv": host_us(cp, ours, calls=100, rounds=5)}
    return row


def problems() -> list[dict[str, Any]]:
    """Every problem of the run, in order (the issue's stem first)."""
    out = []
    for dtype in ("bfloat16", "float16"):
        for n in RESNET_BATCHES:
            for c, k, size, r, s in RESNET50:
                out.append({"layer": f"resnet50 {c}->{k} {size}x{size} {r}x{r} s{s}",
                            "dtype": dtype, "n": n, "c": c, "k": k, "size": size,
                            "kernel": r, "stride": s})
    for dtype in ("float32", "float16", "bfloat16"):
        for n in HEP_BATCHES:
            for c, k, length, r in HEP:
                out.append({"layer": f"hep conv1d {c}->{k} L{length} k{r}", "dtype": dtype,
                            "n": n, "c": c, "k": k, "size": length, "kernel": r,
                            "stride": 1})
    return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and minimum of pl.conv / cuDNN over the problems, by group too."""
    def stats(sel: list[dict[str, Any]]) -> dict[str, Any]:
        ratios = [r["ratio_vs_cudnn"] for r in sel if "ratio_vs_cudnn" in r]
        if not ratios:
            return {"problems": 0}
        return {"problems": len(ratios), "median": statistics.median(ratios),
                "min": min(ratios), "below_0.85": sum(x < 0.85 for x in ratios),
                "gemm_chosen": sum(1 for r in sel
                                   if (r.get("choice") or {}).get("impl") == "gemm")}

    resnet = [r for r in rows if r["layer"].startswith("resnet50")]
    stem = {f"{r['dtype']} n{r['n']}": {"ratio": r.get("ratio_vs_cudnn"),
                                       "tflops": r.get("tflops")}
            for r in resnet if r["c"] == 3}
    return {"all": stats(rows), "resnet50": stats(resnet),
            "hep_conv1d": stats([r for r in rows if r["layer"].startswith("hep")]),
            "stem": stem, "errors": [r["layer"] + " " + r["dtype"] + f" n{r['n']}"
                                     for r in rows if "error" in r]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=360.0,
                        help="stop starting new problems after this many seconds")
    args = parser.parse_args(argv)
    libs = cupy_and_torch("bench_conv")
    if libs is None:
        return 0
    cp, torch = libs
    torch.backends.cudnn.benchmark = True  # the baseline: cuDNN's best algorithm
    t0 = time.perf_counter()
    rows, not_run = [], []

    def save() -> None:
        write_result(args.out, "conv", {
            "method": "forward; CUDA-event medians (common.gpu_time, --repeats) per round, "
                      "median of --rounds interleaved rounds; cuDNN in benchmark mode; "
                      "pl.conv checked against cuDNN before timing; its first call "
                      "(the race) is not timed",
            "results": rows, "not_run": not_run, "summary": summarise(rows),
            "wall_s": time.perf_counter() - t0})

    for problem in problems():
        if time.perf_counter() - t0 > args.budget_s:
            not_run.append(problem)
            continue
        try:
            row = one_problem(cp, torch, problem, args.rounds, args.repeats)
        except Exception as exc:  # one failing problem must not end the run
            row = {**problem, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rows.append(row)
        print(row["layer"], row["dtype"], f"n{row['n']}",
              f"{row.get('ratio_vs_cudnn', float('nan')):.3f}",
              (row.get("choice") or {}).get("impl"), row.get("error", ""), flush=True)
        torch.cuda.empty_cache()
        if len(rows) % 10 == 0:
            save()
    save()
    print(summarise(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
