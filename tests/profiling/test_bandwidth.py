"""The bandwidth probe on the CPU path (and on a GPU where there is one), its argument
checks and its summary."""

from __future__ import annotations

import pandas as pd
import pytest

import pyc_lab as pl
from pyc_lab.profiling import bandwidth as bwmod
from pyc_lab.profiling import timing
from pyc_lab.profiling.bandwidth import bandwidth_summary
from pyc_lab.units import format_bytes


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(bwmod, "cupy_status", lambda: (None, "no driver (test)"))


def test_cpu_path_measures_host_memcpy_and_marks_gpu_rows(no_gpu):
    df = pl.probe_bandwidth(sizes=[4096, 1 << 20], min_time_s=0.001)
    host = df[df["kind"] == "host_memcpy"]
    assert list(host["size_bytes"]) == [4096, 1 << 20]
    assert (host["status"] == "ok").all()
    assert (host["gbps"] > 0).all() and (host["repeats"] >= 3).all()
    assert set(host["timer"]) == {"perf_counter"}
    gpu = df[df["kind"] != "host_memcpy"]
    assert set(gpu["kind"]) == set(bwmod.KINDS)
    assert all(s == "needs a CUDA device: no driver (test)" for s in gpu["status"])
    assert df.attrs["device"] == "CPU only"
    assert "no driver (test)" in df.attrs["note"]


def test_host_copies_are_timed_by_the_one_primitive(no_gpu, monkeypatch):
    seen = []

    def spy(fn, *args, **kwargs):
        seen.append(kwargs)
        return timing.benchmark(fn, *args, **kwargs)

    monkeypatch.setattr(bwmod, "benchmark", spy)
    df = pl.probe_bandwidth(kinds=[], sizes=[4096, 8192], min_time_s=0.001, max_repeats=7)
    assert [kw["name"] for kw in seen] == ["host_memcpy 4 KiB", "host_memcpy 8 KiB"]
    assert all(kw["gpu"] is False and kw["warmup"] == 1 and kw["repeats"] == 7
               and kw["min_time_s"] == 0.001 for kw in seen)
    assert (df["repeats"] <= 7).all() and (df["repeats"] >= 3).all()


def test_gbps_counts_read_plus_write_for_memcpy(no_gpu):
    df = pl.probe_bandwidth(kinds=[], sizes=[1 << 20], min_time_s=0.001)
    row = df.iloc[0]
    assert row["gbps"] == pytest.approx(2 * row["size_bytes"] / (row["median_ms"] / 1e3) / 1e9,
                                        rel=1e-3)


@pytest.mark.parametrize("kwargs, message", [
    ({"kinds": ["h2d", "d2d"]}, "unknown bandwidth kind"),
    ({"sizes": [0]}, "sizes must be positive"),
    ({"sizes": []}, "sizes must be positive"),
    ({"sizes": [1.5]}, "sizes must be positive"),
    ({"min_time_s": 0}, "min_time_s must be a number of seconds > 0"),
    ({"max_repeats": 0}, "max_repeats must be an integer >= 1"),
])
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(pl.PycLabError, match=message):
        pl.probe_bandwidth(**kwargs)


def test_summary_takes_best_size_per_kind_and_groups_skips():
    df = pd.DataFrame([
        {"kind": "h2d_pinned", "peer": None, "size": "4 KiB", "gbps": 3.0,
         "theoretical_gbps": 63.0, "pct_of_theoretical": 4.8, "status": "ok"},
        {"kind": "h2d_pinned", "peer": None, "size": "1 GiB", "gbps": 55.0,
         "theoretical_gbps": 63.0, "pct_of_theoretical": 87.3, "status": "ok"},
        {"kind": "peer", "peer": None, "size": None, "gbps": None,
         "theoretical_gbps": None, "pct_of_theoretical": None, "status": "needs two or more GPUs"},
    ])
    s = bandwidth_summary(df)
    first = s.iloc[0]
    assert first["kind"] == "h2d_pinned" and first["best_gbps"] == 55.0
    assert first["at_size"] == "1 GiB"
    assert s.iloc[1]["note"] == "needs two or more GPUs"


def test_format_bytes():
    assert format_bytes(4096) == "4 KiB"
    assert format_bytes(1 << 30) == "1 GiB"
    assert format_bytes(3 << 19) == "1.5 MiB"
    assert format_bytes(100) == "100 B"


@pytest.mark.gpu
def test_gpu_copies_are_timed_with_cuda_events():
    df = pl.probe_bandwidth(kinds=["h2d_pinned", "d2h_pageable", "d2d"],
                            sizes=[4096, 1 << 20], min_time_s=0.001, max_repeats=10)
    gpu = df[df["kind"] != "peer"]
    assert list(gpu["kind"]) == ["h2d_pinned"] * 2 + ["d2h_pageable"] * 2 + ["d2d"] * 2
    assert (gpu["status"] == "ok").all() and set(gpu["timer"]) == {"cuda events"}
    assert (gpu["gbps"] > 0).all() and gpu["repeats"].between(3, 10).all()
    assert list(df.columns) == bwmod._COLUMNS
