"""Inference views: running servers, a live latency monitor, the throughput-latency curve.

- :class:`ServersView` — the servers of this process (what ``%pyc_serve`` shows): models,
  tensors, batching settings, endpoint.
- :class:`ServerMonitor` — one served model while it runs: a histogram of its recent
  latencies with p50/p90/p99 marked and its counters, refreshed every ``interval_s`` in
  a live Jupyter front end (a plotly FigureWidget updated from a background thread that
  stops when the server closes).
- :class:`LoadTestChart` — what :func:`~pyc_lab.inference.load_testing.load_test` or
  :func:`~pyc_lab.inference.load_testing.sweep` measured: throughput against p99 latency,
  one line per ``max_batch`` / ``max_delay_ms`` setting, a point per concurrency level;
  pass its :meth:`~LoadTestChart.add` as ``on_level`` to watch the curve grow.

Live (ipywidgets + plotly) in a Jupyter kernel, static HTML and text elsewhere. The
reprs of :class:`ServersView` and :class:`ServerMonitor` hold settings only (no timings,
no ports); :class:`LoadTestChart`'s hold the measured table.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ..errors import PycLabError
from ..inference.load_testing import COLUMNS
from ..inference.server import Server, running_servers
from .display import (
    ChartView,
    View,
    escape,
    frame_html,
    frame_text,
    html_widget,
    plotly_text,
    require_plotly,
)

__all__ = ["LoadTestChart", "ServerMonitor", "ServersView"]

_PERCENTILES = (("p50", 0.5, "#2ca02c"), ("p90", 0.9, "#ff7f0e"), ("p99", 0.99, "#d62728"))


class ServersView(View):
    """The running servers of this process, one row per served model.

    Parameters
    ----------
    servers
        Default: :func:`~pyc_lab.inference.server.running_servers`.
    """

    def __init__(self, servers: Sequence[Server] | None = None) -> None:
        self.servers = list(running_servers() if servers is None else servers)

    def to_frame(self) -> Any:
        """Server, model, tensors, settings and whether HTTP runs."""
        import pandas as pd

        rows = []
        for s in self.servers:
            o = s.options
            for name, m in s.models.items():
                rows.append({
                    "server": s.name, "model": name,
                    "inputs": ", ".join(t.describe() for t in m.inputs),
                    "outputs": ", ".join(t.describe() for t in m.outputs),
                    "max_batch": o.max_batch, "max_delay_ms": o.max_delay_ms,
                    "buckets": " ".join(map(str, o.bucket_sizes)) or "none",
                    "max_queue": o.max_queue, "http": "KServe v2" if s.url else "–"})
        return pd.DataFrame(rows, columns=["server", "model", "inputs", "outputs", "max_batch",
                                           "max_delay_ms", "buckets", "max_queue", "http"])

    def _header(self) -> str:
        n = len(self.servers)
        return "no server is running (start one with pl.serve(model))" if not n else \
            f"{n} running server(s)"

    def to_text(self) -> str:
        """The header and the table."""
        if not self.servers:
            return self._header()
        return f"{self._header()}\n{frame_text(self.to_frame(), labels=False)}"

    def to_html(self) -> str:
        """The header and the table as HTML."""
        body = "" if not self.servers else frame_html(self.to_frame(), labels=False)
        return f"<div class='pyc-lab-servers'><h4>{escape(self._header())}</h4>{body}</div>"

    def widget(self) -> Any:
        """The HTML table in an ipywidgets box (a box, so that the front end lays it out
        as the other views)."""
        import ipywidgets as w

        return w.VBox([html_widget(self.to_html())], layout=w.Layout(width="100%"))


class ServerMonitor(View):
    """A live latency histogram and percentiles of one served model.

    Parameters
    ----------
    server
        The server.
    model
        Which model (needed when the server has several).
    interval_s
        How often the live view refreshes.
    """

    def __init__(self, server: Server, model: str | None = None, *,
                 interval_s: float = 0.5) -> None:
        if not isinstance(server, Server):
            raise PycLabError(f"ServerMonitor shows a pl.serve(...) server, not "
                              f"{type(server).__name__}")
        self.server = server
        self.model = (model or next(iter(server.models))) if len(server.models) == 1 else model
        if self.model is None:
            raise PycLabError(f"{server.name} serves {', '.join(server.models)}: pass model=")
        self.interval_s = float(interval_s)
        self._view: Any = None
        self._stop = threading.Event()

    # -- data --------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The model's counters and percentiles now (:meth:`ModelStats.snapshot`)."""
        return self.server.stats(self.model).snapshot()

    def figure(self) -> Any:
        """The histogram of recent latencies (ms), the percentiles as vertical lines."""
        go = require_plotly()
        stats = self.server.stats(self.model)
        lat = stats.recent_latencies() * 1e3
        fig = go.Figure(go.Histogram(x=lat.tolist(), nbinsx=60, name="latency",
                                     marker_color="#1f77b4", opacity=0.8))
        for label, q, color in _PERCENTILES:
            v = stats.latency.quantile(q)
            if v is not None:
                fig.add_vline(x=v * 1e3, line=dict(color=color, dash="dash"),
                              annotation_text=f"{label} {v * 1e3:.2f} ms",
                              annotation_position="top")
        snap = stats.snapshot()
        title = (f"{self.server.name} / {self.model}: {snap['requests']} requests, "
                 f"{snap['batches']} batches, mean batch "
                 f"{(snap['mean_batch'] or 0):.1f}, {snap['failed']} failed, "
                 f"{snap['rejected']} rejected")
        fig.update_layout(title=dict(text=plotly_text(title), font=dict(size=13)),
                          xaxis=dict(title=f"latency (ms), last {len(lat)} requests"),
                          yaxis=dict(title="requests"), height=360, showlegend=False,
                          margin=dict(l=10, r=10, t=60, b=10), plot_bgcolor="white")
        return fig

    # -- reprs -------------------------------------------------------------------------------
    def _header(self) -> str:
        o = self.server.options
        return (f"latency monitor of {self.server.name} / {self.model} (max_batch="
                f"{o.max_batch}, max_delay_ms={o.max_delay_ms:g}); live in Jupyter")

    def to_text(self) -> str:
        """Settings only (the numbers change while it runs)."""
        return self._header()

    def to_html(self) -> str:
        """Settings only, as HTML."""
        return f"<div class='pyc-lab-monitor'><h4>{escape(self._header())}</h4></div>"

    # -- the live view ---------------------------------------------------------------------------
    def widget(self) -> Any:
        """A FigureWidget refreshed every ``interval_s`` until the server closes."""
        if self._view is not None:
            return self._view
        import ipywidgets as w

        go = require_plotly()
        chart = go.FigureWidget(self.figure())
        table = html_widget()

        def refresh() -> None:
            fresh = self.figure()
            with chart.batch_update():
                chart.data[0].x = fresh.data[0].x
                chart.layout.shapes = fresh.layout.shapes
                chart.layout.annotations = fresh.layout.annotations
                chart.layout.title.text = fresh.layout.title.text
            import pandas as pd

            snap = self.snapshot()
            snap.pop("uptime_s", None)
            table.value = frame_html(pd.DataFrame([snap]))

        def loop() -> None:
            seen = -1
            while not self._stop.wait(self.interval_s):
                if self.server.closed:
                    break
                count = self.server.stats(self.model).requests
                if count == seen:  # nothing new: no figure to rebuild
                    continue
                seen = count
                try:
                    refresh()
                except Exception:  # a closed front end: stop quietly
                    break

        refresh()
        threading.Thread(target=loop, name="pyc-lab-monitor", daemon=True).start()
        self._view = w.VBox([chart, table], layout=w.Layout(width="100%"))
        return self._view

    def stop(self) -> None:
        """Stop refreshing the live view."""
        self._stop.set()


