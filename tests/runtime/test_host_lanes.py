"""HostLanes (CPU mode): lane threads, the copies into and out of a slot, spans, hand-over."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from pyc_lab.runtime.belt_state import Crew, Job, Run, Slot
from pyc_lab.runtime.host_lanes import HostLanes
from pyc_lab.runtime.lanes import StageHooks
from pyc_lab.runtime.pinned import PinnedPool


class Belt:
    """What the lanes report to: spans, failures and hand-overs, kept for the test."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, str, str, float, float, int]] = []
        self.finished: list[int] = []
        self.failed: list[tuple[int, str, BaseException]] = []
        self.hooks = StageHooks(self.record, lambda job, stage: time.perf_counter(),
                                self.fail, self.finished_job)

    def record(self, job: Job, stage: str, lane: str, start: float, end: float,
               nbytes: int) -> None:
        self.spans.append((job.index, stage, lane, start, end, nbytes))

    def fail(self, job: Job, stage: str, exc: BaseException) -> None:
        self.failed.append((job.index, stage, exc))

    def finished_job(self, job: Job) -> None:
        self.finished.append(job.index)


@pytest.fixture
def pool():
    with PinnedPool(device=None, mode="cpu") as p:
        yield p


def make_job(index: int = 0, slot: Slot | None = None) -> Job:
    return Job(index, None, slot or Slot(index), Run(Crew({}), dispatcher=None))  # type: ignore[arg-type]


def staged(job: Job, pool: PinnedPool, *arrays: np.ndarray) -> Job:
    """``job`` with ``arrays`` in its slot's host buffers, as prepare leaves them."""
    job.slot.alloc_host(pool, [(a.shape, a.dtype) for a in arrays])
    for v, a in zip(job.slot.host_views, arrays, strict=True):
        np.copyto(v, a)
    return job


def test_start_gives_three_lane_threads_that_run_work_in_order() -> None:
    lanes = HostLanes(None, Belt().hooks)  # type: ignore[arg-type]
    crew = lanes.start()
    try:
        assert sorted(crew.lanes) == ["compute", "d2h", "h2d"]
        assert crew.streams == {} and crew.clock is None
        assert {lane.name for lane in crew.lanes.values()} == {
            "pyc-stream-h2d", "pyc-stream-compute", "pyc-stream-d2h"}
        seen: list[tuple[str, int]] = []
        done = threading.Event()
        for k in range(5):
            crew.lanes["compute"].submit(lambda k=k: seen.append(
                (threading.current_thread().name, k)))
        crew.lanes["compute"].submit(done.set)
        assert done.wait(5)
        assert seen == [("pyc-stream-compute", k) for k in range(5)]
    finally:
        crew.stop()
    for lane in crew.lanes.values():
        lane._thread.join(5)
        assert not lane._thread.is_alive()


def test_h2d_copies_into_device_buffers_kept_while_shapes_fit(pool: PinnedPool) -> None:
    belt = Belt()
    lanes = HostLanes(pool, belt.hooks)
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(4, dtype=np.int64)
    job = staged(make_job(), pool, a, b)
    lanes.h2d(job, time.perf_counter())
    dev = job.slot.dev
    assert len(dev) == 2
    np.testing.assert_array_equal(dev[0], a)
    np.testing.assert_array_equal(dev[1], b)
    assert not np.shares_memory(dev[0], job.slot.host_views[0])
    _item, stage, lane, start, end, nbytes = belt.spans[-1]
    assert (stage, lane, nbytes) == ("h2d", "stream h2d", a.nbytes + b.nbytes)
    assert end >= start

    job.slot.host_views[0][...] = 7  # the same shapes: the same buffers, new values
    lanes.h2d(job, time.perf_counter())
    assert job.slot.dev[0] is dev[0] and job.slot.dev[1] is dev[1]
    assert (job.slot.dev[0] == 7).all()

    job.host_src = [np.ones(5, np.float64)]  # prepare's own page-locked arrays win
    lanes.h2d(job, time.perf_counter())
    assert len(job.slot.dev) == 1 and job.slot.dev[0].shape == (5,)
    assert (job.slot.dev[0] == 1).all()
    assert belt.spans[-1][5] == 40


def test_compute_calls_with_no_stream_and_records_its_span() -> None:
    belt = Belt()
    lanes = HostLanes(None, belt.hooks)  # type: ignore[arg-type]
    got: list[Any] = []
    out = lanes.compute(make_job(3), time.perf_counter(), lambda s: got.append(s) or 42)
    assert out == 42 and got == [None]
    assert [r[:3] + r[5:] for r in belt.spans] == [(3, "compute", "stream compute", 0)]


def test_d2h_copies_contiguous_outputs_into_the_slots_output_buffers(
        pool: PinnedPool) -> None:
    belt = Belt()
    lanes = HostLanes(pool, belt.hooks)
    job = make_job(1)
    x = np.arange(12, dtype=np.float32).reshape(3, 4).T  # not C-contiguous
    y = np.arange(3, dtype=np.int32)
    views = lanes.d2h(job, time.perf_counter(), [x, y])
    assert [v.shape for v in views] == [(4, 3), (3,)]
    assert all(v.flags.c_contiguous for v in views)
    np.testing.assert_array_equal(views[0], x)
    np.testing.assert_array_equal(views[1], y)
    assert len(job.slot.out) == 2 and pool.stats()["in_use"] == 2
    assert belt.spans[-1][1:3] == ("d2h", "stream d2h")
    assert belt.spans[-1][5] == x.nbytes + y.nbytes

    first = list(job.slot.out)  # a later, smaller item reuses them; a larger one grows
    lanes.d2h(job, time.perf_counter(), [np.ones(2, np.float32), np.ones(1 << 16, np.int32)])
    assert job.slot.out[0] is first[0] and job.slot.out[1] is not first[1]
    assert pool.stats()["in_use"] == 2
    job.slot.release()
    assert pool.stats()["in_use"] == 0


def test_hand_over_finishes_at_once_and_nothing_is_left_queued() -> None:
    belt = Belt()
    lanes = HostLanes(None, belt.hooks)  # type: ignore[arg-type]
    crew = Crew({})
    lanes.resume(crew)
    lanes.yield_gil()
    lanes.hand_over(make_job(5))
    assert belt.finished == [5] and belt.failed == []
    assert lanes.wait_idle(crew, time.perf_counter())
    assert not lanes.pinned_as_is([np.ones(4, np.float32)])


def test_slot_discard_drops_its_buffers_from_the_pool(pool: PinnedPool) -> None:
    job = staged(make_job(), pool, np.ones(8, np.float32))
    HostLanes(pool, Belt().hooks).d2h(job, time.perf_counter(), [np.ones(3)])
    job.slot.discard(pool)
    s = pool.stats()
    assert s["in_use"] == 0 and s["discarded"] == 2 and s["buffers"] == 0
    assert job.slot.buffers() == [] and job.slot.dev == []
