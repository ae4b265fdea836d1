"""Traces: every stage of every item, timestamped on the host clock.

A pipeline records one :class:`Span` per stage of each item (``prepare`` on a CPU
worker, ``h2d`` / ``compute`` / ``d2h`` on CUDA streams) into a :class:`Trace`. GPU
spans are measured with CUDA events and mapped onto the host's ``time.perf_counter``
clock by :class:`CudaEventClock`, so CPU and GPU spans share one time axis.

A trace becomes a pandas frame (:meth:`Trace.to_frame`), a Chrome trace-event JSON file
that Perfetto and ``chrome://tracing`` open (:meth:`Trace.to_chrome`, one lane per
stream or thread), and overlap metrics (:meth:`Trace.overlap`): how much copy time hides
behind compute (the Holistic Trace Analysis overlap formula applied to copies), the GPU
idle fraction, compute starvation gaps, achieved copy bandwidths, and the max-stage
bound against the actual wall time. :func:`nvtx_range` marks the same stages for Nsight
Systems when an NVTX binding is importable.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import math
import re
import statistics
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PycLabError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "COPY_STAGES",
    "GPU_STAGES",
    "STAGES",
    "CudaEventClock",
    "OverlapReport",
    "Span",
    "Trace",
    "lane_order",
    "nvtx_range",
    "stage_order",
]

log = logging.getLogger(__name__)

#: The pipeline's stages, in pipeline order; other stage names are allowed.
STAGES: tuple[str, ...] = ("prepare", "h2d", "compute", "d2h")
#: Stages that run on the GPU (copy engines or SMs).
GPU_STAGES: frozenset[str] = frozenset({"h2d", "compute", "d2h"})
#: Stages that are host<->device copies.
COPY_STAGES: frozenset[str] = frozenset({"h2d", "d2h"})

_DEFAULT_GAP_FRACTION = 0.05
_DEFAULT_GAP_FLOOR_S = 10e-6

Interval = tuple[float, float]


# -- spans and traces ----------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    """One stage of one item: ``[start_s, end_s]`` on the host ``perf_counter`` clock.

    Parameters
    ----------
    item
        The item's index in the pipeline's input.
    stage
        ``"prepare"``, ``"h2d"``, ``"compute"``, ``"d2h"`` (others allowed).
    lane
        Where it ran: ``"cpu-worker-0"``, ``"stream h2d"``, ``"stream compute"``, ...
    start_s, end_s
        Start and end in seconds (``time.perf_counter`` clock); ``end_s >= start_s``.
    nbytes
        Bytes moved (copies) or processed, 0 when not meaningful.
    meta
        Free-form details shown in hovers and in the Chrome trace's ``args``.
    """

    item: int
    stage: str
    lane: str
    start_s: float
    end_s: float
    nbytes: int = 0
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and math.isfinite(self.end_s)):
            raise PycLabError(f"span {self.stage!r} of item {self.item} has a non-finite time")
        if self.end_s < self.start_s:
            raise PycLabError(
                f"span {self.stage!r} of item {self.item} ends before it starts "
                f"({self.start_s} > {self.end_s}); check the clock mapping"
            )
        if self.nbytes < 0:
            raise PycLabError(f"span {self.stage!r} of item {self.item} has negative nbytes")

    @property
    def duration_s(self) -> float:
        """``end_s - start_s``."""
        return self.end_s - self.start_s


class Trace:
    """A thread-safe collection of :class:`Span`; what ``pipe.trace`` is.

    Parameters
    ----------
    spans
        Spans to start with.
    name
        A label used in titles (e.g. ``"pinned, 3 streams"``).
    """

    def __init__(self, spans: Iterable[Span] = (), *, name: str = "trace"):
        self.name = name
        self._lock = threading.Lock()
        self._spans: list[Span] = list(spans)

    # -- recording ----------------------------------------------------------------------
    def add(self, span: Span) -> None:
        """Append one span (safe from any thread)."""
        if not isinstance(span, Span):
            raise PycLabError(f"Trace.add takes a Span, not {type(span).__name__}")
        with self._lock:
            self._spans.append(span)

    def record(self, item: int, stage: str, lane: str, start_s: float, end_s: float,
               nbytes: int = 0, **meta: Any) -> Span:
        """Build a :class:`Span` from the arguments, add it, and return it."""
        span = Span(int(item), str(stage), str(lane), float(start_s), float(end_s),
                    int(nbytes), dict(meta))
        self.add(span)
        return span

    @contextlib.contextmanager
    def span(self, item: int, stage: str, lane: str, nbytes: int = 0,
             **meta: Any) -> Iterator[None]:
        """Time a host-side block with ``perf_counter``, inside an NVTX range, and record it.

        Examples
        --------
        >>> trace = Trace()
        >>> with trace.span(0, "prepare", "cpu-worker-0"):
        ...     pass
        >>> len(trace)
        1
        """
        with nvtx_range(f"{stage} {item}"):
            start = time.perf_counter()
            try:
                yield
            finally:
                self.record(item, stage, lane, start, time.perf_counter(), nbytes, **meta)

    def extend(self, spans: Iterable[Span]) -> None:
        """Add several spans."""
        for span in spans:
            self.add(span)

    def clear(self) -> None:
        """Forget every span."""
        with self._lock:
            self._spans.clear()

    # -- views --------------------------------------------------------------------------
    @property
    def spans(self) -> list[Span]:
        """A copy of the spans, sorted by start (then end, lane, item)."""
        with self._lock:
            spans = list(self._spans)
        return sorted(spans, key=lambda s: (s.start_s, s.end_s, s.lane, s.item, s.stage))

    def __len__(self) -> int:
        with self._lock:
            return len(self._spans)

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans)

    @property
    def origin_s(self) -> float:
        """The first span's start (0.0 for an empty trace); frames and JSON count from it."""
        with self._lock:
            return min((s.start_s for s in self._spans), default=0.0)

    @property
    def lanes(self) -> list[str]:
        """The lanes used, in display order (see :func:`lane_order`)."""
        return lane_order({s.lane for s in self.spans})

    @property
    def stages(self) -> list[str]:
        """The stages used, in pipeline order (see :func:`stage_order`)."""
        return stage_order({s.stage for s in self.spans})

    def to_frame(self) -> pd.DataFrame:
        """One row per span, times in milliseconds from the first span's start.

        Returns
        -------
        pandas.DataFrame
            Columns ``item, stage, lane, start_ms, end_ms, duration_ms, nbytes, label``
            (``label``: the span's ``name`` meta, e.g. a kernel's name; empty if none),
            sorted by start.
        """
        import pandas as pd

        spans, origin = self.spans, self.origin_s
        rows = [{
            "item": s.item, "stage": s.stage, "lane": s.lane,
            "start_ms": (s.start_s - origin) * 1e3, "end_ms": (s.end_s - origin) * 1e3,
            "duration_ms": s.duration_s * 1e3, "nbytes": s.nbytes,
            "label": str(s.meta.get("name", "")),
        } for s in spans]
        columns = ["item", "stage", "lane", "start_ms", "end_ms", "duration_ms", "nbytes",
                   "label"]
        frame = pd.DataFrame(rows, columns=columns)
        return frame.astype({"item": "int64", "nbytes": "int64", "start_ms": "float64",
                             "end_ms": "float64", "duration_ms": "float64"})

    def to_chrome(self, path: str | Path | None = None) -> dict[str, Any]:
        """The trace in Chrome's trace-event format (opens in Perfetto / chrome://tracing).

        Each span is a complete event (``"ph": "X"``) with ``ts``/``dur`` in microseconds
        from the first span's start; each lane is a thread (``tid``) named by a
        ``thread_name`` metadata event, ordered CPU workers first, then streams.

        Parameters
        ----------
        path
            Where to write the JSON; nothing is written when ``None``.

        Returns
        -------
        dict
            ``{"traceEvents": [...], "displayTimeUnit": "ms"}``.
        """
        spans, origin = self.spans, self.origin_s
        tids = {lane: k + 1 for k, lane in enumerate(lane_order({s.lane for s in spans}))}
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
             "args": {"name": f"pyc_lab {self.name}"}},
        ]
        for lane, tid in tids.items():
            events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid,
                           "args": {"name": lane}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": tid,
                           "args": {"sort_index": tid}})
        for s in spans:
            args: dict[str, Any] = {"item": s.item, "bytes": s.nbytes}
            args.update({str(k): _json_safe(v) for k, v in s.meta.items()})
            events.append({
                "name": s.stage, "cat": "pyc_lab", "ph": "X",
                "ts": round((s.start_s - origin) * 1e6, 3),
                "dur": round(s.duration_s * 1e6, 3),
                "pid": 1, "tid": tids[s.lane], "args": args,
            })
        doc = {"traceEvents": events, "displayTimeUnit": "ms"}
        if path is not None:
            target = Path(path)
            target.write_text(json.dumps(doc, allow_nan=False), encoding="utf-8")
            log.info("wrote %d trace events to %s", len(events), target)
        return doc

    def overlap(self, *, gap_threshold_s: float | None = None) -> OverlapReport:
        """Overlap metrics of this trace; see :class:`OverlapReport`.

        Parameters
        ----------
        gap_threshold_s
            Compute-lane gaps at least this long count as starvation; by default the
            larger of 5 % of the median compute span and 10 µs.
        """
        return OverlapReport.from_spans(self.spans, gap_threshold_s=gap_threshold_s)

    def __repr__(self) -> str:
        return (f"Trace({self.name!r}: {len(self)} spans, "
                f"{len({s.item for s in self.spans})} items, lanes {self.lanes})")


