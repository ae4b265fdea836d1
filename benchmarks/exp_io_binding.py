"""Experiment: does a binding change what ``model.run`` costs, and what does it save?

For each zoo model at batch 1 on the GPU (CuPy backend, CUDA graphs): host wall time per
call with the device synchronised, median of interleaved rounds, of ``model.run`` on
fixed device inputs (i) before any binding exists, (ii) after ``model.io_binding`` made
one on other arrays, and (iii) the bound call itself. Writes ``io-binding.json``.

    python benchmarks/exp_io_binding.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result
from exp_dispatch import median_us

ROUNDS = 5
CALLS = 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write io-binding.json into this folder")
    parser.add_argument("--calls", type=int, default=CALLS)
    args = parser.parse_args(argv)
    import cupy as cp

    import pyc_lab as pl
    from pyc_lab.inference import zoo

    def sync() -> None:
        cp.cuda.Device().synchronize()

    rows = []
    for name in zoo.names():
        model = pl.inference.load(zoo.build(name), backend="cupy", cuda_graph=True)
        run_in = [cp.asarray(a) for a in model.example(batch=1, seed=1)]
        def run(model: Any = model, run_in: list[Any] = run_in) -> None:
            model.run(run_in)

        for _ in range(3):
            run()
        before = [median_us(run, sync, args.calls) for _ in range(ROUNDS)]
        bound_in = [cp.asarray(a) for a in model.example(batch=1, seed=2)]
        bound = model.io_binding(bound_in)
        after, bound_us = [], []
        for _ in range(ROUNDS):
            after.append(median_us(run, sync, args.calls))
            bound_us.append(median_us(bound, sync, args.calls))
        row = {"model": name, "zero_copy": bound.bound.zero_copy,
               "run_us_before_binding": statistics.median(before),
               "run_us_with_a_binding": statistics.median(after),
               "bound_us": statistics.median(bound_us)}
        rows.append(row)
        print(row, flush=True)
    if args.out:
        write_result(args.out, "io-binding", {
            "method": "host wall time per call with the device synchronised, batch 1, "
                      f"median of {args.calls} calls per round, median of {ROUNDS} rounds",
            "results": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
