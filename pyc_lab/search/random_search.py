"""Random search: candidates drawn uniformly without replacement, until the budget ends."""

from __future__ import annotations

import logging
from typing import Any

from .context import SearchContext
from .strategy import DEFAULT_FIDELITY, Strategy, _check_int

__all__ = ["RandomSearch"]

log = logging.getLogger(__name__)


class RandomSearch(Strategy):
    """Evaluate valid candidates in a random order, each at most once.

    With ``Budget(max_candidates=N)`` it evaluates exactly ``N`` distinct candidates (or
    the whole space if smaller): a uniform sample, a strong baseline for any smarter
    strategy. The order is a permutation drawn from the run's rng, so a fixed seed
    repeats the search.

    Parameters
    ----------
    fidelity
        Timing iterations for every evaluation.
    """

    name = "random"

    def __init__(self, fidelity: int = DEFAULT_FIDELITY) -> None:
        self.fidelity = _check_int("RandomSearch", "fidelity", fidelity, 1)

    def options(self) -> dict[str, Any]:
        """The options: ``fidelity``."""
        return {"fidelity": self.fidelity}

    def search(self, ctx: SearchContext) -> None:
        """Evaluate the candidates of ``ctx.space`` in a random permutation."""
        space = ctx.space
        for i in ctx.rng.permutation(len(space)):
            ctx.evaluate(space[int(i)], self.fidelity)
