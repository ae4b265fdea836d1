"""The compiler's suite of programs people write, against torch eager and torch.compile.

Every program of ``benchmarks/programs.py`` runs at its benchmark size on the GPU three
ways in the same run: ``pl.compile`` of the NumPy-style function (cupy backend), the
torch twin eagerly, and the torch twin under ``torch.compile`` (default mode). Each
result is checked against the torch twin in float64 on the GPU (relative error of the
whole output); GPU time is the median of CUDA-event repeats (``pl.profiling.benchmark``);
memory-bound programs also report bytes read and written per second against a
device-to-device copy measured in the same run. Compile times (first call) and the warm
host time per call (at 1/256 of the size, where issuing the call is what costs) are
recorded, torch.compile's warm host time on the same small inputs beside it (rounds
interleaved, the garbage collector paused as ``timeit`` pauses it). For each
memory-bound program the ratio a kernel at copy bandwidth would reach is recorded too
(torch.compile's time over the copy time of the same bytes), and the summary gives the
median those ceilings allow: how far the suite's median can go on this card at all.
One program failing is recorded and the others go on; programs left when ``--budget-s``
is spent are listed as not run. Writes ``programs.json``.

    python benchmarks/bench_programs.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cupy_and_torch, gpu_time, host_us_many, write_result
from programs import PROGRAMS, Program, make_inputs

import pyc_lab as pl

#: Relative error (whole output, against float64) a result must stay under, per dtype.
TOLERANCE = {"float16": 2e-2, "float32": 1e-4, "bfloat16": 4e-2}


def gpu_ms(fn: Any, repeats: int = 15) -> float:
    """Median GPU milliseconds of ``fn()`` (CUDA events; host gaps kept out)."""
    return gpu_time(fn, repeats=repeats, warmup=2) * 1e3


#: The inputs' scale at which the warm host time per call is measured (the GPU work is
#: then small, so the host's cost of issuing the call is what is timed).
SMALL_SCALE = 1 / 256


def copy_gbps(cp: Any, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second / 1e9)."""
    src = cp.ones(nbytes, dtype=cp.uint8)
    dst = cp.empty_like(src)
    ms = gpu_ms(lambda: dst.data.copy_from_device_async(src.data, nbytes))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _tuple(out: Any) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def rel_error(got: tuple, ref: tuple, torch: Any) -> float:
    """Largest relative error (Frobenius) over the outputs, against float64 ``ref``."""
    worst = 0.0
    for g, r in zip(got, ref, strict=True):
        if hasattr(g, "__dlpack__") and not isinstance(g, np.ndarray):
            g = torch.from_dlpack(g)
        g = torch.as_tensor(np.asarray(g) if isinstance(g, (np.ndarray, np.generic, float))
                            else g, device=r.device).double()
        worst = max(worst, float((g - r).norm() / r.norm().clamp_min(1e-30)))
    return worst


def run_program(p: Program, cp: Any, torch: Any, copy_bw: float) -> dict[str, Any]:
    host = make_inputs(p, 1.0, seed=1)
    dev = [cp.asarray(a) for a in host]
    tins = [torch.from_dlpack(a) for a in dev]
    row: dict[str, Any] = {"program": p.name, "dtype": np.dtype(p.dtype).name,
                           "shapes": [list(a.shape) for a in host]}
    ref = _tuple(p.torch_fn(*[t.double() if t.is_floating_point() else t for t in tins]))
    del host

    fn = pl.compile(p.numpy_fn)
    t0 = time.perf_counter()
    got = _tuple(fn(*dev))
    cp.cuda.Device().synchronize()
    row["pl_compile_s"] = time.perf_counter() - t0
    row["pl_error"] = rel_error(got, ref, torch)
    explained = fn.explain(*dev)
    row["pl_kernels"] = [f"{k['name']}: {k.get('implementation', '')}"[:160]
                         for k in explained.kernels]
    row["eager_error"] = rel_error(_tuple(p.torch_fn(*tins)), ref, torch)
    tc = torch.compile(p.torch_fn)
    t0 = time.perf_counter()
    tout = _tuple(tc(*tins))
    torch.cuda.synchronize()
    row["torch_compile_s"] = time.perf_counter() - t0
    row["torch_compile_error"] = rel_error(tout, ref, torch)
    del ref, got, tout
    tol = TOLERANCE[row["dtype"]]
    row["correct"] = bool(row["pl_error"] < tol)
    row["ms"] = {"pl.compile": gpu_ms(lambda: fn(*dev)),
                 "torch eager": gpu_ms(lambda: p.torch_fn(*tins)),
                 "torch.compile": gpu_ms(lambda: tc(*tins))}
    row["vs_torch_compile"] = row["ms"]["torch.compile"] / row["ms"]["pl.compile"]
    row["vs_torch_eager"] = row["ms"]["torch eager"] / row["ms"]["pl.compile"]
    small = [cp.asarray(a) for a in make_inputs(p, SMALL_SCALE, seed=2)]
    small_fn = pl.compile(p.numpy_fn)
    # the same figure for torch.compile, in the same run and rounds interleaved: the
    # host's speed differs between machine starts, so absolute host times only compare
    # within one run
    tsmall = [torch.from_dlpack(a) for a in small]
    tc_small = torch.compile(p.torch_fn, dynamic=False)
    tc_small(*tsmall)
    host = host_us_many(cp, {"pl": lambda: small_fn(*small),
                             "tc": lambda: tc_small(*tsmall)})
    row["pl_host_us_small"] = host["pl"]
    row["torch_compile_host_us_small"] = host["tc"]
    if p.memory_bound:
        outs = _tuple(fn(*dev))
        moved = sum(a.nbytes for a in dev) + sum(getattr(o, "nbytes", 8) for o in outs)
        row["bytes_moved"] = int(moved)
        row["fraction_of_copy_bw"] = moved / (row["ms"]["pl.compile"] * 1e-3) / 1e9 / copy_bw
        # what any kernel moving these bytes at copy bandwidth would make of the ratio:
        # the ceiling of vs_torch_compile for this program on this card
        copy_ms = moved / (copy_bw * 1e9) * 1e3
        row["torch_compile_fraction_of_copy_bw"] = copy_ms / row["ms"]["torch.compile"]
        row["vs_torch_compile_at_copy_bw"] = row["ms"]["torch.compile"] / copy_ms
    return row


