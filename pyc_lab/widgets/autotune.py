"""Autotuner widgets: a live tuning view and a tuned-vs-library comparison (views only).

:class:`AutotuneWidget` shows a :class:`~pyc_lab.kernels.tuning.background.TuningRun`
— one GEMM tuned live on this machine's GPU, or, where no CUDA device is usable, a
recording made on a GPU replayed by the same search strategies (always labelled as
recorded): a chart fills in as candidates finish, a progress bar counts them, Stop ends
the search after the current candidate, and the final tables compare the winner with
cuBLAS and torch.

:class:`KernelComparison` shows a :class:`~pyc_lab.kernels.tuning.compare.Comparison`:
TFLOP/s per shape for tuned CUTLASS, cuBLAS and torch, as grouped bars with the
fraction of the GPU's dense peak, and a table of ratios.

In a Jupyter kernel with ipywidgets the views are live (ipywidgets + plotly
FigureWidgets); elsewhere they are static HTML and text. Their ``text/plain`` and
``text/html`` reprs hold no addresses, ids or timings.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..hardware.peaks import peak_tflops
from ..kernels.tuning.background import MODES, TuningRun
from ..kernels.tuning.compare import Comparison, kernel_label, problem_label
from ..kernels.tuning.options import GemmTuneOptions
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

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..kernels.tuning.result import TuneResult

__all__ = ["MODES", "AutotuneWidget", "KernelComparison", "kernel_label", "status_color"]

log = logging.getLogger(__name__)

_KERNEL_COLORS = {"tuned CUTLASS": "#76b900", "cublas": "#1f77b4", "torch": "#ee4c2c",
                  "cublaslt": "#9467bd"}
_STATUS_COLORS = {"ok": "#2ca02c", "compile_error": "#d62728", "wrong_result": "#ff7f0e",
                  "nan": "#e377c2", "timeout": "#8c564b", "skipped": "#7f7f7f",
                  "error": "#bcbd22"}
_TABLE_COLUMNS = ["config", "status", "ms", "tflops", "error", "message"]
#: How each baseline's line is drawn in the tuning chart. Baselines often measure the
#: same (torch calls cuBLAS): the first is wide and pale, the next narrow and dotted on
#: top of it, so that coinciding lines both stay visible.
_BASELINE_LINES = {"cublas": dict(dash="solid", width=6), "torch": dict(dash="dot", width=2.5),
                   "cublaslt": dict(dash="dash", width=2)}
_BASELINE_OPACITY = {"cublas": 0.35}


def status_color(status: str) -> str:
    """The colour a candidate's status is drawn in (ok green, failures each their own)."""
    return _STATUS_COLORS.get(status, "#17becf")


def _fmt(value: Any, spec: str, missing: str = "–") -> str:
    try:
        if value is None or value != value:  # None or NaN
            return missing
        return format(value, spec)
    except (TypeError, ValueError):
        return missing


# --------------------------------------------------------------------------- the tuner


