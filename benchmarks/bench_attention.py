"""pl.attention against every torch SDPA backend, on the attention issue's shapes.

For (B, H, S, D) = 4x16x4096x128, 8x16x2048x64, 16x32x1024x128 and 1x32x16384x128, in
bfloat16 and float16, causal and not: the forward pass of ``pl.attention`` on torch
tensors and on CuPy arrays (DLPack), and torch's ``scaled_dot_product_attention`` with
its default choice and with each backend forced (cuDNN, FlashAttention-2, memory
efficient; a backend that refuses a shape is recorded as such). Every candidate's output
is first checked against the float32 math backend on the first batch entry. pyc_lab's
own Hopper kernel is also timed directly in every configuration the kernel cache holds
(``pyc kernel <config>``), beside ``pl.attention``'s raced choice; with ``--tune``,
``pl.autotune_attention`` first tunes each problem over those configurations and records
its winner, which ``pl.attention`` then races against SDPA. Times are
medians of CUDA-event rounds (:func:`common.gpu_time`), taken in five rounds interleaved
across the candidates, each round starting one candidate further on (the median round is
reported); "sdpa default" and the backend it picks run the same kernel, so their
difference shows the run's noise; TFLOP/s count ``4 B H S^2 D``,
halved for causal. Writes ``attention.json`` to ``--out``.

    python benchmarks/bench_attention.py --out benchmarks/results/h200 [--tune]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cupy_and_torch, gpu_time, write_result

import pyc_lab as pl

SHAPES = ((4, 16, 4096, 128), (8, 16, 2048, 64), (16, 32, 1024, 128), (1, 32, 16384, 128))
BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")
TOL = {"float16": 1e-2, "bfloat16": 4e-2}
ROUNDS = 5  # interleaved timing rounds per candidate (the median is reported)


def _reference(torch: Any, q: Any, k: Any, v: Any, causal: bool) -> Any:
    """float32 math-backend attention of the first batch entry."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(
            *(x[:1].float() for x in (q, k, v)), is_causal=causal)


def own_kernels(torch: Any, q: Any, k: Any, v: Any, dtype: str, causal: bool
                ) -> dict[str, Any]:
    """pyc_lab's own kernel in every configuration the kernel cache holds, launched
    directly (no race, no choice): ``{"pyc kernel <config id>": fn}``."""
    from pyc_lab.kernels import attention_sm90
    from pyc_lab.kernels.cutlass.attention import (
        AttnKernel,
        FusedAttention,
        attention_configs,
        cached_attention,
    )

    d = int(q.shape[-1])
    kernel = AttnKernel({"float16": "f16", "bfloat16": "bf16"}[dtype], d)
    o = torch.empty_like(q)
    geometry = attention_sm90.geometry_of(q, k, v, o, causal, d ** -0.5)
    found: dict[str, Any] = {}
    for cfg in attention_configs(kernel, causal):
        library = cached_attention(cfg, kernel)
        if library is None:
            continue
        fa = FusedAttention(library, cfg, kernel)

        def run(fa: Any = fa) -> Any:
            attention_sm90.run_fused(fa, geometry, q, k, v, o)
            return o

        found[f"pyc kernel {cfg.id}"] = run
    return found


def tune(shape: tuple[int, ...], dtype: str, causal: bool) -> dict[str, Any]:
    """``pl.autotune_attention`` over the configurations the kernel cache holds (nothing
    is built): its winner, speed-up over the best SDPA baseline and wall time."""
    from pyc_lab.kernels.cutlass.attention import AttnKernel, cached_attention

    b, h, s, d = shape
    dt = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    kernel = AttnKernel(dt, d)
    t0 = time.perf_counter()
    try:
        res = pl.autotune_attention(b, h, s, d, causal=causal, dtype=dt, repeats=5,
                                    max_candidates=None,
                                    restrict=lambda c: cached_attention(c, kernel) is not None)
    except Exception as exc:  # a refused tuning is a row, not the end of the run
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    best = res.best
    base = min(res.baselines.values()) if res.baselines else None
    return {"seconds": time.perf_counter() - t0, "candidates": len(res.table),
            "winner": best.config if best else None,
            "winner_ms": best.time_ms if best else None,
            "baselines_ms": dict(res.baselines),
            "speedup_vs_best_baseline": (base / best.time_ms) if best and base else None}


