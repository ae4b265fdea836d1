"""The base class of search strategies, and the checks their options share.

Writing a strategy means subclassing :class:`Strategy` and implementing
:meth:`Strategy.search`, which asks :meth:`~pyc_lab.search.context.SearchContext.evaluate`
for measurements; the context enforces the budget, catches failures, times and
records the trials, honours the stop event and calls the observers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import PycLabError
from .budget import Budget
from .context import Evaluate, Observer, SearchContext, StopSearch, _BudgetSpent
from .space import RngLike, SearchSpace
from .trials import SearchResult, select_best

__all__ = ["DEFAULT_FIDELITY", "Strategy"]

log = logging.getLogger(__name__)

#: Timing iterations used by the single-fidelity strategies unless told otherwise; also
#: the default top rung of successive halving (1, 3, 9, 27 with ``eta=3``).
DEFAULT_FIDELITY = 27


class Strategy:
    """Base class of search strategies.

    Subclasses set :attr:`name`, take their options in ``__init__`` (validated there,
    raising :class:`~pyc_lab.errors.PycLabError`), report them from :meth:`options` and
    implement :meth:`search`.
    """

    #: The registry name (see :data:`pyc_lab.search.STRATEGIES`).
    name: str = "strategy"

    def options(self) -> dict[str, Any]:
        """The strategy's options, as given to ``__init__`` (JSON-able)."""
        return {}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"

    def search(self, ctx: SearchContext) -> None:
        """Evaluate candidates through ``ctx.evaluate`` until the strategy is done.

        Parameters
        ----------
        ctx
            The space, the random generator and the budgeted evaluator.
        """
        raise NotImplementedError

    def run(
        self,
        space: SearchSpace,
        evaluate: Evaluate,
        budget: Budget | None = None,
        *,
        rng: RngLike = None,
        observer: Observer | Sequence[Observer] | None = None,
        stop: threading.Event | None = None,
    ) -> SearchResult:
        """Search ``space`` for the candidate with the lowest time.

        Parameters
        ----------
        space
            The candidates.
        evaluate
            ``evaluate(candidate, fidelity) -> Outcome``. Exceptions it raises are
            recorded as status ``"error"``; :class:`StopSearch` ends the search.
        budget
            Limits; ``None`` for none.
        rng
            A seed or NumPy generator; the same seed gives the same search (for a
            deterministic objective).
        observer
            One callable or a sequence of them, each called with every :class:`Trial`
            right after its evaluation; raising :class:`StopSearch` ends the search
            (``stopped_by="observer"``). Other exceptions are logged and the search
            goes on.
        stop
            An event; once it is set no new evaluation starts and the search ends with
            ``stopped_by="observer"`` (a Stop button).

        Returns
        -------
        SearchResult
            Everything measured, even when stopped early.
        """
        if not isinstance(space, SearchSpace):
            raise PycLabError(
                f"{self.name}: space must be a SearchSpace, got {type(space).__name__}."
            )
        if not callable(evaluate):
            raise PycLabError(f"{self.name}: evaluate must be callable.")
        budget = Budget() if budget is None else budget
        if not isinstance(budget, Budget):
            raise PycLabError(f"{self.name}: budget must be a Budget, got {budget!r}.")
        if observer is None:
            observers: tuple[Observer, ...] = ()
        elif callable(observer):
            observers = (observer,)
        else:
            observers = tuple(observer)
        if not all(callable(o) for o in observers):
            raise PycLabError(f"{self.name}: observer must be a callable or a sequence of "
                              f"callables, got {observer!r}.")
        ctx = SearchContext(space, evaluate, budget, np.random.default_rng(rng), observers,
                            stop)
        log.info(
            "%r: searching %d candidates (max_candidates=%s, max_seconds=%s)",
            self, len(space), budget.max_candidates, budget.max_seconds,
        )
        try:
            self.search(ctx)
        except _BudgetSpent as spent:
            stopped_by = spent.reason
        except StopSearch:
            stopped_by = "observer"
        else:
            stopped_by = ctx.limited_by or "exhausted"
        if ctx._observer_errors > 1:
            log.error("the search observer raised %d times in all", ctx._observer_errors)
        result = SearchResult(
            trials=list(ctx.trials),
            best=select_best(ctx.trials),
            stopped_by=stopped_by,
            strategy=self.name,
        )
        log.info("%r: %r", self, result)
        return result


def _check_int(owner: str, name: str, value: Any, minimum: int) -> int:
    """Validate a whole-number option, for the strategies' constructors."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise PycLabError(f"{owner}({name}={value!r}): give a whole number >= {minimum}.")
    return int(value)


def _check_rate(owner: str, name: str, value: Any) -> float:
    """Validate a probability option, for the strategies' constructors."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not 0.0 <= value <= 1.0
    ):
        raise PycLabError(f"{owner}({name}={value!r}): give a probability in [0, 1].")
    return float(value)
