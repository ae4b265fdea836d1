"""Search: tune any objective — strategies, spaces, budgets, observers, the tuning session.

.. code-block:: python

    from pyc_lab.search import Budget, Outcome, SearchSpace, TuningSession

    space = SearchSpace(
        {"tile_m": [64, 128, 256], "tile_n": [64, 128, 256], "stages": [2, 3, 4, 5]},
        restrictions=[lambda c: c["tile_m"] * c["tile_n"] <= 128 * 256],
    )

    class Tiles:                                # a runner: the candidates and one measurement
        def space(self):
            return space

        def evaluate(self, candidate, fidelity):  # compile, check, time `fidelity` runs
            ...
            return Outcome("ok", time=0.42)       # or Outcome("compile_error", message=...)

    session = TuningSession(Tiles(), "successive_halving",
                            strategy_options={"eta": 3, "max_fidelity": 27},
                            budget=Budget(max_seconds=600), observers=[print])
    result = session.run()
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

Modules, one idea each (after Kernel Tuner): :mod:`.space` (candidates),
:mod:`.trials` (outcomes, trials, results), :mod:`.budget`, :mod:`.context` (what a
strategy evaluates through: budget, failures, observers, stop), :mod:`.strategy` (the
base class), one module per strategy, :mod:`.registry` (strategies by name) and
:mod:`.session` (:class:`TuningSession`: a runner, a strategy, a budget, observers).
"""

from .._lazy import lazy_face

_EXPORTS = {
    "Budget": "budget",
    "STOP_REASONS": "context", "Evaluate": "context", "Observer": "context",
    "SearchContext": "context", "StopSearch": "context",
    "Evolutionary": "evolutionary", "Exhaustive": "exhaustive",
    "RandomSearch": "random_search", "SuccessiveHalving": "successive_halving",
    "STRATEGIES": "registry", "get_strategy": "registry", "normalise_name": "registry",
    "Runner": "session", "TuningSession": "session",
    "Candidate": "space", "RngLike": "space", "SearchSpace": "space",
    "candidate_key": "space",
    "DEFAULT_FIDELITY": "strategy", "Strategy": "strategy",
    "Outcome": "trials", "SearchResult": "trials", "Trial": "trials",
    "select_best": "trials",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, globals())
