"""What a server measured, in structures whose size never grows with the run.

Per model: end-to-end latency, queue wait and compute time as
:class:`~pyc_lab.profiling.quantiles.QuantileSketch` (bounded by the values' range, not
their number), a batch-size histogram (one counter per size up to ``max_batch``), a
latency histogram over fixed bucket bounds (what Prometheus scrapes), counters, and a
ring of the most recent latencies for live views. Observers (the load test) get every
finished batch's records as they happen.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..profiling.quantiles import QuantileSketch

__all__ = ["LATENCY_BUCKETS_S", "BatchRecord", "ModelStats"]

#: Upper bounds (seconds) of the latency histogram's buckets; the last is +inf.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, float("inf"))
_BOUNDS = np.asarray(LATENCY_BUCKETS_S)
_VECTOR_FROM = 8  # requests in a record from which counting them in NumPy is cheaper


class BatchRecord(NamedTuple):
    """The requests of one finished batch, as arrays (a batcher makes one per batch: the
    per-request bookkeeping of a busy server is a few NumPy calls, not a Python loop).

    Attributes
    ----------
    queue_s
        Per request: submit to the start of its batch.
    compute_s
        The batch's run (stacking, padding, the model, splitting), shared by its requests.
    latency_s
        Per request: submit to its result being set.
    batch_rows
        Rows in the batch before padding.
    bucket
        The batch size the model ran at (after padding).
    ok
        Whether the requests succeeded (a failed request is a record of its own).
    """

    queue_s: np.ndarray
    compute_s: float
    latency_s: np.ndarray
    batch_rows: int
    bucket: int
    ok: bool = True

    @property
    def requests(self) -> int:
        """How many requests the record holds."""
        return len(self.latency_s)


class ModelStats:
    """Counters and distributions of one served model, in fixed-size structures.

    Parameters
    ----------
    max_batch
        The largest batch (the batch histogram's size).
    recent
        How many recent latencies the ring keeps for live views.
    """

    def __init__(self, max_batch: int, recent: int = 4096) -> None:
        self._lock = threading.Lock()
        self.max_batch = int(max_batch)
        self.started = time.monotonic()
        self.latency = QuantileSketch()
        self.queue = QuantileSketch()
        self.compute = QuantileSketch()
        self.batch_sizes = np.zeros(self.max_batch + 1, dtype=np.int64)
        self.latency_buckets = np.zeros(len(LATENCY_BUCKETS_S), dtype=np.int64)
        self.recent: deque[float] = deque(maxlen=int(recent))
        self.requests = 0
        self.rows = 0
        self.batches = 0
        self.padded_rows = 0
        self.failed = 0
        self.rejected = 0
        self.timed_out = 0
        self.latency_sum = 0.0
        self._observers: list[Callable[[BatchRecord], None]] = []

    # -- recording -----------------------------------------------------------------------------
    def record_batch(self, record: BatchRecord) -> None:
        """Count one batch (its rows, run at size ``record.bucket``) and its requests."""
        with self._lock:
            self.batches += 1
            self.rows += record.batch_rows
            self.padded_rows += record.bucket - record.batch_rows
            self.batch_sizes[min(record.batch_rows, self.max_batch)] += 1
            self._record(record)
            observers = list(self._observers)
        for fn in observers:
            fn(record)

    def _record(self, r: BatchRecord) -> None:
        n = r.requests
        self.requests += n
        if not r.ok:
            self.failed += n
        self.compute.add(r.compute_s, n)  # one batch, one compute time, once per request
        if n < _VECTOR_FROM:  # a small batch: NumPy's per-call cost would dominate
            buckets = self.latency_buckets
            for lat, queued in zip(r.latency_s.tolist(), r.queue_s.tolist(), strict=True):
                self.latency.add(lat)
                self.queue.add(queued)
                self.latency_sum += lat
                buckets[bisect.bisect_left(LATENCY_BUCKETS_S, lat)] += 1
                self.recent.append(lat)
            return
        latency = r.latency_s.tolist()  # the sketches buffer Python floats
        self.latency.add_many(latency)
        self.queue.add_many(r.queue_s.tolist())
        self.latency_sum += sum(latency)
        self.latency_buckets += np.bincount(
            np.searchsorted(_BOUNDS, r.latency_s, side="left"),
            minlength=len(LATENCY_BUCKETS_S))
        self.recent.extend(latency)

    def record_failed(self, record: BatchRecord) -> None:
        """Count requests whose run raised (outside any batch's counts)."""
        with self._lock:
            self._record(record)
            observers = list(self._observers)
        for fn in observers:
            fn(record)

    def count(self, what: str) -> None:
        """Count a request refused before it ran: ``"rejected"`` (bad or queue full) or
        ``"timed_out"``."""
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def observe(self, fn: Callable[[BatchRecord], None]) -> Callable[[], None]:
        """Call ``fn(record)`` after every batch (and every failed request); returns a
        function that stops it."""
        with self._lock:
            self._observers.append(fn)

        def stop() -> None:
            with self._lock:
                if fn in self._observers:
                    self._observers.remove(fn)

        return stop

    # -- reading -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Counters, percentiles (ms) and the mean batch size, now."""
        with self._lock:
            def ms(sketch: QuantileSketch, q: float) -> float | None:
                v = sketch.quantile(q)
                return None if v is None else v * 1e3

            sizes = self.batch_sizes
            n = int(sizes.sum())
            mean_batch = float((sizes * np.arange(len(sizes))).sum() / n) if n else None
            return {
                "requests": self.requests, "rows": self.rows, "batches": self.batches,
                "failed": self.failed, "rejected": self.rejected, "timed_out": self.timed_out,
                "padded_rows": self.padded_rows, "mean_batch": mean_batch,
                "p50_ms": ms(self.latency, 0.5), "p90_ms": ms(self.latency, 0.9),
                "p99_ms": ms(self.latency, 0.99),
                "queue_p50_ms": ms(self.queue, 0.5), "compute_p50_ms": ms(self.compute, 0.5),
                "uptime_s": time.monotonic() - self.started,
            }

    def batch_histogram(self) -> dict[int, int]:
        """Batch size -> batches run at that size (sizes seen only)."""
        with self._lock:
            return {int(k): int(v) for k, v in enumerate(self.batch_sizes) if v}

    def recent_latencies(self) -> np.ndarray:
        """The ring of recent latencies (seconds), oldest first."""
        with self._lock:
            return np.fromiter(self.recent, dtype=np.float64, count=len(self.recent))

    def footprint(self) -> dict[str, int]:
        """Sizes of every structure (entries): constant over a long run once warm."""
        with self._lock:
            return {"latency_bins": len(self.latency._bins), "queue_bins": len(self.queue._bins),
                    "compute_bins": len(self.compute._bins),
                    "batch_sizes": len(self.batch_sizes),
                    "latency_buckets": len(self.latency_buckets), "recent": len(self.recent),
                    "observers": len(self._observers)}
