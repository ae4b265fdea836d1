"""CudaLanes on a stand-in CuPy: what each stage queues on which stream, in which order.

The stand-in runs every queued operation at once and logs it, so the ordering contract
(each stream waits for the item's previous stage's last event; events around each stage;
copies out with ``blocking=False``; the ``done`` lane hands items over in order) is
checked here without a GPU. The real device behaviour is covered by the ``gpu`` tests in
``test_pipeline.py``.
"""

from __future__ import annotations

import itertools
import threading
import time
import types
from typing import Any

import numpy as np
import pytest

from pyc_lab.runtime import pipeline as pipeline_mod
from pyc_lab.runtime.belt_state import Crew, Job, Run, Slot
from pyc_lab.runtime.cuda_lanes import CudaLanes
from pyc_lab.runtime.lanes import StageHooks
from pyc_lab.runtime.pinned import PinnedPool


class FakeCupy:
    """The slice of CuPy the CUDA lanes use, on NumPy; every call is logged."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._ids = itertools.count()
        self.pinned: set[int] = set()  # data pointers that count as page-locked
        self.events_done = True
        fake = self

        class Event:
            def __init__(self) -> None:
                self.id, self.stream, self.t, self.done = next(fake._ids), None, 0.0, False

            def record(self, stream: Any = None) -> None:
                self.stream = stream if stream is not None else fake.current()
                self.t, self.done = time.perf_counter(), fake.events_done
                fake.add("record", self.stream, self)

            def synchronize(self) -> None:
                fake.add("sync", self.stream, self)

        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                self.non_blocking = non_blocking

            def __enter__(self) -> Stream:
                fake._stack().append(self)
                return self

            def __exit__(self, *exc: object) -> None:
                fake._stack().pop()

            def wait_event(self, ev: Event) -> None:
                fake.add("wait", self, ev)

            def record(self) -> Event:
                ev = Event()
                ev.record(self)
                return ev

        class ndarray(np.ndarray):  # CuPy's name
            def set(self, h: np.ndarray, stream: Any = None) -> None:
                fake.add("set", stream)
                np.copyto(np.asarray(self), h)

            def get(self, stream: Any = None, out: Any = None, blocking: bool = True) -> Any:
                fake.add("get", stream, blocking, np.asarray(self).flags.c_contiguous)
                np.copyto(out, np.asarray(self))
                return out

        class Device:
            def __init__(self, dev: int | None = None) -> None:
                self.dev = dev

            def use(self) -> None:
                fake.add("use", self.dev)

            def __enter__(self) -> Device:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

            def synchronize(self) -> None:
                pass

        def empty(shape: Any, dtype: Any) -> ndarray:
            fake.add("empty", fake.current())
            return np.empty(shape, dtype).view(ndarray)

        def attributes(ptr: int) -> Any:
            return types.SimpleNamespace(type=1 if ptr in fake.pinned else 0)

        self.ndarray = ndarray
        self.empty = empty
        self.asarray = lambda a: a if isinstance(a, ndarray) else np.asarray(a).view(ndarray)
        self.ascontiguousarray = lambda a: np.ascontiguousarray(np.asarray(a)).view(ndarray)
        self.cuda = types.SimpleNamespace(
            Stream=Stream, Event=Event, Device=Device,
            get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
            runtime=types.SimpleNamespace(pointerGetAttributes=attributes),
        )

    def _stack(self) -> list[Any]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def current(self) -> Any:
        stack = self._stack()
        return stack[-1] if stack else None

    def add(self, *row: Any) -> None:
        with self._lock:
            self.log.append(row)

    def ops(self, stream: Any) -> list[tuple[Any, ...]]:
        """What was queued on ``stream``, in order (host waits left out)."""
        return [r for r in self.log if len(r) > 1 and r[1] is stream and r[0] != "sync"]


class Belt:
    def __init__(self) -> None:
        self.spans: list[tuple[int, str, str, float, float, int]] = []
        self.finished = threading.Event()
        self.failed: list[BaseException] = []
        self.hooks = StageHooks(
            lambda job, stage, lane, s, e, n: self.spans.append((job.index, stage, lane,
                                                                  s, e, n)),
            lambda job, stage: time.perf_counter(),
            lambda job, stage, exc: self.failed.append(exc),
            lambda job: self.finished.set())


@pytest.fixture
def pool():
    with PinnedPool(device=None, mode="cpu") as p:
        yield p


def staged(index: int, crew: Crew, pool: PinnedPool, a: np.ndarray) -> Job:
    job = Job(index, None, Slot(index), Run(crew, dispatcher=None))  # type: ignore[arg-type]
    job.slot.alloc_host(pool, [(a.shape, a.dtype)])
    np.copyto(job.slot.host_views[0], a)
    return job


def test_start_makes_the_streams_clock_and_lanes_with_the_device_current() -> None:
    cp = FakeCupy()
    crew = CudaLanes(cp, None, Belt().hooks, device=3, compute_streams=3).start()  # type: ignore[arg-type]
    try:
        assert list(crew.streams) == ["h2d", "compute", "compute 1", "compute 2", "d2h"]
        assert all(s.non_blocking for s in crew.streams.values())
        assert crew.clock is not None
        assert sorted(crew.lanes) == ["compute", "d2h", "done", "h2d"]
        done = threading.Event()
        crew.lanes["done"].submit(done.set)
        assert done.wait(5)
    finally:
        crew.stop()
    for lane in crew.lanes.values():
        lane._thread.join(5)
    assert cp.log.count(("use", 3)) == 4  # each lane thread made device 3 current


@pytest.mark.parametrize("with_clock", [True, False])
def test_each_stage_waits_for_the_previous_stages_last_event(
        pool: PinnedPool, with_clock: bool) -> None:
    cp, belt = FakeCupy(), Belt()
    lanes = CudaLanes(cp, pool, belt.hooks, compute_streams=2)
    crew = lanes.start()
    if not with_clock:
        crew.clock = None
    st = crew.streams
    try:
        job = staged(1, crew, pool, np.arange(8, dtype=np.float32))
        lanes.h2d(job, 0.0)
        dev = job.slot.dev[0]
        out = lanes.compute(job, 0.0, lambda stream: (cp.add("compute", stream), dev * 2)[1])
        views = lanes.d2h(job, 0.0, [out.reshape(2, 4).T])  # not contiguous on the device
        assert job.keep[0] is out and len(job.keep) == 2
        assert belt.spans == []  # nothing is timed before the GPU work is done
        lanes.hand_over(job)
        assert belt.finished.wait(5) and not belt.failed
    finally:
        crew.stop()
    np.testing.assert_array_equal(views[0], (np.arange(8) * 2).reshape(2, 4).T)
    h2d = cp.ops(st["h2d"])
    assert [r[0] for r in h2d] == ["empty", "record", "set", "record"]
    comp = cp.ops(st["compute 1"])  # item 1 of 2 compute streams
    assert [r[0] for r in comp] == ["wait", "record", "compute", "record"]
    assert comp[0][2] is h2d[3][2]
    d2h = cp.ops(st["d2h"])
    assert [r[0] for r in d2h] == ["wait", "record", "get", "record"]
    assert d2h[0][2] is comp[3][2]
    assert d2h[2][2:] == (False, True)  # get(blocking=False) of a contiguous copy
    assert cp.ops(st["compute"]) == []
    assert job.ready is d2h[3][2] and job.keep == [] and job.host_src is None
    assert ("sync", st["d2h"], job.ready) in cp.log
    job.slot.release()
    spans = {s[1]: s for s in belt.spans}
    if with_clock:
        assert [spans[k][2] for k in ("h2d", "compute", "d2h")] == [
            "stream h2d", "stream compute 1", "stream d2h"]
        assert spans["h2d"][5] == 32 and spans["d2h"][5] == 32
    else:
        assert spans == {}  # no clock: no event times to map onto the host clock


def test_an_item_handed_to_a_stopped_done_lane_fails_instead_of_waiting(
        pool: PinnedPool) -> None:
    cp, belt = FakeCupy(), Belt()
    lanes = CudaLanes(cp, pool, belt.hooks)
    crew = lanes.start()
    crew.stop()
    job = staged(4, crew, pool, np.arange(4, dtype=np.float32))
    lanes.h2d(job, 0.0)
    lanes.hand_over(job)
    assert not belt.finished.is_set()
    assert len(belt.failed) == 1 and "item 4: the belt was stopped" in str(belt.failed[0])
    job.slot.release()


def test_device_buffers_are_reused_while_they_fit(pool: PinnedPool) -> None:
    cp = FakeCupy()
    lanes = CudaLanes(cp, pool, Belt().hooks)
    crew = lanes.start()
    try:
        job = staged(0, crew, pool, np.ones(4, np.float32))
        lanes.h2d(job, 0.0)
        first = job.slot.dev[0]
        lanes.h2d(job, 0.0)
        assert job.slot.dev[0] is first
        assert [r[0] for r in cp.log].count("empty") == 1
        job.slot.release()
    finally:
        crew.stop()


def test_pinned_as_is_needs_contiguous_page_locked_arrays() -> None:
    cp = FakeCupy()
    lanes = CudaLanes(cp, None, Belt().hooks)  # type: ignore[arg-type]
    a = np.ones((4, 4), np.float32)
    assert not lanes.pinned_as_is([a])
    cp.pinned.add(a.ctypes.data)
    assert lanes.pinned_as_is([a])
    assert not lanes.pinned_as_is([a.T])


def test_wait_idle_marks_every_stream_and_gives_up_at_the_deadline() -> None:
    cp = FakeCupy()
    lanes = CudaLanes(cp, None, Belt().hooks)  # type: ignore[arg-type]
    crew = Crew({}, {k: cp.cuda.Stream() for k in ("h2d", "compute", "d2h")})
    assert lanes.wait_idle(crew, time.perf_counter() + 5)
    assert [r[0] for r in cp.log] == ["record"] * 3
    cp.events_done = False  # work still running on the streams
    t0 = time.perf_counter()
    assert not lanes.wait_idle(crew, t0 + 0.05)
    assert time.perf_counter() - t0 < 2
    assert lanes.wait_idle(Crew({}), time.perf_counter())


def test_gpu_mode_belt_on_the_stand_in_matches_numpy(
        pool: PinnedPool, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = FakeCupy()
    monkeypatch.setattr(pipeline_mod, "cupy_status", lambda: (cp, "ok"))

    def prep(i: int) -> np.ndarray:
        return np.full((8, 4), i, np.float32)

    def comp(x: Any, stream: Any) -> Any:
        assert cp.current() is stream
        return x * 2 + 1

    with pipeline_mod.Pipeline(prep, comp, mode="gpu", depth=3, workers=2, pool=pool,
                               compute_streams=2) as pipe:
        assert pipe.mode == "gpu"
        for _run in range(2):  # the second run reuses the crew
            out = list(pipe.run(range(7)))
            for i, r in enumerate(out):
                np.testing.assert_array_equal(r, prep(i) * 2 + 1)
            assert pool.stats()["in_use"] == 0
        stages = {(s.item, s.stage): s.lane for s in pipe.trace.spans}
    assert stages == {
        **{(i, "prepare"): stages[i, "prepare"] for i in range(7)},
        **{(i, "h2d"): "stream h2d" for i in range(7)},
        **{(i, "compute"): "stream compute" if i % 2 == 0 else "stream compute 1"
           for i in range(7)},
        **{(i, "d2h"): "stream d2h" for i in range(7)},
    }
