"""The timeline widget: a Gantt chart of a :class:`~pyc_lab.profiling.trace.Trace`.

One horizontal lane per CPU worker or CUDA stream (workers first, then streams), one
colour per stage, bars placed at their start on a millisecond axis, hover details per
span, compute starvation gaps shaded, and the overlap summary in the title.

In a Jupyter kernel with ipywidgets the view is live (a plotly FigureWidget above the
tables); elsewhere it is static HTML and text. Its ``text/plain`` and ``text/html``
reprs hold no addresses or ids: for the same trace they are the same.
"""

from __future__ import annotations

from typing import Any

from ..profiling.overlap import OverlapReport
from ..profiling.spans import lane_order, stage_order
from ..profiling.trace import Trace
from .display import ChartView, escape, frame_html, require_plotly

__all__ = ["TimelineWidget", "compare", "stage_color"]

_STAGE_COLORS = {
    "prepare": "#9467bd",
    "h2d": "#1f77b4",
    "compute": "#2ca02c",
    "d2h": "#ff7f0e",
}
_OTHER_COLORS = ["#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
_GAP_COLOR = "rgba(214,39,40,0.35)"
GAP_TRACE_NAME = "starvation gap"


def stage_color(stage: str) -> str:
    """The colour a stage is drawn in (fixed for the pipeline's stages)."""
    if stage in _STAGE_COLORS:
        return _STAGE_COLORS[stage]
    return _OTHER_COLORS[sum(map(ord, stage)) % len(_OTHER_COLORS)]


class TimelineWidget(ChartView):
    """Show a trace as a Gantt chart with its overlap metrics.

    Parameters
    ----------
    trace
        The trace to show (``pipe.trace``).
    title
        A label for the title; the trace's name by default.
    gap_threshold_s
        Passed to :meth:`Trace.overlap`.
    """

    def __init__(self, trace: Trace, *, title: str | None = None,
                 gap_threshold_s: float | None = None):
        self.trace = trace
        self.title = title if title is not None else trace.name
        self.gap_threshold_s = gap_threshold_s

    def overlap(self) -> OverlapReport:
        """The trace's overlap report."""
        return self.trace.overlap(gap_threshold_s=self.gap_threshold_s)

    # -- pictures -------------------------------------------------------------------
    def figure(self) -> Any:
        """The Gantt chart as a plotly ``go.Figure``."""
        go = require_plotly()
        fig = go.Figure()
        report = self.overlap()
        for tr in _bar_traces(go, self.trace, report):
            fig.add_trace(tr)
        lanes = lane_order(self.trace.lanes)
        fig.update_layout(
            barmode="overlay",
            title=dict(text=escape(f"{self.title} — {report.headline()}")
                       if report.n_spans else escape(f"{self.title} — empty trace"),
                       font=dict(size=13)),
            xaxis=dict(title="time (ms)", zeroline=False),
            yaxis=dict(categoryorder="array", categoryarray=lanes, autorange="reversed",
                       title=None),
            height=max(220, 70 + 42 * len(lanes)),
            margin=dict(l=10, r=10, t=60, b=40), plot_bgcolor="white",
            legend=dict(title="stage", orientation="h", y=-0.25),
            hoverlabel=dict(align="left"),
        )
        fig.update_xaxes(showgrid=True, gridcolor="#eee")
        return fig

    # -- text and HTML -----------------------------------------------------------------
    def _counts(self) -> Any:
        import pandas as pd

        frame = self.trace.to_frame()
        lanes = lane_order(frame["lane"].unique())
        stages = stage_order(frame["stage"].unique())
        table = (frame.groupby(["lane", "stage"]).size().unstack(fill_value=0)
                 .reindex(index=lanes, columns=stages, fill_value=0))
        return pd.DataFrame(table.to_numpy(), index=pd.Index(lanes, name="lane"),
                            columns=pd.Index(stages, name="spans"))

    def to_text(self) -> str:
        """Deterministic text: the overlap summary, then span counts per lane and stage."""
        report = self.overlap()
        text = f"Timeline {self.title}\n{report.summary()}"
        if report.n_spans:
            text += "\n\nSpans per lane and stage:\n" + self._counts().to_string()
        return text

    def to_html(self) -> str:
        """Deterministic HTML: summary lines, overlap metrics, span counts."""
        report = self.overlap()
        parts = [f"<div class='pyc-lab-timeline'><h4>Timeline {escape(self.title)}</h4><ul>"]
        parts += [f"<li>{escape(line)}</li>" for line in report.summary().splitlines()]
        parts.append("</ul>")
        if report.n_spans:
            parts.append(frame_html(report.to_frame(), "Overlap metrics"))
            parts.append(frame_html(self._counts(), "Spans per lane and stage"))
        parts.append("</div>")
        return "".join(parts)


def compare(before: Trace, after: Trace, *, labels: tuple[str, str] = ("before", "after"),
            gap_threshold_s: float | None = None) -> Any:
    """Two timelines stacked on one millisecond axis (e.g. pageable vs pinned).

    Parameters
    ----------
    before, after
        The traces; each is drawn from its own first span (time 0).
    labels
        Row titles, each followed by that trace's overlap headline.
    gap_threshold_s
        Passed to :meth:`Trace.overlap`.

    Returns
    -------
    plotly.graph_objects.Figure
        Two rows sharing the x axis, one legend entry per stage.
    """
    go = require_plotly()
    from plotly.subplots import make_subplots

    traces = (before, after)
    reports = [t.overlap(gap_threshold_s=gap_threshold_s) for t in traces]
    titles = [escape(f"{label}: {r.headline()}" if r.n_spans else f"{label}: empty trace")
              for label, r in zip(labels, reports, strict=True)]
    lanes = [lane_order(t.lanes) for t in traces]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=titles,
                        vertical_spacing=0.12,
                        row_heights=[max(1, len(lanes[0])), max(1, len(lanes[1]))])
    seen: set[str] = set()
    for row, (trace, report) in enumerate(zip(traces, reports, strict=True), start=1):
        for bar in _bar_traces(go, trace, report):
            bar.legendgroup = bar.name
            bar.showlegend = bar.name not in seen
            seen.add(bar.name)
            fig.add_trace(bar, row=row, col=1)
        fig.update_yaxes(categoryorder="array", categoryarray=lanes[row - 1],
                         autorange="reversed", row=row, col=1)
    fig.update_xaxes(title_text="time (ms)", row=2, col=1)
    fig.update_layout(barmode="overlay", plot_bgcolor="white",
                      height=max(360, 140 + 42 * (len(lanes[0]) + len(lanes[1]))),
                      margin=dict(l=10, r=10, t=60, b=40),
                      legend=dict(title="stage", orientation="h", y=-0.15))
    return fig


