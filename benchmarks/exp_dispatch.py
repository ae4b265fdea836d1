"""Experiment: the host time a compiled call adds around its run (any machine).

For each zoo model at batch 1 (``pl.inference.load``: the NumPy backend on a machine
without a GPU, the CuPy backend with CUDA graphs on one), side by side in one run and
interleaved: ``model.run`` through the fast path (a call like the last one), the same
call forced through the full path (the key, the look-up and the guards — what every call
paid before the fast path — plus recording the fast path's entry, what a call of a new
kind pays now), and the artifact's runner alone. Host wall time per call,
median of interleaved rounds; on a GPU each call ends with a device synchronise. The
dispatch is ``model.run`` minus the runner. Writes ``dispatch.json`` to ``--out``.

    python benchmarks/exp_dispatch.py --out benchmarks/results/cpu
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

ROUNDS = 7
CALLS = 2000


def median_us(fn: Any, sync: Any, calls: int) -> float:
    """Median microseconds of ``fn(); sync()``."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write dispatch.json into this folder")
    parser.add_argument("--calls", type=int, default=CALLS)
    args = parser.parse_args(argv)
    import pyc_lab as pl
    from pyc_lab.hardware.device import no_gpu_reason
    from pyc_lab.inference import zoo

    gpu = no_gpu_reason() is None
    if gpu:
        import cupy as cp

        def sync() -> None:
            cp.cuda.Device().synchronize()
    else:
        def sync() -> None:
            pass
    results: dict[str, Any] = {}
    for name in zoo.names():
        model = pl.inference.load(zoo.build(name), backend="cupy" if gpu else "numpy",
                                  cuda_graph=gpu)
        feeds = zoo.example_inputs(name, 1, 1)
        inputs = [cp.asarray(feeds[n]) if gpu else feeds[n] for n in model.input_names]
        for _ in range(3):
            model.run(inputs)
        compiled = model.compiled
        art = next(iter(compiled._cache.values()))[0]
        runner_inputs = [*inputs, *model._weights_for(inputs)]

        def full_path(model=model, compiled=compiled, inputs=inputs) -> None:
            compiled._fast = None  # the full path, as a call of a new kind takes it
            model.run(inputs)

        rows: dict[str, list[float]] = {"fast": [], "full": [], "runner": []}
        for _ in range(ROUNDS):
            rows["fast"].append(median_us(lambda m=model, i=inputs: m.run(i), sync,
                                          args.calls))
            rows["full"].append(median_us(full_path, sync, args.calls))
            rows["runner"].append(median_us(lambda a=art, i=runner_inputs: a.runner(i),
                                            sync, args.calls))
        med = {k: statistics.median(v) for k, v in rows.items()}
        results[name] = {
            "model_run_fast_us": med["fast"], "model_run_full_us": med["full"],
            "runner_us": med["runner"], "dispatch_fast_us": med["fast"] - med["runner"],
            "dispatch_full_us": med["full"] - med["runner"], "rounds": rows,
            "arguments": len(runner_inputs)}
        print(f"{name}: model.run {med['fast']:.1f} us (full path {med['full']:.1f}), "
              f"runner {med['runner']:.1f}: dispatch {med['fast'] - med['runner']:.1f} "
              f"against {med['full'] - med['runner']:.1f} us")
    if args.out:
        write_result(args.out, "dispatch", {
            "backend": "cupy (CUDA graphs)" if gpu else "numpy",
            "method": f"host wall time per call, median of {args.calls} calls, median of "
                      f"{ROUNDS} interleaved rounds; batch 1", "models": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
