"""Autotuner widgets: a live tuning view and a tuned-vs-library comparison.

:class:`AutotuneWidget` tunes one GEMM — live on this machine's GPU with
:func:`pyc_lab.autotune_gemm`, or, where no CUDA device is usable, by replaying a
recording made on a GPU with :func:`pyc_lab.kernels.tuning.replay.replay_autotune` (the same
search strategies over the recorded measurements, always labelled as recorded). The
tuning runs in a background thread: a chart fills in as candidates finish, a progress
bar counts them, Stop ends the search after the current candidate, and the final tables
compare the winner with cuBLAS and torch.

:class:`KernelComparison` shows TFLOP/s per shape for tuned CUTLASS, cuBLAS and torch,
as grouped bars with the fraction of the GPU's dense peak, and a table of ratios.

In a Jupyter kernel with ipywidgets the views are live (ipywidgets + plotly
FigureWidgets); elsewhere they are static HTML and text. Their ``text/plain`` and
``text/html`` reprs hold no addresses, ids or timings.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PycLabError
from .display import (
    ChartView,
    View,
    escape,
    frame_html,
    require_plotly,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..kernels.tuning.autotune import TuneResult
    from ..kernels.tuning.replay import ReplayInfo

__all__ = ["MODES", "AutotuneWidget", "KernelComparison", "kernel_label", "status_color"]

log = logging.getLogger(__name__)

#: The modes of :class:`AutotuneWidget`.
MODES = ("auto", "live", "replay")

_KERNEL_LABELS = {"tuned CUTLASS": "tuned CUTLASS", "cublas": "cuBLAS", "torch": "torch",
                  "cublaslt": "cuBLASLt"}
_KERNEL_COLORS = {"tuned CUTLASS": "#76b900", "cublas": "#1f77b4", "torch": "#ee4c2c",
                  "cublaslt": "#9467bd"}
_STATUS_COLORS = {"ok": "#2ca02c", "compile_error": "#d62728", "wrong_result": "#ff7f0e",
                  "nan": "#e377c2", "timeout": "#8c564b", "skipped": "#7f7f7f",
                  "error": "#bcbd22"}
_TABLE_COLUMNS = ["config", "status", "ms", "tflops", "error", "message"]
#: Decimals shown in text tables.
_ROUND = {"ms": 4, "tflops": 1, "pct_of_peak": 1, "vs_cublas": 3, "error": 6}


def kernel_label(name: str) -> str:
    """How a kernel of :meth:`TuneResult.compare` is named in charts (``cublas`` -> cuBLAS)."""
    return _KERNEL_LABELS.get(name, name)


def status_color(status: str) -> str:
    """The colour a candidate's status is drawn in (ok green, failures each their own)."""
    return _STATUS_COLORS.get(status, "#17becf")


def _config_name(config: dict[str, Any], fallback: str) -> str:
    """A GEMM config's readable name (``256x128x64_c2x1x1_...``), else ``fallback``."""
    from ..kernels.cutlass.gemm import GemmConfig

    try:
        return GemmConfig.from_dict(config).id
    except PycLabError:
        return fallback


