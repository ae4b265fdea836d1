"""The timeline widget: Gantt picture, deterministic reprs, static and live views."""

from __future__ import annotations

import re

import pytest

from pyc_lab.runtime.trace import Trace
from pyc_lab.widgets import display
from pyc_lab.widgets import timeline as tl
from pyc_lab.widgets.timeline import TimelineWidget, compare, stage_color

MS = 1e-3
T0 = 50.0


def pipeline_trace(name: str = "synthetic", late: float = 5.0) -> Trace:
    """Four items, two CPU workers, three streams; item 3's compute starts at ``late`` ms."""
    t = Trace(name=name)
    compute = {0: (1.5, 2.5), 1: (2.5, 3.5), 2: (3.5, 4.5), 3: (late, late + 1.0)}
    for i in range(4):
        worker = f"cpu-worker-{i % 2}"
        t.record(i, "prepare", worker, T0 + i * MS, T0 + (i + 0.75) * MS)
        t.record(i, "h2d", "stream h2d", T0 + (i + 1) * MS, T0 + (i + 1.5) * MS, 1_000_000)
        c0, c1 = compute[i]
        t.record(i, "compute", "stream compute", T0 + c0 * MS, T0 + c1 * MS)
        t.record(i, "d2h", "stream d2h", T0 + c1 * MS, T0 + (c1 + 0.25) * MS, 250_000)
    return t


def _stage_bars(fig):
    return [t for t in fig.data if t.type == "bar" and t.name != tl.GAP_TRACE_NAME]


def test_figure_has_one_horizontal_bar_trace_per_stage_based_at_start_ms():
    t = pipeline_trace()
    fig = TimelineWidget(t).figure()
    bars = _stage_bars(fig)
    assert [b.name for b in bars] == ["prepare", "h2d", "compute", "d2h"]
    frame = t.to_frame()
    for bar in bars:
        rows = frame[frame["stage"] == bar.name]
        assert bar.orientation == "h"
        assert list(bar.base) == pytest.approx(rows["start_ms"].tolist(), abs=1e-12)
        assert list(bar.x) == pytest.approx(rows["duration_ms"].tolist(), abs=1e-12)
        assert list(bar.y) == rows["lane"].tolist()
        assert bar.marker.color == stage_color(bar.name)
        assert "bytes" in bar.hovertemplate and "item" in bar.hovertemplate
    assert fig.layout.barmode == "overlay"
    assert list(fig.layout.yaxis.categoryarray) == [
        "cpu-worker-0", "cpu-worker-1", "stream h2d", "stream compute", "stream d2h"]
    assert fig.layout.xaxis.title.text == "time (ms)"
    assert "copy hidden 66.7%" in fig.layout.title.text


def test_starvation_gaps_are_shaded_on_the_compute_lane():
    fig = TimelineWidget(pipeline_trace()).figure()
    gap = next(t for t in fig.data if t.name == tl.GAP_TRACE_NAME)
    assert list(gap.y) == ["stream compute"]
    assert list(gap.base) == pytest.approx([4.5], abs=1e-9)
    assert list(gap.x) == pytest.approx([0.5], abs=1e-9)
    fig = TimelineWidget(pipeline_trace(late=4.5)).figure()  # no gap any more
    assert all(t.name != tl.GAP_TRACE_NAME for t in fig.data)


def test_stage_colours_are_fixed_and_distinct():
    colours = [stage_color(s) for s in ("prepare", "h2d", "compute", "d2h")]
    assert len(set(colours)) == 4
    assert stage_color("decode") == stage_color("decode")


def test_text_is_deterministic_and_exact():
    text = TimelineWidget(pipeline_trace()).to_text()
    assert text == TimelineWidget(pipeline_trace()).to_text()
    assert text.splitlines()[:9] == [
        "Timeline synthetic",
        "4 items, 16 spans, wall 6.250 ms",
        "busy ms: prepare 3.000, h2d 2.000, compute 4.000, d2h 1.000",
        "copy hidden behind compute: 66.7% (2.000 of 3.000 ms)",
        "GPU idle: 20.0% of wall",
        "starvation gaps (>= 0.050 ms): 1, 0.500 ms in all",
        "achieved: H2D 2.00 GB/s, D2H 1.00 GB/s",
        "max-stage bound 4.000 ms (compute) vs actual 6.250 ms: efficiency 64.0%",
        "with fill and drain 5.500 ms: efficiency 88.0%",
    ]
    assert "Spans per lane and stage:" in text
    counts = text.split("Spans per lane and stage:\n")[1].splitlines()
    assert counts[-1].split() == ["stream", "d2h", "0", "0", "0", "4"]


def test_reprs_are_deterministic_and_free_of_addresses():
    a, b = TimelineWidget(pipeline_trace()), TimelineWidget(pipeline_trace())
    assert a.to_html() == b.to_html()
    assert repr(a) == a.to_text()
    for text in (a.to_text(), a.to_html()):
        assert not re.search(r"0x[0-9a-f]{6,}", text)
        assert " at 0x" not in text
    assert "Overlap metrics" in a.to_html() and "Spans per lane and stage" in a.to_html()


def test_an_empty_trace_still_draws_and_describes_itself():
    w = TimelineWidget(Trace(name="nothing"))
    assert w.to_text() == "Timeline nothing\nempty trace: no spans recorded"
    assert "empty trace" in w.to_html()
    assert "empty trace" in w.figure().layout.title.text


def test_static_bundle_without_a_frontend():
    bundle = TimelineWidget(pipeline_trace())._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"].startswith("Timeline synthetic\n")


def test_live_bundle_is_a_widget_with_deterministic_text(monkeypatch):
    monkeypatch.setattr(display, "has_live_frontend", lambda: True)
    bundle = TimelineWidget(pipeline_trace())._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == TimelineWidget(pipeline_trace()).to_text()


def test_compare_stacks_two_traces_with_one_legend_entry_per_stage():
    before, after = pipeline_trace("pageable"), pipeline_trace("pinned", late=4.5)
    fig = compare(before, after, labels=("pageable", "pinned"))
    bars = _stage_bars(fig)
    assert len(bars) == 8
    assert [b.name for b in bars if b.showlegend] == ["prepare", "h2d", "compute", "d2h"]
    assert {b.yaxis for b in bars} == {"y", "y2"}
    titles = [a.text for a in fig.layout.annotations]
    assert titles[0].startswith("pageable: copy hidden") and titles[1].startswith("pinned:")
    assert tuple(fig.layout.yaxis2.categoryarray)[:1] == ("cpu-worker-0",)
