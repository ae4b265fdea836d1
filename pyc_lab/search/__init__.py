"""Search strategies of the kernel autotuner, one module per idea (after kernel_tuner).

.. code-block:: python

    from pyc_lab.search import Budget, Outcome, SearchSpace, get_strategy

    space = SearchSpace(
        {"tile_m": [64, 128, 256], "tile_n": [64, 128, 256], "stages": [2, 3, 4, 5]},
        restrictions=[lambda c: c["tile_m"] * c["tile_n"] <= 128 * 256],
    )

    def evaluate(candidate, fidelity):          # compile, check, time `fidelity` runs
        ...
        return Outcome("ok", time=0.42)         # or Outcome("compile_error", message=...)

    strategy = get_strategy("successive_halving", eta=3, max_fidelity=27)
    result = strategy.run(space, evaluate, Budget(max_seconds=600), rng=0)
    result.best.candidate, result.to_frame()

Strategies
----------
``exhaustive``
    Every valid candidate once, at full fidelity.
``random``
    Uniformly without replacement, as far as the budget goes.
``successive_halving``
    Screen everything at a low fidelity, refine the best ``1/eta`` at higher ones.
``evolutionary``
    A genetic algorithm (tournament selection, neighbour mutation, elitism): the
    model-guided one, for spaces too large to screen.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import PycLabError
from .base import (
    DEFAULT_FIDELITY,
    STOP_REASONS,
    Budget,
    Candidate,
    Evaluate,
    Observer,
    Outcome,
    SearchContext,
    SearchResult,
    SearchSpace,
    StopSearch,
    Strategy,
    Trial,
    candidate_key,
    select_best,
)
from .evolutionary import Evolutionary
from .exhaustive import Exhaustive
from .random_search import RandomSearch
from .successive_halving import SuccessiveHalving

__all__ = [
    "DEFAULT_FIDELITY",
    "STOP_REASONS",
    "STRATEGIES",
    "Budget",
    "Candidate",
    "Evaluate",
    "Evolutionary",
    "Exhaustive",
    "Observer",
    "Outcome",
    "RandomSearch",
    "SearchContext",
    "SearchResult",
    "SearchSpace",
    "StopSearch",
    "Strategy",
    "SuccessiveHalving",
    "Trial",
    "candidate_key",
    "get_strategy",
    "select_best",
]

#: Strategy name -> class.
STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (Exhaustive, RandomSearch, SuccessiveHalving, Evolutionary)
}


def get_strategy(name: str, **options: Any) -> Strategy:
    """A strategy by its registry name, configured with ``options``.

    Parameters
    ----------
    name
        A key of :data:`STRATEGIES` (case and ``-``/``_`` do not matter).
    **options
        Passed to the strategy's constructor, e.g. ``eta=3`` for successive halving.

    Returns
    -------
    Strategy

    Raises
    ------
    PycLabError
        For an unknown name (the message lists the known ones), an option the strategy
        does not take (the message lists those it does) or a bad option value.
    """
    key = str(name).strip().lower().replace("-", "_")
    try:
        cls = STRATEGIES[key]
    except KeyError:
        raise PycLabError(
            f"unknown search strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}."
        ) from None
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p in params if p != "self"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise PycLabError(
            f"search strategy {key!r} takes no option(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(accepted) or 'none'}."
        )
    return cls(**options)