# -- overlap metrics ------------------------------------------------------------------------
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


# -- interval arithmetic --------------------------------------------------------------------
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


# -- ordering -------------------------------------------------------------------------------
def stage_order(stages: Iterable[str]) -> list[str]:
    """Known stages in pipeline order, then any others alphabetically."""
    known = {name: k for k, name in enumerate(STAGES)}
    return sorted(set(stages), key=lambda st: (known.get(st, len(known)), st))


def lane_order(lanes: Iterable[str]) -> list[str]:
    """CPU workers/threads first (natural order), then streams (h2d, compute, d2h, others).

    Examples
    --------
    >>> lane_order(["stream d2h", "cpu-worker-10", "stream h2d", "cpu-worker-2"])
    ['cpu-worker-2', 'cpu-worker-10', 'stream h2d', 'stream d2h']
    """
    def key(lane: str) -> tuple[Any, ...]:
        is_stream = "stream" in lane.lower()
        stage = next((k for k, st in enumerate(STAGES) if st in lane.lower()), len(STAGES))
        natural = tuple((0, int(tok), "") if tok.isdigit() else (1, 0, tok)
                        for tok in re.findall(r"\d+|\D+", lane))
        return (is_stream, stage if is_stream else 0, natural)

    return sorted(set(lanes), key=key)


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return str(value)


