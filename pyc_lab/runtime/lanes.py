"""The lanes interface: what the belt asks of the lanes its H2D, compute and D2H run on.

A :class:`~pyc_lab.runtime.pipeline.Pipeline` picks its lanes once, by mode:
:class:`~pyc_lab.runtime.host_lanes.HostLanes` (threads and NumPy) or
:class:`~pyc_lab.runtime.cuda_lanes.CudaLanes` (threads that queue work on CUDA streams).
The belt keeps what both modes share (slots, ordering, prepare workers, spec checks,
failures, timeouts, shutdown); the lanes do what differs: they start a run's
:class:`~pyc_lab.runtime.belt_state.Crew`, copy an item's arrays in and out, run its
compute, and hand it over when its work is finished.

The belt calls each stage method (``h2d``, ``compute``, ``d2h``) on that stage's lane
thread, inside a ``try``: an exception fails the item at that stage. Their ``start``
argument is the ``perf_counter`` time the stage began.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .belt_state import Crew, Job
    from .pinned import PinnedPool

__all__ = ["Lanes", "StageHooks"]


@dataclass(frozen=True)
class StageHooks:
    """The belt's bookkeeping the lanes report to.

    Attributes
    ----------
    record
        ``record(job, stage, lane, start_s, end_s, nbytes)``: one span into the trace.
    begin
        ``begin(job, stage)``: mark ``stage`` running; ``None`` when the belt is stopping.
    fail
        ``fail(job, stage, exc)``: the item failed in ``stage``.
    finish
        ``finish(job)``: the item's result is ready for the consumer.
    """

    record: Callable[[Job, str, str, float, float, int], None]
    begin: Callable[[Job, str], float | None]
    fail: Callable[[Job, str, BaseException], None]
    finish: Callable[[Job], None]


class Lanes(abc.ABC):
    """Where the belt's H2D, compute and D2H stages run, and how an item is finished.

    Parameters
    ----------
    pool
        The belt's pool; slot output buffers come from it.
    hooks
        The belt's bookkeeping (spans, stage start, failure, hand-over).
    """

    def __init__(self, pool: PinnedPool, hooks: StageHooks) -> None:
        self.pool = pool
        self.hooks = hooks

    @abc.abstractmethod
    def start(self) -> Crew:
        """A new crew for a run: one thread per lane (and streams and a clock)."""

    @abc.abstractmethod
    def resume(self, crew: Crew) -> None:
        """Get a crew kept from the last run ready for the next run."""

    @abc.abstractmethod
    def yield_gil(self) -> None:
        """Called on the belt's threads right after they handed work to a lane (or the
        prepare workers): give the GIL away now, or not."""

    @abc.abstractmethod
    def pinned_as_is(self, arrays: Sequence[np.ndarray]) -> bool:
        """Whether H2D may read ``arrays`` (what ``prepare`` returned) as they are,
        without staging them through the slot's buffers."""

    @abc.abstractmethod
    def h2d(self, job: Job, start: float) -> None:
        """Copy the item's host arrays into ``job.slot.dev`` (allocated or reused)."""

    @abc.abstractmethod
    def compute(self, job: Job, start: float, call: Callable[[Any], Any]) -> Any:
        """Run ``call(stream)`` (the user's compute) for the item; return its result."""

    @abc.abstractmethod
    def d2h(self, job: Job, start: float, outs: list[Any]) -> list[np.ndarray]:
        """Copy compute's outputs into the slot's host output buffers; return their views."""

    @abc.abstractmethod
    def hand_over(self, job: Job) -> None:
        """The item's last stage was done (or queued): finish it when its work is."""

    @abc.abstractmethod
    def wait_idle(self, crew: Crew, deadline: float) -> bool:
        """At shutdown, wait (until ``deadline``) for work the crew still has queued;
        ``False`` if some was still running then."""

    @staticmethod
    def h2d_source(job: Job) -> tuple[Sequence[np.ndarray], int]:
        """The host arrays H2D reads (prepare's own page-locked ones, else the slot's),
        and their bytes."""
        src = job.host_src if job.host_src is not None else job.slot.host_views
        return src, sum(v.nbytes for v in src)