class LoadTestChart(ChartView):
    """Throughput against p99 latency across concurrency and batching settings.

    Parameters
    ----------
    frame
        What ``load_test`` or ``sweep`` returned (or ``None``, to fill with :meth:`add`).
    title
        A caption.
    """

    def __init__(self, frame: Any = None, *, title: str = "Throughput vs latency") -> None:
        import pandas as pd

        self.frame = pd.DataFrame(columns=COLUMNS) if frame is None else frame
        self.title = title
        self._chart: Any = None
        self._table: Any = None

    def add(self, row: dict[str, Any]) -> None:
        """Append one measured level (``load_test(..., on_level=chart.add)``)."""
        import pandas as pd

        new = pd.DataFrame([row], columns=COLUMNS)
        self.frame = new if self.frame.empty else pd.concat([self.frame, new],
                                                            ignore_index=True)
        if self._chart is not None:
            fresh = self.figure()
            with self._chart.batch_update():
                self._chart.data = []
                self._chart.add_traces(list(fresh.data))
            self._table.value = self._tables_html()

    def to_frame(self) -> Any:
        """The measured table without the histograms, latencies in ms."""
        cols = ["max_batch", "max_delay_ms", "concurrency", "throughput_rps", "p50_ms",
                "p99_ms", "queue_mean_ms", "compute_mean_ms", "mean_batch", "errors"]
        return self.frame[[c for c in cols if c in self.frame.columns]].reset_index(drop=True)

    def figure(self) -> Any:
        """A line per (max_batch, max_delay_ms), points labelled by concurrency."""
        go = require_plotly()
        fig = go.Figure()
        f = self.frame
        if not f.empty:
            for (mb, delay), rows in f.groupby(["max_batch", "max_delay_ms"], sort=True):
                rows = rows.sort_values("concurrency")
                label = f"max_batch={mb}, max_delay_ms={delay:g}"
                fig.add_trace(go.Scatter(
                    x=rows["throughput_rps"].tolist(), y=rows["p99_ms"].tolist(),
                    mode="lines+markers+text", name=label,
                    text=[f"c={c}" for c in rows["concurrency"]], textposition="top center",
                    hovertemplate=(f"{plotly_text(label)}<br>%{{text}}: %{{x:.0f}} req/s, "
                                   "p99 %{y:.2f} ms<extra></extra>")))
        fig.update_layout(title=dict(text=plotly_text(self.title), font=dict(size=13)),
                          xaxis=dict(title="throughput (requests/s)", rangemode="tozero"),
                          yaxis=dict(title="p99 latency (ms)", rangemode="tozero"),
                          height=400, margin=dict(l=10, r=10, t=60, b=10),
                          plot_bgcolor="white",
                          legend=dict(orientation="h", x=0, y=-0.18, yanchor="top"))
        fig.update_xaxes(showgrid=True, gridcolor="#eee")
        fig.update_yaxes(showgrid=True, gridcolor="#eee")
        return fig

    def _header(self) -> str:
        n = len(self.frame)
        if not n:
            return f"{self.title}: nothing measured yet"
        best = self.frame.loc[self.frame["throughput_rps"].astype(float).idxmax()]
        return (f"{self.title}: {n} level(s); most throughput at max_batch="
                f"{best['max_batch']}, max_delay_ms={best['max_delay_ms']:g}, concurrency "
                f"{best['concurrency']}")

    def _tables_html(self) -> str:
        return frame_html(self.to_frame()) if len(self.frame) else ""

    def to_text(self) -> str:
        """The header and the table."""
        if not len(self.frame):
            return self._header()
        return f"{self._header()}\n{frame_text(self.to_frame())}"

    def to_html(self) -> str:
        """The header and the table as HTML."""
        return (f"<div class='pyc-lab-loadtest'><h4>{escape(self._header())}</h4>"
                f"{self._tables_html()}</div>")

    def widget(self) -> Any:
        """A FigureWidget that :meth:`add` updates, above the table."""
        import ipywidgets as w

        go = require_plotly()
        self._chart = go.FigureWidget(self.figure())
        self._table = html_widget(self._tables_html())
        return w.VBox([self._chart, self._table], layout=w.Layout(width="100%"))
