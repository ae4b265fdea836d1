"""The timeline widget: Gantt picture, deterministic reprs, static and live views."""

from __future__ import annotations

import re

import pytest

from pyc_lab.profiling.spans import Span
from pyc_lab.profiling.trace import Trace
from pyc_lab.widgets import display
from pyc_lab.widgets import timeline as tl
from pyc_lab.widgets.timeline import TimelineWidget, compare, stage_color
from tests.fakes import traces as fakes

T0 = 50.0


def pipeline_trace(name: str = "synthetic", late: float = 5.0) -> Trace:
    """Four items, two CPU workers, three streams; item 3's compute starts at ``late`` ms."""
    return fakes.pipeline_trace(name, late, workers=2, t0=T0)


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
    assert text.splitlines()[:9] == ["Timeline synthetic", *fakes.SUMMARY_LINES]
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


def host_trace(name: str = "cpu belt", late: float = 5.0) -> Trace:
    """The synthetic trace as a CPU-mode belt records it: every span says ``mode="cpu"``."""
    spans = [Span(s.item, s.stage, s.lane, s.start_s, s.end_s, s.nbytes, {"mode": "cpu"})
             for s in pipeline_trace(name, late).spans]
    return Trace(spans, name=name)


def test_a_cpu_mode_trace_says_what_its_lanes_are():
    w = TimelineWidget(host_trace())
    assert w.host and tl.is_host_trace(host_trace()) and not tl.is_host_trace(pipeline_trace())
    text = w.to_text()
    for gpu_word in ("GPU idle", "H2D", "D2H", "stream h2d", "stream d2h"):
        assert gpu_word not in text
    assert "copy-in, compute and copy-out threads all idle: 20.0% of wall" in text
    assert "host-to-host copies: copy in 2 GB/s, copy out 1 GB/s" in text
    assert "busy ms: prepare 3.000, copy in 2.000, compute 4.000, copy out 1.000" in text
    counts = text.split("Spans per lane and stage:\n")[1].splitlines()
    assert counts[0].split() == ["spans", "prepare", "copy", "in", "compute", "copy", "out"]
    assert [line.rsplit(None, 4)[0] for line in counts[2:]] == [
        "cpu-worker-0", "cpu-worker-1", "copy-in thread", "compute thread", "copy-out thread"]
    html = w.to_html()
    for gpu_word in ("GPU idle", "H2D", "D2H", "stream h2d"):
        assert gpu_word not in html
    assert "copy/compute threads all idle" in html and "copy in (host to host)" in html


def test_a_cpu_mode_timeline_names_threads_and_copies():
    fig = TimelineWidget(host_trace()).figure()
    assert list(fig.layout.yaxis.categoryarray) == [
        "cpu-worker-0", "cpu-worker-1", "copy-in thread", "compute thread", "copy-out thread"]
    bars = _stage_bars(fig)
    assert [b.name for b in bars] == ["prepare", "copy in", "compute", "copy out"]
    assert [b.marker.color for b in bars] == [stage_color(s)
                                              for s in ("prepare", "h2d", "compute", "d2h")]
    assert set(bars[1].y) == {"copy-in thread"} and bars[1].customdata[0][1] == "copy in"
    gap = next(t for t in fig.data if t.name == tl.GAP_TRACE_NAME)
    assert list(gap.y) == ["compute thread"]
    title = fig.layout.title.text
    assert "threads idle 20.0%" in title and "GPU idle" not in title
    both = compare(host_trace("a"), host_trace("b", late=4.5))
    assert all("threads idle" in a.text for a in both.layout.annotations[:2])


def test_a_gpu_trace_keeps_the_words_of_cuda():
    w = TimelineWidget(pipeline_trace())
    assert not w.host
    assert "GPU idle: 20.0% of wall" in w.to_text()
    assert "achieved: H2D 2.00 GB/s, D2H 1.00 GB/s" in w.to_text()
    assert "GPU idle 20.0%" in w.figure().layout.title.text
    assert TimelineWidget(host_trace(), host=False).to_text() == w.to_text().replace(
        "synthetic", "cpu belt")


def test_a_real_cpu_belt_is_recognised():
    import numpy as np

    import pyc_lab as pl

    with pl.Pipeline(lambda i: np.full(64, float(i)), lambda a: a * 2, depth=2,
                     mode="cpu") as belt:
        list(belt.run(range(4)))
    w = TimelineWidget(belt.trace)
    assert w.host and "copy-in thread" in w.to_text() and "GPU idle" not in w.to_text()


def test_overlap_metrics_are_written_with_units():
    html = re.sub(r">\s+<", "><", TimelineWidget(pipeline_trace()).to_html())
    assert not re.search(r"\d\.\d{5,}", html)
    for cell in ("<td>wall</td><td>6.25 ms</td>", "<td>GPU idle</td><td>20 %</td>",
                 "<td>copy hidden behind compute</td><td>66.67 %</td>",
                 "<td>H2D</td><td>2 GB/s</td>", "<td>bound stage</td><td>compute</td>",
                 "<td>efficiency (bound / wall)</td><td>64 %</td>"):
        assert cell in html
    fig = TimelineWidget(pipeline_trace()).figure()
    assert fig.layout.legend.yanchor == "bottom" and fig.layout.legend.y >= 1  # above
    assert fig.layout.width is None
