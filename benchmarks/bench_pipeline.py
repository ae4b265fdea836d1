"""The conveyor belt and pinned memory on the GPU (GPU lane).

1. **H2D bandwidth** of one 1 GiB copy from a :class:`pyc_lab.PinnedPool` buffer, from a
   raw ``cudaHostAlloc`` buffer (CuPy's ``alloc_pinned_memory``) and from pageable NumPy
   memory, CUDA events, median of 7, the three interleaved (target: the pool >= 95 % of
   raw pinned).
2. **The belt**: 16 chunks of 64 MiB float32, each H2D -> 30 x sin -> D2H, as
   (a) a serial loop on one stream, (b) a hand-written 4-stream CuPy loop
   (non-blocking copies), both from and into pinned memory, and ``pl.Pipeline`` fed two
   ways: (c) ``belt_pinned`` — ``prepare(i)`` returns chunk i already in pinned memory,
   as the baselines get it, and the belt copies it to the device as it is — and
   (d) ``belt_pageable`` — ``prepare(i, out)`` copies chunk i from ordinary NumPy memory
   into the slot's pinned buffer, a loader's real work. Results are views of the slot's
   pinned output (``copy_results=False``). Each belt's depth, workers and compute
   streams come from ``pl.tune_pipeline`` in the same run; one belt per variant is
   reused for every run (its first, untimed run checks every element of every result).
   Host wall time per run, median of 5, interleaved with the baselines; the trace of the
   median run gives the share of copy time hidden behind compute and the max-stage
   bound (targets: >= 90 % hidden, wall <= 1.10x the bound) and is written as Chrome
   JSON.

    python benchmarks/bench_pipeline.py --out benchmarks/results/h200

``--small`` shrinks everything (a smoke run; with ``--cpu`` it runs the belt in CPU mode
without a GPU and writes nothing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result

SIN_PASSES = 30
REPEATS = 5


def bandwidth(cp, nbytes: int, repeats: int = 7) -> dict:
    """GB/s of one H2D copy from pool, raw pinned and pageable buffers (interleaved)."""
    import pyc_lab as pl
    from pyc_lab.profiling import benchmark

    dev = cp.empty(nbytes, dtype=cp.uint8)
    raw_mem = cp.cuda.alloc_pinned_memory(nbytes)
    raw = np.frombuffer(raw_mem, dtype=np.uint8, count=nbytes)
    pageable = np.empty(nbytes, dtype=np.uint8)
    pool = pl.PinnedPool(device=0)
    buf = pool.acquire(nbytes)
    pooled = buf.raw[:nbytes]
    for a in (raw, pageable, pooled):
        a[:] = 1  # touch every page before timing
    stream = cp.cuda.Stream(non_blocking=True)
    times: dict[str, list[float]] = {"pool": [], "raw_pinned": [], "pageable": []}
    for _ in range(repeats):
        for name, host in (("pool", pooled), ("raw_pinned", raw), ("pageable", pageable)):
            # one copy per round (interleaved); no spin, as in probe_bandwidth: a pageable
            # copy's host-side staging belongs in its time
            t = benchmark(
                cp.cuda.runtime.memcpyAsync,
                (dev.data.ptr, host.ctypes.data, nbytes, cp.cuda.runtime.memcpyHostToDevice,
                 stream.ptr),
                repeats=1, warmup=0, spin=False, gpu=True, stream=stream, name=name)
            times[name].append(t.gpu_s[0])
    gbps = {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
    out = {"bytes": nbytes, "repeats": repeats, "gbps": gbps,
           "pool_vs_raw_pinned": gbps["pool"] / gbps["raw_pinned"],
           "pool_stats": pool.stats(), "pool_placement": pool.placement()[:1]}
    buf.release()
    pool.close()
    return out


def sin30(cp, x, stream=None):
    with stream if stream is not None else cp.cuda.Stream.null:
        for _ in range(SIN_PASSES):
            cp.sin(x, out=x)
    return x


def serial(cp, chunks, results) -> float:
    """One stream: copy in, compute, copy out, one chunk after another."""
    stream = cp.cuda.Stream(non_blocking=True)
    dev = cp.empty(chunks[0].shape, dtype=cp.float32)
    t0 = time.perf_counter()
    for src, dst in zip(chunks, results, strict=True):
        dev.set(src, stream=stream)
        sin30(cp, dev, stream)
        dev.get(stream=stream, out=dst, blocking=False)
        stream.synchronize()
    return time.perf_counter() - t0


def four_streams(cp, chunks, results, n_streams: int = 4) -> float:
    """The hand-written overlap: chunk i on stream i % 4, non-blocking copies."""
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(n_streams)]
    devs = [cp.empty(chunks[0].shape, dtype=cp.float32) for _ in range(n_streams)]
    t0 = time.perf_counter()
    for i, (src, dst) in enumerate(zip(chunks, results, strict=True)):
        s, d = streams[i % n_streams], devs[i % n_streams]
        d.set(src, stream=s)
        sin30(cp, d, s)
        d.get(stream=s, out=dst, blocking=False)
    for s in streams:
        s.synchronize()
    return time.perf_counter() - t0


SAMPLE = 4099  # the timed runs check every SAMPLE-th element of every result


def pinned_copies(cp, chunks, fill: bool = True) -> list:
    """A page-locked (``cudaHostAlloc``) array per chunk, holding a copy of it (or
    uninitialised, for results)."""
    out = []
    for c in chunks:
        a = np.frombuffer(cp.cuda.alloc_pinned_memory(c.nbytes), dtype=c.dtype, count=c.size)
        if fill:
            a[:] = c
        out.append(a)
    return out


def compute_sin(x, stream):
    import cupy as cp

    return sin30(cp, x, stream)


def feed(variant: str, chunks, pinned_in) -> tuple:
    """``prepare`` and the Pipeline options for one way of feeding the belt:
    ``"pinned"`` — ``prepare(i)`` returns chunk i already in pinned memory, as the
    baselines get it (copied to the device as it is) — or ``"pageable"`` —
    ``prepare(i, out)`` copies chunk i from ordinary NumPy memory into the slot's pinned
    buffer (a loader's real work)."""
    if variant == "pinned":
        def prepare(i):
            return pinned_in[i]
        return prepare, {"copy_results": False}

    def prepare_into(i, out):
        np.copyto(out, chunks[i])
    return prepare_into, {"copy_results": False, "spec": (chunks[0].shape, chunks[0].dtype)}


def open_belt(variant: str, chunks, pinned_in, depth: int, workers: int, mode: str = "gpu",
              compute_streams: int = 1):
    """A belt fed as :func:`feed` says."""
    import pyc_lab as pl

    prepare, opts = feed(variant, chunks, pinned_in)
    compute = compute_sin if mode == "gpu" else (lambda x: np.sin(x))
    return pl.Pipeline(prepare, compute, depth=depth, workers=workers, mode=mode,
                       compute_streams=compute_streams, **opts)


def belt_run(pipe, n: int, want, full: bool = False) -> tuple[float, bool, float]:
    """One timed run: host wall seconds, whether every result checked out (every
    element with ``full``, else every ``SAMPLE``-th — the full check costs ~100 ms per
    chunk on the consumer's thread, which would be the bound instead of the belt), and
    the host time it started at."""
    ok = []
    t0 = time.perf_counter()
    for i, r in enumerate(pipe.run(range(n))):
        if full:
            ok.append(bool(np.allclose(r, want[i], atol=1e-6)))
        else:
            ok.append(bool(np.allclose(r[::SAMPLE], want[i][::SAMPLE], atol=1e-6)))
    wall = time.perf_counter() - t0
    return wall, all(ok) and len(ok) == n, t0


def sweep(variant: str, chunks, pinned_in, depths, workers, streams) -> dict:
    """pl.tune_pipeline over depth x workers x compute streams for one variant (each:
    warm-up + 3 timed runs)."""
    import pyc_lab as pl

    prepare, opts = feed(variant, chunks, pinned_in)
    result = pl.tune_pipeline(prepare, compute_sin, range(len(chunks)), depths=depths,
                              workers=workers, compute_streams=streams, repeats=3,
                              warmup=1, mode="gpu", **opts)
    rows = [{k: (v * 1e3 if k == "median_s" and v is not None else v)
             for k, v in r.items()} for r in result.rows]
    for r in rows:
        r["median_ms"] = r.pop("median_s")
    best = result.best or {}
    return {"rows": rows, "best": {k: best.get(k, 1) for k in
                                   ("depth", "workers", "compute_streams")}}


def report_of(trace, host_wall: float, host_start: float) -> dict:
    rep = trace.overlap()
    first = min(s.start_s for s in trace.spans)
    last = max(s.end_s for s in trace.spans)
    return {
        "host_wall_ms": host_wall * 1e3,
        "host_before_first_span_ms": (first - host_start) * 1e3,
        "host_after_last_span_ms": (host_start + host_wall - last) * 1e3,
        "trace_wall_ms": rep.wall_s * 1e3, "copy_hidden_pct": rep.copy_hidden_pct,
        "gpu_idle_fraction": rep.gpu_idle_fraction,
        "stage_busy_ms": {k: v * 1e3 for k, v in rep.stage_busy_s.items()},
        "max_stage_bound_ms": rep.max_stage_bound_s * 1e3, "bound_stage": rep.bound_stage,
        "trace_wall_over_max_stage_bound": rep.wall_s / rep.max_stage_bound_s
        if rep.max_stage_bound_s else None,
        "host_wall_over_max_stage_bound": host_wall / rep.max_stage_bound_s
        if rep.max_stage_bound_s else None,
        "pipeline_bound_ms": rep.pipeline_bound_s * 1e3,
        "trace_wall_over_pipeline_bound": rep.wall_s / rep.pipeline_bound_s
        if rep.pipeline_bound_s else None,
        "h2d_gbps": rep.h2d_gbps, "d2h_gbps": rep.d2h_gbps,
        "starvation_gaps": len(rep.starvation_gaps),
        "starvation_ms": rep.starvation_s * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    parser.add_argument("--small", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--cpu", action="store_true", help="CPU-mode belt only (no GPU)")
    args = parser.parse_args()
    n_chunks, chunk_mib = (4, 1) if args.small else (16, 64)
    rng = np.random.default_rng(0)
    chunks = [rng.uniform(-3, 3, chunk_mib << 18).astype(np.float32) for _ in range(n_chunks)]
    if args.cpu:
        want = [np.sin(c) for c in chunks]
        with open_belt("pageable", chunks, chunks, 4, 4, mode="cpu") as pipe:
            wall, ok, _t0 = belt_run(pipe, n_chunks, want, full=True)
            print(f"cpu belt: {wall * 1e3:.1f} ms, correct={ok}; "
                  f"{pipe.trace.overlap().headline()}")
        return

    from pyc_lab.hardware.device import cupy_status

    cp, reason = cupy_status()
    if cp is None:
        print(f"skipped: the pipeline benchmark needs a CUDA device ({reason})")
        return
    # the reference answer, computed the same way (float32 sin on the GPU, 30 times)
    want = [cp.asnumpy(sin30(cp, cp.asarray(c))) for c in chunks]
    bw = bandwidth(cp, (64 if args.small else 1024) << 20)
    print("bandwidth", bw["gbps"], "pool/raw", round(bw["pool_vs_raw_pinned"], 3), flush=True)

    pinned_in = pinned_copies(cp, chunks)
    pinned_out = pinned_copies(cp, chunks, fill=False)
    depths = (2, 4) if args.small else (3, 4, 6, 8)
    grid = {"pinned": ((1, 2), (1, 2)), "pageable": ((2, 4, 8), (1, 2))}  # workers, streams
    sweeps = {v: sweep(v, chunks, pinned_in, depths, *grid[v]) for v in grid}
    print("sweeps", {v: s["best"] for v, s in sweeps.items()}, flush=True)

    belts = {v: open_belt(v, chunks, pinned_in, s["best"]["depth"], s["best"]["workers"],
                          compute_streams=s["best"]["compute_streams"])
             for v, s in sweeps.items()}
    for v, pipe in belts.items():  # warm-up run: every element of every result checked
        _wall, ok, _t0 = belt_run(pipe, n_chunks, want, full=True)
        assert ok, f"the {v} belt's results differ from the chunk-by-chunk computation"
    names = ("serial", "four_streams", "belt_pinned", "belt_pageable")
    runs: dict[str, list[float]] = {k: [] for k in names}
    traces: dict[str, list] = {v: [] for v in belts}
    for _ in range(REPEATS):
        runs["serial"].append(serial(cp, pinned_in, pinned_out))
        assert all(np.allclose(o, w, atol=1e-6) for o, w in zip(pinned_out, want, strict=True))
        runs["four_streams"].append(four_streams(cp, pinned_in, pinned_out))
        assert all(np.allclose(o, w, atol=1e-6) for o, w in zip(pinned_out, want, strict=True))
        for v, pipe in belts.items():
            wall, ok, t0 = belt_run(pipe, n_chunks, want)
            assert ok, f"the {v} belt's results differ from the chunk-by-chunk computation"
            runs[f"belt_{v}"].append(wall)
            traces[v].append((wall, pipe.trace, t0))
        print({k: round(v[-1] * 1e3, 2) for k, v in runs.items()}, flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    ms = {k: statistics.median(v) * 1e3 for k, v in runs.items()}
    belt_results = {}
    for v, pipe in belts.items():
        wall, trace, t0 = sorted(traces[v], key=lambda t: t[0])[len(traces[v]) // 2]
        name = "pipeline-trace.json" if v == "pinned" else f"pipeline-trace-{v}.json"
        trace.to_chrome(Path(args.out) / name)
        belt_results[v] = {
            **sweeps[v]["best"],
            "prepare": "prepare(i) returns chunk i, already pinned (no staging copy)"
            if v == "pinned" else "prepare(i, out): np.copyto of chunk i (pageable) into "
                                  "the slot's pinned buffer",
            "copy_results": False, "wall_ms": ms[f"belt_{v}"],
            "speedup_vs_serial": ms["serial"] / ms[f"belt_{v}"],
            "vs_four_streams": ms["four_streams"] / ms[f"belt_{v}"],
            "trace_of_median_run": report_of(trace, wall, t0), "chrome_trace": name,
            "pool_stats": pipe.pool.stats(), "sweep": sweeps[v]["rows"]}
        pipe.close()
    result = {
        "chunks": n_chunks, "chunk_mib": chunk_mib, "sin_passes": SIN_PASSES,
        "repeats": REPEATS, "wall_ms": ms,
        "runs_ms": {k: [x * 1e3 for x in v] for k, v in runs.items()},
        "belts": belt_results}
    print("belt", result, flush=True)
    path = write_result(args.out, "pipeline", {
        "method": "H2D: one memcpyAsync per buffer, CUDA events, median of 7, interleaved; "
                  "belt: host wall time of the whole run (pipe.run start to last result), "
                  f"median of {REPEATS}, interleaved with the two baselines; depth, workers "
                  "and compute streams per belt picked by pl.tune_pipeline (exhaustive, "
                  "warm-up + 3 runs each) in the same run; each belt's warm-up run checks "
                  "every element of every result against the same computation done chunk "
                  f"by chunk on the GPU, timed runs every {SAMPLE}th element; baselines are "
                  "checked in full after each run",
        "bandwidth": bw, "belt": result})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
