"""A CPU worker pool with a bounded queue and per-task timing, used by the prepare stage.

:class:`Dispatcher` runs callables on a fixed set of daemon threads named
``pyc-<name>-<k>`` (traces use them as lanes). :meth:`Dispatcher.submit` blocks while the
queue is full, so a fast producer cannot pile up unbounded work. Every task's queue wait
(submit to start) and run time (start to end) are recorded; :meth:`Dispatcher.metrics`
summarises them as p50/p99 in milliseconds. The per-task records are a ring of the most
recent ``keep_records`` tasks; counts and percentiles cover every task, from running
counters and :class:`~pyc_lab.profiling.quantiles.QuantileSketch` distributions, so a pool
that runs millions of tasks stays bounded.

Every task :meth:`Dispatcher.submit` accepts runs, or its future is cancelled: a submit
racing :meth:`Dispatcher.close` either raises or lands ahead of the workers' stop markers.
"""

from __future__ import annotations

import collections
import logging
import numbers
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checks import check_whole
from ..errors import PycLabError
from ..profiling.quantiles import QuantileSketch

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["Dispatcher", "TaskRecord"]

log = logging.getLogger(__name__)

_STOP = object()

#: Per-task records a dispatcher keeps by default (older ones live on in the aggregates).
KEEP_RECORDS = 10_000


@dataclass(frozen=True)
class TaskRecord:
    """Timing of one finished task (host ``perf_counter`` seconds)."""

    task: int
    worker: int
    submitted_s: float
    started_s: float
    ended_s: float
    ok: bool

    @property
    def queue_wait_s(self) -> float:
        """Seconds between submit and the start of the run."""
        return self.started_s - self.submitted_s

    @property
    def run_s(self) -> float:
        """Seconds the task ran."""
        return self.ended_s - self.started_s


