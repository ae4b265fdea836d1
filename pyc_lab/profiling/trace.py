"""Traces: every stage of every item, timestamped on the host clock.

A pipeline records one :class:`~pyc_lab.profiling.spans.Span` per stage of each item
(``prepare`` on a CPU worker, ``h2d`` / ``compute`` / ``d2h`` on CUDA streams) into a
:class:`Trace`; so does :class:`~pyc_lab.profiling.activity.GpuActivity` for any block of
GPU work. A trace becomes a pandas frame (:meth:`Trace.to_frame`), a Chrome trace-event
JSON file that Perfetto and ``chrome://tracing`` open (:meth:`Trace.to_chrome`, one lane
per stream or thread), and overlap metrics (:meth:`Trace.overlap`, an
:class:`~pyc_lab.profiling.overlap.OverlapReport`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PycLabError
from .nvtx import nvtx_range
from .overlap import OverlapReport
from .spans import Span, lane_order, stage_order

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["Trace"]

log = logging.getLogger(__name__)


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
