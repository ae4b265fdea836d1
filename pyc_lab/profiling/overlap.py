"""Overlap metrics of a trace: how much copy time hides behind compute, and the bounds.

:class:`OverlapReport` applies the Holistic Trace Analysis communication/computation
overlap formula to copies, measures the GPU idle fraction and compute starvation gaps,
achieved copy bandwidths, and compares the wall time with the max-stage and classic
pipeline bounds.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .spans import COPY_STAGES, GPU_STAGES, Span, stage_order

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["OverlapReport", "intersect", "total", "union"]


_DEFAULT_GAP_FRACTION = 0.05
_DEFAULT_GAP_FLOOR_S = 10e-6

Interval = tuple[float, float]


@dataclass(frozen=True)
class OverlapReport:
    """How well a trace's stages overlap.

    Attributes
    ----------
    wall_s
        First span's start to last span's end.
    stage_busy_s
        Per stage, the length of the union of its spans (time with >= 1 span running).
    copy_busy_s
        Union of all copy spans (``h2d`` and ``d2h``).
    copy_hidden_s
        Time during which a copy and a compute span both run.
    copy_hidden_pct
        ``100 * copy_hidden_s / copy_busy_s``: the Holistic Trace Analysis
        communication/computation overlap formula applied to copies; 0 without copies.
    gpu_busy_s, gpu_idle_fraction
        Union of all GPU-stage spans, and ``1 - gpu_busy_s / wall_s``.
    starvation_gaps
        ``(start_s, length_s)`` of each gap between compute spans at least
        ``gap_threshold_s`` long, ``start_s`` counted from the trace's first span.
    gap_threshold_s
        The threshold used.
    h2d_bytes, d2h_bytes, h2d_gbps, d2h_gbps
        Bytes copied each way and achieved GB/s (bytes / that stage's busy time);
        ``None`` when the stage has no busy time.
    max_stage_bound_s, bound_stage
        The busiest stage's busy time (the lower bound on the total time if all stages
        overlapped perfectly) and which stage it is.
    efficiency
        ``max_stage_bound_s / wall_s`` (1.0 means the pipeline runs at its bound).
    pipeline_bound_s, pipeline_efficiency
        The classic pipeline bound: the busiest stage's busy time plus the fill (one
        item's median time in each stage before it) and the drain (after it) — the first
        item cannot reach the busiest stage sooner, nor the last leave it later. No
        schedule of these spans beats it; ``pipeline_bound_s / wall_s`` says how close
        this one came.
    n_spans, n_items
        Counts.
    """

    wall_s: float
    stage_busy_s: dict[str, float]
    copy_busy_s: float
    copy_hidden_s: float
    copy_hidden_pct: float
    gpu_busy_s: float
    gpu_idle_fraction: float
    starvation_gaps: list[tuple[float, float]]
    gap_threshold_s: float
    h2d_bytes: int
    d2h_bytes: int
    h2d_gbps: float | None
    d2h_gbps: float | None
    max_stage_bound_s: float
    bound_stage: str | None
    efficiency: float
    n_spans: int
    n_items: int
    pipeline_bound_s: float = 0.0
    pipeline_efficiency: float = 0.0

    @classmethod
    def from_spans(cls, spans: Iterable[Span], *,
                   gap_threshold_s: float | None = None) -> OverlapReport:
        """Compute the report from spans (any order)."""
        spans = list(spans)
        if not spans:
            return cls(0.0, {}, 0.0, 0.0, 0.0, 0.0, 0.0, [], gap_threshold_s or 0.0, 0, 0,
                       None, None, 0.0, None, 0.0, 0, 0)
        origin = min(s.start_s for s in spans)
        wall = max(s.end_s for s in spans) - origin
        by_stage: dict[str, list[Interval]] = {}
        for s in spans:
            by_stage.setdefault(s.stage, []).append((s.start_s, s.end_s))
        unions = {stage: union(iv) for stage, iv in by_stage.items()}
        busy = {stage: total(unions[stage]) for stage in stage_order(unions)}

        copies = union(iv for st in COPY_STAGES for iv in by_stage.get(st, []))
        compute = unions.get("compute", [])
        copy_busy = total(copies)
        hidden = total(intersect(copies, compute))
        hidden_pct = 100.0 * hidden / copy_busy if copy_busy > 0 else 0.0
        gpu_busy = total(union(iv for st in GPU_STAGES for iv in by_stage.get(st, [])))
        idle = 1.0 - gpu_busy / wall if wall > 0 else 0.0

        if gap_threshold_s is None:
            durations = [e - s for s, e in by_stage.get("compute", [])]
            median = statistics.median(durations) if durations else 0.0
            gap_threshold_s = max(_DEFAULT_GAP_FRACTION * median, _DEFAULT_GAP_FLOOR_S)
        gaps = [(a_end - origin, b_start - a_end)
                for (_a, a_end), (b_start, _b) in itertools.pairwise(compute)
                if b_start - a_end >= gap_threshold_s]

        def nbytes(stage: str) -> int:
            return sum(s.nbytes for s in spans if s.stage == stage)

        def gbps(stage: str) -> float | None:
            t = busy.get(stage, 0.0)
            return nbytes(stage) / t / 1e9 if t > 0 else None

        bound_stage = max(busy, key=lambda st: busy[st]) if busy else None
        bound = busy[bound_stage] if bound_stage else 0.0
        per_item: dict[str, dict[int, float]] = {}
        for s in spans:
            items = per_item.setdefault(s.stage, {})
            items[s.item] = items.get(s.item, 0.0) + s.duration_s
        order = list(busy)
        at = order.index(bound_stage) if bound_stage else 0
        fill_drain = sum(statistics.median(per_item[st].values())
                         for k, st in enumerate(order) if k != at)
        pipeline_bound = bound + fill_drain
        return cls(
            wall_s=wall, stage_busy_s=busy, copy_busy_s=copy_busy, copy_hidden_s=hidden,
            copy_hidden_pct=hidden_pct, gpu_busy_s=gpu_busy, gpu_idle_fraction=idle,
            starvation_gaps=gaps, gap_threshold_s=gap_threshold_s,
            h2d_bytes=nbytes("h2d"), d2h_bytes=nbytes("d2h"),
            h2d_gbps=gbps("h2d"), d2h_gbps=gbps("d2h"),
            max_stage_bound_s=bound, bound_stage=bound_stage,
            efficiency=bound / wall if wall > 0 else 0.0,
            n_spans=len(spans), n_items=len({s.item for s in spans}),
            pipeline_bound_s=pipeline_bound,
            pipeline_efficiency=pipeline_bound / wall if wall > 0 else 0.0,
        )

    @property
    def starvation_s(self) -> float:
        """Total length of the starvation gaps."""
        return sum(length for _start, length in self.starvation_gaps)

    def to_frame(self) -> pd.DataFrame:
        """The metrics as a two-column frame (``metric``, ``value``), stable order."""
        import pandas as pd

        rows: list[tuple[str, Any]] = [("wall_ms", self.wall_s * 1e3)]
        rows += [(f"{stage}_busy_ms", t * 1e3) for stage, t in self.stage_busy_s.items()]
        rows += [
            ("copy_hidden_pct", self.copy_hidden_pct),
            ("gpu_idle_fraction", self.gpu_idle_fraction),
            ("starvation_gaps", len(self.starvation_gaps)),
            ("starvation_ms", self.starvation_s * 1e3),
            ("h2d_gbps", self.h2d_gbps),
            ("d2h_gbps", self.d2h_gbps),
            ("max_stage_bound_ms", self.max_stage_bound_s * 1e3),
            ("bound_stage", self.bound_stage),
            ("efficiency", self.efficiency),
            ("pipeline_bound_ms", self.pipeline_bound_s * 1e3),
            ("pipeline_efficiency", self.pipeline_efficiency),
        ]
        return pd.DataFrame(rows, columns=["metric", "value"])

    def summary(self) -> str:
        """A few deterministic lines (for identical traces) describing the overlap."""
        if self.n_spans == 0:
            return "empty trace: no spans recorded"
        stages = ", ".join(f"{st} {t * 1e3:.3f}" for st, t in self.stage_busy_s.items())
        gb = [f"{name} {value:.2f} GB/s" for name, value in
              (("H2D", self.h2d_gbps), ("D2H", self.d2h_gbps)) if value is not None]
        lines = [
            f"{self.n_items} items, {self.n_spans} spans, wall {self.wall_s * 1e3:.3f} ms",
            f"busy ms: {stages}",
            f"copy hidden behind compute: {self.copy_hidden_pct:.1f}% "
            f"({self.copy_hidden_s * 1e3:.3f} of {self.copy_busy_s * 1e3:.3f} ms)",
            f"GPU idle: {100 * self.gpu_idle_fraction:.1f}% of wall",
            f"starvation gaps (>= {self.gap_threshold_s * 1e3:.3f} ms): "
            f"{len(self.starvation_gaps)}, {self.starvation_s * 1e3:.3f} ms in all",
        ]
        if gb:
            lines.append("achieved: " + ", ".join(gb))
        lines.append(f"max-stage bound {self.max_stage_bound_s * 1e3:.3f} ms "
                     f"({self.bound_stage}) vs actual {self.wall_s * 1e3:.3f} ms: "
                     f"efficiency {100 * self.efficiency:.1f}%")
        lines.append(f"with fill and drain {self.pipeline_bound_s * 1e3:.3f} ms: "
                     f"efficiency {100 * self.pipeline_efficiency:.1f}%")
        return "\n".join(lines)

    def headline(self) -> str:
        """One line: copy hidden, GPU idle, efficiency."""
        return (f"copy hidden {self.copy_hidden_pct:.1f}% · GPU idle "
                f"{100 * self.gpu_idle_fraction:.1f}% · efficiency {100 * self.efficiency:.1f}%"
                f" (bound {self.bound_stage})")


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge intervals into a sorted list of disjoint ones (touching ones merge)."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two sorted disjoint interval lists (as :func:`union` returns)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def total(intervals: Iterable[Interval]) -> float:
    """Summed length of (disjoint) intervals."""
    return sum(end - start for start, end in intervals)
