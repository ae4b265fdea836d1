"""What the belt tracks while it runs: items' slots and jobs, runs and their crews of lanes.

These are plain state holders shared by :class:`~pyc_lab.runtime.pipeline.Pipeline` (which
moves items from stage to stage) and the lanes that run the stages
(:mod:`~pyc_lab.runtime.host_lanes`, :mod:`~pyc_lab.runtime.cuda_lanes`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .dispatcher import Dispatcher
    from .pinned import PinnedBuffer, PinnedPool

__all__ = ["Crew", "Job", "Lane", "Run", "Slot", "Spec"]

log = logging.getLogger(__name__)

#: The prepared arrays' (shape, dtype) pairs.
Spec = list[tuple[tuple[int, ...], np.dtype]]

_STOP = object()


class Lane:
    """One daemon thread running queued callables in order (a CPU stand-in for a stream).

    ``init`` runs first on the thread (the CUDA lanes make their device current there).
    Once :meth:`stop` was called the lane refuses new work (:meth:`submit` returns
    ``False``), so nothing is ever queued behind the stop marker and silently dropped.
    """

    def __init__(self, name: str, init: Callable[[], None] | None = None) -> None:
        self.name = name
        self._q: queue.Queue[Any] = queue.Queue()
        self._init = init
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        if self._init is not None:
            try:
                self._init()
            except Exception as exc:  # pragma: no cover - GPU setup failure
                log.error("lane %s: setup failed: %s", self.name, exc)
        while True:
            fn = self._q.get()
            if fn is _STOP:
                return
            fn()

    def submit(self, fn: Callable[[], None]) -> bool:
        """Queue ``fn``; ``False`` (and ``fn`` never runs) when the lane was stopped."""
        with self._lock:  # stop() takes the same lock: fn lands before the marker or not
            if self._stopped:
                return False
            self._q.put(fn)
            return True

    def stop(self) -> None:
        """Let the thread end once what was queued before has run; refuse new work."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._q.put(_STOP)

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopped


class Crew:
    """A run's lanes (one thread per stage lane), CUDA streams and event clock.

    A belt whose run ended cleanly hands its crew to the next run, so a loader reused
    epoch after epoch starts its threads and streams once. The streams and clock are
    empty / ``None`` on host lanes.
    """

    def __init__(self, lanes: dict[str, Lane], streams: dict[str, Any] | None = None,
                 clock: Any = None) -> None:
        self.lanes = lanes
        self.streams: dict[str, Any] = streams if streams is not None else {}
        self.clock = clock  # a CudaEventClock on CUDA lanes, when one could be made

    def stop(self) -> None:
        """Stop every lane thread (each ends after the work queued before)."""
        for lane in self.lanes.values():
            lane.stop()


class Slot:
    """Buffers one in-flight item owns: host inputs, device inputs, host outputs."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.host: list[PinnedBuffer] = []
        self.host_views: list[np.ndarray] = []
        self.dev: list[Any] = []
        self.out: list[PinnedBuffer] = []

    def buffers(self) -> list[PinnedBuffer]:
        return [*self.host, *self.out]

    def alloc_host(self, pool: PinnedPool, spec: Sequence[tuple[tuple[int, ...], np.dtype]]
                   ) -> None:
        """Take one host input buffer per ``(shape, dtype)`` from ``pool``, with its view."""
        for shape, dtype in spec:
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            buf = pool.acquire(max(nbytes, 1))
            self.host.append(buf)
            self.host_views.append(buf.array(dtype, shape))

    def dev_fits(self, src: Sequence[Any]) -> bool:
        """Whether the device input buffers have ``src``'s shapes and dtypes (reusable)."""
        return bool(self.dev) and [(d.shape, d.dtype) for d in self.dev] == [
            (v.shape, v.dtype) for v in src]

    def out_views(self, pool: PinnedPool, outs: Sequence[Any]) -> list[np.ndarray]:
        """Host output views shaped like ``outs``, on output buffers kept from earlier
        items where they are large enough, else taken from ``pool``."""
        views = []
        for k, o in enumerate(outs):
            if k < len(self.out) and self.out[k].capacity < o.nbytes:
                self.out[k].release()
                self.out[k] = pool.acquire(o.nbytes)
            elif k >= len(self.out):
                self.out.append(pool.acquire(o.nbytes))
            views.append(self.out[k].array(o.dtype, o.shape))
        return views

    def release(self, keep_device: bool = False) -> None:
        """Give the host buffers back to the pool; keep the device ones if asked."""
        for b in self.buffers():
            b.release()
        self.host, self.host_views, self.out = [], [], []
        if not keep_device:
            self.dev = []

    def discard(self, pool: PinnedPool) -> None:
        """Drop every buffer (a stage still running may write into them): ``pool``
        forgets the host ones instead of handing them out again."""
        for b in self.buffers():
            pool.discard(b)
        self.host, self.host_views, self.out, self.dev = [], [], [], []


class Run:
    """State of one :meth:`~pyc_lab.runtime.pipeline.Pipeline.run`: a stale stage of an
    earlier run never sees a later run's cancel flag, spec, lanes or streams."""

    def __init__(self, crew: Crew, dispatcher: Dispatcher,
                 cancel: threading.Event | None = None) -> None:
        self.cancel = cancel if cancel is not None else threading.Event()
        self.spec: Spec | None = None
        self.spec_ready = threading.Event()
        self.crew = crew
        self.dispatcher = dispatcher


class Job:
    """State of one item on the belt."""

    def __init__(self, index: int, item: Any, slot: Slot, run: Run) -> None:
        self.run = run
        self.index = index
        self.item = item
        self.slot = slot
        self.stage = "prepare"
        self.started: float | None = None  # when the current stage began running
        self.running = False
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.error_stage: str | None = None
        self.value: Any = None  # what flows between stages
        self.result: Any = None
        self.result_in_slot = False  # result is a view of the slot's output buffers
        # host arrays the H2D copy reads when they are not the slot's (prepare's own
        # page-locked ones); CUDA lanes: (first event, last event, bytes, lane) per
        # enqueued stage, the event the next stage waits for, and device arrays kept
        # alive until the item's work is done
        self.host_src: list[np.ndarray] | None = None
        self.events: dict[str, tuple[Any, Any, int, str]] = {}  # first, last, bytes, lane
        self.ready: Any = None
        self.keep: list[Any] = []
