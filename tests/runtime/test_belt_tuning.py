"""tune_pipeline: sweeps belt configurations through the autotuner's strategies (CPU mode)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.runtime.belt_tuning import tune_pipeline


def slow_prepare(i):
    time.sleep(0.002)  # a loader that wants several workers
    return np.full((64,), float(i))


def compute(a):
    return a * 2


def test_sweeps_every_configuration_and_reports_the_best():
    sweep = tune_pipeline(slow_prepare, compute, range(12), depths=(1, 3), workers=(1, 3),
                          repeats=1, mode="cpu")
    frame = sweep.to_frame()
    assert len(frame) == 4 and set(frame["status"]) == {"ok"}
    assert {(r.depth, r.workers) for r in frame.itertuples()} == {(1, 1), (1, 3), (3, 1), (3, 3)}
    assert sweep.best["median_s"] == frame["median_s"].min()
    assert sweep.stopped_by == "exhausted"
    assert "best: depth=" in repr(sweep)
    assert frame["efficiency"].notna().all()


def test_chunk_size_sweep_uses_make_items():
    seen = []

    def make_items(chunk):
        seen.append(chunk)
        return range(0, 40, chunk)

    sweep = tune_pipeline(lambda i: np.arange(8.0) + i, compute, make_items, depths=(2,),
                          workers=(1,), chunks=(4, 8), repeats=1, mode="cpu")
    assert sorted(seen) == [4, 8]
    assert set(sweep.to_frame()["chunk"]) == {4, 8}


def test_a_failing_configuration_does_not_stop_the_sweep():
    def prepare(i):
        if i == 3:
            raise ValueError("bad item")
        return np.ones(4)

    sweep = tune_pipeline(prepare, compute, range(5), depths=(1, 2), workers=(1,), repeats=1,
                          mode="cpu")
    frame = sweep.to_frame()
    assert len(frame) == 2 and set(frame["status"]) == {"error"}
    assert all("item 3" in m for m in frame["message"])
    assert sweep.best is None


@pytest.mark.parametrize("kwargs, message", [
    ({"repeats": 0}, "repeats must be at least 1"),
    ({"chunks": (4,)}, "chunks needs items to be a function"),
    ({"depths": ()}, "at least one value"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(pl.PycLabError, match=message):
        tune_pipeline(slow_prepare, compute, range(3), mode="cpu", **kwargs)


@pytest.mark.parametrize("prepare, compute_fn, items, message", [
    (slow_prepare, compute, [], "items is empty"),
    (None, compute, range(3), "prepare must be callable"),
    (slow_prepare, "compute", range(3), "compute must be callable"),
])
def test_nothing_to_time_is_refused_before_any_belt_runs(prepare, compute_fn, items, message):
    with pytest.raises(pl.PycLabError, match=message):
        tune_pipeline(prepare, compute_fn, items, mode="cpu")


def test_each_configuration_warms_up_one_belt_before_timing_it():
    calls = []

    def prepare(i):
        calls.append(i)
        return np.full(4, float(i))

    sweep = tune_pipeline(prepare, compute, range(5), depths=(2,), workers=(1,), repeats=2,
                          warmup=1, mode="cpu")
    assert len(calls) == 3 * 5  # one untimed run, then two timed ones
    assert sweep.to_frame()["pipeline_efficiency"].notna().all()
    with pytest.raises(pl.PycLabError, match="warmup"):
        tune_pipeline(prepare, compute, range(2), warmup=-1, mode="cpu")


def test_compute_streams_is_swept_when_asked():
    sweep = tune_pipeline(lambda i: np.ones(4) * i, compute, range(4), depths=(2,),
                          workers=(1,), compute_streams=(1, 2), repeats=1, mode="cpu")
    frame = sweep.to_frame()
    assert sorted(frame["compute_streams"]) == [1, 2] and set(frame["status"]) == {"ok"}
    plain = tune_pipeline(lambda i: np.ones(4) * i, compute, range(4), depths=(2,),
                          workers=(1,), repeats=1, mode="cpu").to_frame()
    assert "compute_streams" not in plain.columns  # not swept: not a column


def test_compute_streams_must_be_positive():
    with pytest.raises(pl.PycLabError, match="compute_streams"):
        pl.Pipeline(lambda i: np.ones(2), compute, mode="cpu", compute_streams=0)
