"""Host lanes: the belt's H2D, compute and D2H done on host threads with NumPy (CPU mode).

Each lane is one thread that does its stage and moves on, so the belt has the same
stages, ordering, failures and trace lanes (``stream h2d``, ``stream compute``,
``stream d2h``) as on a GPU: "device" buffers are host arrays, the copies are
``np.copyto`` and each span is the ``perf_counter`` time around the stage's own work.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .belt_state import Crew, Job, Lane
from .lanes import Lanes

__all__ = ["HostLanes"]


class HostLanes(Lanes):
    """The belt's stages on host threads: every stage is done when its method returns."""

    def start(self) -> Crew:
        """Three lane threads, ``pyc-stream-h2d``, ``-compute`` and ``-d2h``."""
        return Crew({k: Lane(f"pyc-stream-{k}") for k in ("h2d", "compute", "d2h")})

    def resume(self, crew: Crew) -> None:
        """Nothing to do: threads need no refresh between runs."""

    def yield_gil(self) -> None:
        """Nothing: each lane does its whole stage whenever it gets the GIL."""

    def pinned_as_is(self, arrays: Sequence[np.ndarray]) -> bool:
        """Never: H2D always copies from the slot's host buffers."""
        return False

    def h2d(self, job: Job, start: float) -> None:
        """Copy into host "device" buffers (kept from the slot's last item if they fit)."""
        slot = job.slot
        src, nbytes = self.h2d_source(job)
        if not slot.dev_fits(src):
            slot.dev = [np.empty_like(v) for v in src]
        for d, h in zip(slot.dev, src, strict=True):
            np.copyto(d, h)
        self.hooks.record(job, "h2d", "stream h2d", start, time.perf_counter(), nbytes)

    def compute(self, job: Job, start: float, call: Callable[[Any], Any]) -> Any:
        """Call compute with no stream (``None``)."""
        out = call(None)
        self.hooks.record(job, "compute", "stream compute", start, time.perf_counter(), 0)
        return out

    def d2h(self, job: Job, start: float, outs: list[Any]) -> list[np.ndarray]:
        """Copy the outputs, made contiguous arrays first, into the slot's output buffers."""
        outs = [np.ascontiguousarray(o) for o in outs]
        views = job.slot.out_views(self.pool, outs)
        nbytes = sum(v.nbytes for v in views)
        for v, o in zip(views, outs, strict=True):
            np.copyto(v, o)
        self.hooks.record(job, "d2h", "stream d2h", start, time.perf_counter(), nbytes)
        return views

    def hand_over(self, job: Job) -> None:
        """Finish the item at once: its stages have all run."""
        self.hooks.finish(job)

    def wait_idle(self, crew: Crew, deadline: float) -> bool:
        """``True``: a host stage's work is over when its method returns."""
        return True