def ceiling_median(rows: list[dict[str, Any]]) -> float | None:
    """The largest median of ``vs_torch_compile`` the suite allows on this card.

    A memory-bound program's ratio cannot pass ``vs_torch_compile_at_copy_bw`` unless a
    kernel moves its bytes faster than a device-to-device copy; a program that is not
    memory-bound is given no ceiling (counted as unbounded), so the figure is generous.
    """
    ceilings = sorted(r.get("vs_torch_compile_at_copy_bw", float("inf")) for r in rows
                      if "vs_torch_compile" in r)
    return statistics.median(ceilings) if ceilings else None


def _median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else None


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "vs_torch_compile" in r]
    ratios = sorted(r["vs_torch_compile"] for r in ok)
    return {
        "programs_timed": len(ok),
        "median_vs_torch_compile": statistics.median(ratios) if ratios else None,
        "min_vs_torch_compile": ratios[0] if ratios else None,
        "below_0_90": [r["program"] for r in ok if r["vs_torch_compile"] < 0.90],
        "median_vs_torch_eager": statistics.median(r["vs_torch_eager"] for r in ok)
        if ok else None,
        "wrong": [r["program"] for r in ok if not r["correct"]],
        "failed": [r["program"] for r in rows if "error" in r],
        "not_run": [r["program"] for r in rows if r.get("not_run")],
        "memory_bound_below_85pct_copy": [r["program"] for r in ok
                                          if r.get("fraction_of_copy_bw", 1.0) < 0.85],
        "compile_over_2s": [r["program"] for r in ok if r["pl_compile_s"] > 2.0],
        "host_over_30us": [r["program"] for r in ok if r.get("pl_host_us_small", 0) > 30.0],
        "median_host_us_small": _median_of(ok, "pl_host_us_small"),
        "median_torch_compile_host_us_small": _median_of(ok, "torch_compile_host_us_small"),
        "median_vs_torch_compile_ceiling_at_copy_bw": ceiling_median(ok),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    parser.add_argument("--only", nargs="*", help="program names to run (default: all)")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no program after this many seconds")
    args = parser.parse_args(argv)
    gate = cupy_and_torch("the program suite")
    if gate is None:
        return 0
    cp, torch = gate
    chosen = [p for p in PROGRAMS if not args.only or p.name in args.only]
    bw = copy_gbps(cp)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()

    def save() -> Path:
        return write_result(args.out, "programs", {
            "method": "GPU time: CUDA events (pyc_lab.profiling.benchmark), median of 15 "
                      "repeats after 2 warm-ups; errors against the torch twin in float64 on "
                      "the GPU; torch.compile default mode",
            "copy_gbps": bw, "rows": rows, "summary": summary(rows)})

    for p in chosen:
        if time.perf_counter() - start > args.budget_s:
            rows.append({"program": p.name, "not_run": "time budget spent"})
            continue
        try:
            rows.append(run_program(p, cp, torch, bw))
        except Exception as exc:  # record, keep going
            rows.append({"program": p.name, "error": f"{type(exc).__name__}: {exc}"[:400]})
        r = rows[-1]
        print(p.name, {k: r.get(k) for k in ("vs_torch_compile", "vs_torch_eager", "pl_error",
                                             "error")}, file=sys.stderr)
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
        save()
    print(save())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
