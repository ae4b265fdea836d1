"""Copy bandwidth: pyc_lab.probe_bandwidth against a torch-measured baseline, same run.

The probe (cupy, CUDA events, median of repeats, random bytes) covers 4 KiB to 1 GiB for
H2D/D2H from pageable and pinned memory, D2D and peer copies. As an independent check
of the probe itself, the same copies at 64 MiB and 1 GiB are timed through PyTorch
(``tensor.copy_`` with ``non_blocking=True``, CUDA events, median of 10) when torch is
installed. Writes ``bandwidth.json`` to ``--out``.

    python benchmarks/bench_bandwidth.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result

import pyc_lab
from pyc_lab.profiling.bandwidth import bandwidth_summary


def torch_baseline(sizes: list[int], repeats: int = 10) -> list[dict]:
    """The same copies through PyTorch, timed with CUDA events (median of ``repeats``)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    rows = []
    for size in sizes:
        rows += _torch_copies(torch, size, repeats)
    return rows


def _torch_copies(torch, size: int, repeats: int) -> list[dict]:
    stream = torch.cuda.Stream()
    pageable = torch.randint(0, 256, (size,), dtype=torch.uint8)
    pinned = torch.randint(0, 256, (size,), dtype=torch.uint8).pin_memory()
    dev = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda")
    dev2 = torch.empty_like(dev)
    out_pinned = torch.empty(size, dtype=torch.uint8).pin_memory()
    cases = {
        "h2d_pageable": (lambda: dev2.copy_(pageable, non_blocking=True), 1),
        "h2d_pinned": (lambda: dev2.copy_(pinned, non_blocking=True), 1),
        "d2h_pinned": (lambda: out_pinned.copy_(dev, non_blocking=True), 1),
        "d2d": (lambda: dev2.copy_(dev), 2),
    }
    rows = []
    for kind, (fn, factor) in cases.items():
        times = []
        with torch.cuda.stream(stream):
            fn()
            for _ in range(repeats):
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record(stream)
                fn()
                b.record(stream)
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
        med = statistics.median(times)
        rows.append({"kind": kind, "size_bytes": size, "repeats": repeats,
                     "median_ms": med * 1e3, "gbps": factor * size / med / 1e9})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    args = parser.parse_args()

    frame = pyc_lab.probe_bandwidth(min_time_s=0.05)
    ok = frame[frame["status"] == "ok"]
    baseline = torch_baseline([64 << 20, 1 << 30]) if len(ok) and ok["timer"].iloc[0] == \
        "cuda events" else []
    comparison = []
    for b in baseline:
        mine = ok[(ok["kind"] == b["kind"]) & (ok["size_bytes"] == b["size_bytes"])]
        if len(mine):
            comparison.append({
                "kind": b["kind"], "size_bytes": b["size_bytes"],
                "pyc_lab_gbps": float(mine["gbps"].iloc[0]), "torch_gbps": b["gbps"],
                "ratio_pyc_lab_over_torch": float(mine["gbps"].iloc[0]) / b["gbps"],
            })
    path = write_result(args.out, "bandwidth", {
        "method": "CUDA events on a non-blocking stream; median of repeats (>= 3, ~50 ms per "
                  "size); random bytes; D2D counts read + write",
        "probe_device": frame.attrs.get("device"),
        "results": frame.to_dict(orient="records"),
        "summary": bandwidth_summary(frame).to_dict(orient="records"),
        "baseline": {"library": "torch", "results": baseline},
        "comparison": comparison,
    })
    print(bandwidth_summary(frame).to_string(index=False))
    for c in comparison:
        print(f"{c['kind']:>13} {c['size_bytes'] >> 20:>5} MiB  pyc_lab {c['pyc_lab_gbps']:8.1f}"
              f"  torch {c['torch_gbps']:8.1f} GB/s  ratio {c['ratio_pyc_lab_over_torch']:.3f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
