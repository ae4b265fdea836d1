"""A synthetic belt trace with overlap metrics worked out by hand (no GPU, no clock)."""

from __future__ import annotations

from pyc_lab.profiling.trace import Trace

MS = 1e-3

#: ``pipeline_trace().overlap().summary()``, line by line, as computed by hand
SUMMARY_LINES = [
    "4 items, 16 spans, wall 6.250 ms",
    "busy ms: prepare 3.000, h2d 2.000, compute 4.000, d2h 1.000",
    "copy hidden behind compute: 66.7% (2.000 of 3.000 ms)",
    "GPU idle: 20.0% of wall",
    "starvation gaps (>= 0.050 ms): 1, 0.500 ms in all",
    "achieved: H2D 2.00 GB/s, D2H 1.00 GB/s",
    "max-stage bound 4.000 ms (compute) vs actual 6.250 ms: efficiency 64.0%",
    "with fill and drain 5.500 ms: efficiency 88.0%",
]


def pipeline_trace(name: str = "synthetic", late: float = 5.0, *, workers: int = 1,
                   t0: float = 100.0) -> Trace:
    """Four items through prepare -> h2d -> compute -> d2h; item 3's compute starts late.

    In ms from ``t0``, item i: prepare [i, i+0.75] on ``cpu-worker-<i % workers>``;
    h2d [i+1, i+1.5] (1 MB); compute [i+1.5, i+2.5] except item 3 at [late, late+1];
    d2h right after compute, 0.25 ms (250 kB). With the default ``late`` its overlap
    summary is :data:`SUMMARY_LINES` whatever ``workers`` and ``t0`` are.
    """
    t = Trace(name=name)
    compute = {0: (1.5, 2.5), 1: (2.5, 3.5), 2: (3.5, 4.5), 3: (late, late + 1.0)}
    for i in range(4):
        worker = f"cpu-worker-{i % workers}"
        t.record(i, "prepare", worker, t0 + i * MS, t0 + (i + 0.75) * MS)
        t.record(i, "h2d", "stream h2d", t0 + (i + 1) * MS, t0 + (i + 1.5) * MS, 1_000_000)
        c0, c1 = compute[i]
        t.record(i, "compute", "stream compute", t0 + c0 * MS, t0 + c1 * MS)
        t.record(i, "d2h", "stream d2h", t0 + c1 * MS, t0 + (c1 + 0.25) * MS, 250_000)
    return t
