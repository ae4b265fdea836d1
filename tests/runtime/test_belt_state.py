"""Belt state: a lane refuses work once stopped, so nothing waits behind its stop marker."""

from __future__ import annotations

import threading
import time

from pyc_lab.runtime.belt_state import Lane


def test_a_stopped_lane_refuses_work_instead_of_dropping_it() -> None:
    lane = Lane("pyc-test-lane")
    ran: list[int] = []
    assert lane.submit(lambda: ran.append(0)) is True
    lane.stop()
    lane.stop()  # a second stop is harmless
    assert lane.submit(lambda: ran.append(1)) is False
    lane._thread.join(5)
    assert ran == [0] and lane.stopped and not lane._thread.is_alive()


def test_work_submitted_while_a_lane_stops_runs_or_is_refused() -> None:
    """Three threads submit while stop() runs: every accepted callable runs."""
    for _ in range(100):
        lane = Lane("pyc-test-lane")
        accepted, ran = [0], [0]
        lock = threading.Lock()
        start = threading.Barrier(4)

        def feed(lane: Lane = lane, accepted: list[int] = accepted, ran: list[int] = ran,
                 lock: threading.Lock = lock, start: threading.Barrier = start) -> None:
            def bump() -> None:
                with lock:
                    ran[0] += 1

            start.wait()
            for _ in range(50):
                if not lane.submit(bump):
                    return
                with lock:
                    accepted[0] += 1

        threads = [threading.Thread(target=feed) for _ in range(3)]
        for t in threads:
            t.start()
        start.wait()
        time.sleep(0.0001)
        lane.stop()
        for t in threads:
            t.join(5)
        lane._thread.join(5)
        assert not lane._thread.is_alive()
        assert ran == accepted
