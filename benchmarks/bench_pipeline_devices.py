"""The conveyor belt over every GPU of the node against one GPU (the multi-GPU lane).

``bench_pipeline``'s workload — 16 chunks of 64 MiB float32, each copied to a GPU, put
through 30 passes of ``sin`` and copied back, ``prepare(i, out)`` filling the slot's
pinned buffer from ordinary NumPy memory (``--feed pinned``: ``prepare(i)`` returning
the chunk already pinned, so that no host copy bounds the belt) — through
``pl.Pipeline(..., devices=[0])`` and through
``pl.Pipeline(..., devices=[0, ..., n-1])``, the same depth and workers per GPU. Every
result of a first, untimed run of each is checked against the GPU's answer; then host
wall time per run, median of ``--repeats``, the two interleaved. Writes
``pipeline_devices.json`` to ``--out``; with fewer than two GPUs it says so and writes
nothing.

    python benchmarks/bench_pipeline_devices.py --out benchmarks/results/h200x2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipeline import belt_run, compute_sin, feed, pinned_copies, sin30
from common import write_result

import pyc_lab as pl

CHUNKS, CHUNK_MIB = 16, 64


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--feed", choices=("pageable", "pinned"), default="pageable",
                        help="prepare copies each chunk into the slot's pinned buffer "
                             "(pageable), or returns it already pinned (pinned)")
    args = parser.parse_args(argv)
    from pyc_lab.hardware.device import cupy_status

    cp, why = cupy_status()
    gpus = 0 if cp is None else cp.cuda.runtime.getDeviceCount()
    if gpus < 2:
        print(f"bench_pipeline_devices: needs two GPUs or more; this machine has {gpus} "
              f"({why or 'one GPU'})")
        return 0
    rng = np.random.default_rng(0)
    chunks = [rng.uniform(-3, 3, CHUNK_MIB << 18).astype(np.float32) for _ in range(CHUNKS)]
    want = [cp.asnumpy(sin30(cp, cp.asarray(c))) for c in chunks]
    pinned_in = pinned_copies(cp, chunks) if args.feed == "pinned" else None
    prepare, opts = feed(args.feed, chunks, pinned_in)
    configs = {"1 GPU": [0], f"{gpus} GPUs": list(range(gpus))}
    belts = {name: pl.Pipeline(prepare, compute_sin, depth=args.depth, workers=args.workers,
                               mode="gpu", devices=devs, **opts)
             for name, devs in configs.items()}
    t0 = time.perf_counter()
    rows: dict[str, dict] = {}
    try:
        for name, pipe in belts.items():
            _, ok, _ = belt_run(pipe, CHUNKS, want, full=True)
            rows[name] = {"devices": configs[name], "checked": ok, "wall_s": []}
        for _ in range(args.repeats):
            for name, pipe in belts.items():
                wall, ok, _ = belt_run(pipe, CHUNKS, want)
                rows[name]["wall_s"].append(wall)
                rows[name]["checked"] = rows[name]["checked"] and ok
    finally:
        for pipe in belts.values():
            pipe.close()
    gib = CHUNKS * CHUNK_MIB / 1024
    for row in rows.values():
        row["median_s"] = statistics.median(row["wall_s"])
        row["gib_per_s"] = gib / row["median_s"]
    one, many = rows["1 GPU"], rows[f"{gpus} GPUs"]
    summary = {"gpus": gpus, "speedup": one["median_s"] / many["median_s"],
               "all_checked": all(r["checked"] for r in rows.values())}
    write_result(args.out, "pipeline_devices", {
        "method": f"{CHUNKS} x {CHUNK_MIB} MiB float32, H2D -> 30 x sin -> D2H, fed "
                  f"{args.feed}; depth and workers per GPU as given; host "
                  "wall per run, median of --repeats, interleaved; first run fully checked",
        "depth": args.depth, "workers": args.workers, "feed": args.feed, "results": rows,
        "summary": summary,
        "wall_s": time.perf_counter() - t0})
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
