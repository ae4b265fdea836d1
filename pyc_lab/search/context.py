"""The search context: what a strategy evaluates candidates through.

It enforces the budget, catches failures, records every trial, honours a stop event
and calls the observers, so that strategies only decide *what* to evaluate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import PycLabError
from .budget import Budget
from .space import Candidate, SearchSpace, candidate_key
from .trials import Outcome, Trial, _normalise_outcome

__all__ = ["STOP_REASONS", "Evaluate", "Observer", "SearchContext", "StopSearch"]

log = logging.getLogger(__name__)

#: ``evaluate(candidate, fidelity) -> Outcome``.
Evaluate = Callable[[Candidate, int], Outcome]
#: ``observer(trial)``, called after every evaluation; may raise :class:`StopSearch`.
Observer = Callable[[Trial], None]

#: The values of :attr:`~pyc_lab.search.trials.SearchResult.stopped_by`.
STOP_REASONS = ("exhausted", "max_candidates", "max_seconds", "observer")


class StopSearch(Exception):
    """Raise from an observer (or from ``evaluate``) to end the search now.

    The search returns normally with everything measured so far and
    ``stopped_by == "observer"``.
    """


class _BudgetSpent(Exception):
    """Raised by :meth:`SearchContext.evaluate` when the budget allows no more."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SearchContext:
    """What a strategy's :meth:`Strategy.search` works with.

    It evaluates candidates under the budget, records each :class:`Trial`, catches
    failures and calls the observers. Strategies read :attr:`space` and :attr:`rng` and
    call :meth:`evaluate`; when the budget is spent or the stop event is set,
    :meth:`evaluate` raises an internal signal that :meth:`Strategy.run` catches
    (strategies must not catch it: avoid bare ``except Exception`` around
    :meth:`evaluate`).

    Parameters
    ----------
    space, evaluate, budget, rng
        The candidates, the objective, the limits and the random generator.
    observers
        Called in order with each trial; raising :class:`StopSearch` ends the search,
        any other exception is logged and the search goes on.
    stop
        Once set, no new evaluation starts (a Stop button); the search ends as if an
        observer had raised :class:`StopSearch`.
    """

    def __init__(
        self,
        space: SearchSpace,
        evaluate: Evaluate,
        budget: Budget,
        rng: np.random.Generator,
        observers: Sequence[Observer] = (),
        stop: threading.Event | None = None,
    ) -> None:
        self.space = space
        self.rng = rng
        self.budget = budget
        self.trials: list[Trial] = []
        self._evaluate = evaluate
        self._observers = tuple(observers)
        self._stop = stop
        self._clock = budget.clock
        self._start = self._clock()
        self._seen: dict[str, int] = {}
        self._observer_errors = 0
        self.limited_by: str | None = None

    @property
    def elapsed_s(self) -> float:
        """Seconds since the search started."""
        return self._clock() - self._start

    @property
    def n_candidates(self) -> int:
        """Distinct candidates evaluated so far."""
        return len(self._seen)

    def candidates_left(self) -> int | None:
        """How many new candidates the budget still allows (``None``: no limit)."""
        if self.budget.max_candidates is None:
            return None
        return max(0, int(self.budget.max_candidates) - len(self._seen))

    def seen(self, candidate: Mapping[str, Any]) -> bool:
        """Whether ``candidate`` was evaluated already (at any fidelity)."""
        return candidate_key(candidate) in self._seen

    def note_limit(self, reason: str) -> None:
        """Record that the budget shaped the search without interrupting it.

        A strategy that trims its plan to fit (successive halving screening fewer
        candidates than the space holds) calls this so that the result's
        ``stopped_by`` says so.
        """
        if reason not in STOP_REASONS:
            raise PycLabError(f"unknown stop reason {reason!r}; known: {STOP_REASONS}")
        self.limited_by = reason

    def evaluate(self, candidate: Mapping[str, Any], fidelity: int) -> Trial:
        """Evaluate one candidate at one fidelity and record the trial.

        Parameters
        ----------
        candidate
            The candidate; the objective receives a copy.
        fidelity
            Timing iterations, >= 1.

        Returns
        -------
        Trial
            Failures included: an exception from the objective becomes status
            ``"error"`` with the exception as message.
        """
        if isinstance(fidelity, bool) or not isinstance(fidelity, (int, np.integer)) or (
            fidelity < 1
        ):
            raise PycLabError(f"fidelity must be a whole number >= 1, got {fidelity!r}.")
        fidelity = int(fidelity)
        if self._stop is not None and self._stop.is_set():
            raise StopSearch("the stop event was set")
        budget = self.budget
        if budget.max_seconds is not None and self.elapsed_s >= budget.max_seconds:
            raise _BudgetSpent("max_seconds")
        key = candidate_key(candidate)
        if (
            key not in self._seen
            and budget.max_candidates is not None
            and len(self._seen) >= budget.max_candidates
        ):
            raise _BudgetSpent("max_candidates")

        cand = dict(candidate)
        t0 = self._clock()
        try:
            raw = self._evaluate(dict(cand), fidelity)
        except StopSearch:
            raise
        except Exception as exc:
            log.warning("candidate %s raised %s: %s", cand, type(exc).__name__, exc)
            outcome = Outcome("error", None, f"{type(exc).__name__}: {exc}")
        else:
            outcome = _normalise_outcome(raw)
        t1 = self._clock()

        trial = Trial(
            index=len(self.trials),
            candidate=cand,
            fidelity=fidelity,
            outcome=outcome,
            elapsed_s=t1 - t0,
            started_s=t0 - self._start,
        )
        self.trials.append(trial)
        self._seen.setdefault(key, trial.index)
        log.debug(
            "trial %d: %s @%d -> %s %s", trial.index, cand, fidelity, outcome.status,
            outcome.time if outcome.ok else outcome.message,
        )
        for observer in self._observers:
            try:
                observer(trial)
            except StopSearch:
                raise
            except Exception:
                self._observer_errors += 1
                if self._observer_errors == 1:
                    log.exception("a search observer raised; the search goes on")
        return trial
