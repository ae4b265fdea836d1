"""CUDA lanes: the belt's H2D, compute and D2H queued on CUDA streams (GPU mode, CuPy).

Each stage lane is one thread that only *queues* its stage on its stream (``h2d``,
``compute`` (item ``i`` on ``compute``, ``compute 1``, ... by ``i % compute_streams``),
``d2h``): the stream first waits (``cudaStreamWaitEvent``) for the item's previous
stage's last event, so the order holds on the GPU while the host runs ahead and every
stream keeps work queued. One more thread, the ``done`` lane, waits for each item's last
event, in order, before its result is handed over (a stage that runs past ``timeout_s``
is reported from there). Stage spans are the times of CUDA events recorded around each
queued stage, mapped onto the host ``perf_counter`` clock
(:class:`~pyc_lab.profiling.clock.CudaEventClock`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PycLabError
from .belt_state import Crew, Job, Lane
from .lanes import Lanes, StageHooks
from .pinned import is_page_locked

if TYPE_CHECKING:  # pragma: no cover
    from .pinned import PinnedPool

__all__ = ["CudaLanes"]

log = logging.getLogger(__name__)


class CudaLanes(Lanes):
    """The belt's stages queued on CUDA streams, finished by a ``done`` lane.

    Parameters
    ----------
    cp
        The CuPy module (with a usable device).
    pool, hooks
        As for :class:`~pyc_lab.runtime.lanes.Lanes`.
    device
        The CUDA device ordinal the streams and lane threads use.
    compute_streams
        Item ``i`` computes on stream ``i % compute_streams``.
    """

    def __init__(self, cp: Any, pool: PinnedPool, hooks: StageHooks, *, device: int = 0,
                 compute_streams: int = 1) -> None:  # pragma: no cover - needs a GPU
        super().__init__(pool, hooks)
        self._cp = cp
        self.device = device
        self.compute_streams = compute_streams

    def start(self) -> Crew:  # pragma: no cover - needs a GPU
        """Streams ``h2d``, ``compute`` (and ``compute 1``, ...), ``d2h``; an event clock;
        lane threads ``pyc-stream-h2d``, ``-compute``, ``-d2h`` and ``-done``, each with
        the device current."""
        cp, dev = self._cp, self.device

        def init() -> None:
            cp.cuda.Device(dev).use()

        clock = None
        with cp.cuda.Device(dev):
            names = ["h2d", "compute", *(f"compute {k}" for k in
                                         range(1, self.compute_streams)), "d2h"]
            streams = {k: cp.cuda.Stream(non_blocking=True) for k in names}
            try:  # stage spans from CUDA events, mapped onto the host clock
                from ..profiling.clock import CudaEventClock

                clock = CudaEventClock(cp)
            except Exception as exc:
                log.warning("Pipeline: no CUDA event clock (%s); stage times are host "
                            "times around each stream's work", exc)
        lanes = {k: Lane(f"pyc-stream-{k}", init) for k in ("h2d", "compute", "d2h", "done")}
        return Crew(lanes, streams, clock)

    def resume(self, crew: Crew) -> None:  # pragma: no cover - needs a GPU
        """Resync the event clock when its reference is over 10 s old."""
        if crew.clock is not None and time.perf_counter() - crew.clock.ref_host_s > 10:
            crew.clock.resync()  # the clocks drift apart slowly

    def yield_gil(self) -> None:  # pragma: no cover - needs a GPU
        """``time.sleep(0)``: the lane just handed work queues it now, not after more
        prepares."""
        time.sleep(0)

    def pinned_as_is(self, arrays: Sequence[np.ndarray]) -> bool:  # pragma: no cover - GPU
        """Whether every array is C-contiguous and page-locked (H2D copies straight from it)."""
        return all(a.flags.c_contiguous and is_page_locked(a, self._cp) for a in arrays)

    def h2d(self, job: Job, start: float) -> None:  # pragma: no cover - needs a GPU
        """Queue ``d.set(h)`` per array on stream ``h2d`` (device buffers allocated on it
        when the slot's do not fit)."""
        cp = self._cp
        slot = job.slot
        src, nbytes = self.h2d_source(job)
        stream = job.run.crew.streams["h2d"]
        if not slot.dev_fits(src):
            with stream:
                slot.dev = [cp.empty(v.shape, v.dtype) for v in src]

        def copy_in() -> None:
            for d, h in zip(slot.dev, src, strict=True):
                d.set(h, stream=stream)

        self._enqueue(job, "h2d", "h2d", copy_in, nbytes)

    def compute(self, job: Job, start: float,
                call: Callable[[Any], Any]) -> Any:  # pragma: no cover - needs a GPU
        """Queue ``call(stream)`` on compute stream ``index % compute_streams``; its
        result is kept alive until the item is done."""
        k = job.index % self.compute_streams
        key = "compute" if k == 0 else f"compute {k}"
        stream = job.run.crew.streams[key]
        out = self._enqueue(job, "compute", key, lambda: call(stream))
        job.keep.append(out)
        return out

    def d2h(self, job: Job, start: float,
            outs: list[Any]) -> list[np.ndarray]:  # pragma: no cover - needs a GPU
        """Queue, on stream ``d2h``, each output made contiguous and copied into the
        slot's pinned output buffers (``get(blocking=False)``)."""
        cp = self._cp
        views = job.slot.out_views(self.pool, outs)
        nbytes = sum(v.nbytes for v in views)
        stream = job.run.crew.streams["d2h"]

        def copy_out() -> None:  # after compute, on the D2H stream
            for v, o in zip(views, outs, strict=True):
                o = cp.ascontiguousarray(cp.asarray(o))
                job.keep.append(o)
                o.get(stream=stream, out=v, blocking=False)

        self._enqueue(job, "d2h", "d2h", copy_out, nbytes)
        return views

    def hand_over(self, job: Job) -> None:
        """Queue the item on the ``done`` lane, which waits for its last event (a lane
        already stopped fails the item instead of dropping it)."""
        job.running = False
        if not job.run.crew.lanes["done"].submit(lambda: self._done(job)):
            stage = next(reversed(job.events)) if job.events else "compute"
            self.hooks.fail(job, stage, PycLabError(
                f"item {job.index}: the belt was stopped before its result was handed over"))

    def wait_idle(self, crew: Crew, deadline: float) -> bool:
        """Wait until the crew's streams have finished what was queued (by ``deadline``):
        stages run ahead of the GPU, so a stopped belt may still have copies in flight
        into buffers that are about to go back to the pool."""
        if not crew.streams:
            return True
        try:  # pragma: no cover - needs a GPU
            marks = [s.record() for s in crew.streams.values()]
            while not all(m.done for m in marks):
                if time.perf_counter() > deadline:
                    return False
                time.sleep(0.001)
        except Exception as exc:  # pragma: no cover - a failed device
            log.warning("Pipeline: could not wait for the streams: %s", exc)
            return False
        return True  # pragma: no cover - needs a GPU

    def _enqueue(self, job: Job, stage: str, key: str, work: Callable[[], Any],
                 nbytes: int = 0) -> Any:  # pragma: no cover - needs a GPU
        """Queue ``work`` on the run's stream ``key`` after the item's previous stage,
        between two CUDA events, without waiting for it; return what ``work`` returned.

        The stream waits for the previous stage's last event on the GPU, so the host
        lanes run ahead and every stream keeps work queued: no host round trip between
        one item's copy and the next item's kernels.
        """
        clock = job.run.crew.clock
        stream = job.run.crew.streams[key]
        with stream:
            if job.ready is not None:
                stream.wait_event(job.ready)
            first = clock.event(stream) if clock is not None else stream.record()
            result = work()
            last = clock.event(stream) if clock is not None else stream.record()
        job.events[stage] = (first, last, nbytes, f"stream {key}")
        job.ready = last
        return result

    def _done(self, job: Job) -> None:  # pragma: no cover - needs a GPU
        """Wait (off the stream lanes) for the item's last GPU event; record its spans
        from the CUDA events, mapped onto the host clock, and hand the result over."""
        last_stage = next(reversed(job.events)) if job.events else "compute"
        if self.hooks.begin(job, last_stage) is None:
            return
        try:
            job.ready.synchronize()
            clock = job.run.crew.clock
            for stage, (first, last, nbytes, lane) in job.events.items():
                if clock is not None:
                    self.hooks.record(job, stage, lane, clock.to_host(first),
                                      clock.to_host(last), nbytes)
        except BaseException as exc:
            self.hooks.fail(job, last_stage, exc)
            return
        job.keep = []
        job.host_src = None
        self.hooks.finish(job)
