"""``blas_direct.race`` — the never-slower first-call race of library paths — against a
recording fake of the CUDA runtime: the order of flush, spin, events and the call in
every round; the spin sized from each run's quickest host time so far (so that a run's
interval is its GPU time, not the host's time to issue it); medians of the timed
rounds; a run that raises is never run again and gets infinity."""

from __future__ import annotations

import sys
import types

import pytest

from pyc_lab.kernels import arrays, blas_direct
from pyc_lab.profiling import timing as timing_mod


class FakeRuntime:
    """The runtime calls ``race`` makes, recorded; event ``i``'s elapsed time is read
    from :attr:`elapsed` by run and round."""

    def __init__(self, log: list, elapsed: dict[int, list[float]]) -> None:
        self.log, self.elapsed, self.events, self.round = log, elapsed, 0, {}

    def eventCreate(self) -> int:
        self.events += 1
        return self.events

    def eventDestroy(self, e: int) -> None:
        self.log.append(("destroy", e))

    def memsetAsync(self, ptr: int, value: int, size: int, stream: int) -> None:
        self.log.append(("flush", value, stream))

    def eventRecord(self, e: int, stream: int) -> None:
        self.log.append(("record", e))

    def streamSynchronize(self, stream: int) -> None:
        self.log.append(("sync",))

    def eventElapsedTime(self, start: int, end: int) -> float:
        run = (start - 1) // 2
        n = self.round.get(run, 0)
        self.round[run] = n + 1
        return self.elapsed[run][n]


@pytest.fixture
def fake(monkeypatch):
    log: list = []
    clock = types.SimpleNamespace(now=0.0)
    rt = FakeRuntime(log, {0: [3.0, 1.0, 2.0], 1: [5.0, 4.0, 6.0]})
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=rt, Memory=lambda n: types.SimpleNamespace(ptr=1234),
        Device=lambda: types.SimpleNamespace(id=0)))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(arrays, "cupy_stream", lambda ptr, device: f"stream {ptr}")
    monkeypatch.setattr(timing_mod, "spin_ahead",
                        lambda cp, host_s, stream: log.append(("spin", host_s, stream)))
    import time

    monkeypatch.setattr(time, "perf_counter", lambda: clock.now)
    return types.SimpleNamespace(log=log, clock=clock)


def test_each_run_waits_behind_a_spin_sized_from_its_quickest_host_time(fake):
    host = {0: [5e-3, 20e-6, 40e-6, 30e-6], 1: [60e-6, 70e-6, 50e-6, 80e-6]}
    calls = {0: 0, 1: 0}

    def run(i):
        def fn():
            fake.log.append(("call", i))
            fake.clock.now += host[i][calls[i]]
            calls[i] += 1
        return fn

    times = blas_direct.race([run(0), run(1)], 7, rounds=3)
    assert times == [2.0, 5.0]  # medians of the three timed rounds
    log = [e for e in fake.log if e[0] != "destroy"]
    # warm-up round: no spin (nothing known of the host time yet)
    assert log[:9] == [("flush", 0, 7), ("record", 1), ("call", 0), ("record", 2),
                       ("flush", 0, 7), ("record", 3), ("call", 1), ("record", 4), ("sync",)]
    spins = [(round(e[1] * 1e6), e[2]) for e in log if e[0] == "spin"]
    # round 1 spins from the warm-up's host times; later rounds from the quickest so far
    assert spins == [(5000, "stream 7"), (60, "stream 7"), (20, "stream 7"),
                     (60, "stream 7"), (20, "stream 7"), (50, "stream 7")]
    first_timed = log[9:14]
    assert first_timed == [("flush", 1, 7), ("spin", pytest.approx(5e-3), "stream 7"),
                           ("record", 1), ("call", 0), ("record", 2)]


def test_a_run_that_raises_is_not_run_again_and_loses(fake):
    ran = []

    def bad():
        ran.append("bad")
        raise RuntimeError("no kernel for this shape")

    times = blas_direct.race([lambda: ran.append("ok"), bad], 0, rounds=3)
    assert ran.count("bad") == 1 and ran.count("ok") == 4
    assert times[1] == float("inf") and times[0] == 2.0
    assert len([e for e in fake.log if e[0] == "destroy"]) == 4  # both runs' events
