"""Budgets: how much a search may spend, in candidates and in seconds."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import PycLabError

__all__ = ["Budget"]


@dataclass(frozen=True)
class Budget:
    """How much a search may spend; checked before each evaluation.

    Parameters
    ----------
    max_candidates
        The most *distinct* candidates evaluated. Measuring an already-evaluated
        candidate again at a higher fidelity (successive halving's refinement) does not
        count again. ``None``: no limit.
    max_seconds
        No new evaluation starts once this many seconds have passed since the search
        started (an evaluation already running is not interrupted: per-candidate
        timeouts are the objective's business). ``None``: no limit.
    clock
        A monotonic clock in seconds (another one replays a search on a simulated clock).

    Raises
    ------
    PycLabError
        For a negative limit.
    """

    max_candidates: int | None = None
    max_seconds: float | None = None
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_candidates is not None and (
            isinstance(self.max_candidates, bool)
            or not isinstance(self.max_candidates, (int, np.integer))
            or self.max_candidates < 0
        ):
            raise PycLabError(
                f"Budget(max_candidates={self.max_candidates!r}): give a whole number >= 0 "
                "or None for no limit."
            )
        if self.max_seconds is not None and (
            isinstance(self.max_seconds, bool)
            or not isinstance(self.max_seconds, (int, float, np.integer, np.floating))
            or not self.max_seconds >= 0
        ):
            raise PycLabError(
                f"Budget(max_seconds={self.max_seconds!r}): give a number of seconds >= 0 "
                "or None for no limit."
            )
        if not callable(self.clock):
            raise PycLabError("Budget(clock=...) must be a callable returning seconds.")
