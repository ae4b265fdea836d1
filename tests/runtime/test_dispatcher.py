"""Dispatcher: bounded queue, worker names, affinity, metrics, close."""

from __future__ import annotations

import concurrent.futures
import gc
import os
import threading
import time
import tracemalloc
from typing import Any

import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.runtime.dispatcher import Dispatcher


def test_results_and_thread_names() -> None:
    with Dispatcher(workers=3, name="prepare") as d:
        futs = [d.submit(lambda k: (k * k, threading.current_thread().name), k) for k in range(9)]
        out = [f.result(timeout=5) for f in futs]
    assert [v for v, _ in out] == [k * k for k in range(9)]
    assert {name for _, name in out} <= {"pyc-prepare-0", "pyc-prepare-1", "pyc-prepare-2"}
    assert d.thread_names == ["pyc-prepare-0", "pyc-prepare-1", "pyc-prepare-2"]


def test_submit_blocks_when_queue_full() -> None:
    gate = threading.Event()
    started = threading.Event()

    def first() -> str:
        started.set()
        gate.wait(5)
        return "first"

    d = Dispatcher(workers=1, queue_size=2)
    try:
        f0 = d.submit(first)
        assert started.wait(5)
        queued = [d.submit(lambda k: k, k) for k in range(2)]  # fills the queue
        done = threading.Event()
        box: dict[str, object] = {}

        def producer() -> None:
            box["fut"] = d.submit(lambda: "late")
            done.set()

        t = threading.Thread(target=producer, daemon=True)
        t.start()
        assert not done.wait(0.2), "submit should block while the queue is full"
        gate.set()
        assert done.wait(5), "submit should unblock once a worker takes a task"
        assert f0.result(timeout=5) == "first"
        assert [f.result(timeout=5) for f in queued] == [0, 1]
        assert box["fut"].result(timeout=5) == "late"  # type: ignore[attr-defined]
    finally:
        gate.set()
        d.close()


def test_metrics_percentiles_and_frame() -> None:
    with Dispatcher(workers=2) as d:
        futs = [d.submit(time.sleep, s) for s in (0.01, 0.01, 0.02, 0.02)]
        for f in futs:
            f.result(timeout=5)
        m = d.metrics()
        frame = d.to_frame()
    assert m["count"] == 4 and m["failed"] == 0 and m["workers"] == 2
    assert m["run_p50_ms"] >= 5.0
    assert m["run_p99_ms"] >= m["run_p50_ms"]
    assert m["queue_wait_p99_ms"] >= m["queue_wait_p50_ms"] >= 0.0
    assert list(frame.columns) == ["worker", "queue_wait_ms", "run_ms", "ok"]
    assert len(frame) == 4 and frame["ok"].all()
    assert (frame["run_ms"] >= 5.0).all()


def test_metrics_empty() -> None:
    with Dispatcher(workers=1) as d:
        m = d.metrics()
    assert m["count"] == 0 and m["run_p50_ms"] is None and m["queue_wait_p99_ms"] is None
    with Dispatcher(workers=1) as d:  # a new batch after reset_metrics
        d.submit(time.sleep, 0.001).result(timeout=5)
        assert d.metrics()["count"] == 1
        d.reset_metrics()
        assert d.metrics()["count"] == 0 and d.records() == []
        d.submit(time.sleep, 0.001).result(timeout=5)
        assert d.metrics()["count"] == 1


def test_exception_goes_to_future_and_is_counted() -> None:
    def boom() -> None:
        raise ValueError("bad")

    with Dispatcher(workers=1) as d:
        f = d.submit(boom)
        with pytest.raises(ValueError, match="bad"):
            f.result(timeout=5)
        assert d.submit(lambda: 1).result(timeout=5) == 1  # the worker survived
    assert d.metrics()["failed"] == 1


def test_close_refuses_and_cancels_pending() -> None:
    gate = threading.Event()
    started = threading.Event()

    def first() -> None:
        started.set()
        gate.wait(5)

    d = Dispatcher(workers=1, queue_size=4)
    d.submit(first)
    assert started.wait(5)
    pending = [d.submit(lambda: 1) for _ in range(3)]
    d.close(wait=False, cancel_pending=True)  # the worker is still held by the gate
    gate.set()
    d.close(wait=True)
    assert all(not t.is_alive() for t in d._threads)
    assert all(f.cancelled() for f in pending)
    assert d.closed
    with pytest.raises(PycLabError, match="closed"):
        d.submit(lambda: 1)


def test_bad_arguments() -> None:
    with pytest.raises(PycLabError):
        Dispatcher(workers=0)
    with pytest.raises(PycLabError):
        Dispatcher(workers=1, queue_size=0)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"workers": True}, "workers must be a whole number"),
    ({"workers": 2.0}, "workers must be a whole number"),
    ({"workers": "2"}, "workers must be a whole number"),
    ({"workers": -1}, "workers must be >= 1"),
    ({"queue_size": 1.5}, "queue_size must be a whole number"),
    ({"queue_size": False}, "queue_size must be a whole number"),
    ({"queue_size": "4"}, "queue_size must be a whole number"),
    ({"keep_records": 0}, "keep_records must be >= 1"),
    ({"keep_records": 10.0}, "keep_records must be a whole number"),
    ({"name": ""}, "name must be a non-empty string"),
    ({"name": 3}, "name must be a non-empty string"),
    ({"cpus": ["0"]}, "cpus must be None, a list of CPU ids"),
    ({"cpus": [[-1]]}, "cpus must be None, a list of CPU ids"),
    ({"cpus": [True]}, "cpus must be None, a list of CPU ids"),
])
def test_bad_arguments_are_refused_at_construction_with_what_to_do(
        kwargs: dict[str, Any], needle: str) -> None:
    before = threading.active_count()
    with pytest.raises(PycLabError, match=needle) as info:
        Dispatcher(**{"workers": 1, **kwargs})
    assert repr(next(iter(kwargs.values()))) in str(info.value)
    assert threading.active_count() == before  # refused before any thread started