class AutotuneWidget(View):
    """Tune one GEMM and watch it: controls, Start/Stop, progress, live chart, tables.

    Parameters
    ----------
    m, n, k
        The problem: ``a`` is M x K, ``b`` K x N.
    options, **settings
        The tuning settings: a :class:`~pyc_lab.kernels.tuning.options.GemmTuneOptions`
        and/or its fields (``dtype``, ``layout``, ``strategy``, ``budget_s``,
        ``max_candidates``, ``seed``, ...); the same defaults as ``pyc_lab.autotune_gemm``.
    mode
        ``"live"``: tune on this machine's GPU. ``"replay"``: replay a recording made on
        a GPU (no kernel runs). ``"auto"``: live when CuPy can use a CUDA device, else
        replay.
    source
        The recording to replay (a tuning-database export); ``None`` for the H200
        recording shipped with pyc_lab. Implies replay under ``mode="auto"``.
    pace_s
        Replay only: seconds per evaluated candidate, so that the chart can be watched
        filling in (0 for an instant replay).

    Attributes
    ----------
    tuning : TuningRun
        What is shown: the run, its state, rows and result.

    Raises
    ------
    PycLabError
        For an unknown mode or setting, ``mode="live"`` without a usable CUDA device, or,
        in replay mode, a problem the recording does not hold.
    """

    def __init__(self, m: int = 4096, n: int = 4096, k: int = 4096, *,
                 options: GemmTuneOptions | None = None, mode: str = "auto",
                 source: str | Path | None = None, pace_s: float = 0.1,
                 **settings: Any) -> None:
        self.tuning = TuningRun(m, n, k, options=options, mode=mode, source=source,
                                pace_s=pace_s, **settings)
        self.tuning.add_listener(self._refresh)
        self._view: Any = None
        self._parts: dict[str, Any] = {}

    # -- the run, as the view sees it ---------------------------------------------------
    m = property(lambda self: self.tuning.m, doc="M of the problem.")
    n = property(lambda self: self.tuning.n, doc="N of the problem.")
    k = property(lambda self: self.tuning.k, doc="K of the problem.")
    options = property(lambda self: self.tuning.options, doc="The tuning settings.")
    dtype = property(lambda self: self.tuning.options.dtype, doc="The kernel dtype.")
    layout = property(lambda self: self.tuning.options.layout, doc="The operand layout.")
    strategy = property(lambda self: self.tuning.options.strategy, doc="The strategy.")
    mode = property(lambda self: self.tuning.mode, doc="``live`` or ``replay``.")
    fallback = property(lambda self: self.tuning.fallback,
                        doc="Whether ``auto`` fell back to replay for want of a GPU.")
    result = property(lambda self: self.tuning.result, doc="The last finished result.")
    rows = property(lambda self: self.tuning.rows, doc="The tuner's reports, in order.")
    error = property(lambda self: self.tuning.error, doc="Why the last run failed.")
    state = property(lambda self: self.tuning.state, doc="The run's state.")
    running = property(lambda self: self.tuning.running, doc="Whether it is tuning.")

    @property
    def stop_event(self) -> threading.Event:
        """The event passed to the tuner as ``stop=`` (set by :meth:`stop`)."""
        return self.tuning.stop_event

    def run(self, wait: bool = True) -> TuneResult | None:
        """Tune (or replay) the current problem in a background thread; see
        :meth:`TuningRun.start <pyc_lab.kernels.tuning.background.TuningRun.start>`."""
        return self.tuning.start(wait)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a background run; returns whether it has finished."""
        return self.tuning.join(timeout)

    def stop(self) -> None:
        """Stop the running search after the candidate being measured."""
        self.tuning.stop()

    def candidates(self) -> list[dict[str, Any]]:
        """The latest report of each candidate, numbered in the order they finished."""
        return self.tuning.candidates()

    def baselines(self) -> dict[str, float]:
        """Baseline times (ms) known so far."""
        return self.tuning.baselines()

    # -- words --------------------------------------------------------------------------
    def problem_label(self) -> str:
        """``"GEMM 4096x4096x4096 f16 tn"``."""
        t = self.tuning
        return f"GEMM {problem_label((t.m, t.n, t.k, self.dtype, self.layout))}"

    def settings_label(self) -> str:
        """The search settings in words."""
        return self.tuning.options.describe()

    def banner(self) -> str:
        """Where the numbers come from: a recording (with device and date) or this GPU."""
        t = self.tuning
        if t.mode == "replay" and t.replay_info is not None:
            text = t.replay_info.banner
            if t.fallback:
                text += " (no usable CUDA device on this machine)"
            return text[0].upper() + text[1:]
        return f"Live tuning on {t.device_name}: kernels are built, checked and timed here"

    def progress_label(self) -> str:
        """``"5 of 8 candidates (4 ok, 1 failed)"``."""
        cands = self.candidates()
        ok = sum(r["status"] == "ok" for r in cands)
        total = self.tuning.total()
        of = f" of {total}" if total else ""
        return f"{len(cands)}{of} candidates ({ok} ok, {len(cands) - ok} failed)"

    def state_label(self) -> str:
        """The run's state in words."""
        if self.state == "not started":
            return "not started: press Start (or call .run())"
        if self.state == "failed":
            return f"failed: {self.error}"
        text = f"{self.state}: {self.progress_label()}"
        if self.result is not None:
            reason = "the Stop button" if self.state == "stopped" else self.result.stopped_by
            text += f"; stopped by {reason}"
        return text

    def best_label(self) -> str:
        """The winner (so far) in words, with TFLOP/s and fraction of the dense peak."""
        best = self.tuning.best()
        if best is None:
            return "no candidate ran correctly" if self.result is not None else "no result yet"
        name, ms = best
        tflops = self.tuning.tflops(ms)
        peak = peak_tflops(self.tuning.device_name, self.dtype)
        pct = f" ({100 * tflops / peak:.1f} % of the {peak:g} TFLOP/s dense peak)" \
            if tflops and peak else ""
        word = "recorded " if self.mode == "replay" else ""
        return f"best: {name}, {word}{ms:.4g} ms = {tflops:.1f} TFLOP/s{pct}"

    def compare(self) -> pd.DataFrame | None:
        """The result's comparison with the baselines (``None`` before a result)."""
        return None if self.result is None else self.result.compare()

    def table(self) -> pd.DataFrame | None:
        """The candidate table (config, status, ms, TFLOP/s, error, message) or ``None``."""
        if self.result is None:
            return None
        table = self.result.table
        return table[[c for c in _TABLE_COLUMNS if c in table.columns]]

    def to_text(self) -> str:
        """Deterministic text: problem, settings, provenance, state, best, tables."""
        lines = [f"AutotuneWidget: {self.problem_label()}; {self.settings_label()}",
                 self.banner(), f"state: {self.state_label()}"]
        if self.rows or self.result is not None:
            lines.append(self.best_label())
        compare = self.compare()
        if compare is not None:
            compare = compare.drop(columns=["source"], errors="ignore")
            lines += ["", "Tuned vs libraries:", frame_text(compare)]
        table = self.table()
        if table is not None and len(table):
            lines += ["", "Candidates:", frame_text(table)]
        return "\n".join(lines)

    def to_html(self) -> str:
        """Deterministic HTML: banner, state, best, the comparison and candidate tables."""
        color = "#fff4d6" if self.mode == "replay" else "#e8f5e9"
        parts = ["<div class='pyc-lab-autotune' style='line-height:normal'>",
                 f"<h4>Autotune {escape(self.problem_label())}</h4>",
                 f"<p style='background:{color};padding:4px 8px;border-radius:4px'>"
                 f"{escape(self.banner())}</p><ul>",
                 f"<li>{escape(self.settings_label())}</li>",
                 f"<li>state: {escape(self.state_label())}</li>"]
        if self.rows or self.result is not None:
            parts.append(f"<li>{escape(self.best_label())}</li>")
        parts.append("</ul>")
        compare = self.compare()
        if compare is not None:
            parts.append(frame_html(compare, "Tuned CUTLASS vs libraries"))
        table = self.table()
        if table is not None and len(table):
            parts.append(frame_html(table, "Candidates"))
        parts.append("</div>")
        return "".join(parts)

    # -- pictures -----------------------------------------------------------------------
    def traces(self) -> list[Any]:
        """The chart's plotly traces: one per status, the best so far, baseline lines."""
        go = require_plotly()
        cands = self.candidates()
        recorded = " (recorded)" if self.mode == "replay" else ""
        out = []
        statuses = sorted({r["status"] for r in cands}, key=lambda s: (s != "ok", s))
        for status in statuses:
            rows = [r for r in cands if r["status"] == status]
            ok = status == "ok"
            hover = [
                f"<b>{plotly_text(r['config'])}</b><br>status: {plotly_text(status)}"
                f"{recorded}<br>" +
                (f"{r['ms']:.4g} ms, {r['tflops']:.1f} TFLOP/s" if ok and r.get("tflops")
                 else plotly_text((r.get("message") or "")[:200]) or "no time")
                for r in rows]
            out.append(go.Scatter(
                x=[r["_order"] for r in rows],
                y=[(r.get("tflops") or 0.0) if ok else 0.0 for r in rows],
                mode="markers", name=f"{status}{recorded}",
                marker=dict(color=status_color(status), size=11 if ok else 12,
                            symbol="circle" if ok else "x",
                            line=dict(color="#333", width=0.5)),
                hovertext=hover, hoverinfo="text", customdata=[r["config"] for r in rows],
            ))
        done = [r for r in cands if r["status"] == "ok" and r.get("tflops")]
        if done:
            best = max(done, key=lambda r: r["tflops"])
            out.append(go.Scatter(
                x=[best["_order"]], y=[best["tflops"]], mode="markers",
                name=f"best so far{recorded}",
                marker=dict(symbol="star", size=18, color="gold",
                            line=dict(color="#333", width=1)),
                hovertext=[f"best: {plotly_text(best['config'])}"], hoverinfo="text"))
        right = max(len(cands), self.tuning.total(), 1) + 0.5
        for name, ms in self.baselines().items():
            tflops = self.tuning.tflops(ms)
            if not tflops:
                continue
            label = f"{kernel_label(name)}{recorded} {tflops:.0f} TFLOP/s"
            style = _BASELINE_LINES.get(name, dict(dash="dash", width=2))
            out.append(go.Scatter(
                x=[0.5, right], y=[tflops, tflops], mode="lines", name=label,
                line=dict(color=_KERNEL_COLORS.get(name, "#555"), **style),
                opacity=_BASELINE_OPACITY.get(name, 1.0),
                hovertext=[label, label], hoverinfo="text"))
        return out

    def _layout(self) -> dict[str, Any]:
        t = self.tuning
        where = (t.replay_info.label if t.mode == "replay" and t.replay_info
                 else f"live on {t.device_name}")
        return dict(
            title=dict(text=plotly_text(f"{self.problem_label()} · {self.strategy} — {where}"),
                       font=dict(size=13)),
            xaxis=dict(title="candidate, in the order it finished", dtick=1,
                       rangemode="tozero"),
            yaxis=dict(title="TFLOP/s", rangemode="tozero"),
            height=420, autosize=True, margin=dict(l=60, r=10, t=50, b=10),
            plot_bgcolor="white", legend=dict(orientation="h", x=0, y=-0.18, yanchor="top"),
            hoverlabel=dict(align="left"))

    def figure(self) -> Any:
        """The chart as a plotly ``go.Figure``: TFLOP/s per candidate, failures at 0 (x),
        the best starred, cuBLAS/torch as dashed lines when known."""
        go = require_plotly()
        fig = go.Figure(data=self.traces())
        fig.update_layout(**self._layout())
        fig.update_xaxes(showgrid=True, gridcolor="#eee")
        fig.update_yaxes(showgrid=True, gridcolor="#eee")
        return fig

    # -- the live view ------------------------------------------------------------------
    def widget(self) -> Any:
        """The live ipywidgets view (built once): controls, Start/Stop, progress, chart,
        tables."""
        if self._view is not None:
            return self._view
        import ipywidgets as w

        from ..kernels.cutlass import DTYPES, LAYOUTS
        from ..search import STRATEGIES

        go = require_plotly()
        p: dict[str, Any] = {}
        small = w.Layout(width="150px")
        p["m"] = w.BoundedIntText(value=self.m, min=1, max=1 << 20, description="M",
                                  layout=small)
        p["n"] = w.BoundedIntText(value=self.n, min=1, max=1 << 20, description="N",
                                  layout=small)
        p["k"] = w.BoundedIntText(value=self.k, min=1, max=1 << 20, description="K",
                                  layout=small)
        p["dtype"] = w.Dropdown(options=list(DTYPES), value=self.dtype, description="dtype",
                                layout=w.Layout(width="150px"))
        p["layout"] = w.Dropdown(options=list(LAYOUTS), value=self.layout,
                                 description="layout", layout=w.Layout(width="150px"))
        p["strategy"] = w.Dropdown(options=sorted(STRATEGIES), value=self.strategy,
                                   description="strategy", layout=w.Layout(width="280px"))
        p["budget"] = w.BoundedFloatText(value=self.options.budget_s or 0.0, min=0, max=86400,
                                         description="budget s",
                                         tooltip="0: no time limit", layout=small)
        p["max"] = w.BoundedIntText(value=self.options.max_candidates or 0, min=0, max=10000,
                                    description="max cand.", tooltip="0: no limit",
                                    layout=w.Layout(width="170px"))
        controls = [w.HBox([p["m"], p["n"], p["k"], p["dtype"], p["layout"]]),
                    w.HBox([p["strategy"], p["budget"], p["max"]])]
        if self.mode == "replay":
            from ..kernels.tuning.recording import recorded_problems

            recorded = recorded_problems(self.tuning.source)
            options = [(f"{r.m}x{r.n}x{r.k} {r.dtype} {r.layout}",
                        (int(r.m), int(r.n), int(r.k), r.dtype, r.layout))
                       for r in recorded.itertuples()]
            current = (self.m, self.n, self.k, self.dtype, self.layout)
            p["recorded"] = w.Dropdown(options=options, description="recorded",
                                       value=current if current in dict(options).values()
                                       else None, layout=w.Layout(width="340px"))

            def pick(change: dict[str, Any]) -> None:
                if change.get("new"):
                    m, n, k, dtype, layout = change["new"]
                    p["m"].value, p["n"].value, p["k"].value = m, n, k
                    p["dtype"].value, p["layout"].value = dtype, layout

            p["recorded"].observe(pick, names="value")
            controls[1].children = (*controls[1].children, p["recorded"])
        p["start"] = w.Button(description="Start", icon="play", button_style="success",
                              tooltip="tune (or replay) this problem")
        p["stop"] = w.Button(description="Stop", icon="stop", button_style="danger",
                             disabled=True, tooltip="stop after the current candidate")
        p["progress"] = w.IntProgress(value=0, min=0, max=1, description="candidates",
                                      layout=w.Layout(width="320px"))
        p["status"] = w.HTML()
        p["banner"] = w.HTML()
        p["chart"] = go.FigureWidget(self.figure())
        p["tables"] = html_widget()

        def start(_btn: Any) -> None:
            try:
                self._read_controls()
                self.run(wait=False)
            except Exception as exc:  # show, never kill the widget
                p["status"].value = f"<span style='color:#b00'>{escape(exc)}</span>"

        p["start"].on_click(start)
        p["stop"].on_click(lambda _btn: self.stop())
        self._parts = p
        self._view = w.VBox([p["banner"], *controls,
                             w.HBox([p["start"], p["stop"], p["progress"], p["status"]],
                                    layout=w.Layout(align_items="center")),
                             p["chart"], p["tables"]], layout=w.Layout(width="100%"))
        self._refresh()
        return self._view

    def _read_controls(self) -> None:
        """Take the problem and settings from the live controls (before a Start)."""
        p = self._parts
        if not p or self.running:
            return
        self.tuning.configure(p["m"].value, p["n"].value, p["k"].value,
                              dtype=p["dtype"].value, layout=p["layout"].value,
                              strategy=p["strategy"].value,
                              budget_s=p["budget"].value or None,
                              max_candidates=p["max"].value or None)

    def _refresh(self) -> None:
        """Bring the live view (if one was built) up to date; safe from any thread."""
        p = self._parts
        if not p:
            return
        try:
            running = self.running and self.state == "running"
            p["start"].disabled = running
            p["stop"].disabled = not running
            total = self.tuning.total()
            p["progress"].max = max(total, 1)
            p["progress"].value = min(len(self.candidates()), p["progress"].max)
            p["status"].value = escape(self.state_label())
            p["banner"].value = (f"<b>{escape(self.banner())}</b>" if self.mode == "replay"
                                 else escape(self.banner()))
            chart = p["chart"]
            fresh = self.traces()
            with chart.batch_update():
                chart.layout.title.text = self._layout()["title"]["text"]
            if [t.name for t in chart.data] == [t.name for t in fresh]:
                with chart.batch_update():
                    for old, new in zip(chart.data, fresh, strict=True):
                        old.x, old.y = new.x, new.y
                        old.hovertext, old.customdata = new.hovertext, new.customdata
            else:
                chart.data = []
                chart.add_traces(fresh)
            p["tables"].value = self.to_html() if self.result is not None else ""
        except Exception:  # a view update must never break the tuning
            log.exception("autotune widget: view update failed")


