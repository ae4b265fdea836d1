"""The belt sweep chart: what :func:`~pyc_lab.runtime.belt_tuning.tune_pipeline` measured.

Median wall time against depth, one line per setting of the other swept parameters
(workers, compute streams, chunk size), the fastest configuration starred and failed
ones listed with their error. Live (plotly) in a Jupyter kernel, static HTML and text
elsewhere; the reprs hold no addresses.
"""

from __future__ import annotations

from typing import Any

from ..errors import PycLabError
from ..runtime.belt_tuning import BeltSweep
from .display import ChartView, escape, frame_html, frame_text, plotly_text, require_plotly

__all__ = ["SweepChart"]

_SWEPT = ("workers", "compute_streams", "chunk")
_COLUMNS = ["depth", *_SWEPT, "status", "median_ms", "copy_hidden_pct", "efficiency",
            "pipeline_efficiency", "message"]


class SweepChart(ChartView):
    """Show a belt sweep: time per configuration, the best one marked.

    Parameters
    ----------
    sweep
        What :func:`~pyc_lab.runtime.belt_tuning.tune_pipeline` returned.
    title
        A caption (default: ``"Belt sweep"``).

    Raises
    ------
    PycLabError
        If ``sweep`` is not a :class:`~pyc_lab.runtime.belt_tuning.BeltSweep` or holds no
        configuration.
    """

    def __init__(self, sweep: BeltSweep, *, title: str = "Belt sweep") -> None:
        if not isinstance(sweep, BeltSweep):
            raise PycLabError(f"SweepChart shows what tune_pipeline returned (a BeltSweep), "
                              f"not {type(sweep).__name__}")
        if not sweep.rows:
            raise PycLabError("SweepChart: the sweep tried no configuration")
        self.sweep = sweep
        self.title = title

    # -- data ---------------------------------------------------------------------------
    def to_frame(self) -> Any:
        """One row per configuration, fastest first, failures last; times in ms."""
        import pandas as pd

        frame = pd.DataFrame(self.sweep.rows)
        frame["median_ms"] = frame["median_s"] * 1e3
        cols = [c for c in _COLUMNS if c in frame.columns]
        ok = frame["status"] == "ok"
        keys = ["depth", *[c for c in _SWEPT if c in frame.columns]]
        good = frame[ok].sort_values(["median_ms", *keys])
        bad = frame[~ok].sort_values(keys)
        return pd.concat([good, bad])[cols].reset_index(drop=True)


    def _best_text(self) -> str:
        best = self.sweep.best
        if best is None:
            return "no configuration ran"
        keys = ", ".join(f"{k}={best[k]}" for k in ("depth", *_SWEPT) if k in best)
        return f"best {keys}: {best['median_s'] * 1e3:.3f} ms"

    # -- pictures -------------------------------------------------------------------------
    def figure(self) -> Any:
        """Median wall time (ms) against depth, a line per setting of the other
        parameters, the best configuration starred."""
        go = require_plotly()
        frame = self.to_frame()
        ok = frame[frame["status"] == "ok"]
        others = [c for c in _SWEPT if c in frame.columns]  # swept besides depth
        fig = go.Figure()
        groups = ok.groupby(others, sort=True) if others else [((), ok)]
        for key, rows in groups:
            key = key if isinstance(key, tuple) else (key,)
            label = ", ".join(f"{k}={v}" for k, v in zip(others, key, strict=True)) or "all"
            rows = rows.sort_values("depth")
            fig.add_trace(go.Scatter(
                x=rows["depth"].tolist(), y=rows["median_ms"].tolist(), mode="lines+markers",
                name=label, hovertemplate=(f"{plotly_text(label)}, depth %{{x}}<br>"
                                           "%{y:.3f} ms<extra></extra>")))
        best = self.sweep.best
        if best is not None:
            fig.add_trace(go.Scatter(
                x=[best["depth"]], y=[best["median_s"] * 1e3], mode="markers", name="best",
                marker=dict(symbol="star", size=16, color="gold",
                            line=dict(color="black", width=1)),
                hovertemplate=plotly_text(self._best_text()) + "<extra></extra>"))
        failed = int((frame["status"] != "ok").sum())
        note = f" · {failed} failed" if failed else ""
        fig.update_layout(
            title=dict(text=plotly_text(f"{self.title} — {self._best_text()}{note}"),
                       font=dict(size=13)),
            xaxis=dict(title="depth (items in flight)", dtick=1),
            yaxis=dict(title="median wall time (ms)", rangemode="tozero"),
            height=400, autosize=True, margin=dict(l=10, r=10, t=60, b=10),
            plot_bgcolor="white",
            legend=dict(orientation="h", x=0, y=-0.18, yanchor="top"))
        fig.update_xaxes(showgrid=True, gridcolor="#eee")
        fig.update_yaxes(showgrid=True, gridcolor="#eee")
        return fig

    # -- text and HTML ------------------------------------------------------------------------
    def _header(self) -> str:
        return (f"{self.title}: {len(self.sweep.rows)} configuration(s), strategy "
                f"{self.sweep.strategy}, stopped by {self.sweep.stopped_by}; "
                f"{self._best_text()}")

    def to_text(self) -> str:
        """The header line and the table (fastest first), numbers to 4 significant
        digits."""
        return f"{self._header()}\n{frame_text(self.to_frame())}"

    def to_html(self) -> str:
        """The header and the table as HTML, numbers to 4 significant digits."""
        return (f"<div class='pyc-lab-sweep' style='line-height:normal'>"
                f"<h4>{escape(self._header())}</h4>{frame_html(self.to_frame())}</div>")
