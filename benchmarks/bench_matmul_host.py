"""Host time per call of pl.matmul, a matmul plan, cupy.matmul and torch.matmul.

The same small operands for each (``--size``, default 128: the GEMM takes the GPU a few
microseconds, so the host's cost of issuing it is what is measured), float16 and
bfloat16, ``b`` a transposed view as a linear layer holds it, with and without an
``out``; and as floors, the direct library call alone (three pointers and a stream, what
a plan issues) and the replay of a CUDA graph holding one captured plan. A plan called
on the same arrays replays a CUDA graph of its own (:mod:`pyc_lab.kernels.gemm_replays`);
``graphs=False`` times the direct library call it makes otherwise. Each timed
sample is a loop of ``--calls`` calls divided by their number, timed on the host through
:func:`pyc_lab.profiling.timing.benchmark` (``gpu=False``); the device is synchronised
after each sample. Writes ``matmul_host.json`` to ``--out``.

    python benchmarks/bench_matmul_host.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result

import pyc_lab as pl
from pyc_lab.profiling.timing import benchmark


def per_call_us(fn: Callable[[], Any], calls: int, repeats: int, sync: Callable[[], Any]
                ) -> dict[str, float]:
    """Median and spread of host microseconds per call of ``fn``."""
    def loop() -> None:
        for _ in range(calls):
            fn()
        sync()

    timing = benchmark(loop, repeats=repeats, warmup=2, gpu=False)
    per = [t / calls * 1e6 for t in timing.cpu_s]
    return {"median_us": statistics.median(per), "min_us": min(per), "max_us": max(per)}


def calls_for(cp: Any, torch: Any, dtype: str, size: int
              ) -> tuple[Any, dict[str, Callable[[], Any]]]:
    """The plan and the calls compared, on one set of operands (``b`` = ``w.T``)."""
    cdt = cp.dtype(dtype)
    a = cp.random.uniform(-1, 1, (size, size), dtype=cp.float32).astype(cdt)
    w = cp.random.uniform(-1, 1, (size, size), dtype=cp.float32).astype(cdt)
    out = cp.empty((size, size), dtype=cdt)
    plan = pl.matmul_plan(a, w.T, out=out)
    direct_plan = pl.matmul_plan(a, w.T, out=out, graphs=False)
    cases: dict[str, Callable[[], Any]] = {
        "cupy.matmul": lambda: cp.matmul(a, w.T),
        "cupy.matmul(out=)": lambda: cp.matmul(a, w.T, out=out),
        "pl.matmul": lambda: pl.matmul(a, w.T),
        "pl.matmul(out=)": lambda: pl.matmul(a, w.T, out=out),
        # the same addresses every call: replayed from the plan's own CUDA graph
        "plan(out=)": lambda: plan(a, w.T),
        "plan(out=, graphs=False)": lambda: direct_plan(a, w.T),
    }
    # the library calls alone: three pointers and a stream, what a plan issues — for
    # both libraries, whichever the plan chose
    from pyc_lab.kernels.matmul_plan import direct_for

    ptrs = (a.data.ptr, w.T.data.ptr, out.data.ptr)
    stream = cp.cuda.get_current_stream().ptr
    for impl in ("cublas", "cublaslt"):
        direct = direct_for(a, w.T, out, impl, 1.0, 0.0, dtype)
        if direct is not None:
            cases[f"{impl} call alone"] = \
                lambda gemm=direct.gemm: gemm(*ptrs, stream)
    cublas = direct_for(a, w.T, out, "cublas", 1.0, 0.0, dtype)
    if cublas is not None:  # the binding alone: the handle bound, no Python around it
        from pyc_lab.kernels import blas_direct

        gemm = cublas.gemm
        gemm(*ptrs, stream)
        h = blas_direct._cublas(cp.cuda.runtime.getDevice())
        g, t = gemm.gemm, gemm._type
        args = (h.handle, g.op_a, g.op_b, g.m, g.n, g.k, gemm._pa, ptrs[1], t, g.lda,
                ptrs[0], t, g.ldb, gemm._pb, ptrs[2], t, g.ldc, gemm.compute, gemm._algo)
        if g.batch == 1:
            cases["cublasGemmEx binding alone"] = lambda: h.lib.gemm_ex(*args)
    graph = _captured(cp, a, w, out)
    if graph is not None:
        cases["plan in a CUDA graph"] = graph
    if torch is not None:
        ta, tw, tout = torch.from_dlpack(a), torch.from_dlpack(w), torch.from_dlpack(out)
        cases["torch.matmul"] = lambda: torch.matmul(ta, tw.T)
        cases["torch.matmul(out=)"] = lambda: torch.matmul(ta, tw.T, out=tout)
        cases["pl.matmul(torch)"] = lambda: pl.matmul(ta, tw.T)
        cases["pl.matmul(torch, out=)"] = lambda: pl.matmul(ta, tw.T, out=tout)
        tplan = pl.matmul_plan(ta, tw.T, out=tout)
        cases["plan(torch, out=)"] = lambda: tplan(ta, tw.T)
    return plan, cases


def _captured(cp: Any, a: Any, w: Any, out: Any) -> Callable[[], Any] | None:
    """A capturable plan captured into a CUDA graph: the replay of one graph per call."""
    try:
        plan = pl.matmul_plan(a, w.T, out=out, capturable=True)
        stream = cp.cuda.Stream(non_blocking=True)  # the legacy stream cannot capture
        stream.use()
        plan(a, w.T)
        stream.synchronize()
        stream.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
        try:
            plan(a, w.T)
        finally:
            graph = stream.end_capture()
    except Exception as exc:  # no capture on this stream (the legacy default stream)
        print(f"no CUDA-graph case: {exc}", file=sys.stderr)
        return None
    return lambda: graph.launch(stream)


def run(size: int, calls: int, repeats: int) -> list[dict[str, Any]]:
    import cupy as cp

    try:
        import torch
    except ImportError:
        torch = None
    rows = []
    sync = cp.cuda.Device().synchronize  # every stream: torch runs on its own
    for dtype in ("float16", "bfloat16"):
        plan, cases = calls_for(cp, torch, dtype, size)
        for name, fn in cases.items():
            fn()
            row = {"dtype": dtype, "size": size, "call": name,
                   **per_call_us(fn, calls, repeats, sync)}
            if name.startswith("pl.matmul"):
                row["impl"] = pl.kernels.matmul.last_choice["impl"]
                row["direct"] = pl.kernels.matmul.last_choice.launch.direct is not None
            if name.startswith("plan"):
                row["impl"] = plan.choice["impl"]
                row["direct"] = plan._direct is not None
            if name == "plan(out=)":
                row["graph_replays"] = None if plan.replays is None else {
                    "captures": plan.replays.captures, "refused": plan.replays.refused}
            rows.append(row)
            print(f"{dtype:9s} {name:22s} {row['median_us']:7.1f} us", file=sys.stderr)
        rows.extend(_gpu_times(cp, dtype, size))
    return rows


def _gpu_times(cp: Any, dtype: str, size: int) -> list[dict[str, Any]]:
    """GPU milliseconds of the two libraries' direct calls on these operands (interleaved
    rounds, L2 flushed: blas_direct.race), so that a host-time difference can be weighed
    against the kernel each library picks."""
    from pyc_lab.kernels import blas_direct
    from pyc_lab.kernels.matmul_plan import direct_for

    cdt = cp.dtype(dtype)
    a = cp.random.uniform(-1, 1, (size, size), dtype=cp.float32).astype(cdt)
    w = cp.random.uniform(-1, 1, (size, size), dtype=cp.float32).astype(cdt)
    out = cp.empty((size, size), dtype=cdt)
    stream = cp.cuda.get_current_stream().ptr
    impls, runs = [], []
    for impl in ("cublas", "cublaslt"):
        direct = direct_for(a, w.T, out, impl, 1.0, 0.0, dtype)
        if direct is not None:
            impls.append(impl)
            runs.append(lambda gemm=direct.gemm: gemm(a.data.ptr, w.T.data.ptr,
                                                      out.data.ptr, stream))
    times = blas_direct.race(runs, stream, rounds=9) if runs else []
    return [{"dtype": dtype, "size": size, "call": f"{impl} call alone", "gpu_ms": ms}
            for impl, ms in zip(impls, times, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    rows = run(args.size, args.calls, args.repeats)
    path = write_result(args.out, "matmul_host", {
        "what": "host microseconds per call, median of samples of --calls calls",
        "size": args.size, "calls": args.calls, "repeats": args.repeats, "rows": rows})
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