# -- GPU clock mapping and NVTX -------------------------------------------------------------
class CudaEventClock:
    """Map CUDA events onto the host ``perf_counter`` clock (GPU only).

    At creation the device is synchronised and a reference event is recorded on the idle
    device, the host clock read just before (see :meth:`resync`); an event's host time is
    then ``ref_host_s + elapsed(ref_event, event)``. Call :meth:`resync` on long runs, since
    the GPU and host clocks drift apart slowly.

    Parameters
    ----------
    cupy
        The CuPy module; imported (and checked for a device) when omitted.
    """

    def __init__(self, cupy: Any = None):
        if cupy is None:
            from ..hardware.device import require_cupy

            cupy = require_cupy("CudaEventClock")
        self._cp = cupy
        self.ref_event: Any = None
        self.ref_host_s = 0.0
        self.uncertainty_s = 0.0
        self.resync()

    def resync(self, tries: int = 5) -> None:
        """Synchronise the device, then record reference events on the idle device and
        read the host clock around each; keep the tightest bracket.

        An idle device completes the event within microseconds of the record call, but
        the host may notice it much later (the wake-up from the synchronise), so the host
        time is taken *before* the record and the bracket with the least slack wins:
        :attr:`uncertainty_s` is its width.
        """
        cp = self._cp
        cp.cuda.Device().synchronize()
        best: tuple[float, float, Any] | None = None
        for _ in range(max(1, tries)):
            ref = cp.cuda.Event()
            before = time.perf_counter()
            ref.record()
            ref.synchronize()
            width = time.perf_counter() - before
            if best is None or width < best[0]:
                best = (width, before, ref)
        assert best is not None
        self.uncertainty_s, self.ref_host_s, self.ref_event = best

    def event(self, stream: Any = None) -> Any:
        """Record and return a new timing event on ``stream`` (the current one if None)."""
        ev = self._cp.cuda.Event()
        ev.record(stream)
        return ev

    def to_host(self, event: Any) -> float:
        """The host ``perf_counter`` time of a completed ``event``, in seconds."""
        event.synchronize()
        elapsed_ms = self._cp.cuda.get_elapsed_time(self.ref_event, event)
        return self.ref_host_s + float(elapsed_ms) / 1e3

    def record_span(self, trace: Trace, item: int, stage: str, lane: str, start_event: Any,
                    end_event: Any, nbytes: int = 0, **meta: Any) -> Span:
        """Convert an event pair to host times and record it into ``trace``."""
        return trace.record(item, stage, lane, self.to_host(start_event),
                            self.to_host(end_event), nbytes, **meta)


@functools.lru_cache(maxsize=1)
def _nvtx_backend() -> tuple[str, Any]:
    """``("nvtx", module)``, ``("cupy", cupy.cuda.nvtx)`` or ``("none", None)``."""
    try:
        import nvtx

        return "nvtx", nvtx
    except Exception:  # missing, or a broken install: fall through
        pass
    try:
        from ..hardware.device import cupy_status

        cp, _reason = cupy_status()
        if cp is not None:
            return "cupy", cp.cuda.nvtx
    except Exception as exc:
        log.debug("no NVTX through CuPy: %s", exc)
    return "none", None


@contextlib.contextmanager
def nvtx_range(name: str, *, domain: str = "pyc_lab") -> Iterator[None]:
    """An NVTX range around the block so that Nsight Systems shows it; never raises.

    Uses the ``nvtx`` package when importable, else ``cupy.cuda.nvtx`` when CuPy has a
    device, else does nothing. Errors from the NVTX binding itself are logged and
    swallowed; errors from the block propagate unchanged.
    """
    kind, mod = _nvtx_backend()
    pushed = False
    try:
        if kind == "nvtx":
            mod.push_range(message=name, domain=domain)
            pushed = True
        elif kind == "cupy":
            mod.RangePush(name)
            pushed = True
    except Exception as exc:
        log.debug("NVTX push failed for %r: %s", name, exc)
    try:
        yield
    finally:
        if pushed:
            try:
                if kind == "nvtx":
                    mod.pop_range(domain=domain)
                else:
                    mod.RangePop()
            except Exception as exc:
                log.debug("NVTX pop failed for %r: %s", name, exc)
