"""Dispatcher: bounded queue, worker names, affinity, metrics, close."""

from __future__ import annotations

import os
import threading
import time

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