def one_problem(cp: Any, torch: Any, shape: tuple[int, ...], dtype: str, causal: bool,
                repeats: int, tuned: bool = False) -> dict[str, Any]:
    """Every candidate on one problem: ms, TFLOP/s and the error against float32
    (``tuned``: ``pl.autotune_attention`` runs first, so ``pl.attention`` races its
    winner)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tuning = tune(shape, dtype, causal) if tuned else None
    b, h, s, d = shape
    tdt = getattr(torch, dtype)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=tdt) for _ in range(3))
    qc, kc, vc = (cp.from_dlpack(x) for x in (q, k, v))
    ref = _reference(torch, q, k, v, causal)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    cands: dict[str, Any] = {
        "pl.attention (torch)": lambda: pl.attention(q, k, v, causal=causal),
        "pl.attention (cupy)": lambda: pl.attention(qc, kc, vc, causal=causal),
        "sdpa default": lambda: sdpa(q, k, v, is_causal=causal),
    }
    for name in BACKENDS:
        backend = getattr(SDPBackend, name)

        def forced(backend: Any = backend) -> Any:
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=causal)

        cands[f"sdpa {name.lower()}"] = forced
    cands.update(own_kernels(torch, q, k, v, dtype, causal))
    flop = 4 * b * h * s * s * d / (2 if causal else 1)
    rows: dict[str, Any] = {}
    for name, fn in cands.items():
        try:
            out = fn()
            got = out[:1].float() if not isinstance(out, cp.ndarray) \
                else torch.from_dlpack(out)[:1].float()
            err = float((got - ref).abs().max())
            if not err <= TOL[dtype]:
                rows[name] = {"error": f"max abs error {err:.3g} against float32"}
                continue
            rows[name] = {"max_abs_err": err, "rounds_ms": []}
        except Exception as exc:  # one refusing backend must not end the run
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    del ref
    torch.cuda.empty_cache()
    # Interleaved rounds, each starting one candidate further on: a drift of the clocks
    # (after the float32 reference, or as a long problem heats the GPU) falls on every
    # candidate alike instead of on whichever was timed first or last.
    timed = [name for name, row in rows.items() if "rounds_ms" in row]
    for i in range(ROUNDS if timed else 0):
        start = i % len(timed)
        for name in timed[start:] + timed[:start]:
            rows[name]["rounds_ms"].append(gpu_time(cands[name], repeats=repeats) * 1e3)
    for row in rows.values():
        if "rounds_ms" in row:
            row["ms"] = statistics.median(row["rounds_ms"])
            row["tflops"] = flop / row["ms"] / 1e9
    from pyc_lab.kernels.attention import attention_explain

    pl_choice = attention_explain(q, k, v, causal=causal)
    libs = {n: r["ms"] for n, r in rows.items() if n.startswith("sdpa") and "ms" in r}
    best = min(libs, key=libs.get) if libs else None
    pl_ms = rows.get("pl.attention (torch)", {}).get("ms")
    own = {n: r["ms"] for n, r in rows.items() if n.startswith("pyc kernel") and "ms" in r}
    own_best = min(own, key=own.get) if own else None
    return {"tuning": tuning, "own_best": own_best, "pl_choice": pl_choice,
            "own_vs_best": (libs[best] / own[own_best]) if best and own_best else None,
            "shape": list(shape), "dtype": dtype, "causal": causal, "candidates": rows,
            "best_library": best,
            "ratio_vs_best": (libs[best] / pl_ms) if best and pl_ms else None,
            "ratio_vs_flash": (libs["sdpa flash_attention"] / pl_ms)
            if pl_ms and "sdpa flash_attention" in libs else None}


def problems(budget_s: float, t0: float, not_run: list) -> Iterator[tuple]:
    """The issue's problems (shape, dtype, causal) in order while ``budget_s`` seconds
    since ``t0`` last; those left are appended to ``not_run``."""
    for shape in SHAPES:
        for dtype in ("bfloat16", "float16"):
            for causal in (False, True):
                if time.perf_counter() - t0 > budget_s:
                    not_run.append([list(shape), dtype, causal])
                    continue
                yield shape, dtype, causal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tune", action="store_true",
                        help="run pl.autotune_attention (over the cached configurations) "
                             "before each problem")
    parser.add_argument("--budget-s", type=float, default=200.0,
                        help="stop starting new problems after this many seconds")
    args = parser.parse_args(argv)
    libs = cupy_and_torch("bench_attention")
    if libs is None:
        return 0
    cp, torch = libs
    t0 = time.perf_counter()
    results, not_run = [], []
    for shape, dtype, causal in problems(args.budget_s, t0, not_run):
        row = one_problem(cp, torch, shape, dtype, causal, args.repeats, args.tune)
        results.append(row)
        print(shape, dtype, "causal" if causal else "full", row["best_library"],
              "pl/best", row["ratio_vs_best"], row["own_best"], "own/best",
              row["own_vs_best"], flush=True)
        torch.cuda.empty_cache()
    ratios = [r["ratio_vs_best"] for r in results if r["ratio_vs_best"]]
    own = [r["own_vs_best"] for r in results if r["own_vs_best"]]
    summary = {"problems": len(results), "not_run": not_run,
               "own_kernel_median_vs_best_library": statistics.median(own) if own else None,
               "own_kernel_min_vs_best_library": min(own) if own else None,
               "own_kernel_max_vs_best_library": max(own) if own else None,
               "tuning_seconds": sum(r["tuning"].get("seconds", 0) for r in results
                                     if r.get("tuning")),
               "median_vs_best_library": statistics.median(ratios) if ratios else None,
               "min_vs_best_library": min(ratios) if ratios else None,
               "failed": [[r["shape"], r["dtype"], r["causal"]] for r in results
                          if "ms" not in r["candidates"].get("pl.attention (torch)", {})]}
    write_result(args.out, "attention", {
        "method": "forward only; each candidate checked against the float32 math backend "
                  f"on batch entry 0, then timed in {ROUNDS} interleaved rounds of "
                  "CUDA-event medians (common.gpu_time, --repeats each), each round "
                  "starting one candidate further on; the median round is reported",
        "results": results, "summary": summary, "wall_s": time.perf_counter() - t0})
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
