"""ManyTuningChart: the replayed H200 tuning of several problems, as a chart and tables."""

from __future__ import annotations

import pytest

import pyc_lab as pl
from pyc_lab.widgets import ManyTuningChart


@pytest.fixture(scope="module")
def many():
    return pl.autotune_many([(4096, 4096, 4096, "f16"), (2048, 2048, 2048, "bf16"),
                             (1000, 1000, 1000, "f16")], replay=True, max_candidates=4)


def test_the_chart_shows_each_problem_and_why_one_was_not_tuned(many):
    chart = ManyTuningChart(many)
    frame = chart.to_frame()
    assert list(frame["problem"]) == ["f16 tn 4096x4096x4096", "bf16 tn 2048x2048x2048",
                                      "f16 tn 1000x1000x1000"]
    tuned = frame[frame["status"] != "not tuned"]
    assert len(tuned) == 2 and tuned["speedup"].notna().all()
    for speedup, winner in zip(tuned["speedup"], tuned["winner"], strict=True):
        # the winner is CUTLASS exactly when it beat the best library in the run
        assert str(winner).startswith("cutlass:") == (speedup > 1.0)
    text = chart.to_text()
    assert "3 problem(s), 2 replayed" in text
    assert "not tuned: f16 tn 1000x1000x1000:" in text
    html = chart.to_html()
    assert "<table" in html and "Not tuned:" in html and "1000x1000x1000" in html


def test_the_figure_has_one_bar_per_tuned_problem(many):
    pytest.importorskip("plotly")
    fig = ManyTuningChart(many).figure()
    (bars,) = [t for t in fig.data if t.type == "bar"]
    assert list(bars.x) == ["f16 tn 4096x4096x4096", "bf16 tn 2048x2048x2048"]
    assert all(y > 0 for y in bars.y)


def test_other_objects_are_refused():
    with pytest.raises(pl.PycLabError, match="ManyResult"):
        ManyTuningChart({"not": "a result"})
