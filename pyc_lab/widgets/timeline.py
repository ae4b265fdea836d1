"""The timeline widget: a Gantt chart of a :class:`~pyc_lab.profiling.trace.Trace`.

One horizontal lane per CPU worker or CUDA stream (workers first, then streams), one
colour per stage, bars placed at their start on a millisecond axis, hover details per
span, compute starvation gaps shaded, and the overlap summary in the title.

A CPU-mode belt (``Pipeline(mode="cpu")``, whose spans say ``mode="cpu"``) has no GPU:
its copy and compute lanes are host threads and its copies go from host buffer to host
buffer. Its timeline says so — "copy-in thread", "compute thread", "copy-out thread",
stages "copy in" / "copy out", no GPU idle time and no H2D/D2H bandwidth — while a GPU
trace keeps the stream and stage names of CUDA.

In a Jupyter kernel with ipywidgets the view is live (a plotly FigureWidget above the
tables); elsewhere it is static HTML and text. Its ``text/plain`` and ``text/html``
reprs hold no addresses or ids: for the same trace they are the same.
"""

from __future__ import annotations

from typing import Any

from ..profiling.overlap import HOST_STAGE_WORDS, OverlapReport
from ..profiling.spans import lane_order, stage_order
from ..profiling.trace import Trace
from .display import (
    ChartView,
    column_label,
    escape,
    format_number,
    frame_html,
    plotly_text,
    require_plotly,
)

__all__ = ["TimelineWidget", "compare", "is_host_trace", "lane_label", "stage_color",
           "stage_label"]

#: What the belt's CPU-mode lanes are (host threads, not CUDA streams).
HOST_LANE_WORDS = {"stream h2d": "copy-in thread", "stream compute": "compute thread",
                   "stream d2h": "copy-out thread"}

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


def is_host_trace(trace: Trace) -> bool:
    """Whether ``trace`` comes from a CPU-mode belt: every span it keeps says
    ``mode="cpu"`` (the belt records its mode with each span)."""
    modes = {s.meta.get("mode") for s in trace.spans}
    return modes == {"cpu"}


def lane_label(lane: str, host: bool) -> str:
    """A lane's name as shown: a CPU-mode belt's ``stream h2d`` is its copy-in thread."""
    return HOST_LANE_WORDS.get(lane, lane) if host else lane


