"""CUTLASS GEMM autotuning vs cuBLAS (GPU lane).

For fp16 and bf16 (layout ``tn``, float32 accumulation) and the issue's shapes, tune
with :func:`pyc_lab.autotune_gemm` and compare the winner with cuBLAS timed the same way
in the same run (``cupy.matmul`` for fp16, ``torch.matmul`` for bf16: CuPy has no
bfloat16). Every candidate is checked against cuBLAS before it is timed.

To fit the GPU lane, every shape of one dtype draws from one pool of configurations
(the union of each shape's ``--per-shape`` best-ranked ones), built once in parallel;
the first shape's tuning is the cold one (builds included), the same shape tuned again
is the warm one (everything cached). Also measured: a fused bias + GELU epilogue at the
compiler MLP's first layer (4096 x 8192 x 2048 f16) against cuBLASLt's ``GELU_BIAS``,
and host microseconds per call of a tuned kernel on repeated arguments against
``cupy.matmul``'s.

Writes ``gemm.json`` (and ``tuning-replay.json``, the tuning database's export) to
``--out``.

    python benchmarks/bench_gemm.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compiler import host_us
from common import write_result

SHAPES = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
          (8192, 4096, 4096), (4096, 4096, 16384), (4096, 16384, 4096)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    parser.add_argument("--per-shape", type=int, default=8,
                        help="best-ranked configurations per shape in the dtype's pool")
    parser.add_argument("--no-fused", action="store_true", help="skip the epilogue case")
    parser.add_argument("--dtypes", default="f16,bf16")
    parser.add_argument("--strategy", default="exhaustive")
    parser.add_argument("--shapes", default="", help="MxNxK,... (default: the issue's seven)")
    parser.add_argument("--stream-k", action="store_true",
                        help="let Stream-K configurations into the pools (off by default in "
                             "autotune_gemm); writes gemm-streamk.json")
    args = parser.parse_args()
    suffix = "-streamk" if args.stream_k else ""

    from pyc_lab.hardware.device import cupy_status

    cp, reason = cupy_status()
    if cp is None:
        print(f"skipped: the GEMM benchmark needs a CUDA device ({reason})")
        return
    import pyc_lab as pl
    from pyc_lab.kernels import cutlass as cg
    from pyc_lab.kernels.tuning.database import TuningDB
    from pyc_lab.kernels.tuning.gemm_reference import gemm_inputs
    from pyc_lab.kernels.tuning.keys import device_key

    _, cc, sm_count = device_key()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] \
        or SHAPES

    def progress(row: dict) -> None:
        print(f"  {row['config']}: {row['status']} {row['ms']} ms {row['message'][:120]}",
              flush=True)

    db_path = Path(args.out) / "tuning.sqlite"
    db_path.parent.mkdir(parents=True, exist_ok=True)
    db = TuningDB(db_path)
    results: dict[str, dict] = {}
    summary: dict[str, dict] = {}
    pool_of: dict[str, set] = {}
    fused: dict = {}
    overhead: dict = {}

    def save() -> Path:
        n = db.export(Path(args.out) / f"tuning-replay{suffix}.json")
        return write_result(args.out, f"gemm{suffix}", {
            "method": "autotune_gemm per shape (exhaustive over the pool), timed with "
                      "pyc_lab.profiling.benchmark: CUDA events, median of 15 with the L2 "
                      "flushed before each and a spin kernel queued ahead of the start "
                      "event (GPU time only, no host launch gaps); cuBLAS timed the same "
                      "way",
            "layout": "tn", "stream_k": args.stream_k, "summary": summary, "results": results,
            "fused_epilogue": fused, "host_overhead": overhead, "replay_rows": n})

    for dtype in args.dtypes.split(","):
        configs = cg.configurations(dtype, "tn", cc)
        pool: set = set()
        for m, n, k in shapes:
            kept = cg.prune(configs, m, n, k, "tn", dtype, stream_k=args.stream_k)[0]
            pool.update(cg.rank(kept, m, n, k, sm_count)[: args.per_shape])
            if args.stream_k:  # the model ranks them low: bring in those with a TMA store
                pool.update(c for c in kept if c.tile_scheduler == "StreamK"
                            and c.epilogue_schedule == "TmaWarpSpecializedCooperative")
        print(dtype, "pool:", sorted(c.id for c in pool), flush=True)
        rows = {}
        for i, (m, n, k) in enumerate(shapes):
            t0 = time.perf_counter()
            try:
                res = pl.autotune_gemm(m, n, k, dtype=dtype, layout="tn",
                                       strategy=args.strategy, budget_s=120,
                                       max_candidates=None, restrict=pool.__contains__,
                                       db=db, repeats=15, observer=progress,
                                       stream_k=args.stream_k)
            except Exception as exc:  # one failing shape must not lose the others
                rows[f"{m}x{n}x{k}"] = {"error": f"{type(exc).__name__}: {exc}"}
                print(dtype, m, n, k, "FAILED", exc)
                continue
            cmp = res.compare().set_index("kernel")
            row = {"tuned_ms": res.best.time_ms if res.best else None,
                   "cublas_ms": res.baselines.get("cublas"),
                   "torch_ms": res.baselines.get("torch"),
                   "tuned_tflops": cmp.loc["tuned CUTLASS", "tflops"],
                   "cublas_tflops": cmp.loc["cublas", "tflops"],
                   "ratio_vs_cublas": cmp.loc["tuned CUTLASS", "vs_cublas"],
                   "best_config": res.best.config if res.best else None,
                   "statuses": res.table.status.value_counts().to_dict(),
                   "tune_s": time.perf_counter() - t0}
            if i == 0:
                row["cold"] = True
                t1 = time.perf_counter()
                pl.autotune_gemm(m, n, k, dtype=dtype, layout="tn", strategy=args.strategy,
                                 max_candidates=None, restrict=pool.__contains__, db=db,
                                 repeats=15, stream_k=args.stream_k)
                row["warm_tune_s"] = time.perf_counter() - t1
            rows[f"{m}x{n}x{k}"] = row
            results[dtype] = rows
            save()  # a lane cut short still returns every shape measured so far
            print(dtype, m, n, k, {k2: row[k2] for k2 in ("tuned_ms", "cublas_ms",
                                                          "ratio_vs_cublas", "tune_s")})
        ratios = [r["ratio_vs_cublas"] for r in rows.values() if r.get("ratio_vs_cublas")]
        summary[dtype] = {"median_ratio_vs_cublas": statistics.median(ratios) if ratios else None,
                          "faster_than_cublas": int(sum(r > 1.0 for r in ratios)),
                          "shapes": len(rows), "pool": sorted(c.id for c in pool)}
        results[dtype] = rows
        pool_of[dtype] = pool

    # a fused epilogue: the MLP's first layer, bias + GELU inside the kernel
    if not args.no_fused and "f16" in args.dtypes.split(","):
        m, n, k = 4096, 8192, 2048
        tma = {c for c in pool_of.get("f16", ()) if c.epilogue_schedule.startswith("Tma")}
        try:
            t0 = time.perf_counter()
            res = pl.autotune_gemm(m, n, k, dtype="f16", layout="tn", strategy=args.strategy,
                                   budget_s=300, max_candidates=None,
                                   restrict=tma.__contains__, db=db, repeats=15,
                                   observer=progress, bias=True, activation="gelu")
            cmp = res.compare().set_index("kernel")
            fused |= {"shape": f"{m}x{n}x{k}", "epilogue": "bias_gelu",
                     "tuned_ms": res.best.time_ms if res.best else None,
                     "baselines_ms": res.baselines,
                     "ratio_vs_cublaslt": (res.baselines["cublaslt"] / res.best.time_ms
                                           if res.best and "cublaslt" in res.baselines
                                           else None),
                     "tuned_tflops": cmp.loc["tuned CUTLASS", "tflops"],
                     "best_config": res.best.config if res.best else None,
                     "statuses": res.table.status.value_counts().to_dict(),
                     "tune_s": time.perf_counter() - t0}
        except Exception as exc:
            fused |= {"error": f"{type(exc).__name__}: {exc}"}
        print("fused", fused, flush=True)

    # host cost per call, f16 4096^3 with the winner, repeated arguments
    from pyc_lab.kernels.tuning import database as tuning_db

    tuning_db.default_path = lambda: db_path  # pl.matmul reads this run's database
    try:
        a, b, out = gemm_inputs(4096, 4096, 4096, "f16", "tn", 1)
        pl.matmul(a, b)  # warm: loads the winner
        kernel = next(iter(pl.kernels.matmul._KERNELS.values()), None)
        if kernel is not None:
            stream = cp.cuda.get_current_stream().ptr
            kernel(a, b, out)
            overhead["cutlass_call_us"] = host_us(cp, lambda: kernel(a, b, out))
            overhead["cutlass_launch_us"] = host_us(cp, lambda: kernel.launch(stream))
            graph = kernel.capture()
            overhead["cutlass_graph_us"] = host_us(cp, lambda: graph.launch())
            overhead["pl_matmul_us"] = host_us(cp, lambda: pl.matmul(a, b, out=out))
        overhead["cupy_matmul_us"] = host_us(cp, lambda: cp.matmul(a, b, out=out))
    except Exception as exc:
        overhead["error"] = f"{type(exc).__name__}: {exc}"
    print("overhead", overhead)
    path = save()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
