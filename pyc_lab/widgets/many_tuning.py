"""The chart of a many-problem tuning: what :func:`~pyc_lab.autotune_many` found.

One bar per problem: the best CUTLASS kernel's speed-up over the best library measured in
the same run (above 1: the tuned kernel is faster and ``pl.matmul`` will run it; at or
below 1: the library keeps the problem), coloured by the winner; problems that could not
be tuned are listed with the reason. A sweep run over a Dask cluster also says how many
workers tuned it, each problem's worker (table and hover), and, given the client, links
its dashboard. Live (plotly) in a Jupyter kernel, static HTML and text elsewhere; the
text repr holds no addresses.
"""

from __future__ import annotations

from typing import Any

from ..errors import PycLabError
from ..kernels.tuning.many import ManyResult
from ..kernels.tuning.result import is_tuned_winner
from .display import ChartView, escape, frame_html, frame_text, plotly_text, require_plotly

__all__ = ["ManyTuningChart"]

_COLUMNS = ["problem", "winner", "speedup", "best_cutlass_ms", "best_library",
            "best_library_ms", "candidates", "ok", "seconds", "status", "worker"]


class ManyTuningChart(ChartView):
    """Show an :func:`~pyc_lab.autotune_many` result: speed-up over the library per problem.

    Parameters
    ----------
    result
        What :func:`~pyc_lab.autotune_many` returned.
    title
        A caption (default: ``"Tuning many problems"``).
    client
        The ``distributed.Client`` the sweep ran on: its dashboard is linked.

    Raises
    ------
    PycLabError
        If ``result`` is not a :class:`~pyc_lab.kernels.tuning.many.ManyResult` or holds
        no problem.
    """

    def __init__(self, result: ManyResult, *, title: str = "Tuning many problems",
                 client: Any = None) -> None:
        if not isinstance(result, ManyResult):
            raise PycLabError(f"ManyTuningChart shows what autotune_many returned (a "
                              f"ManyResult), not {type(result).__name__}")
        if not result.problems:
            raise PycLabError("ManyTuningChart: the result holds no problem")
        self.result = result
        self.title = title
        self.dashboard = getattr(client, "dashboard_link", None) if client is not None \
            else None

    # -- data ---------------------------------------------------------------------------
    def to_frame(self) -> Any:
        """The summary's main columns, in the order tuned."""
        frame = self.result.summary
        return frame[[c for c in _COLUMNS if c in frame.columns]].reset_index(drop=True)

    def _counts(self) -> str:
        frame = self.result.summary
        tuned = int((frame["status"] != "not tuned").sum())
        wins = int(frame["winner"].map(is_tuned_winner).sum())
        mode = "replayed" if self.result.replay else "tuned"
        budget = ("" if self.result.budget_s is None
                  else f", budget {self.result.budget_s:g} s")
        workers = len(set(self.result.workers.values()))
        where = f", on {workers} Dask worker(s)" if workers else ""
        return (f"{len(frame)} problem(s), {tuned} {mode}{where}, a tuned kernel faster "
                f"than the library on {wins}{budget}, {self.result.total_seconds:.1f} s")

    # -- pictures -------------------------------------------------------------------------
    def figure(self) -> Any:
        """A bar per tuned problem: best library time / best CUTLASS time, the line at 1
        marking where a tuned kernel starts to win."""
        go = require_plotly()
        frame = self.to_frame()
        done = frame[frame["speedup"].notna()]
        colors = ["#76b900" if is_tuned_winner(w) else "#1f77b4"
                  for w in done["winner"]]
        fig = go.Figure(go.Bar(
            x=done["problem"].tolist(), y=done["speedup"].astype(float).tolist(),
            marker_color=colors,
            customdata=[[plotly_text(w), plotly_text(lib), plotly_text(str(where or "here"))]
                        for w, lib, where in zip(done["winner"], done["best_library"],
                                                 done.get("worker", [None] * len(done)),
                                                 strict=True)],
            hovertemplate=("%{x}<br>speed-up over %{customdata[1]}: %{y:.3f}<br>"
                           "winner: %{customdata[0]}<br>tuned on: %{customdata[2]}"
                           "<extra></extra>")))
        fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
        fig.update_layout(
            title=dict(text=plotly_text(f"{self.title} — {self._counts()}"),
                       font=dict(size=13)),
            yaxis=dict(title="best library / best CUTLASS (> 1: CUTLASS wins)"),
            xaxis=dict(tickangle=-30, automargin=True),
            height=420, autosize=True, margin=dict(l=10, r=10, t=60, b=10),
            plot_bgcolor="white", showlegend=False)
        fig.update_yaxes(showgrid=True, gridcolor="#eee")
        return fig

    # -- text and HTML ------------------------------------------------------------------------
    def _header(self) -> str:
        return f"{self.title}: {self._counts()}"

    def _shown(self) -> Any:
        """The table the reprs show: workers' addresses (ports that change from run to
        run) stay in :meth:`to_frame` and the chart's hover."""
        frame = self.to_frame()
        return frame.drop(columns=["worker"]) if "worker" in frame else frame

    def _not_tuned(self) -> list[str]:
        frame = self.result.summary
        rows = frame[frame["status"] == "not tuned"]
        return [f"{p}: {m}" for p, m in zip(rows["problem"], rows["message"], strict=True)]

    def to_text(self) -> str:
        """The header, the table (numbers to 4 significant digits; without the workers'
        addresses) and why problems were not tuned."""
        lines = [self._header(), frame_text(self._shown())]
        lines += [f"not tuned: {line}" for line in self._not_tuned()]
        return "\n".join(lines)

    def to_html(self) -> str:
        """The header, the table and why problems were not tuned, as HTML."""
        items = "".join(f"<li>{escape(line)}</li>" for line in self._not_tuned())
        link = (f"<p><a href='{escape(self.dashboard)}' target='_blank'>Dask dashboard</a>"
                "</p>" if self.dashboard else "")
        return (f"<div class='pyc-lab-many-tuning'><p>{escape(self._header())}</p>{link}"
                f"{frame_html(self._shown())}"
                + (f"<p>Not tuned:</p><ul>{items}</ul>" if items else "") + "</div>")
