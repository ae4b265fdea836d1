"""SweepChart: the belt sweep's table, text and chart (deterministic for a given sweep)."""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.runtime.belt_tuning import BeltSweep, tune_pipeline
from pyc_lab.widgets import SweepChart


def synthetic() -> BeltSweep:
    def row(depth, workers, ms, status="ok", message=""):
        return {"depth": depth, "workers": workers, "status": status,
                "median_s": None if ms is None else ms / 1e3, "copy_hidden_pct": 50.0,
                "efficiency": 0.5, "pipeline_efficiency": 0.9, "message": message}

    rows = [row(1, 1, 40.0), row(2, 1, 25.0), row(1, 2, 30.0), row(2, 2, 12.5),
            row(4, 2, None, "error", "item 3: prepare failed: ValueError: bad")]
    best = dict(rows[3])
    return BeltSweep(rows=rows, best=best, strategy="exhaustive", stopped_by="exhausted")


def test_table_is_fastest_first_with_failures_last():
    frame = SweepChart(synthetic()).to_frame()
    assert frame["median_ms"].tolist()[:4] == [12.5, 25.0, 30.0, 40.0]
    assert frame["status"].tolist() == ["ok"] * 4 + ["error"]
    assert list(frame.columns)[:3] == ["depth", "workers", "status"]


def test_text_is_exact_and_names_the_best():
    text = SweepChart(synthetic()).to_text()
    assert text.splitlines()[0] == ("Belt sweep: 5 configuration(s), strategy exhaustive, "
                                    "stopped by exhausted; best depth=2, workers=2: 12.500 ms")
    assert "item 3: prepare failed" in text
    assert text == SweepChart(synthetic()).to_text()
    assert "item 3: prepare failed" in SweepChart(synthetic()).to_html()


def test_figure_has_a_line_per_worker_count_and_the_best_starred():
    fig = SweepChart(synthetic()).figure()
    names = [t.name for t in fig.data]
    assert names == ["workers=1", "workers=2", "best"]
    assert list(fig.data[1].x) == [1, 2] and list(fig.data[1].y) == [30.0, 12.5]
    assert list(fig.data[2].y) == [12.5] and fig.data[2].marker.symbol == "star"
    assert "1 failed" in fig.layout.title.text


def test_a_real_cpu_sweep_draws():
    sweep = tune_pipeline(lambda i: np.full(8, float(i)), lambda a: a + 1, range(6),
                          depths=(1, 2), workers=(1, 2), compute_streams=(1, 2),
                          repeats=1, mode="cpu")
    chart = SweepChart(sweep)
    assert len(chart.to_frame()) == 8
    names = [t.name for t in chart.figure().data]
    assert "best" in names and "workers=1, compute_streams=2" in names


def test_bad_input():
    with pytest.raises(PycLabError, match="BeltSweep"):
        SweepChart([1, 2])
    with pytest.raises(PycLabError, match="no configuration"):
        SweepChart(BeltSweep())


def test_tables_write_numbers_for_people():
    chart = SweepChart(synthetic())
    text, html = chart.to_text(), chart.to_html()
    assert text.splitlines()[1].split()[:6] == ["depth", "workers", "status", "median", "(ms)",
                                                "copy"]
    assert "<th>median (ms)</th>" in html and "<th>copy hidden (%)</th>" in html
    assert "12.50000" not in text and "<td>12.5</td>" in html
    assert chart.to_frame()["median_ms"].tolist()[0] == 12.5  # the data stay numbers
