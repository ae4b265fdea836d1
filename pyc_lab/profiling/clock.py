"""CUDA events on the host clock, so CPU and GPU spans share one time axis."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .spans import Span

if TYPE_CHECKING:  # pragma: no cover
    from .trace import Trace

__all__ = ["CudaEventClock"]


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
