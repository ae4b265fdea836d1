"""The tuning session: one loop that drives every tuner, whatever it measures.

A tuner is a *runner* — what Kernel Tuner calls a runner — that knows its candidates and
how to measure one: building and timing CUTLASS GEMMs on this GPU, replaying a tuning
recorded elsewhere, running a conveyor belt with a setting. :class:`TuningSession` puts
a runner together with a search strategy, a budget, observers and a stop event, and
runs the search; the strategies, the budget, failure isolation, observers and stopping
are the same for every runner.

Examples
--------
>>> from pyc_lab.search import Outcome, SearchSpace, TuningSession
>>> class Squares:
...     def space(self):
...         return SearchSpace({"x": [3, 1, 2]})
...     def evaluate(self, candidate, fidelity):
...         return Outcome("ok", time=float(candidate["x"] ** 2))
>>> TuningSession(Squares(), "exhaustive").run().best.candidate
{'x': 1}
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import PycLabError
from .budget import Budget
from .context import Observer
from .registry import get_strategy
from .space import Candidate, RngLike, SearchSpace
from .strategy import Strategy
from .trials import Outcome, SearchResult

__all__ = ["Runner", "TuningSession"]

log = logging.getLogger(__name__)


@runtime_checkable
class Runner(Protocol):
    """What a :class:`TuningSession` measures with.

    ``space()`` returns the candidates; ``evaluate(candidate, fidelity)`` measures one
    (``fidelity`` timing iterations) and returns an
    :class:`~pyc_lab.search.trials.Outcome` — a failure is an outcome, not an exception
    (an exception is recorded as status ``"error"``; raising
    :class:`~pyc_lab.search.context.StopSearch` ends the search, e.g. when a kernel hangs
    the device).
    """

    def space(self) -> SearchSpace:
        """The candidates this runner can measure."""
        ...

    def evaluate(self, candidate: Candidate, fidelity: int) -> Outcome:
        """Measure one candidate at one fidelity."""
        ...


class TuningSession:
    """A runner, a strategy, a budget, observers and a stop event: one search.

    Parameters
    ----------
    runner
        See :class:`Runner`.
    strategy
        A :class:`~pyc_lab.search.strategy.Strategy`, or a registry name
        (:data:`~pyc_lab.search.registry.STRATEGIES`) configured with
        ``strategy_options``.
    strategy_options
        Options for a strategy given by name.
    budget
        Limits in candidates and seconds (none by default).
    observers
        Called with every :class:`~pyc_lab.search.trials.Trial` as it finishes (a
        progress bar, a live chart, a log); raising ``StopSearch`` ends the search.
    stop
        Set it to stop after the candidate being measured.
    seed
        The strategy's random seed: the same seed searches the same way.

    Raises
    ------
    PycLabError
        For a runner without ``space``/``evaluate``, an unknown strategy or option, or a
        budget that is not a :class:`~pyc_lab.search.budget.Budget`.
    """

    def __init__(self, runner: Runner, strategy: str | Strategy = "exhaustive", *,
                 strategy_options: Mapping[str, Any] | None = None,
                 budget: Budget | None = None, observers: Sequence[Observer] = (),
                 stop: threading.Event | None = None, seed: RngLike = 0) -> None:
        if not isinstance(runner, Runner):
            raise PycLabError(f"TuningSession needs a runner with space() and evaluate(); "
                              f"got {type(runner).__name__}")
        if isinstance(strategy, Strategy):
            if strategy_options:
                raise PycLabError("strategy_options go with a strategy given by name; this "
                                  f"one is already configured: {strategy!r}")
            self.strategy = strategy
        else:
            self.strategy = get_strategy(strategy, **dict(strategy_options or {}))
        if budget is not None and not isinstance(budget, Budget):
            raise PycLabError(f"TuningSession(budget=...) takes a Budget, got {budget!r}")
        self.runner = runner
        self.budget = budget if budget is not None else Budget()
        self.observers = tuple(observers)
        self.stop = stop
        self.seed = seed

    def run(self) -> SearchResult:
        """Search the runner's space; everything measured comes back, even when stopped.

        Returns
        -------
        SearchResult
            ``stopped_by`` is ``"exhausted"``, ``"max_candidates"``, ``"max_seconds"`` or
            ``"observer"`` (an observer, the runner or the stop event ended it).
        """
        space = self.runner.space()
        log.info("tuning session: %s over %d candidates with %r", type(self.runner).__name__,
                 len(space), self.strategy)
        return self.strategy.run(space, self.runner.evaluate, self.budget, rng=self.seed,
                                 observer=self.observers, stop=self.stop)

    def __repr__(self) -> str:
        return (f"TuningSession({type(self.runner).__name__}, {self.strategy!r}, "
                f"max_candidates={self.budget.max_candidates}, "
                f"max_seconds={self.budget.max_seconds})")