# --------------------------------------------------------------------------- comparison


class KernelComparison(ChartView):
    """TFLOP/s per shape for tuned CUTLASS, cuBLAS and torch, against the dense peak.

    Parameters
    ----------
    results_or_rows
        Tuning results (live or replayed), rows (a DataFrame or dicts with ``m``, ``n``,
        ``k``, ``dtype``, ``kernel``, ``ms``; optional ``layout``, ``gpu_name``,
        ``source``) or a :class:`~pyc_lab.kernels.tuning.compare.Comparison`.
    title
        A caption; by default it names the device(s) and, for recordings, the date.

    Raises
    ------
    PycLabError
        For an empty input or rows missing a column.
    """

    def __init__(self, results_or_rows: Any, *, title: str | None = None) -> None:
        self.comparison = (results_or_rows if isinstance(results_or_rows, Comparison)
                           else Comparison(results_or_rows))
        self.rows = self.comparison.rows
        self.title = title if title is not None else self.comparison.default_title()

    @classmethod
    def from_recording(cls, source: str | Path | None = None, dtype: str | None = None,
                       layout: str | None = None) -> KernelComparison:
        """Every problem of a recording (the shipped H200 one by default), optionally of
        one dtype / layout."""
        return cls(Comparison.from_recording(source, dtype, layout))

    def problems(self) -> list[tuple[int, int, int, str, str]]:
        """The problems ``(m, n, k, dtype, layout)``, in first-seen order."""
        return self.comparison.problems()

    def kernels(self) -> list[str]:
        """The kernels compared: tuned CUTLASS first, then cuBLAS, torch, others."""
        return self.comparison.kernels()

    def to_frame(self) -> pd.DataFrame:
        """One row per problem and kernel (see :meth:`Comparison.to_frame
        <pyc_lab.kernels.tuning.compare.Comparison.to_frame>`)."""
        return self.comparison.to_frame()

    def ratios(self) -> pd.DataFrame:
        """One row per problem: TFLOP/s per kernel, % of peak, ratios to cuBLAS."""
        return self.comparison.ratios()

    def summary(self) -> str:
        """One line: the tuned kernel's median speed relative to cuBLAS, or why not."""
        return self.comparison.summary()

    def to_text(self) -> str:
        """Deterministic text: title, summary, ratio table."""
        table = frame_text(self.ratios())
        return f"KernelComparison: {self.title}\n{self.summary()}\n\n{table}"

    def to_html(self) -> str:
        """Deterministic HTML: title, summary, ratio table."""
        return (f"<div class='pyc-lab-kernel-comparison' style='line-height:normal'>"
                f"<h4>Kernel comparison: "
                f"{escape(self.title)}</h4><p>{escape(self.summary())}</p>"
                f"{frame_html(self.ratios(), 'TFLOP/s and speed relative to cuBLAS')}</div>")

    def figure(self) -> Any:
        """Grouped bars: TFLOP/s per problem for each kernel, % of dense peak on the bars
        (where the bars are wide enough to hold it), the dense peak dotted.

        The legend sits above the plot and the slanted problem labels get the room they
        need below it (``automargin``), so that neither covers the other."""
        go = require_plotly()
        frame = self.to_frame()
        names = [problem_label(p) for p in self.problems()]
        fig = go.Figure()
        for kernel in self.kernels():
            label = kernel_label(kernel)
            part = frame[frame["kernel"] == label].set_index("problem")
            ys = [part["tflops"].get(p) for p in names]
            pct = [part["pct_of_peak"].get(p) for p in names]
            vs = [part["vs_cublas"].get(p) for p in names]
            fig.add_trace(go.Bar(
                name=label, x=names, y=ys, marker=dict(color=_KERNEL_COLORS.get(kernel)),
                text=[_fmt(v, ".0f") + " %" if _fmt(v, ".0f") != "–" else "" for v in pct],
                textposition="outside", textfont=dict(size=10), cliponaxis=False,
                customdata=[[_fmt(part["ms"].get(p), ".4f"), _fmt(x, ".1f"),
                             _fmt(v, ".2f")] for p, x, v in zip(names, pct, vs, strict=True)],
                hovertemplate=(f"<b>{plotly_text(label)}</b> %{{x}}<br>%{{y:.1f}} TFLOP/s, "
                               "%{customdata[0]} ms<br>%{customdata[1]} % of dense peak<br>"
                               "%{customdata[2]}x cuBLAS<extra></extra>")))
        for peak in self.comparison.peaks():
            fig.add_hline(y=peak, line=dict(color="#888", dash="dot"),
                          annotation_text=f"dense peak {peak:g} TFLOP/s",
                          annotation_position="top left")
        fig.update_layout(
            barmode="group",
            title=dict(text=plotly_text(self.title), font=dict(size=13), x=0.01,
                       xanchor="left", y=0.98, yanchor="top"),
            yaxis=dict(title="TFLOP/s", rangemode="tozero"),
            xaxis=dict(title=None, tickangle=-35, automargin=True, tickfont=dict(size=11)),
            height=480, autosize=True, margin=dict(l=60, r=10, t=80, b=10),
            plot_bgcolor="white", uniformtext=dict(minsize=9, mode="hide"),
            legend=dict(orientation="h", x=1, xanchor="right", y=1.02, yanchor="bottom"))
        fig.update_yaxes(showgrid=True, gridcolor="#eee")
        return fig

