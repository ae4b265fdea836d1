"""A CPU worker pool with a bounded queue and per-task timing, used by the prepare stage.

:class:`Dispatcher` runs callables on a fixed set of daemon threads named
``pyc-<name>-<k>`` (traces use them as lanes). :meth:`Dispatcher.submit` blocks while the
queue is full, so a fast producer cannot pile up unbounded work. Every task's queue wait
(submit to start) and run time (start to end) are recorded; :meth:`Dispatcher.metrics`
summarises them as p50/p99 in milliseconds.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import PycLabError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["Dispatcher", "TaskRecord"]

log = logging.getLogger(__name__)

_STOP = object()


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
    ) -> None:
        n = int(workers) if workers is not None else max(1, os.cpu_count() or 1)
        if n < 1:
            raise PycLabError(f"Dispatcher needs at least 1 worker, got workers={workers!r}")
        if int(queue_size) < 1:
            raise PycLabError(f"Dispatcher queue_size must be >= 1, got {queue_size!r}")
        self.name = name
        self.workers = n
        self.queue_size = int(queue_size)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=self.queue_size)
        self._lock = threading.Lock()
        self._records: list[TaskRecord] = []
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
        if all(isinstance(c, int) for c in cpus):
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
        with self._lock:
            if self._closed:
                raise PycLabError(f"Dispatcher {self.name!r} is closed; create a new one")
            task = self._next_task
            self._next_task += 1
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

    @property
    def thread_names(self) -> list[str]:
        """The worker threads' names, ``pyc-<name>-<k>``."""
        return [t.name for t in self._threads]

    @property
    def pending(self) -> int:
        """Tasks waiting to start (approximate)."""
        return self._queue.qsize()

    def records(self) -> list[TaskRecord]:
        """Timing of every finished task, in finishing order."""
        with self._lock:
            return list(self._records)

    def reset_metrics(self) -> None:
        """Forget the records of finished tasks (start a new batch's metrics)."""
        with self._lock:
            self._records.clear()

    def metrics(self) -> dict[str, Any]:
        """Summary of finished tasks.

        Returns
        -------
        dict
            ``count``, ``failed``, ``workers``, ``queue_wait_p50_ms``, ``queue_wait_p99_ms``,
            ``run_p50_ms``, ``run_p99_ms`` (``None`` when no task has finished).
        """
        recs = self.records()
        qw50, qw99 = _percentiles_ms([r.queue_wait_s for r in recs])
        run50, run99 = _percentiles_ms([r.run_s for r in recs])
        return {
            "name": self.name,
            "workers": self.workers,
            "count": len(recs),
            "failed": sum(not r.ok for r in recs),
            "queue_wait_p50_ms": qw50,
            "queue_wait_p99_ms": qw99,
            "run_p50_ms": run50,
            "run_p99_ms": run99,
        }

    def to_frame(self) -> pd.DataFrame:
        """One row per finished task: worker, queue wait and run time in ms, ok."""
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
            while True:
                try:
                    entry = self._queue.get_nowait()
                except queue.Empty:
                    break
                if entry is not _STOP:
                    entry[1].cancel()
        if not already:
            for _ in self._threads:
                if wait:
                    self._queue.put(_STOP)
                else:
                    threading.Thread(
                        target=self._queue.put, args=(_STOP,), daemon=True
                    ).start()
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()

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