def _bar_traces(go: Any, trace: Trace, report: OverlapReport) -> list[Any]:
    """One horizontal bar trace per stage, plus one for compute starvation gaps."""
    frame = trace.to_frame()
    bars = []
    for stage in stage_order(frame["stage"].unique()):
        rows = frame[frame["stage"] == stage]
        custom = list(zip(rows["item"].tolist(), rows["stage"].tolist(),
                          rows["start_ms"].tolist(), rows["duration_ms"].tolist(),
                          rows["nbytes"].tolist(), rows["lane"].tolist(),
                          rows["label"].tolist(), strict=True))
        bars.append(go.Bar(
            name=stage, orientation="h", y=rows["lane"].tolist(),
            base=rows["start_ms"].tolist(), x=rows["duration_ms"].tolist(),
            marker=dict(color=stage_color(stage), line=dict(color="white", width=0.5)),
            customdata=custom,
            hovertemplate=("item %{customdata[0]} · <b>%{customdata[1]}</b> on "
                           "%{customdata[5]}<br>%{customdata[6]}<br>start %{customdata[2]:.3f}"
                           " ms, duration %{customdata[3]:.3f} ms<br>%{customdata[4]:,} bytes"
                           "<extra></extra>"),
        ))
    if report.starvation_gaps and len(frame):
        compute = frame[frame["stage"] == "compute"]
        lane = compute["lane"].value_counts().sort_index().idxmax()
        bars.append(go.Bar(
            name=GAP_TRACE_NAME, orientation="h", y=[lane] * len(report.starvation_gaps),
            base=[start * 1e3 for start, _ in report.starvation_gaps],
            x=[length * 1e3 for _, length in report.starvation_gaps],
            marker=dict(color=_GAP_COLOR), width=0.3,
            hovertemplate="compute starved %{x:.3f} ms<extra></extra>",
        ))
    return bars

