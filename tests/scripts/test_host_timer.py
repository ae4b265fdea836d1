"""The benchmarks' host timer (``benchmarks/common.py``) on the CPU, with a stand-in for
CuPy's device: rounds of several callables interleaved, the GPU synchronised only
between rounds, the garbage collector paused inside a round and restored after (also
when a call raises), and medians per call in microseconds."""

from __future__ import annotations

import gc
import importlib.util
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "common.py"
_spec = importlib.util.spec_from_file_location("pyc_lab_bench_common", _PATH)
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)


def _fake_cp(log):
    device = SimpleNamespace(synchronize=lambda: log.append("sync"))
    return SimpleNamespace(cuda=SimpleNamespace(Device=lambda: device))


def test_rounds_interleave_and_the_collector_is_paused_inside_them():
    log = []
    seen_gc = []

    def call(name, pause=0.0):
        def fn():
            log.append(name)
            seen_gc.append(gc.isenabled())
            if pause:
                time.sleep(pause)
        return fn

    assert gc.isenabled()
    out = common.host_us_many(_fake_cp(log), {"a": call("a"), "b": call("b", 1e-4)},
                              calls=3, rounds=2)
    assert set(out) == {"a", "b"} and out["b"] > out["a"] > 0
    assert out["b"] >= 100  # 0.1 ms a call, in microseconds
    timed = log[log.index("sync") + 1:]  # after the warm-up calls and their sync
    assert timed == ["a"] * 3 + ["sync"] + ["b"] * 3 + ["sync"] \
        + ["a"] * 3 + ["sync"] + ["b"] * 3 + ["sync"]
    assert not any(seen_gc[-12:])  # every timed call ran with the collector paused
    assert gc.isenabled()


def test_the_collector_comes_back_when_a_call_raises():
    state = {"n": 0}

    def flaky():
        state["n"] += 1
        if state["n"] > 20:  # after the warm-up
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        common.host_us(_fake_cp([]), flaky, calls=2, rounds=1)
    assert gc.isenabled()
