"""Experiment: where the host time of a small model's call goes (GPU lane).

A zoo model at batch 1 is a few microseconds of GPU work; its call costs what the host
does around it. This times, per model (host wall time, median of many calls, each ended
by a device synchronise): a bare synchronise, one tiny kernel, the served call
(``model.run``), the compiled executable alone and its replay program alone, and torch
eager / ``torch.compile(mode="reduce-overhead")`` on the same layers; then profiles 200
``model.run`` calls with cProfile and prints the top entries. Writes
``inference-host.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cupy_and_torch, write_result


def per_call_us(fn: Any, sync: Any, calls: int = 300) -> float:
    """Median host microseconds of ``fn()`` followed by ``sync()`` (what a caller waits
    for), through :func:`pyc_lab.profiling.timing.benchmark` on the host clock."""
    from pyc_lab.profiling.timing import benchmark

    def call() -> None:
        fn()
        sync()

    t = benchmark(call, repeats=calls, warmup=20, gpu=False)
    return statistics.median(t.cpu_s) * 1e6


def measure_model(name: str, pl: Any, bi: Any, cp: Any, torch: Any, sync: Any) -> dict:
    """One zoo model at batch 1: the timings and the profile of :func:`main`."""
    m = pl.inference.zoo.build(name)
    feeds = pl.inference.zoo.example_inputs(name, 1)
    model = pl.inference.load(m, backend="cupy", cuda_graph=True)
    state = [cp.asarray(feeds[n]) for n in model.input_names]
    row: dict[str, Any] = {"model_run_us": per_call_us(lambda: model.run(state), sync)}
    exe = model.compiled._last.runner
    inputs = state + model._weights_for(state)
    row["inputs"] = len(inputs)
    try:
        row["executable_us"] = per_call_us(lambda: exe(inputs), sync)
        prog = getattr(exe, "_program", None)
        if prog is not None:
            row["program"] = [kind for kind, _ in prog.program]
            row["replay_us"] = per_call_us(lambda: prog.replay(inputs), sync)
    except Exception as exc:
        row["executable_error"] = f"{type(exc).__name__}: {exc}"
    run = bi.torch_runner(m, "cuda")
    tfeeds = {k: torch.as_tensor(v).cuda() for k, v in feeds.items()}
    with torch.inference_mode():
        row["torch_eager_us"] = per_call_us(lambda: run(tfeeds), torch.cuda.synchronize)
        try:
            t0 = time.perf_counter()
            comp = torch.compile(run, mode="reduce-overhead")
            for _ in range(3):
                comp(tfeeds)
            row["torch_compile_first_s"] = time.perf_counter() - t0
            row["torch_compile_ro_us"] = per_call_us(lambda: comp(tfeeds),
                                                     torch.cuda.synchronize)
        except Exception as exc:
            row["torch_compile_error"] = f"{type(exc).__name__}: {exc}"[:300]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        model.run(state)
    sync()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    row["profile"] = text.getvalue()[-6000:]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    parser.add_argument("--models", default="astro_mlp,biology_vae")
    args = parser.parse_args()
    found = cupy_and_torch("the host-time experiment")
    if found is None:
        return 0
    cp, torch = found
    import bench_inference as bi

    import pyc_lab as pl

    sync = cp.cuda.Device().synchronize
    tiny = cp.zeros(1, dtype=cp.float32)
    rows: dict[str, Any] = {"sync_us": per_call_us(lambda: None, sync),
                            "tiny_kernel_us": per_call_us(lambda: tiny.__iadd__(1), sync)}
    print(rows, flush=True)
    for name in args.models.split(","):
        row = measure_model(name, pl, bi, cp, torch, sync)
        rows[name] = row
        print(name, {k: v for k, v in row.items() if k != "profile"}, flush=True)
        print(row["profile"][-3500:], flush=True)
    path = write_result(args.out, "inference-host", {"results": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
