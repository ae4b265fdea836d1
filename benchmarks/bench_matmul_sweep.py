"""``pl.matmul`` over a sweep of problems users bring, against the libraries (GPU lane).

The sweep (:func:`sweep`, at least 40 problems) is not chosen to suit the tuner: the
linear layers of common transformer sizes — Llama-2 7B / 13B (hidden 4096 / 5120, MLP
11008 / 13824, fused QKV), Llama-3 8B / Mistral 7B (hidden 4096, MLP 14336, GQA QKV
6144) and Llama-3 70B (hidden 8192, MLP 28672, GQA QKV 10240) — at decode M in
{1, 8, 16, 32, 64} and prefill M in {512, 2048, 8192, 16384}; square and rectangular
shapes; short K and long K; extents that are not multiples of 8; in f16 and bf16.
Operands are held as a linear layer holds them: ``a`` row-major M x K, ``b = w.T`` with
``w`` row-major N x K (the same memory for every implementation, shared through DLPack).

Per problem, timed with :func:`pyc_lab.profiling.timing.benchmark` (CUDA events, L2
flushed before each call, a spin kernel ahead of the start event), in interleaved rounds
(each round times every implementation once, starting one later in the list each
round; the figure is the median of the rounds' medians): ``pl.matmul`` (whatever it
routes to), ``cupy.matmul``, ``torch.matmul`` and, for bf16, cuBLASLt through
nvmath-python. ``pl.matmul``'s result is checked against
``torch.matmul``'s in float32 first. Reported: the ratio of ``pl.matmul``'s speed to the
best baseline's (above 1: ``pl.matmul`` is faster), its distribution (min, quartiles,
median) and how many problems ``pl.matmul`` wins by 2 % or more; host microseconds per
call of ``pl.matmul`` and ``cupy.matmul`` on a small shape.

``--tune`` first runs :func:`pyc_lab.autotune_many` over the sweep with the total budget
``--tune-budget`` (recorded with the time it took and its summary); ``--no-cutlass``
tunes without CUTLASS candidates (no nvcc builds): pyc_lab's skinny GEMM for the
problems of at most 64 rows beside the libraries, the others left to the libraries.
Each row records what ``pl.matmul`` ran (``pl_impl``, ``pl_config``). Tunings persist in
the tuning database and kernel cache under ``$PYC_LAB_CACHE_DIR`` (default: the user
cache dir); point it at a folder kept between runs to tune in one command and measure
in the next.

    python benchmarks/bench_matmul_sweep.py --out benchmarks/results/h200
    PYC_LAB_CACHE_DIR=.pyc-cache python benchmarks/bench_matmul_sweep.py --tune \
        --tune-budget 420 --tune-only --out OUT      # then, same cache dir, the sweep
    PYC_LAB_CACHE_DIR=.pyc-cache python benchmarks/bench_matmul_sweep.py --out OUT
    python benchmarks/bench_matmul_sweep.py --quick --problems 12

The default run (no ``--tune``) takes a few minutes on an H200 (46 problems, 5 rounds);
the GPU lane gives it 420 s (``SWEEP_BENCH_ARGS`` passes options). Builds that
``--tune`` started and its budget did not wait for finish in the background before the
process exits (nvcc cannot be interrupted cleanly), so a tune-only run may outlast its
budget by about one kernel build.

Writes ``matmul-sweep.json`` to ``--out``. Without a GPU it says why and exits 0 (as the
other benchmarks do), writing nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result

#: (name, hidden, mlp, qkv) of the models whose linear layers the sweep takes.
MODELS = [("llama2-7b", 4096, 11008, 12288), ("llama2-13b", 5120, 13824, 15360),
          ("llama3-8b", 4096, 14336, 6144), ("llama3-70b", 8192, 28672, 10240)]
DECODE_M = (1, 8, 16, 32, 64)
PREFILL_M = (512, 2048, 8192, 16384)
#: Problems beyond the model layers: square, rectangular, short K, long K, unaligned.
EXTRA = [(1024, 1024, 1024, "f16"), (4096, 4096, 4096, "f16"), (8192, 8192, 8192, "bf16"),
         (6144, 6144, 6144, "bf16"), (8192, 8192, 512, "bf16"), (16384, 4096, 256, "f16"),
         (1024, 1024, 32768, "f16"), (256, 4096, 16384, "bf16"), (128, 4096, 8192, "bf16"),
         (4095, 4097, 1023, "f16"), (1000, 4100, 4100, "bf16"), (7, 4099, 4096, "bf16"),
         (127, 11009, 4096, "f16"), (2047, 2049, 2047, "bf16")]


def sweep() -> list[dict[str, Any]]:
    """The sweep's problems, in a fixed order: each model layer at one decode M and one
    prefill M (taken round-robin, so every M appears), f16 and bf16 alternating, then
    :data:`EXTRA`."""
    out = []
    i = 0
    for model, hidden, mlp, qkv in MODELS:
        for layer, n, k in (("qkv", qkv, hidden), ("o_proj", hidden, hidden),
                            ("up", mlp, hidden), ("down", hidden, mlp)):
            dtype = ("f16", "bf16")[i % 2]
            for m in (DECODE_M[i % len(DECODE_M)], PREFILL_M[i % len(PREFILL_M)]):
                out.append({"m": m, "n": n, "k": k, "dtype": dtype,
                            "what": f"{model} {layer} {'decode' if m <= 64 else 'prefill'}"})
            i += 1
    for m, n, k, dtype in EXTRA:
        out.append({"m": m, "n": n, "k": k, "dtype": dtype, "what": "shape"})
    return out


def _operands(torch: Any, cp: Any, p: dict[str, Any], seed: int) -> tuple:
    """``a`` (M x K) and ``w`` (N x K), uniform in [-1, 1], as torch and CuPy views."""
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a_t = (torch.rand(p["m"], p["k"], device="cuda", generator=gen) * 2 - 1).to(dtype)
    w_t = (torch.rand(p["n"], p["k"], device="cuda", generator=gen) * 2 - 1).to(dtype)
    return a_t, w_t, cp.from_dlpack(a_t), cp.from_dlpack(w_t)


def _nvmath(a_t: Any, b_t: Any) -> Any:
    try:
        from nvmath.linalg.advanced import Matmul

        mm = Matmul(a_t, b_t)
        mm.plan()
        return mm.execute
    except Exception as exc:  # nvmath missing or refusing the operands
        print(f"    (no cuBLASLt/nvmath baseline: {type(exc).__name__}: {exc})")
        return None


def measure(pl: Any, cp: Any, torch: Any, p: dict[str, Any], rounds: int,
            repeats: int) -> dict[str, Any]:
    """One problem: correctness of ``pl.matmul``, then interleaved timing rounds."""
    from pyc_lab.units import gemm_flops, tflops

    a_t, w_t, a, w = _operands(torch, cp, p, seed=p["m"] * 7 + p["n"])
    b, b_t = w.T, w_t.T
    row: dict[str, Any] = dict(p)
    ref = torch.matmul(a_t, b_t).float()
    try:
        got = torch.from_dlpack(pl.matmul(a, b)).float()
        choice = dict(pl.kernels.matmul.last_choice)
        row["pl_impl"] = choice.get("impl")
        if choice.get("config"):
            row["pl_config"] = choice["config"]
        scale = float(ref.abs().max()) or 1.0
        row["pl_max_rel_err"] = float((got - ref).abs().max()) / scale
    except Exception as exc:
        row["pl_error"] = f"{type(exc).__name__}: {exc}"[:400]
    impls = {"pl.matmul": (lambda: pl.matmul(a, b)) if "pl_error" not in row else None,
             "cupy.matmul": lambda: cp.matmul(a, b),
             "torch.matmul": lambda: torch.matmul(a_t, b_t)}
    if p["dtype"] == "bf16":
        impls["cublaslt"] = _nvmath(a_t, b_t)
    impls = {name: fn for name, fn in impls.items() if fn is not None}
    for name, fn in list(impls.items()):  # a baseline that cannot run is left out
        try:
            fn()
        except Exception as exc:
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:400]
            del impls[name]
    ms = interleaved_ms(impls, rounds, repeats)
    row["ms"] = ms
    row["tflops"] = {name: tflops(gemm_flops(p["m"], p["n"], p["k"]), v)
                     for name, v in ms.items()}
    baselines = {name: v for name, v in ms.items() if name != "pl.matmul"}
    if baselines:
        best = min(baselines, key=baselines.get)
        row["best_baseline"] = best
        if "pl.matmul" in ms:
            row["ratio_vs_best"] = baselines[best] / ms["pl.matmul"]
            if "torch.matmul" in ms:
                row["ratio_vs_torch"] = ms["torch.matmul"] / ms["pl.matmul"]
            if "cupy.matmul" in ms:
                row["ratio_vs_cupy"] = ms["cupy.matmul"] / ms["pl.matmul"]
    return row


def interleaved_ms(impls: dict[str, Any], rounds: int, repeats: int) -> dict[str, float]:
    """Median GPU milliseconds per implementation over interleaved rounds, each a
    :func:`pyc_lab.profiling.timing.benchmark` (CUDA events, L2 flushed, spin ahead)."""
    from pyc_lab.profiling.timing import benchmark

    per_round: dict[str, list[float]] = {name: [] for name in impls}
    names = list(impls)
    for r in range(rounds):
        # each round starts one later in the list: none is always timed first (a long
        # GEMM's clocks drift with the heat of the one before)
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = benchmark(impls[name], repeats=repeats, warmup=1, flush_l2=True, spin=True,
                          gpu=True)
            per_round[name].append(float(t.gpu_median_s) * 1e3)
    return {name: statistics.median(v) for name, v in per_round.items()}


def host_overhead(pl: Any, cp: Any, calls: int = 200, rounds: int = 7) -> dict[str, Any]:
    """Median host microseconds per call, ``pl.matmul`` against ``cupy.matmul``, on a
    128 x 128 x 128 f16 problem (the arrays reused, as in a loop)."""
    rng = cp.random.default_rng(1)
    a = rng.uniform(-1, 1, (128, 128), dtype=cp.float32).astype(cp.float16)
    b = rng.uniform(-1, 1, (128, 128), dtype=cp.float32).astype(cp.float16).T

    def per_call(fn: Any) -> list[float]:
        for _ in range(20):
            fn()
        cp.cuda.Device().synchronize()
        out = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - t0) / calls * 1e6)
            cp.cuda.Device().synchronize()
        return out

    res: dict[str, Any] = {"shape": "128x128x128 f16", "calls_per_round": calls}
    samples: dict[str, list[float]] = {"pl.matmul": [], "cupy.matmul": []}
    for _ in range(2):  # interleaved
        samples["pl.matmul"] += per_call(lambda: pl.matmul(a, b))
        samples["cupy.matmul"] += per_call(lambda: cp.matmul(a, b))
    res["host_us"] = {name: statistics.median(v) for name, v in samples.items()}
    return res


def distribution(values: list[float]) -> dict[str, Any]:
    """min, quartiles, median and max of ``values`` (None when empty)."""
    if not values:
        return {"n": 0}
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"n": len(values), "min": min(values), "q1": q[0], "median": statistics.median(values),
            "q3": q[2], "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    parser.add_argument("--problems", type=int, default=0, help="only the first N problems")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 5 (default 5 of 10)")
    parser.add_argument("--tune", action="store_true",
                        help="run pl.autotune_many over the sweep first")
    parser.add_argument("--tune-budget", type=float, default=420.0,
                        help="total seconds for --tune (default 420)")
    parser.add_argument("--tune-only", action="store_true",
                        help="with --tune: tune, write the result, and stop")
    parser.add_argument("--no-cutlass", action="store_true",
                        help="with --tune: no CUTLASS candidates (no nvcc builds), only "
                             "pyc_lab's skinny GEMM beside the libraries")
    args = parser.parse_args()
    problems = sweep()
    if args.problems:
        problems = problems[:args.problems]

    from pyc_lab.hardware.device import cupy_status

    cp, reason = cupy_status()
    if cp is None:
        print(f"skipped: the matmul sweep needs a CUDA device ({reason})")
        return 0
    try:
        import torch
    except ImportError:
        print("skipped: the matmul sweep holds its operands as torch tensors (torch.matmul "
              "is a baseline); install torch")
        return 0
    import pyc_lab as pl

    rounds, repeats = (3, 5) if args.quick else (5, 10)
    payload: dict[str, Any] = {
        "method": (f"per problem {rounds} interleaved rounds, each pyc_lab.profiling.timing."
                   f"benchmark (CUDA events, L2 flushed, spin ahead, median of {repeats}) "
                   "of every implementation, each round starting one later in the list; "
                   "the figure is the median of the rounds"),
        "operands": "a row-major M x K, b = w.T with w row-major N x K, uniform [-1, 1]",
        "ratio": "best baseline ms / pl.matmul ms (above 1: pl.matmul faster)",
        "problems": len(problems)}
    t_start = time.perf_counter()
    if args.tune:
        t0 = time.perf_counter()
        many = pl.autotune_many([(p["m"], p["n"], p["k"], p["dtype"]) for p in problems],
                                budget_s=args.tune_budget, cutlass=not args.no_cutlass)
        summary = many.summary
        payload["tuning"] = {"budget_s": args.tune_budget, "cutlass": not args.no_cutlass,
                             "used_s": time.perf_counter() - t0,
                             "builds_requested": many.builds_requested,
                             "builds_distinct": many.builds_distinct,
                             "summary": summary.to_dict(orient="records")}
        print(summary.to_string(index=False), flush=True)
        print(f"tuning: budget {args.tune_budget:g} s, used {payload['tuning']['used_s']:.0f} s")
        if args.tune_only:
            path = write_result(args.out, "matmul-sweep-tuning", payload)
            print(f"wrote {path}")
            return 0
    rows = []
    for i, p in enumerate(problems):
        try:
            row = measure(pl, cp, torch, p, rounds, repeats)
        except Exception as exc:  # one failing problem must not lose the others
            row = {**p, "error": f"{type(exc).__name__}: {exc}"[:400]}
        rows.append(row)
        print(f"[{i + 1}/{len(problems)}] {p['dtype']} {p['m']}x{p['n']}x{p['k']} "
              f"({p['what']}): ratio {row.get('ratio_vs_best')} vs {row.get('best_baseline')}",
              flush=True)
        payload["results"] = rows
        write_result(args.out, "matmul-sweep", payload)  # a cut-short run keeps what it has
    ratios = [r["ratio_vs_best"] for r in rows if r.get("ratio_vs_best")]
    payload["summary"] = {
        "ratio_vs_best": distribution(ratios),
        "ratio_vs_torch": distribution([r["ratio_vs_torch"] for r in rows
                                        if r.get("ratio_vs_torch")]),
        "wins_by_2pct": sum(r >= 1.02 for r in ratios),
        "impl_counts": {impl: sum(r.get("pl_impl") == impl for r in rows)
                        for impl in sorted({str(r.get("pl_impl")) for r in rows})},
        "losses_below_0_97": sum(r < 0.97 for r in ratios),
        "by_dtype": {d: distribution([r["ratio_vs_best"] for r in rows
                                      if r.get("ratio_vs_best") and r["dtype"] == d])
                     for d in ("f16", "bf16")},
        "failed": [f"{r['dtype']} {r['m']}x{r['n']}x{r['k']}" for r in rows
                   if "error" in r or "pl_error" in r]}
    try:
        payload["host_overhead"] = host_overhead(pl, cp)
    except Exception as exc:
        payload["host_overhead"] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    payload["wall_s"] = time.perf_counter() - t_start
    path = write_result(args.out, "matmul-sweep", payload)
    print(payload["summary"])
    print(payload["host_overhead"])
    print(f"wrote {path} in {payload['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
