"""Traces: every stage of every item, timestamped on the host clock.

A pipeline records one :class:`~pyc_lab.profiling.spans.Span` per stage of each item
(``prepare`` on a CPU worker, ``h2d`` / ``compute`` / ``d2h`` on CUDA streams) into a
:class:`Trace`; so does :class:`~pyc_lab.profiling.activity.GpuActivity` for any block of
GPU work. A trace becomes a pandas frame (:meth:`Trace.to_frame`), a Chrome trace-event
JSON file that Perfetto and ``chrome://tracing`` open (:meth:`Trace.to_chrome`, one lane
per stream or thread), and overlap metrics (:meth:`Trace.overlap`, an
:class:`~pyc_lab.profiling.overlap.OverlapReport`).

A trace keeps every span unless it is given ``max_items``: then it keeps the spans of
the most recent items and folds older items' spans into running whole-run figures
(:class:`~pyc_lab.profiling.overlap.FoldedSpans`), so a belt that runs for hours holds a
bounded trace whose overlap report still covers the whole run.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import numbers
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PycLabError
from .nvtx import nvtx_range
from .overlap import FoldedSpans, OverlapReport
from .spans import Span, lane_order, stage_order

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["Trace"]

log = logging.getLogger(__name__)


class _Kept:
    """One kept item's spans and their earliest start."""

    __slots__ = ("first_s", "spans")

    def __init__(self, span: Span) -> None:
        self.spans = [span]
        self.first_s = span.start_s


def _check_max_items(max_items: object) -> int | None:
    if max_items is None:
        return None
    if (isinstance(max_items, bool) or not isinstance(max_items, numbers.Integral)
            or int(max_items) < 1):
        raise PycLabError(f"Trace max_items must be a whole number >= 1 (items whose spans "
                          f"are kept) or None to keep every span; got {max_items!r}")
    return int(max_items)


class Trace:
    """A thread-safe collection of :class:`Span`; what ``pipe.trace`` is.

    Parameters
    ----------
    spans
        Spans to start with.
    name
        A label used in titles (e.g. ``"pinned, 3 streams"``).
    max_items
        ``None`` (default): keep every span. A whole number: keep the spans of at least
        this many most recent items (in the order items first appear) and fold older
        items' spans into running figures, so memory stays bounded however long the run
        (as long as each item has a few spans, as a belt's have: one item's spans are
        kept or folded together).
        :meth:`overlap` still covers the whole run; :attr:`spans`, :meth:`to_frame`,
        :meth:`to_chrome` and timelines show the items kept, on the whole run's clock
        (:attr:`origin_s` is the first span's start, folded or not).
    """

    def __init__(self, spans: Iterable[Span] = (), *, name: str = "trace",
                 max_items: int | None = None):
        self.name = name
        self.max_items = _check_max_items(max_items)
        self._lock = threading.Lock()
        self._spans: list[Span] = []  # every span, when max_items is None
        # max_items set: each kept item's spans, oldest item first; the items folded
        # lately (a span arriving for one of them is folded at once); the folded figures
        self._ring: collections.OrderedDict[int, _Kept] = collections.OrderedDict()
        self._gone: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._kept = 0
        self._folded = FoldedSpans()
        self._batch = max(1, (self.max_items or 0) // 8)  # items folded at a time
        self.extend(spans)

    # -- recording ----------------------------------------------------------------------
    def add(self, span: Span) -> None:
        """Append one span (safe from any thread); a bounded trace may fold old items."""
        if not isinstance(span, Span):
            raise PycLabError(f"Trace.add takes a Span, not {type(span).__name__}")
        with self._lock:
            if self.max_items is None:
                self._spans.append(span)
            else:
                self._keep(span)

    def _keep(self, span: Span) -> None:
        """Ring bookkeeping of a bounded trace (the lock is held)."""
        kept = self._ring.get(span.item)
        if kept is not None:
            kept.spans.append(span)
            if span.start_s < kept.first_s:
                kept.first_s = span.start_s
            self._kept += 1
        elif span.item in self._gone:  # a late span of an item already folded
            self._folded.fold([span], items=0)
        else:
            self._ring[span.item] = _Kept(span)
            self._kept += 1
            assert self.max_items is not None
            if len(self._ring) >= self.max_items + self._batch:
                self._fold_oldest(len(self._ring) - self.max_items)

    def _fold_oldest(self, n: int) -> None:
        """Fold the ``n`` oldest items' spans; sum what no later span can overlap."""
        assert self.max_items is not None
        folded: list[Span] = []
        for _ in range(n):
            item, kept = self._ring.popitem(last=False)
            folded.extend(kept.spans)
            self._gone[item] = None
        while len(self._gone) > self.max_items + self._batch:
            self._gone.popitem(last=False)
        self._kept -= len(folded)
        self._folded.fold(folded, items=n)
        # spans still to be folded are kept now (or belong to newer items): none starts
        # before the earliest kept start
        self._folded.collapse(min(kept.first_s for kept in self._ring.values()))

    def _kept_spans(self) -> list[Span]:
        """The spans kept, in no particular order (the lock is held)."""
        if self.max_items is None:
            return list(self._spans)
        return [s for kept in self._ring.values() for s in kept.spans]

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
        """Forget every span, kept or folded."""
        with self._lock:
            self._spans.clear()
            self._ring.clear()
            self._gone.clear()
            self._kept = 0
            self._folded = FoldedSpans()

    # -- views --------------------------------------------------------------------------
    @property
    def spans(self) -> list[Span]:
        """A copy of the spans kept, sorted by start (then end, lane, item)."""
        with self._lock:
            spans = self._kept_spans()
        return sorted(spans, key=_start_order)

    def __len__(self) -> int:
        """How many spans are kept."""
        with self._lock:
            return len(self._spans) if self.max_items is None else self._kept

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans)

    @property
    def folded_items(self) -> int:
        """Items whose spans were folded into the whole-run figures (0: all are kept)."""
        with self._lock:
            return self._folded.n_items

    @property
    def folded_spans(self) -> int:
        """Spans folded into the whole-run figures instead of kept."""
        with self._lock:
            return self._folded.n_spans

    @property
    def origin_s(self) -> float:
        """The first span's start, folded ones included (0.0 for an empty trace); frames
        and JSON count from it."""
        with self._lock:
            first = min((s.start_s for s in self._kept_spans()), default=math.inf)
            first = min(first, self._folded.first_s)
        return first if math.isfinite(first) else 0.0

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

        A bounded trace's report covers the whole run: the folded items' running figures
        merged with the spans kept.

        Parameters
        ----------
        gap_threshold_s
            Compute-lane gaps at least this long count as starvation; by default the
            larger of 5 % of the median compute span and 10 µs.
        """
        with self._lock:  # the kept and folded parts as of one moment
            kept = self._kept_spans()
            folded = self._folded.copy() if self._folded.n_spans else None
        return OverlapReport.from_spans(sorted(kept, key=_start_order),
                                        gap_threshold_s=gap_threshold_s, folded=folded)

    def __repr__(self) -> str:
        spans = self.spans
        folded = self.folded_items
        more = f", {folded} earlier items folded" if folded else ""
        return (f"Trace({self.name!r}: {len(spans)} spans, "
                f"{len({s.item for s in spans})} items, "
                f"lanes {lane_order({s.lane for s in spans})}{more})")


def _start_order(s: Span) -> tuple[float, float, str, int, str]:
    return (s.start_s, s.end_s, s.lane, s.item, s.stage)


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
