"""What a search measured: outcomes, trials, the best trial and the result of a search.

An *outcome* is what one evaluation of one candidate gave: ``"ok"`` with a time, or a
named failure (``"compile_error"``, ``"wrong_result"``, ...) that is recorded and
skipped, never fatal. A *trial* is one evaluation at one fidelity (timing iterations);
a :class:`SearchResult` holds every trial, the best one and why the search stopped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .space import Candidate, candidate_key

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["Outcome", "SearchResult", "Trial", "select_best"]


@dataclass(frozen=True)
class Outcome:
    """What one evaluation of one candidate gave.

    Parameters
    ----------
    status
        ``"ok"`` for a correct, timed run; anything else names a failure, e.g.
        ``"compile_error"``, ``"wrong_result"``, ``"nan"``, ``"timeout"``. The search
        itself uses ``"error"`` when ``evaluate`` raised or returned something unusable.
    time
        The measured time (lower is better) when ``status == "ok"``, in whatever unit
        the objective uses throughout one search (milliseconds, typically).
    message
        A human-readable detail: the compiler's error, the mismatch found, ...
    details
        What else the runner measured for observers and tables (throughput, error
        against the reference, build time, ...); not part of equality.
    """

    status: str
    time: float | None = None
    message: str = ""
    details: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def ok(self) -> bool:
        """Whether the candidate ran, was correct and was timed."""
        return self.status == "ok"


def _normalise_outcome(result: Any) -> Outcome:
    """Turn what ``evaluate`` returned into a well-formed :class:`Outcome`."""
    if not isinstance(result, Outcome):
        return Outcome("error", None, f"evaluate returned {type(result).__name__}, not an Outcome")
    if not result.ok:
        return result
    t = result.time
    details = result.details
    if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)):
        return Outcome("error", None, f"status 'ok' without a numeric time (time={t!r})",
                       details)
    t = float(t)
    if math.isnan(t) or math.isinf(t):
        return Outcome("nan", t, f"status 'ok' with a non-finite time ({t})", details)
    if t < 0:
        return Outcome("error", t, f"status 'ok' with a negative time ({t})", details)
    return Outcome("ok", t, result.message, details)


@dataclass(frozen=True)
class Trial:
    """One evaluation of one candidate at one fidelity.

    Parameters
    ----------
    index
        Position in the search (0, 1, 2, ...), i.e. in :attr:`SearchResult.trials`.
    candidate
        The candidate evaluated (a copy: changing it changes nothing else).
    fidelity
        The number of timing iterations asked for.
    outcome
        What the evaluation gave.
    elapsed_s
        Wall-clock seconds the evaluation took (compile + run + check), by the
        budget's clock.
    started_s
        Seconds from the start of the search to the start of this evaluation.
    """

    index: int
    candidate: Candidate
    fidelity: int
    outcome: Outcome
    elapsed_s: float
    started_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the outcome is ``"ok"``."""
        return self.outcome.ok

    @property
    def time(self) -> float | None:
        """The outcome's time (``None`` for most failures)."""
        return self.outcome.time

    @property
    def status(self) -> str:
        """The outcome's status."""
        return self.outcome.status

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the trial (for a tuning database or a log)."""
        return {
            "index": self.index,
            "candidate": dict(self.candidate),
            "fidelity": self.fidelity,
            "status": self.outcome.status,
            "time": self.outcome.time,
            "message": self.outcome.message,
            "elapsed_s": self.elapsed_s,
            "started_s": self.started_s,
        }


def select_best(trials: Sequence[Trial]) -> Trial | None:
    """The best trial: lowest time among ``"ok"`` trials, at the highest fidelity reached.

    Each candidate is represented by its trial at the highest fidelity it reached (the
    latest one if it was measured several times there); it is eligible only if that
    trial is ``"ok"`` — a candidate that passed a cheap screen and then failed a longer
    run is not trusted. Among eligible candidates, one measured at a higher fidelity
    beats one measured at a lower fidelity (its time is the better estimate); at equal
    fidelity the lower time wins, then the earlier trial.

    Parameters
    ----------
    trials
        Trials in evaluation order.

    Returns
    -------
    Trial or None
        ``None`` when no candidate is eligible.
    """
    top: dict[str, Trial] = {}
    for t in trials:
        key = candidate_key(t.candidate)
        prev = top.get(key)
        if prev is None or t.fidelity >= prev.fidelity:
            top[key] = t
    eligible = [t for t in top.values() if t.ok and t.time is not None]
    if not eligible:
        return None
    return min(eligible, key=lambda t: (-t.fidelity, t.time, t.index))


_FIXED_COLUMNS = ["fidelity", "status", "time", "message", "elapsed_s", "started_s", "best"]


@dataclass
@dataclass
class SearchResult:
    """Everything a search measured.

    Parameters
    ----------
    trials
        Every evaluation, in order.
    best
        See :func:`select_best`; ``None`` when nothing succeeded.
    stopped_by
        ``"exhausted"`` (the strategy finished), ``"max_candidates"`` or
        ``"max_seconds"`` (the budget ran out), ``"observer"`` (:class:`StopSearch`).
    strategy
        The strategy's name.
    """

    trials: list[Trial]
    best: Trial | None
    stopped_by: str
    strategy: str = ""

    def __repr__(self) -> str:
        best = "None" if self.best is None else f"{self.best.candidate!r} @ {self.best.time:g}"
        return (
            f"SearchResult(strategy={self.strategy!r}, trials={len(self.trials)}, "
            f"candidates={self.n_candidates}, best={best}, stopped_by={self.stopped_by!r})"
        )

    @property
    def n_evaluations(self) -> int:
        """The number of trials."""
        return len(self.trials)

    @property
    def n_candidates(self) -> int:
        """The number of distinct candidates evaluated."""
        return len({candidate_key(t.candidate) for t in self.trials})

    @property
    def failures(self) -> list[Trial]:
        """The trials whose status is not ``"ok"``."""
        return [t for t in self.trials if not t.ok]

    def to_frame(self) -> pd.DataFrame:
        """One row per trial.

        Returns
        -------
        pandas.DataFrame
            Columns ``index``, one column per parameter (prefixed ``param_`` if its name
            clashes with another column), then ``fidelity``, ``status``, ``time``,
            ``message``, ``elapsed_s``, ``started_s`` and ``best`` (true on the row of
            :attr:`best`).
        """
        import pandas as pd

        names: list[str] = []
        for t in self.trials:
            for n in t.candidate:
                if n not in names:
                    names.append(n)
        reserved = {"index", *_FIXED_COLUMNS}
        column = {n: (f"param_{n}" if n in reserved else n) for n in names}
        best_index = None if self.best is None else self.best.index
        rows = []
        for t in self.trials:
            row: dict[str, Any] = {"index": t.index}
            for n in names:
                row[column[n]] = t.candidate.get(n)
            row.update(
                fidelity=t.fidelity,
                status=t.status,
                time=t.time,
                message=t.outcome.message,
                elapsed_s=t.elapsed_s,
                started_s=t.started_s,
                best=t.index == best_index,
            )
            rows.append(row)
        columns = ["index", *(column[n] for n in names), *_FIXED_COLUMNS]
        return pd.DataFrame(rows, columns=columns)