@pytest.mark.parametrize(("wait", "cancel_pending"), [(True, False), (False, True)])
def test_submits_racing_close_never_strand_a_future(wait: bool, cancel_pending: bool) -> None:
    """Four threads submit while close() runs: every accepted task runs or is cancelled."""
    t0 = time.perf_counter()
    for it in range(150):
        d = Dispatcher(workers=2, queue_size=4)
        futures: list[concurrent.futures.Future[Any]] = []
        lock = threading.Lock()
        start = threading.Barrier(5)

        def submitter(d: Dispatcher = d, futures: list[Any] = futures,
                      lock: threading.Lock = lock, start: threading.Barrier = start) -> None:
            start.wait()
            for _ in range(40):
                try:
                    fut = d.submit(int, 1)
                except PycLabError:  # closed: refused, nothing to resolve
                    return
                with lock:
                    futures.append(fut)

        threads = [threading.Thread(target=submitter, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        start.wait()
        time.sleep(0.0002 * (it % 4))
        d.close(wait=wait, cancel_pending=cancel_pending)
        for t in threads:
            t.join(5)
            assert not t.is_alive(), "a submit hung after close()"
        _done, stuck = concurrent.futures.wait(futures, timeout=5)
        assert not stuck, f"iteration {it}: {len(stuck)} futures never resolved"
        d.close(wait=True)
        assert all(not t.is_alive() for t in d._threads)
    assert time.perf_counter() - t0 < 10


def test_a_second_close_that_cancels_keeps_the_workers_stop_markers() -> None:
    gate = threading.Event()
    d = Dispatcher(workers=2, queue_size=8)
    held = [d.submit(gate.wait, 5) for _ in range(2)]  # both workers busy
    pending = [d.submit(int, 1) for _ in range(3)]
    d.close(wait=False)  # stop markers queued behind the pending tasks
    time.sleep(0.05)
    d.close(wait=False, cancel_pending=True)  # drains the queue, markers included
    gate.set()
    closer = threading.Thread(target=d.close, daemon=True)  # joins the workers
    closer.start()
    closer.join(5)
    assert not closer.is_alive(), "workers never got their stop markers"
    assert all(f.result(timeout=5) for f in held)
    assert all(f.cancelled() for f in pending)


def test_records_are_a_ring_and_metrics_cover_every_task() -> None:
    def task(k: int) -> int:
        if k % 10 == 0:
            raise ValueError(k)
        return k

    with Dispatcher(workers=2, keep_records=50) as d:
        futures = [d.submit(task, k) for k in range(2000)]
        concurrent.futures.wait(futures, timeout=30)
        m = d.metrics()
        recs = d.records()
        frame = d.to_frame()
    assert len(recs) == 50 and len(frame) == 50
    assert sorted(r.task for r in recs)[-1] >= 1950  # the most recent ones
    assert m["count"] == 2000 and m["failed"] == 200
    assert 0.0 <= m["run_p50_ms"] <= m["run_p99_ms"]
    assert 0.0 <= m["queue_wait_p50_ms"] <= m["queue_wait_p99_ms"]
    d.reset_metrics()
    assert d.metrics()["count"] == 0 and d.metrics()["run_p99_ms"] is None


def test_task_records_stay_bounded_over_many_tasks() -> None:
    """Memory held after 12,000 tasks is what it was after 3,000: the ring of records
    and the running aggregates are full (every record kept would be some 2 MB more)."""
    with Dispatcher(workers=1, queue_size=64, keep_records=100) as d:
        def batch(n: int) -> None:
            for _ in range(n // 100):  # futures dropped as they go
                concurrent.futures.wait([d.submit(int, 1) for _ in range(100)], timeout=30)

        batch(1000)
        tracemalloc.start()
        try:
            batch(2000)
            gc.collect()
            at_3000 = tracemalloc.get_traced_memory()[0]
            batch(9000)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - at_3000
        finally:
            tracemalloc.stop()
        assert d.metrics()["count"] == 12000 and len(d.records()) == 100
    # what may still grow: a new bucket now and then in the percentile sketches' tails
    assert grown < 64 * 1024, f"{grown} bytes more after 9000 more tasks"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity")
def test_affinity_binds_workers() -> None:
    cpu = min(os.sched_getaffinity(0))
    with Dispatcher(workers=2, cpus=[cpu]) as d:
        seen = [d.submit(os.sched_getaffinity, 0).result(timeout=5) for _ in range(4)]
    assert all(s == {cpu} for s in seen)
    assert d.affinity_errors == []
    assert os.sched_getaffinity(0) != set()  # the caller is not touched


def test_affinity_failure_is_reported_not_fatal() -> None:
    with Dispatcher(workers=1, cpus=[[100000]]) as d:
        assert d.submit(lambda: 42).result(timeout=5) == 42
    assert len(d.affinity_errors) == 1
    assert "100000" in d.affinity_errors[0]
