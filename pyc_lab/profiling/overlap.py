"""Overlap metrics of a trace: how much copy time hides behind compute, and the bounds.

:class:`OverlapReport` applies the Holistic Trace Analysis communication/computation
overlap formula to copies, measures the GPU idle fraction and compute starvation gaps,
achieved copy bandwidths, and compares the wall time with the max-stage and classic
pipeline bounds.

A trace that keeps only its recent items' spans (a long-running belt) folds the older
ones into a :class:`FoldedSpans`: running interval unions, byte counts and
:class:`QuantileSketch` distributions, from which the report covers the whole run in
bounded memory.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .quantiles import QuantileSketch
from .spans import COPY_STAGES, GPU_STAGES, Span, stage_order

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["HOST_STAGE_WORDS", "FoldedSpans", "OverlapReport", "intersect", "total",
           "union"]

#: What the copy stages are in a CPU-mode trace (the belt's host lanes): copies between
#: host buffers, done on threads, with no device and no PCIe link in between.
HOST_STAGE_WORDS: dict[str, str] = {"h2d": "copy in", "d2h": "copy out"}


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
    folded_items, folded_spans
        How many of those items and spans were folded out of a trace that keeps only its
        recent items (0 for a trace that keeps every span). The figures still cover the
        whole run; the medians (gap threshold, fill and drain) and the folded gaps'
        lengths are then known within 1 %.
    folded_gaps, folded_gaps_s
        Starvation gaps among the folded spans: counted in :attr:`starvation_s` and the
        summary, not listed in :attr:`starvation_gaps` (whose spans are no longer kept).
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
    folded_items: int = 0
    folded_spans: int = 0
    folded_gaps: int = 0
    folded_gaps_s: float = 0.0

    @classmethod
    def from_spans(cls, spans: Iterable[Span], *, gap_threshold_s: float | None = None,
                   folded: FoldedSpans | None = None) -> OverlapReport:
        """Compute the report from spans (any order).

        Parameters
        ----------
        spans
            The spans (of a trace that keeps them all, or the ones a bounded trace kept).
        gap_threshold_s
            Compute gaps at least this long count as starvation; by default the larger of
            5 % of the median compute span and 10 µs.
        folded
            The older spans a bounded trace folded away; the report then covers them too.
        """
        if folded is not None and folded.n_spans:
            return folded.report(spans, gap_threshold_s=gap_threshold_s)
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

        medians = {st: statistics.median(times.values())
                   for st, times in _per_item_times(spans).items()}
        bound_stage, bound, pipeline_bound = _bounds(busy, medians)
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
        """Total length of the starvation gaps (the folded ones included)."""
        return sum(length for _start, length in self.starvation_gaps) + self.folded_gaps_s

    @property
    def n_starvation_gaps(self) -> int:
        """How many starvation gaps there were (the folded ones included)."""
        return len(self.starvation_gaps) + self.folded_gaps

    def to_frame(self) -> pd.DataFrame:
        """The metrics as a two-column frame (``metric``, ``value``), stable order."""
        import pandas as pd

        rows: list[tuple[str, Any]] = [("wall_ms", self.wall_s * 1e3)]
        rows += [(f"{stage}_busy_ms", t * 1e3) for stage, t in self.stage_busy_s.items()]
        rows += [
            ("copy_hidden_pct", self.copy_hidden_pct),
            ("gpu_idle_fraction", self.gpu_idle_fraction),
            ("starvation_gaps", self.n_starvation_gaps),
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

    def summary(self, *, host: bool = False) -> str:
        """A few deterministic lines (for identical traces) describing the overlap.

        Parameters
        ----------
        host
            Word the lines for a CPU-mode trace, whose lanes are host threads: the
            ``h2d``/``d2h`` stages are "copy in"/"copy out" between host buffers, the
            GPU idle line becomes the time the copy and compute threads were all idle,
            and copy speeds are host-to-host copies rather than H2D/D2H over PCIe. The
            figures are the same; only their names change.
        """
        if self.n_spans == 0:
            return "empty trace: no spans recorded"

        def word(stage: str | None) -> str | None:
            return HOST_STAGE_WORDS.get(stage, stage) if host and stage else stage

        stages = ", ".join(f"{word(st)} {t * 1e3:.3f}" for st, t in self.stage_busy_s.items())
        idle = (f"copy-in, compute and copy-out threads all idle: "
                f"{100 * self.gpu_idle_fraction:.1f}% of wall" if host else
                f"GPU idle: {100 * self.gpu_idle_fraction:.1f}% of wall")
        lines = [
            f"{self.n_items} items, {self.n_spans} spans, wall {self.wall_s * 1e3:.3f} ms",
            f"busy ms: {stages}",
            f"copy hidden behind compute: {self.copy_hidden_pct:.1f}% "
            f"({self.copy_hidden_s * 1e3:.3f} of {self.copy_busy_s * 1e3:.3f} ms)",
            idle,
            f"starvation gaps (>= {self.gap_threshold_s * 1e3:.3f} ms): "
            f"{self.n_starvation_gaps}, {self.starvation_s * 1e3:.3f} ms in all",
        ]
        if self.folded_items:
            lines.insert(1, f"spans of the first {self.folded_items} items folded into "
                            "these figures (medians within 1 %); the rest kept in full")
        speeds = (("h2d", self.h2d_gbps), ("d2h", self.d2h_gbps))
        if host:
            gb = [f"{word(st)} {value:.3g} GB/s" for st, value in speeds if value is not None]
            if gb:
                lines.append("host-to-host copies: " + ", ".join(gb))
        else:
            gb = [f"{st.upper()} {value:.2f} GB/s" for st, value in speeds if value is not None]
            if gb:
                lines.append("achieved: " + ", ".join(gb))
        lines.append(f"max-stage bound {self.max_stage_bound_s * 1e3:.3f} ms "
                     f"({word(self.bound_stage)}) vs actual {self.wall_s * 1e3:.3f} ms: "
                     f"efficiency {100 * self.efficiency:.1f}%")
        lines.append(f"with fill and drain {self.pipeline_bound_s * 1e3:.3f} ms: "
                     f"efficiency {100 * self.pipeline_efficiency:.1f}%")
        return "\n".join(lines)

    def headline(self, *, host: bool = False) -> str:
        """One line: copy hidden, GPU idle (for a CPU-mode trace, ``host=True``: the copy
        and compute threads' idle time), efficiency."""
        bound = (HOST_STAGE_WORDS.get(self.bound_stage, self.bound_stage)
                 if host and self.bound_stage else self.bound_stage)
        idle = "threads idle" if host else "GPU idle"
        return (f"copy hidden {self.copy_hidden_pct:.1f}% · {idle} "
                f"{100 * self.gpu_idle_fraction:.1f}% · efficiency {100 * self.efficiency:.1f}%"
                f" (bound {bound})")


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


def _per_item_times(spans: Iterable[Span]) -> dict[str, dict[int, float]]:
    """Per stage, each item's time in it (its spans there summed)."""
    per_item: dict[str, dict[int, float]] = {}
    for s in spans:
        items = per_item.setdefault(s.stage, {})
        items[s.item] = items.get(s.item, 0.0) + s.duration_s
    return per_item


def _bounds(busy: dict[str, float],
            medians: dict[str, float]) -> tuple[str | None, float, float]:
    """The busiest stage, its busy time (the max-stage bound) and that plus the fill and
    drain (the median item's time in every other stage: the pipeline bound)."""
    bound_stage = max(busy, key=lambda st: busy[st]) if busy else None
    bound = busy[bound_stage] if bound_stage else 0.0
    fill_drain = sum(medians[st] for st in busy if st != bound_stage)
    return bound_stage, bound, bound + fill_drain


class _Sweep:
    """The union of a stream of intervals that arrive roughly in time order.

    Merged intervals stay *open* (mergeable) until :meth:`collapse` is told no later
    interval will start before a time; then they are summed into ``closed_s`` and, for
    the compute stage, the gaps between them go into ``gaps``. An interval that arrives
    later anyway is clipped to the closed part's end.
    """

    __slots__ = ("closed_end", "closed_s", "gaps", "open")

    def __init__(self, gaps: QuantileSketch | None = None) -> None:
        self.closed_s = 0.0
        self.closed_end = -math.inf
        self.open: list[list[float]] = []
        self.gaps = gaps

    def add(self, start: float, end: float) -> None:
        start = max(start, self.closed_end)
        if end < start:
            return
        iv = self.open
        if not iv or start > iv[-1][1]:  # after every open interval (the usual case)
            iv.append([start, end])
            return
        if start >= iv[-1][0]:  # overlaps the last one only
            iv[-1][1] = max(iv[-1][1], end)
            return
        i = bisect.bisect_right(iv, start, key=lambda x: x[0])
        if i > 0 and iv[i - 1][1] >= start:
            i -= 1
            iv[i][1] = max(iv[i][1], end)
        else:
            iv.insert(i, [start, end])
        cur, j = iv[i], i + 1
        while j < len(iv) and iv[j][0] <= cur[1]:
            cur[1] = max(cur[1], iv[j][1])
            j += 1
        del iv[i + 1:j]

    def add_all(self, intervals: Iterable[Interval]) -> None:
        """Add intervals sorted by start (as :func:`union` returns them)."""
        for start, end in intervals:
            self.add(start, end)

    def collapse(self, watermark: float) -> None:
        k = 0
        for start, end in self.open:
            if end > watermark:
                break
            if self.gaps is not None and -math.inf < self.closed_end < start:
                self.gaps.add(start - self.closed_end)
            self.closed_s += end - start
            self.closed_end = end
            k += 1
        del self.open[:k]

    def merged(self, extra: Iterable[Interval]) -> list[Interval]:
        """The open intervals and ``extra`` (clipped to the closed part), merged."""
        cut = self.closed_end
        clipped = ((max(s, cut), e) for s, e in extra if e >= max(s, cut))
        return union(itertools.chain(((s, e) for s, e in self.open), clipped))

    def copy(self) -> _Sweep:
        other = _Sweep(self.gaps.copy() if self.gaps is not None else None)
        other.closed_s, other.closed_end = self.closed_s, self.closed_end
        other.open = [list(iv) for iv in self.open]
        return other


class FoldedSpans:
    """Whole-run overlap figures of the spans a bounded trace no longer keeps.

    A trace that keeps only its recent items' spans hands the older items' spans here
    (:meth:`fold`), then says from when on no folded span can start any more
    (:meth:`collapse`); :meth:`report` merges these running figures with the spans still
    kept into one :class:`OverlapReport` for the whole run. Memory stays bounded: interval
    unions keep only their open tail, and the medians the report needs (compute span
    length, each stage's time per item) and the starvation gaps are
    :class:`QuantileSketch` distributions.

    Unions, busy and hidden times, bytes, wall time and counts are exact as long as no
    span reaches the trace after the spans kept have moved past its start (a belt has only
    ``depth`` items in flight, far fewer than a trace keeps); medians and folded gap
    lengths are within the sketches' 1 %.
    """

    def __init__(self) -> None:
        self.n_spans = 0
        self.n_items = 0
        self.first_s = math.inf
        self.last_s = -math.inf
        self.nbytes: dict[str, int] = {}
        self._stages: dict[str, _Sweep] = {}
        self._copies = _Sweep()
        self._gpu = _Sweep()
        self._copies_compute = _Sweep()
        self._item_time: dict[str, QuantileSketch] = {}
        self._compute_spans = QuantileSketch()

    def fold(self, spans: Sequence[Span], items: int) -> None:
        """Take in the spans of ``items`` items leaving the trace (``items=0``: spans that
        arrived for items already folded)."""
        if not spans:
            return
        self.n_spans += len(spans)
        self.n_items += items
        self.first_s = min(self.first_s, min(s.start_s for s in spans))
        self.last_s = max(self.last_s, max(s.end_s for s in spans))
        for stage, times in _per_item_times(spans).items():
            self._item_time.setdefault(stage, QuantileSketch()).add_many(list(times.values()))
        by_stage: dict[str, list[Interval]] = {}
        for s in spans:
            by_stage.setdefault(s.stage, []).append((s.start_s, s.end_s))
            if s.nbytes:
                self.nbytes[s.stage] = self.nbytes.get(s.stage, 0) + s.nbytes
        self._compute_spans.add_many([end - start for start, end in by_stage.get("compute", ())])
        merged = {stage: union(intervals) for stage, intervals in by_stage.items()}
        for stage, intervals in merged.items():
            sweep = self._stages.get(stage)
            if sweep is None:
                sweep = self._stages[stage] = _Sweep(
                    QuantileSketch() if stage == "compute" else None)
            sweep.add_all(intervals)
        for sweep, stages in ((self._copies, COPY_STAGES), (self._gpu, GPU_STAGES),
                              (self._copies_compute, (*COPY_STAGES, "compute"))):
            sweep.add_all(union(iv for st in stages for iv in merged.get(st, ())))

    def collapse(self, watermark: float) -> None:
        """No span folded from now on starts before ``watermark``: sum what ends by then."""
        for sweep in (*self._stages.values(), self._copies, self._gpu, self._copies_compute):
            sweep.collapse(watermark)

    def copy(self) -> FoldedSpans:
        """An independent copy (a report taken while the trace goes on recording)."""
        other = FoldedSpans()
        other.n_spans, other.n_items = self.n_spans, self.n_items
        other.first_s, other.last_s = self.first_s, self.last_s
        other.nbytes = dict(self.nbytes)
        other._stages = {k: v.copy() for k, v in self._stages.items()}
        other._copies, other._gpu = self._copies.copy(), self._gpu.copy()
        other._copies_compute = self._copies_compute.copy()
        other._item_time = {k: v.copy() for k, v in self._item_time.items()}
        other._compute_spans = self._compute_spans.copy()
        return other

    def report(self, kept: Iterable[Span], *,
               gap_threshold_s: float | None = None) -> OverlapReport:
        """The whole run's :class:`OverlapReport`: these folded figures plus ``kept``."""
        kept = list(kept)
        first = min([self.first_s, *(s.start_s for s in kept)])
        last = max([self.last_s, *(s.end_s for s in kept)])
        wall = last - first
        by_stage: dict[str, list[Interval]] = {}
        for s in kept:
            by_stage.setdefault(s.stage, []).append((s.start_s, s.end_s))

        def busy_of(sweep: _Sweep, stages: Iterable[str]) -> tuple[float, list[Interval]]:
            merged = sweep.merged(iv for st in stages for iv in by_stage.get(st, []))
            return sweep.closed_s + total(merged), merged

        stages = stage_order({*self._stages, *by_stage})
        busy = {st: busy_of(self._stages.get(st) or _Sweep(), [st])[0] for st in stages}
        copy_busy = busy_of(self._copies, COPY_STAGES)[0]
        either = busy_of(self._copies_compute, [*COPY_STAGES, "compute"])[0]
        hidden = max(copy_busy + busy.get("compute", 0.0) - either, 0.0)
        gpu_busy = busy_of(self._gpu, GPU_STAGES)[0]

        if gap_threshold_s is None:
            durations = self._compute_spans.copy()
            for s, e in by_stage.get("compute", []):
                durations.add(e - s)
            median = durations.quantile(0.5) or 0.0
            gap_threshold_s = max(_DEFAULT_GAP_FRACTION * median, _DEFAULT_GAP_FLOOR_S)
        compute_sweep = self._stages.get("compute") or _Sweep()
        merged = compute_sweep.merged(by_stage.get("compute", []))
        between = [(a_end, b_start) for (_a, a_end), (b_start, _b) in itertools.pairwise(merged)]
        if merged and -math.inf < compute_sweep.closed_end < merged[0][0]:  # folded part's end
            between.insert(0, (compute_sweep.closed_end, merged[0][0]))
        gaps = [(a_end - first, b_start - a_end) for a_end, b_start in between
                if b_start - a_end >= gap_threshold_s]
        folded_gaps = (compute_sweep.gaps.at_least(gap_threshold_s)
                       if compute_sweep.gaps is not None else (0, 0.0))

        nbytes = dict(self.nbytes)
        for s in kept:
            nbytes[s.stage] = nbytes.get(s.stage, 0) + s.nbytes

        def gbps(stage: str) -> float | None:
            t = busy.get(stage, 0.0)
            return nbytes.get(stage, 0) / t / 1e9 if t > 0 else None

        medians: dict[str, float] = {}
        kept_times = _per_item_times(kept)
        for st in stages:
            sketch = self._item_time.get(st, QuantileSketch()).copy()
            for t in kept_times.get(st, {}).values():
                sketch.add(t)
            medians[st] = sketch.quantile(0.5) or 0.0
        bound_stage, bound, pipeline_bound = _bounds(busy, medians)
        return OverlapReport(
            wall_s=wall, stage_busy_s=busy, copy_busy_s=copy_busy, copy_hidden_s=hidden,
            copy_hidden_pct=100.0 * hidden / copy_busy if copy_busy > 0 else 0.0,
            gpu_busy_s=gpu_busy, gpu_idle_fraction=1.0 - gpu_busy / wall if wall > 0 else 0.0,
            starvation_gaps=gaps, gap_threshold_s=gap_threshold_s,
            h2d_bytes=nbytes.get("h2d", 0), d2h_bytes=nbytes.get("d2h", 0),
            h2d_gbps=gbps("h2d"), d2h_gbps=gbps("d2h"),
            max_stage_bound_s=bound, bound_stage=bound_stage,
            efficiency=bound / wall if wall > 0 else 0.0,
            n_spans=self.n_spans + len(kept),
            n_items=self.n_items + len({s.item for s in kept}),
            pipeline_bound_s=pipeline_bound,
            pipeline_efficiency=pipeline_bound / wall if wall > 0 else 0.0,
            folded_items=self.n_items, folded_spans=self.n_spans,
            folded_gaps=folded_gaps[0], folded_gaps_s=folded_gaps[1],
        )