def _percentiles_ms(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    import numpy as np

    p50, p99 = np.percentile(np.asarray(values, dtype=float) * 1e3, [50, 99])
    return float(p50), float(p99)


def _sketch_ms(sketch: QuantileSketch) -> tuple[float | None, float | None]:
    p50, p99 = sketch.quantile(0.5), sketch.quantile(0.99)
    return (None if p50 is None else p50 * 1e3), (None if p99 is None else p99 * 1e3)


def _check_cpus(cpus: Any) -> None:
    """Raise unless ``cpus`` is ``None``, CPU ids, or a list of lists of CPU ids."""
    def listed(seq: Any) -> bool:
        return (isinstance(seq, Iterable) and not isinstance(seq, (str, bytes, Iterator)))

    def ids(seq: Any) -> bool:
        return listed(seq) and all(
            isinstance(c, numbers.Integral) and not isinstance(c, bool) and c >= 0
            for c in seq)

    if cpus is None or ids(cpus):
        return
    if listed(cpus) and all(ids(s) and len(list(s)) for s in cpus):
        return
    raise PycLabError(f"Dispatcher cpus must be None, a list of CPU ids (ints >= 0) or a "
                      f"list of such lists (one per worker), got {cpus!r}")


class Dispatcher:
    """A pool of CPU worker threads with a bounded queue and queue-wait/run-time metrics.

    Parameters
    ----------
    workers
        Number of threads; ``None`` means ``os.cpu_count()`` (at least 1).
    queue_size
        Most tasks waiting to start; :meth:`submit` blocks while that many wait.
    name
        Thread names are ``pyc-<name>-<k>`` for ``k`` in ``0 .. workers-1``.
    cpus
        Optional CPU affinity: a list of CPU ids that every worker is bound to, or a list
        of such lists, one per worker (used round-robin). Binding uses
        :func:`os.sched_setaffinity`; where that is missing or refused, the worker runs
        unbound and the reason is logged and kept in :attr:`affinity_errors`.
    keep_records
        How many finished tasks' :class:`TaskRecord` are kept (:meth:`records`,
        :meth:`to_frame`), ``None`` for all of them; :meth:`metrics` covers every task
        either way, exactly while no record was dropped, within 1 % after.

    Examples
    --------
    >>> with Dispatcher(workers=2) as d:
    ...     futures = [d.submit(pow, 2, k) for k in range(4)]
    ...     [f.result() for f in futures]
    [1, 2, 4, 8]
    """

    def __init__(
        self,
        workers: int | None = None,
        queue_size: int = 64,
        name: str = "prepare",
        *,
        cpus: Sequence[int] | Sequence[Sequence[int]] | None = None,
        keep_records: int | None = KEEP_RECORDS,
    ) -> None:
        n = (check_whole("Dispatcher", "workers", workers) if workers is not None
             else max(1, os.cpu_count() or 1))
        self.queue_size = check_whole("Dispatcher", "queue_size", queue_size)
        self.keep_records = (None if keep_records is None
                             else check_whole("Dispatcher", "keep_records", keep_records))
        if not isinstance(name, str) or not name:
            raise PycLabError(f"Dispatcher name must be a non-empty string (threads are "
                              f"named pyc-<name>-<k>), got {name!r}")
        _check_cpus(cpus)
        self.name = name
        self.workers = n
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=self.queue_size)
        self._lock = threading.Lock()
        self._no_submits = threading.Condition(self._lock)  # notified when _submitting is 0
        self._submitting = 0  # submit calls between their closed check and their put
        self._records: collections.deque[TaskRecord] = collections.deque(
            maxlen=self.keep_records)
        self._count = 0
        self._failed = 0
        self._queue_wait = QuantileSketch()
        self._run_time = QuantileSketch()
        self._next_task = 0
        self._closed = False
        self.affinity_errors: list[str] = []
        self._cpus = self._per_worker_cpus(cpus, n)
        self._threads = [
            threading.Thread(
                target=self._worker, args=(k,), name=f"pyc-{name}-{k}", daemon=True
            )
            for k in range(n)
        ]
        for t in self._threads:
            t.start()

    # -- setup ------------------------------------------------------------------
    @staticmethod
    def _per_worker_cpus(
        cpus: Sequence[int] | Sequence[Sequence[int]] | None, n: int
    ) -> list[list[int] | None]:
        if cpus is None or len(cpus) == 0:
            return [None] * n
        if all(isinstance(c, numbers.Integral) for c in cpus):
            flat = [int(c) for c in cpus]  # type: ignore[arg-type]
            return [flat] * n
        sets = [[int(c) for c in s] for s in cpus]  # type: ignore[union-attr]
        return [sets[k % len(sets)] for k in range(n)]

    def _bind(self, k: int) -> None:
        cpus = self._cpus[k]
        if not cpus:
            return
        setaff = getattr(os, "sched_setaffinity", None)
        if setaff is None:
            msg = f"worker {k}: os.sched_setaffinity is not available on this platform"
        else:
            try:
                setaff(0, cpus)  # 0 = the calling thread on Linux
                return
            except (OSError, ValueError) as exc:
                msg = f"worker {k}: could not bind to CPUs {cpus}: {exc}"
        log.info("Dispatcher %s: %s; running unbound", self.name, msg)
        with self._lock:
            self.affinity_errors.append(msg)

    # -- the worker loop ----------------------------------------------------------
    def _worker(self, k: int) -> None:
        self._bind(k)
        while True:
            entry = self._queue.get()
            if entry is _STOP:
                return
            task, fut, fn, args, kwargs, submitted = entry
            if not fut.set_running_or_notify_cancel():
                continue
            started = time.perf_counter()
            error: BaseException | None = None
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # a task's KeyboardInterrupt goes to its future
                error = exc
            ended = time.perf_counter()
            with self._lock:  # recorded before the future resolves: a caller who waited
                self._records.append(  # for it sees the task in the metrics
                    TaskRecord(task, k, submitted, started, ended, error is None))
                self._count += 1
                self._failed += error is not None
                self._queue_wait.add(started - submitted)
                self._run_time.add(ended - started)
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(error)
                del error

    # -- public API -----------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        """Queue ``fn(*args, **kwargs)``; block while the queue is full.

        Returns
        -------
        concurrent.futures.Future
            Resolves to the call's result or exception.

        Raises
        ------
        PycLabError
            If the dispatcher is closed (also when it is closed while this call waits).
        """
        fut: Future[Any] = Future()
        with self._lock:  # close() waits for every submit that got past this check
            if self._closed:
                raise PycLabError(f"Dispatcher {self.name!r} is closed; create a new one")
            task = self._next_task
            self._next_task += 1
            self._submitting += 1
        try:
            entry = (task, fut, fn, args, kwargs, time.perf_counter())
            while True:
                try:
                    self._queue.put(entry, timeout=0.05)
                    return fut
                except queue.Full:
                    if self._closed:
                        raise PycLabError(
                            f"Dispatcher {self.name!r} was closed while a submit waited"
                        ) from None
        finally:
            with self._lock:
                self._submitting -= 1
                if not self._submitting:
                    self._no_submits.notify_all()

    @property
    def thread_names(self) -> list[str]:
        """The worker threads' names, ``pyc-<name>-<k>``."""
        return [t.name for t in self._threads]

    @property
    def pending(self) -> int:
        """Tasks waiting to start (approximate)."""
        return self._queue.qsize()

    def records(self) -> list[TaskRecord]:
        """Timing of the most recent finished tasks (``keep_records`` of them at most), in
        finishing order."""
        with self._lock:
            return list(self._records)

    def reset_metrics(self) -> None:
        """Forget finished tasks, records and aggregates (start a new batch's metrics)."""
        with self._lock:
            self._records.clear()
            self._count = self._failed = 0
            self._queue_wait = QuantileSketch()
            self._run_time = QuantileSketch()

    def metrics(self) -> dict[str, Any]:
        """Summary of every finished task since the start (or :meth:`reset_metrics`).

        Percentiles are exact (NumPy's) while every task's record is kept, and within 1 %
        (:class:`~pyc_lab.profiling.quantiles.QuantileSketch`) once older records were
        dropped.

        Returns
        -------
        dict
            ``count``, ``failed``, ``workers``, ``queue_wait_p50_ms``, ``queue_wait_p99_ms``,
            ``run_p50_ms``, ``run_p99_ms`` (``None`` when no task has finished).
        """
        with self._lock:
            recs = list(self._records)
            count, failed = self._count, self._failed
            sketches = (None if count == len(recs)
                        else (self._queue_wait.copy(), self._run_time.copy()))
        if sketches is None:
            qw50, qw99 = _percentiles_ms([r.queue_wait_s for r in recs])
            run50, run99 = _percentiles_ms([r.run_s for r in recs])
        else:
            (qw50, qw99), (run50, run99) = _sketch_ms(sketches[0]), _sketch_ms(sketches[1])
        return {
            "name": self.name,
            "workers": self.workers,
            "count": count,
            "failed": failed,
            "queue_wait_p50_ms": qw50,
            "queue_wait_p99_ms": qw99,
            "run_p50_ms": run50,
            "run_p99_ms": run99,
        }

    def to_frame(self) -> pd.DataFrame:
        """One row per kept task record: worker, queue wait and run time in ms, ok."""
        import pandas as pd

        rows = [
            {
                "task": r.task,
                "worker": f"pyc-{self.name}-{r.worker}",
                "queue_wait_ms": r.queue_wait_s * 1e3,
                "run_ms": r.run_s * 1e3,
                "ok": r.ok,
            }
            for r in sorted(self.records(), key=lambda r: r.task)
        ]
        cols = ["task", "worker", "queue_wait_ms", "run_ms", "ok"]
        return pd.DataFrame(rows, columns=cols).set_index("task")

    def close(self, wait: bool = True, *, cancel_pending: bool = False) -> None:
        """Stop accepting tasks and stop the workers once the queue is drained.

        Submits that were already past their closed check finish first (their tasks are
        queued ahead of the workers' stop markers, or their submit raises), so every
        accepted task runs or is cancelled.

        Parameters
        ----------
        wait
            Join the worker threads (they finish their current and queued tasks first).
            With ``False`` the daemon threads end on their own; a hung task cannot block
            the caller.
        cancel_pending
            Cancel tasks that have not started instead of running them.
        """
        with self._lock:
            already = self._closed
            self._closed = True
        if cancel_pending:
            self._cancel_queued()
        if not already:
            if wait:
                self._stop_workers(cancel_pending)
            else:
                threading.Thread(target=self._stop_workers, args=(cancel_pending,),
                                 name=f"pyc_lab {self.name} close", daemon=True).start()
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()

    def _stop_workers(self, cancel_pending: bool) -> None:
        """Once no submit is between its check and its put, queue one stop per worker."""
        with self._lock:
            while self._submitting:
                self._no_submits.wait()
        if cancel_pending:  # what those last submits queued
            self._cancel_queued()
        for _ in self._threads:
            self._queue.put(_STOP)

    def _cancel_queued(self) -> None:
        """Cancel every queued task (its waiters are woken); stop markers taken out on the
        way go back in."""
        stops = 0
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                break
            if entry is _STOP:
                stops += 1
            elif entry[1].cancel():  # and tell waiters (concurrent.futures.wait, as_completed)
                entry[1].set_running_or_notify_cancel()
        for _ in range(stops):
            self._queue.put(_STOP)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(wait=True, cancel_pending=exc[0] is not None)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Dispatcher({self.name!r}, workers={self.workers}, {state})"