def stage_label(stage: str, host: bool) -> str:
    """A stage's name as shown: in CPU mode ``h2d``/``d2h`` are "copy in"/"copy out"."""
    return HOST_STAGE_WORDS.get(stage, stage) if host else stage


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
    host
        Whether the trace's lanes are host threads (a CPU-mode belt), which changes the
        words (see the module's docstring); ``None`` tells from the spans
        (:func:`is_host_trace`).
    """

    def __init__(self, trace: Trace, *, title: str | None = None,
                 gap_threshold_s: float | None = None, host: bool | None = None):
        self.trace = trace
        self.title = title if title is not None else trace.name
        self.gap_threshold_s = gap_threshold_s
        self.host = is_host_trace(trace) if host is None else bool(host)

    def overlap(self) -> OverlapReport:
        """The trace's overlap report."""
        return self.trace.overlap(gap_threshold_s=self.gap_threshold_s)

    # -- pictures -------------------------------------------------------------------
    def figure(self) -> Any:
        """The Gantt chart as a plotly ``go.Figure``."""
        go = require_plotly()
        fig = go.Figure()
        report = self.overlap()
        for tr in _bar_traces(go, self.trace, report, self.host):
            fig.add_trace(tr)
        lanes = [lane_label(lane, self.host) for lane in lane_order(self.trace.lanes)]
        headline = report.headline(host=self.host) if report.n_spans else "empty trace"
        fig.update_layout(
            barmode="overlay",
            title=dict(text=plotly_text(f"{self.title} — {headline}"), font=dict(size=13),
                       x=0.01, xanchor="left", y=0.98, yanchor="top"),
            xaxis=dict(title="time (ms)", zeroline=False),
            yaxis=dict(categoryorder="array", categoryarray=lanes, autorange="reversed",
                       title=None),
            height=max(260, 150 + 36 * len(lanes)), autosize=True,
            margin=dict(l=10, r=10, t=80, b=10), plot_bgcolor="white",
            legend=dict(title="stage", orientation="h", x=1, xanchor="right", y=1.0,
                        yanchor="bottom"),
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
        return pd.DataFrame(
            table.to_numpy(),
            index=pd.Index([lane_label(lane, self.host) for lane in lanes], name="lane"),
            columns=pd.Index([stage_label(st, self.host) for st in stages], name="spans"))

    def _metrics(self, report: OverlapReport) -> Any:
        """The overlap metrics as a two-column table for people: names in words, values
        with their units, in this trace's words (see the module's docstring)."""
        import pandas as pd

        rows = []
        for metric, value in report.to_frame().itertuples(index=False):
            label, unit = _metric_words(str(metric), self.host)
            if unit == "%" and metric.endswith(("_fraction", "efficiency")):
                value = None if value is None else 100 * value
            text = format_number(value) if not isinstance(value, str) else (
                stage_label(value, self.host))
            rows.append((label, text if unit is None or text == "–" else f"{text} {unit}"))
        return pd.DataFrame(rows, columns=["metric", "value"])

    def to_text(self) -> str:
        """Deterministic text: the overlap summary, then span counts per lane and stage."""
        report = self.overlap()
        text = f"Timeline {self.title}\n{report.summary(host=self.host)}"
        if report.n_spans:
            text += "\n\nSpans per lane and stage:\n" + self._counts().to_string()
        return text

    def to_html(self) -> str:
        """Deterministic HTML: summary lines, overlap metrics, span counts."""
        report = self.overlap()
        parts = [f"<div class='pyc-lab-timeline' style='line-height:normal'>"
                 f"<h4>Timeline {escape(self.title)}</h4><ul>"]
        parts += [f"<li>{escape(line)}</li>"
                  for line in report.summary(host=self.host).splitlines()]
        parts.append("</ul>")
        if report.n_spans:
            parts.append("<div style='display:flex;flex-wrap:wrap;gap:4px 32px;"
                         "align-items:flex-start'>")
            parts.append(frame_html(self._metrics(report), "Overlap metrics"))
            parts.append(frame_html(self._counts(), "Spans per lane and stage", labels=False))
            parts.append("</div>")
        parts.append("</div>")
        return "".join(parts)


def _metric_words(metric: str, host: bool) -> tuple[str, str | None]:
    """The words and unit of an :meth:`OverlapReport.to_frame` metric."""
    fixed = {
        "wall_ms": ("wall", "ms"),
        "copy_hidden_pct": ("copy hidden behind compute", "%"),
        "gpu_idle_fraction": (("copy/compute threads all idle" if host else "GPU idle"), "%"),
        "starvation_gaps": ("compute starvation gaps", None),
        "starvation_ms": ("starvation, in all", "ms"),
        "h2d_gbps": (("copy in (host to host)" if host else "H2D"), "GB/s"),
        "d2h_gbps": (("copy out (host to host)" if host else "D2H"), "GB/s"),
        "max_stage_bound_ms": ("max-stage bound", "ms"),
        "bound_stage": ("bound stage", None),
        "efficiency": ("efficiency (bound / wall)", "%"),
        "pipeline_bound_ms": ("bound with fill and drain", "ms"),
        "pipeline_efficiency": ("efficiency with fill and drain", "%"),
    }
    if metric in fixed:
        return fixed[metric]
    if metric.endswith("_busy_ms"):
        return f"{stage_label(metric[:-len('_busy_ms')], host)} busy", "ms"
    return column_label(metric), None


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
    hosts = [is_host_trace(t) for t in traces]
    reports = [t.overlap(gap_threshold_s=gap_threshold_s) for t in traces]
    titles = [plotly_text(f"{label}: {r.headline(host=host)}" if r.n_spans
                          else f"{label}: empty trace")
              for label, r, host in zip(labels, reports, hosts, strict=True)]
    lanes = [[lane_label(lane, host) for lane in lane_order(t.lanes)]
             for t, host in zip(traces, hosts, strict=True)]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=titles,
                        vertical_spacing=0.14,
                        row_heights=[max(1, len(lanes[0])), max(1, len(lanes[1]))])
    seen: set[str] = set()
    for row, (trace, report, host) in enumerate(zip(traces, reports, hosts, strict=True),
                                                start=1):
        for bar in _bar_traces(go, trace, report, host):
            bar.legendgroup = bar.name
            bar.showlegend = bar.name not in seen
            seen.add(bar.name)
            fig.add_trace(bar, row=row, col=1)
        fig.update_yaxes(categoryorder="array", categoryarray=lanes[row - 1],
                         autorange="reversed", row=row, col=1)
    fig.update_xaxes(title_text="time (ms)", row=2, col=1)
    fig.update_layout(barmode="overlay", plot_bgcolor="white", autosize=True,
                      height=max(400, 200 + 36 * (len(lanes[0]) + len(lanes[1]))),
                      margin=dict(l=10, r=10, t=60, b=10),
                      legend=dict(title="stage", orientation="h", x=0, y=-0.1,
                                  yanchor="top"))
    return fig


def _bar_traces(go: Any, trace: Trace, report: OverlapReport, host: bool) -> list[Any]:
    """One horizontal bar trace per stage, plus one for compute starvation gaps, with
    lanes and stages named for a GPU or a CPU-mode (``host``) trace."""
    frame = trace.to_frame()
    bars = []
    for stage in stage_order(frame["stage"].unique()):
        rows = frame[frame["stage"] == stage]
        name = stage_label(stage, host)
        lanes = [lane_label(lane, host) for lane in rows["lane"].tolist()]
        custom = list(zip(rows["item"].tolist(), [name] * len(rows),
                          rows["start_ms"].tolist(), rows["duration_ms"].tolist(),
                          rows["nbytes"].tolist(), lanes,
                          [plotly_text(label) for label in rows["label"].tolist()],
                          strict=True))
        bars.append(go.Bar(
            name=name, orientation="h", y=lanes,
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
        lane = lane_label(compute["lane"].value_counts().sort_index().idxmax(), host)
        bars.append(go.Bar(
            name=GAP_TRACE_NAME, orientation="h", y=[lane] * len(report.starvation_gaps),
            base=[start * 1e3 for start, _ in report.starvation_gaps],
            x=[length * 1e3 for _, length in report.starvation_gaps],
            marker=dict(color=_GAP_COLOR), width=0.3,
            hovertemplate="compute starved %{x:.3f} ms<extra></extra>",
        ))
    return bars
