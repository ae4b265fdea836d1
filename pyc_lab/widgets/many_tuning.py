"""The chart of a many-problem tuning: what :func:`~pyc_lab.autotune_many` found.

One bar per problem: the best CUTLASS kernel's speed-up over the best library measured in
the same run (above 1: the tuned kernel is faster and ``pl.matmul`` will run it; at or
below 1: the library keeps the problem), coloured by the winner; problems that could not
be tuned are listed with the reason. Live (plotly) in a Jupyter kernel, static HTML and
text elsewhere; the reprs hold no addresses.
"""

from __future__ import annotations

from typing import Any

from ..errors import PycLabError
from ..kernels.tuning.many import ManyResult
from ..kernels.tuning.result import is_tuned_winner
from .display import ChartView, escape, frame_html, frame_text, plotly_text, require_plotly

__all__ = ["ManyTuningChart"]

_COLUMNS = ["problem", "winner", "speedup", "best_cutlass_ms", "best_library",
            "best_library_ms", "candidates", "ok", "seconds", "status"]


class ManyTuningChart(ChartView):
    """Show an :func:`~pyc_lab.autotune_many` result: speed-up over the library per problem.

    Parameters
    ----------
    result
        What :func:`~pyc_lab.autotune_many` returned.
    title
        A caption (default: ``"Tuning many problems"``).

    Raises
    ------
    PycLabError
        If ``result`` is not a :class:`~pyc_lab.kernels.tuning.many.ManyResult` or holds
        no problem.
    """

    def __init__(self, result: ManyResult, *, title: str = "Tuning many problems") -> None:
        if not isinstance(result, ManyResult):
            raise PycLabError(f"ManyTuningChart shows what autotune_many returned (a "
                              f"ManyResult), not {type(result).__name__}")
        if not result.problems:
            raise PycLabError("ManyTuningChart: the result holds no problem")
        self.result = result
        self.title = title

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
        return (f"{len(frame)} problem(s), {tuned} {mode}, a tuned kernel faster than "
                f"the library on {wins}{budget}, {self.result.total_seconds:.1f} s")

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
            customdata=[[plotly_text(w), plotly_text(lib)] for w, lib in
                        zip(done["winner"], done["best_library"], strict=True)],
            hovertemplate=("%{x}<br>speed-up over %{customdata[1]}: %{y:.3f}<br>"
                           "winner: %{customdata[0]}<extra></extra>")))
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

    def _not_tuned(self) -> list[str]:
        frame = self.result.summary
        rows = frame[frame["status"] == "not tuned"]
        return [f"{p}: {m}" for p, m in zip(rows["problem"], rows["message"], strict=True)]

    def to_text(self) -> str:
        """The header, the table (numbers to 4 significant digits) and why problems were
        not tuned."""
        lines = [self._header(), frame_text(self.to_frame())]
        lines += [f"not tuned: {line}" for line in self._not_tuned()]
        return "\n".join(lines)

    def to_html(self) -> str:
        """The header, the table and why problems were not tuned, as HTML."""
        items = "".join(f"<li>{escape(line)}</li>" for line in self._not_tuned())
        return (f"<div class='pyc-lab-many-tuning'><p>{escape(self._header())}</p>"
                f"{frame_html(self.to_frame())}"
                + (f"<p>Not tuned:</p><ul>{items}</ul>" if items else "") + "</div>")
