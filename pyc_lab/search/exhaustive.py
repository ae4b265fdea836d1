"""Exhaustive search: every valid candidate once, at full fidelity, in space order."""

from __future__ import annotations

import logging
from typing import Any

from .context import SearchContext
from .strategy import DEFAULT_FIDELITY, Strategy, _check_int

__all__ = ["Exhaustive"]

log = logging.getLogger(__name__)


class Exhaustive(Strategy):
    """Evaluate every valid candidate once, in the space's enumeration order.

    The reference the other strategies are measured against: it finds the true best
    (up to measurement noise) at the cost of evaluating everything. The rng is unused.

    Parameters
    ----------
    fidelity
        Timing iterations for every evaluation.
    """

    name = "exhaustive"

    def __init__(self, fidelity: int = DEFAULT_FIDELITY) -> None:
        self.fidelity = _check_int("Exhaustive", "fidelity", fidelity, 1)

    def options(self) -> dict[str, Any]:
        """The options: ``fidelity``."""
        return {"fidelity": self.fidelity}

    def search(self, ctx: SearchContext) -> None:
        """Evaluate each candidate of ``ctx.space`` in order."""
        for candidate in ctx.space:
            ctx.evaluate(candidate, self.fidelity)