def _shape(m: int, n: int, k: int) -> str:
    return f"{m}x{n}x{k}"


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
    dtype, layout
        ``"f16"``, ``"bf16"`` (or another of ``cutlass_gemm.DTYPES``); ``"tn"``, ``"tt"``,
        ``"nt"`` or ``"nn"``.
    strategy
        ``"exhaustive"``, ``"random"``, ``"successive_halving"`` or ``"evolutionary"``.
    budget_s, max_candidates
        As for :func:`pyc_lab.autotune_gemm` (``None``: no limit).
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
    seed
        The search strategies' random seed.

    Attributes
    ----------
    mode : str
        ``"live"`` or ``"replay"`` (``"auto"`` resolved).
    result : TuneResult or None
        The last finished run's result (a :class:`~pyc_lab.kernels.tuning.replay.ReplayResult`
        in replay mode).
    rows : list of dict
        What the tuner's observer reported, one dict per evaluated candidate, in order.
    error : Exception or None
        Why the last run failed, if it did.

    Raises
    ------
    PycLabError
        For an unknown mode, ``mode="live"`` without a usable CUDA device, or, in replay
        mode, a problem the recording does not hold (the message lists what it holds).
    """

    def __init__(self, m: int = 4096, n: int = 4096, k: int = 4096, *, dtype: str = "f16",
                 layout: str = "tn", strategy: str = "successive_halving",
                 budget_s: float | None = 180, max_candidates: int | None = 16,
                 mode: str = "auto", source: str | Path | None = None,
                 pace_s: float = 0.1, seed: int = 0) -> None:
        from ..search import STRATEGIES

        if mode not in MODES:
            raise PycLabError(f"AutotuneWidget(mode={mode!r}): use one of {MODES}")
        key = str(strategy).strip().lower().replace("-", "_")
        if key not in STRATEGIES:
            raise PycLabError(f"unknown search strategy {strategy!r}; known: "
                              f"{', '.join(sorted(STRATEGIES))}")
        self.m, self.n, self.k = m, n, k
        self.dtype, self.layout, self.strategy = dtype, layout, key
        self.budget_s, self.max_candidates = budget_s, max_candidates
        self.source, self.pace_s, self.seed = source, pace_s, seed
        self.requested_mode = mode
        self.mode, self.fallback = self._resolve_mode(mode, source)
        self.device_name = ""
        self.replay_info: ReplayInfo | None = None
        self.recorded_baselines: dict[str, float] = {}
        if self.mode == "replay":
            self._load_recording()
        else:
            from ..hardware import detect_hardware

            gpus = detect_hardware().gpus
            self.device_name = gpus[0].name if gpus and gpus[0].name else "this GPU"
        self.result: TuneResult | None = None
        self.rows: list[dict[str, Any]] = []
        self.error: Exception | None = None
        self.state = "not started"
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._view: Any = None
        self._parts: dict[str, Any] = {}

    # -- set-up -----------------------------------------------------------------------
    @staticmethod
    def _resolve_mode(mode: str, source: str | Path | None) -> tuple[str, bool]:
        """The mode to use and whether "auto" fell back to replay."""
        if mode == "replay":
            return "replay", False
        if source is not None:
            if mode == "live":
                raise PycLabError("source= names a recording to replay; use mode='replay' "
                                  "(or 'auto'), or drop source= to tune live")
            return "replay", False
        from ..hardware.device import cupy_status

        cp, why = cupy_status()
        if cp is not None:
            return "live", False
        if mode == "live":
            raise PycLabError(f"AutotuneWidget(mode='live') needs a CUDA device: {why}. Use "
                              "mode='replay' to replay the tuning recorded on an H200")
        return "replay", True

    def _load_recording(self) -> None:
        from ..kernels.tuning.replay import recorded_result

        recorded = recorded_result(self.m, self.n, self.k, dtype=self.dtype,
                                   layout=self.layout, source=self.source)
        self.replay_info = recorded.replay
        self.recorded_baselines = dict(recorded.baselines)
        self.device_name = recorded.device.gpu_name

    # -- running ----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether a tuning thread is running."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def stop_event(self) -> threading.Event:
        """The event passed to the tuner as ``stop=`` (set by :meth:`stop`)."""
        return self._stop

    def run(self, wait: bool = True) -> TuneResult | None:
        """Tune (or replay) the current problem in a background thread.

        Parameters
        ----------
        wait
            Wait for the end and return the result (and raise the run's error, if it
            failed); ``False`` returns at once, with the thread running.

        Returns
        -------
        TuneResult or None
            ``None`` when not waiting.

        Raises
        ------
        PycLabError
            If a run is already going on (press Stop or wait for it), or, when waiting,
            the run's own error.
        """
        with self._lock:
            if self.running:
                raise PycLabError("this AutotuneWidget is already tuning; press Stop (or call "
                                  ".stop()) or wait for it before starting again")
            self._stop.clear()
            self.rows = []
            self.result = None
            self.error = None
            self.state = "running"
            self._thread = threading.Thread(target=self._work, name="pyc-lab-autotune",
                                            daemon=True)
            self._thread.start()
        self._refresh()
        if not wait:
            return None
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.result

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a background run; returns whether it has finished."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.running

    def stop(self) -> None:
        """Stop the running search after the candidate being measured."""
        self._stop.set()

    def _tune(self) -> TuneResult:
        common = dict(dtype=self.dtype, layout=self.layout, strategy=self.strategy,
                      budget_s=self.budget_s, max_candidates=self.max_candidates,
                      observer=self._observe, stop=self._stop, seed=self.seed)
        if self.mode == "replay":
            from ..kernels.tuning.replay import replay_autotune

            return replay_autotune(self.m, self.n, self.k, source=self.source,
                                   pace_s=self.pace_s, **common)
        from ..kernels.tuning.autotune import autotune_gemm

        return autotune_gemm(self.m, self.n, self.k, **common)

    def _work(self) -> None:
        try:
            result = self._tune()
        except Exception as exc:  # shown in the widget; run(wait=True) raises it
            log.debug("autotune widget run failed: %s", exc)
            with self._lock:
                self.error = exc
                self.state = "failed"
        else:
            with self._lock:
                self.result = result
                stopped = result.stopped_by == "observer" and self._stop.is_set()
                self.state = "stopped" if stopped else "done"
        self._refresh()

    def _observe(self, row: dict[str, Any]) -> None:
        with self._lock:
            self.rows.append(dict(row))
        self._refresh()

    # -- what was seen ------------------------------------------------------------------
    def candidates(self) -> list[dict[str, Any]]:
        """The latest report of each candidate, numbered (``_order``, from 1) in the order
        they first finished."""
        with self._lock:
            order: dict[str, int] = {}
            latest: dict[str, dict[str, Any]] = {}
            for row in self.rows:
                cid = row["config"]
                order.setdefault(cid, len(order) + 1)
                latest[cid] = {**row, "_order": order[cid]}
        return sorted(latest.values(), key=lambda r: r["_order"])

    def baselines(self) -> dict[str, float]:
        """Baseline times (ms) known so far: the result's, or the recording's up front."""
        if self.result is not None and self.result.baselines:
            return dict(self.result.baselines)
        return dict(self.recorded_baselines)

    def _total(self) -> int:
        with self._lock:
            if self.rows:
                return int(self.rows[-1].get("total") or 0)
        return 0

    @property
    def flops(self) -> float:
        """Floating-point operations of one GEMM (2 M N K)."""
        return 2.0 * self.m * self.n * self.k

    def _tflops(self, ms: float | None) -> float | None:
        return self.flops / (ms * 1e-3) / 1e12 if ms else None

    # -- words --------------------------------------------------------------------------
    def problem_label(self) -> str:
        """``"GEMM 4096x4096x4096 f16 tn"``."""
        return f"GEMM {_shape(self.m, self.n, self.k)} {self.dtype} {self.layout}"

    def settings_label(self) -> str:
        """The search settings in words."""
        budget = "no time limit" if self.budget_s is None else f"budget {self.budget_s:g} s"
        cands = ("all candidates" if self.max_candidates is None
                 else f"at most {self.max_candidates} candidates")
        return f"strategy {self.strategy}, {budget}, {cands}"

    def banner(self) -> str:
        """Where the numbers come from: a recording (with device and date) or this GPU."""
        if self.mode == "replay" and self.replay_info is not None:
            text = self.replay_info.banner
            if self.fallback:
                text += " (no usable CUDA device on this machine)"
            return text[0].upper() + text[1:]
        return f"Live tuning on {self.device_name}: kernels are built, checked and timed here"

    def progress_label(self) -> str:
        """``"5 of 8 candidates (4 ok, 1 failed)"``."""
        cands = self.candidates()
        ok = sum(r["status"] == "ok" for r in cands)
        total = self._total()
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
        from ..kernels.tuning.autotune import peak_tflops

        if self.result is not None:
            best = self.result.best
            if best is None:
                return "no candidate ran correctly"
            name, ms = _config_name(best.config, best.config_id), best.time_ms
        else:
            done = [r for r in self.candidates() if r["status"] == "ok" and r.get("ms")]
            if not done:
                return "no result yet"
            fastest = min(done, key=lambda r: r["ms"])
            name, ms = fastest["config"], fastest["ms"]
        tflops = self._tflops(ms)
        peak = peak_tflops(self.device_name, self.dtype)
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
            compare = compare.drop(columns=["source"], errors="ignore").round(_ROUND)
            lines += ["", "Tuned vs libraries:", compare.to_string(index=False)]
        table = self.table()
        if table is not None and len(table):
            lines += ["", "Candidates:", table.round(_ROUND).to_string(index=False)]
        return "\n".join(lines)

    def to_html(self) -> str:
        """Deterministic HTML: banner, state, best, the comparison and candidate tables."""
        color = "#fff4d6" if self.mode == "replay" else "#e8f5e9"
        parts = ["<div class='pyc-lab-autotune'>",
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
                f"<b>{escape(r['config'])}</b><br>status: {escape(status)}{recorded}<br>" +
                (f"{r['ms']:.4f} ms, {r['tflops']:.1f} TFLOP/s" if ok and r.get("tflops")
                 else escape((r.get("message") or "")[:200]) or "no time")
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
                hovertext=[f"best: {escape(best['config'])}"], hoverinfo="text"))
        right = max(len(cands), self._total(), 1) + 0.5
        for name, ms in self.baselines().items():
            tflops = self._tflops(ms)
            if not tflops:
                continue
            label = f"{kernel_label(name)}{recorded} {tflops:.0f} TFLOP/s"
            out.append(go.Scatter(
                x=[0.5, right], y=[tflops, tflops], mode="lines", name=label,
                line=dict(color=_KERNEL_COLORS.get(name, "#555"), dash="dash", width=2),
                hovertext=[label, label], hoverinfo="text"))
        return out

    def _layout(self) -> dict[str, Any]:
        where = (self.replay_info.label if self.mode == "replay" and self.replay_info
                 else f"live on {self.device_name}")
        return dict(
            title=dict(text=escape(f"{self.problem_label()} · {self.strategy} — {where}"),
                       font=dict(size=13)),
            xaxis=dict(title="candidate, in the order it finished", dtick=1,
                       rangemode="tozero"),
            yaxis=dict(title="TFLOP/s", rangemode="tozero"),
            height=380, margin=dict(l=50, r=10, t=50, b=40), plot_bgcolor="white",
            legend=dict(orientation="h", y=-0.2), hoverlabel=dict(align="left"))

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

        from ..kernels.cutlass.gemm import DTYPES, LAYOUTS
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
        p["budget"] = w.BoundedFloatText(value=self.budget_s or 0.0, min=0, max=86400,
                                         description="budget s",
                                         tooltip="0: no time limit", layout=small)
        p["max"] = w.BoundedIntText(value=self.max_candidates or 0, min=0, max=10000,
                                    description="max cand.", tooltip="0: no limit",
                                    layout=w.Layout(width="170px"))
        controls = [w.HBox([p["m"], p["n"], p["k"], p["dtype"], p["layout"]]),
                    w.HBox([p["strategy"], p["budget"], p["max"]])]
        if self.mode == "replay":
            from ..kernels.tuning.replay import recorded_problems

            recorded = recorded_problems(self.source)
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
        p["tables"] = w.HTML()

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
                             w.HBox([p["start"], p["stop"], p["progress"], p["status"]]),
                             p["chart"], p["tables"]])
        self._refresh()
        return self._view

    def _read_controls(self) -> None:
        """Take the problem and settings from the live controls (before a Start)."""
        p = self._parts
        if not p or self.running:
            return
        problem = (p["m"].value, p["n"].value, p["k"].value, p["dtype"].value,
                   p["layout"].value)
        changed = problem != (self.m, self.n, self.k, self.dtype, self.layout)
        self.m, self.n, self.k, self.dtype, self.layout = problem
        self.strategy = p["strategy"].value
        self.budget_s = p["budget"].value or None
        self.max_candidates = p["max"].value or None
        if changed and self.mode == "replay":
            self._load_recording()

    def _refresh(self) -> None:
        """Bring the live view (if one was built) up to date; safe from any thread."""
        p = self._parts
        if not p:
            return
        try:
            running = self.running and self.state == "running"
            p["start"].disabled = running
            p["stop"].disabled = not running
            total = self._total()
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
        Tuning results (:class:`~pyc_lab.kernels.tuning.autotune.TuneResult`, live or
        replayed), or rows — a DataFrame or dicts — with columns ``m``, ``n``, ``k``,
        ``dtype``, ``kernel`` (``"tuned CUTLASS"``, ``"cublas"``, ``"torch"``) and ``ms``;
        optional ``layout``, ``gpu_name`` and ``source``.
    title
        A caption; by default it names the device(s) and, for recordings, the date.

    Raises
    ------
    PycLabError
        For an empty input or rows missing a column.
    """

    def __init__(self, results_or_rows: Any, *, title: str | None = None) -> None:
        self.rows = self._rows(results_or_rows)
        if not self.rows:
            raise PycLabError("KernelComparison needs at least one tuning result or row")
        self.title = title if title is not None else self._default_title()

    @classmethod
    def from_recording(cls, source: str | Path | None = None, dtype: str | None = None,
                       layout: str | None = None) -> KernelComparison:
        """Every problem of a recording (the shipped H200 one by default).

        Parameters
        ----------
        source
            A tuning-database export; ``None`` for the shipped H200 recording.
        dtype, layout
            Keep only problems of this dtype / layout.
        """
        from ..kernels.tuning.replay import recorded_results

        results = recorded_results(source, dtype=dtype, layout=layout)
        if not results:
            raise PycLabError(f"the recording holds no GEMM problem with dtype={dtype!r}, "
                              f"layout={layout!r}; see pyc_lab.kernels.tuning.replay."
                              "recorded_problems()")
        return cls(results)

    # -- rows ---------------------------------------------------------------------------
    @staticmethod
    def _rows(data: Any) -> list[dict[str, Any]]:
        from ..kernels.tuning.autotune import TuneResult

        if isinstance(data, TuneResult):
            data = [data]
        if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a DataFrame
            data = data.to_dict("records")
        if not isinstance(data, Iterable):
            raise PycLabError(f"KernelComparison takes tuning results or rows, not "
                              f"{type(data).__name__}")
        rows: list[dict[str, Any]] = []
        for item in data:
            if isinstance(item, TuneResult):
                rows += KernelComparison._result_rows(item)
            elif isinstance(item, dict):
                missing = {"m", "n", "k", "dtype", "kernel", "ms"} - set(item)
                if missing:
                    raise PycLabError(f"KernelComparison row {item!r} lacks "
                                      f"{sorted(missing)}; give m, n, k, dtype, kernel, ms")
                rows.append({"m": int(item["m"]), "n": int(item["n"]), "k": int(item["k"]),
                             "dtype": str(item["dtype"]),
                             "layout": str(item.get("layout") or "tn"),
                             "kernel": str(item["kernel"]), "ms": item["ms"],
                             "gpu_name": str(item.get("gpu_name") or ""),
                             "source": str(item.get("source") or "")})
            else:
                raise PycLabError(f"KernelComparison takes TuneResults or dict rows, not "
                                  f"{type(item).__name__}")
        return rows

    @staticmethod
    def _result_rows(res: TuneResult) -> list[dict[str, Any]]:
        info = getattr(res, "replay", None)
        source = info.label if info is not None else f"tuned live on {res.device.gpu_name}"
        m, n, k = res.problem.shape
        entries = [("tuned CUTLASS", res.best.time_ms if res.best else None),
                   *res.baselines.items()]
        return [{"m": m, "n": n, "k": k, "dtype": res.problem.dtype_a,
                 "layout": res.problem.layout, "kernel": name, "ms": ms,
                 "gpu_name": res.device.gpu_name, "source": source} for name, ms in entries]

    def _default_title(self) -> str:
        gpus = sorted({r["gpu_name"] for r in self.rows if r["gpu_name"]})
        sources = sorted({r["source"] for r in self.rows if r["source"]})
        shapes = len({(r["m"], r["n"], r["k"], r["dtype"], r["layout"]) for r in self.rows})
        text = f"{shapes} problem(s)"
        if sources:  # "recorded on <GPU>, <date>" / "tuned live on <GPU>"
            return f"{text} — " + "; ".join(sources)
        return f"{text} on " + ", ".join(gpus) if gpus else text

    def problems(self) -> list[tuple[int, int, int, str, str]]:
        """The problems ``(m, n, k, dtype, layout)``, in first-seen order."""
        seen: dict[tuple, None] = {}
        for r in self.rows:
            seen.setdefault((r["m"], r["n"], r["k"], r["dtype"], r["layout"]), None)
        return list(seen)

    def kernels(self) -> list[str]:
        """The kernels compared: tuned CUTLASS first, then cuBLAS, torch, others."""
        order = {"tuned CUTLASS": 0, "cublas": 1, "torch": 2}
        names = {r["kernel"] for r in self.rows}
        return sorted(names, key=lambda name: (order.get(name, 3), name))

    @staticmethod
    def _label(problem: tuple[int, int, int, str, str]) -> str:
        m, n, k, dtype, layout = problem
        return f"{_shape(m, n, k)} {dtype} {layout}"

    def to_frame(self) -> pd.DataFrame:
        """One row per problem and kernel: ms, TFLOP/s, % of the dense peak, speed vs
        cuBLAS (``cublas_ms / ms``: above 1 is faster than cuBLAS), device, source."""
        import pandas as pd

        from ..kernels.tuning.autotune import peak_tflops

        cublas = {(r["m"], r["n"], r["k"], r["dtype"], r["layout"]): r["ms"]
                  for r in self.rows if r["kernel"] == "cublas" and r["ms"]}
        out = []
        for r in self.rows:
            key = (r["m"], r["n"], r["k"], r["dtype"], r["layout"])
            ms = r["ms"] if r["ms"] and r["ms"] == r["ms"] else None
            tflops = 2.0 * r["m"] * r["n"] * r["k"] / (ms * 1e-3) / 1e12 if ms else None
            peak = peak_tflops(r["gpu_name"], r["dtype"]) if r["gpu_name"] else None
            ref = cublas.get(key)
            out.append({"problem": self._label(key), "kernel": kernel_label(r["kernel"]),
                        "ms": ms, "tflops": tflops,
                        "pct_of_peak": 100 * tflops / peak if tflops and peak else None,
                        "vs_cublas": ref / ms if ref and ms else None,
                        "gpu_name": r["gpu_name"], "source": r["source"]})
        return pd.DataFrame(out, columns=["problem", "kernel", "ms", "tflops", "pct_of_peak",
                                          "vs_cublas", "gpu_name", "source"])

    def ratios(self) -> pd.DataFrame:
        """One row per problem: TFLOP/s of each kernel, the tuned kernel's % of the dense
        peak, and each kernel's speed relative to cuBLAS (``x cuBLAS``)."""
        import pandas as pd

        frame = self.to_frame()
        labels = [kernel_label(k) for k in self.kernels()]
        rows = []
        for problem in self.problems():
            name = self._label(problem)
            part = frame[frame["problem"] == name].set_index("kernel")
            row: dict[str, Any] = {"problem": name}
            for label in labels:
                row[f"{label} TFLOP/s"] = part["tflops"].get(label)
            row["tuned % of peak"] = part["pct_of_peak"].get("tuned CUTLASS")
            if "cuBLAS" in labels:
                for label in labels:
                    if label != "cuBLAS":
                        row[f"{label} x cuBLAS"] = part["vs_cublas"].get(label)
            rows.append(row)
        return pd.DataFrame(rows)

    def summary(self) -> str:
        """One line: the tuned kernel's median speed relative to cuBLAS, or why not."""
        import statistics

        frame = self.to_frame()
        tuned = frame[(frame["kernel"] == "tuned CUTLASS") & frame["vs_cublas"].notna()]
        if tuned.empty:
            return ("no cuBLAS time to compare with (the results hold no cuBLAS baseline; "
                    "a recording has them when its run recorded baseline rows)")
        ratios = tuned["vs_cublas"].tolist()
        faster = sum(r > 1.0 for r in ratios)
        return (f"tuned CUTLASS vs cuBLAS: median {statistics.median(ratios):.2f}x over "
                f"{len(ratios)} problem(s), faster on {faster}")

    # -- text, HTML, pictures ---------------------------------------------------------------
    def to_text(self) -> str:
        """Deterministic text: title, summary, ratio table."""
        table = self.ratios().round(3).to_string(index=False)
        return f"KernelComparison: {self.title}\n{self.summary()}\n\n{table}"

    def to_html(self) -> str:
        """Deterministic HTML: title, summary, ratio table."""
        return (f"<div class='pyc-lab-kernel-comparison'><h4>Kernel comparison: "
                f"{escape(self.title)}</h4><p>{escape(self.summary())}</p>"
                f"{frame_html(self.ratios(), 'TFLOP/s and speed relative to cuBLAS')}</div>")

    def figure(self) -> Any:
        """Grouped bars: TFLOP/s per problem for each kernel, % of dense peak on the bars,
        the dense peak dotted."""
        from ..kernels.tuning.autotune import peak_tflops

        go = require_plotly()
        frame = self.to_frame()
        names = [self._label(p) for p in self.problems()]
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
                textposition="outside",
                customdata=[[_fmt(part["ms"].get(p), ".4f"), _fmt(x, ".1f"),
                             _fmt(v, ".2f")] for p, x, v in zip(names, pct, vs, strict=True)],
                hovertemplate=(f"<b>{escape(label)}</b> %{{x}}<br>%{{y:.1f}} TFLOP/s, "
                               "%{customdata[0]} ms<br>%{customdata[1]} % of dense peak<br>"
                               "%{customdata[2]}x cuBLAS<extra></extra>")))
        peaks = sorted({peak_tflops(r["gpu_name"], r["dtype"]) for r in self.rows
                        if r["gpu_name"]} - {None})
        for peak in peaks:
            fig.add_hline(y=peak, line=dict(color="#888", dash="dot"),
                          annotation_text=f"dense peak {peak:g} TFLOP/s",
                          annotation_position="top left")
        fig.update_layout(
            barmode="group", title=dict(text=escape(self.title), font=dict(size=13)),
            yaxis=dict(title="TFLOP/s", rangemode="tozero"), xaxis=dict(title=None),
            height=420, margin=dict(l=50, r=10, t=60, b=40), plot_bgcolor="white",
            legend=dict(orientation="h", y=-0.15))
        fig.update_yaxes(showgrid=True, gridcolor="#eee")
        return fig

