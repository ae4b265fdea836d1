"""Per-GPU progress of a tuning sweep over Dask, live while it runs.

``SweepProgress`` is the ``observer`` of :func:`pyc_lab.autotune_many` over a cluster:
each finished problem updates one row per worker (its GPU) — problems done, tuned and
not tuned, seconds spent, the last problem and its winner — under an overall
``done / total`` line. With ``per_candidate=True`` each candidate measured updates its
worker's row as well: candidates measured, and what it is on now (problem, candidates
so far, the last one's time). Displayed before the sweep starts, its live form (an
ipywidgets progress bar and table) follows the sweep; elsewhere the text and HTML reprs
show where it stands. Worker addresses change from run to run, so the reprs number the
workers instead (``worker 1``, ``worker 2`` in order of first report); the addresses
are in :meth:`to_frame` and the live table.
"""

from __future__ import annotations

import threading
from typing import Any

from .display import View, escape, frame_html, frame_text, html_widget

__all__ = ["SweepProgress"]

_COLUMNS = ["worker", "done", "tuned", "not_tuned", "seconds", "last_problem", "last_winner",
            "candidates", "now"]


class SweepProgress(View):
    """Pass it as ``observer=`` to ``pl.autotune_many(..., client=...)`` and display it.

    Parameters
    ----------
    title
        A caption (default: ``"Tuning sweep"``).
    """

    def __init__(self, title: str = "Tuning sweep") -> None:
        self.title = title
        self.total: int | None = None
        self.done = 0
        self.events: list[dict[str, Any]] = []
        self._rows: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, int] = {}  # candidates reported per problem
        self._finished: set[str] = set()
        self._lock = threading.Lock()
        self._live: list[Any] = []  # the shown widgets: (bar, table)

    def __call__(self, event: dict[str, Any]) -> None:
        """Take one report of ``autotune_many``: a finished problem, or (with
        ``per_candidate=True``) a candidate measured."""
        with self._lock:
            if event.get("event") == "candidate":
                self._candidate(event)
            else:
                self._problem(event)
        for bar, table in self._live:
            bar.max, bar.value = max(1, self.total or 1), self.done
            bar.description = f"{self.done}/{self.total or '?'}"
            table.value = self._html(addresses=True)

    def _row(self, worker: str) -> dict[str, Any]:
        return self._rows.setdefault(worker, {
            "worker": worker, "done": 0, "tuned": 0, "not_tuned": 0, "seconds": 0.0,
            "last_problem": "", "last_winner": "", "candidates": 0, "now": ""})

    def _candidate(self, event: dict[str, Any]) -> None:
        problem = str(event.get("problem", ""))
        row = self._row(str(event.get("worker") or "here"))
        row["candidates"] += 1
        if problem in self._finished:  # a late report of a problem already done
            return
        seen = self._seen[problem] = self._seen.get(problem, 0) + 1
        ms = event.get("ms")
        row["now"] = f"{problem}: {seen} candidate(s)" + (
            f", last {ms:.3f} ms" if isinstance(ms, (int, float)) else "")

    def _problem(self, event: dict[str, Any]) -> None:
        self.events.append(dict(event))
        self.total = event.get("total", self.total)
        self.done = max(self.done, int(event.get("done", self.done + 1)))
        row = self._row(str(event.get("worker") or "here"))
        self._finished.add(str(event.get("problem", "")))
        row["now"] = ""
        row["done"] += 1
        row["tuned" if event.get("status") == "tuned" else "not_tuned"] += 1
        row["seconds"] += float(event.get("seconds") or 0.0)
        row["last_problem"] = str(event.get("problem", ""))
        row["last_winner"] = str(event.get("winner") or "")

    # -- data -------------------------------------------------------------------------
    def to_frame(self) -> Any:
        """One row per worker, in order of first report."""
        import pandas as pd

        with self._lock:
            rows = [dict(r) for r in self._rows.values()]
        return pd.DataFrame(rows, columns=_COLUMNS)

    def _header(self) -> str:
        total = "?" if self.total is None else self.total
        return (f"{self.title}: {self.done} of {total} problem(s) finished on "
                f"{len(self._rows)} worker(s)")

    # -- reprs ----------------------------------------------------------------------------
    def _numbered(self) -> Any:
        frame = self.to_frame()
        frame["worker"] = [f"worker {k + 1}" for k in range(len(frame))]
        return frame

    def to_text(self) -> str:
        """The header and the table, workers numbered instead of addressed."""
        frame = self._numbered()
        return "\n".join([self._header(), frame_text(frame)]) if len(frame) else \
            self._header()

    def to_html(self) -> str:
        """The header and the table, workers numbered instead of addressed."""
        return self._html(addresses=False)

    def _html(self, addresses: bool) -> str:
        frame = self.to_frame() if addresses else self._numbered()
        table = frame_html(frame) if len(frame) else ""
        return f"<div class='pyc-lab-sweep'><p>{escape(self._header())}</p>{table}</div>"

    def widget(self) -> Any:
        """A live view: a progress bar and the table, updated by every report."""
        import ipywidgets as w

        bar = w.IntProgress(value=self.done, min=0, max=max(1, self.total or 1),
                            description=f"{self.done}/{self.total or '?'}")
        table = html_widget(self._html(addresses=True))
        self._live.append((bar, table))
        return w.VBox([bar, table], layout=w.Layout(width="100%"))
