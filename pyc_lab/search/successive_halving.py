"""Successive halving: screen every candidate cheaply, refine the best ones at length.

Each *rung* evaluates the surviving candidates at one fidelity (timing iterations).
The first rung screens every candidate (or as many as the budget allows) at
``min_fidelity``; failures drop out at once; the fastest ``ceil(n_ok / eta)`` of the
successful ones survive to the next rung, measured at ``eta`` times the fidelity, and so
on until a rung at ``max_fidelity``. With the defaults the rungs are 1, 3, 9 and 27
iterations: most candidates cost one iteration, and only a handful the full 27.

When a single candidate survives before the top rung, it goes straight to
``max_fidelity`` (the intermediate rungs could not change the ranking).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ..errors import PycLabError
from .context import SearchContext
from .strategy import DEFAULT_FIDELITY, Strategy, _check_int

__all__ = ["SuccessiveHalving"]

log = logging.getLogger(__name__)


class SuccessiveHalving(Strategy):
    """Multi-fidelity search: many cheap measurements, few expensive ones.

    Parameters
    ----------
    eta
        The reduction factor: each rung keeps ``ceil(1/eta)`` of the successful
        candidates and multiplies the fidelity by ``eta``. A whole number >= 2.
    min_fidelity
        Timing iterations of the screening rung.
    max_fidelity
        Timing iterations of the last rung (the last rung is clipped to it when
        ``min_fidelity * eta**k`` overshoots).

    Notes
    -----
    The screening order is a permutation drawn from the run's rng; with
    ``Budget(max_candidates=N)`` smaller than the space, ``N`` candidates drawn uniformly
    are screened and the result says ``stopped_by="max_candidates"``. Re-measuring a
    screened candidate at a higher fidelity does not count against ``max_candidates``.
    Within a rung candidates are measured best-first, so that a time budget running out
    mid-rung has refined the most promising ones.
    """

    name = "successive_halving"

    def __init__(
        self, eta: int = 3, min_fidelity: int = 1, max_fidelity: int = DEFAULT_FIDELITY
    ) -> None:
        self.eta = _check_int("SuccessiveHalving", "eta", eta, 2)
        self.min_fidelity = _check_int("SuccessiveHalving", "min_fidelity", min_fidelity, 1)
        self.max_fidelity = _check_int("SuccessiveHalving", "max_fidelity", max_fidelity, 1)
        if self.max_fidelity < self.min_fidelity:
            raise PycLabError(
                f"SuccessiveHalving(min_fidelity={min_fidelity}, max_fidelity={max_fidelity}):"
                " max_fidelity must be >= min_fidelity."
            )

    def options(self) -> dict[str, Any]:
        """The options: ``eta``, ``min_fidelity``, ``max_fidelity``."""
        return {
            "eta": self.eta,
            "min_fidelity": self.min_fidelity,
            "max_fidelity": self.max_fidelity,
        }

    def rungs(self) -> list[int]:
        """The fidelities of the rungs, when no single survivor cuts them short."""
        out = [self.min_fidelity]
        while out[-1] < self.max_fidelity:
            out.append(min(out[-1] * self.eta, self.max_fidelity))
        return out

    def search(self, ctx: SearchContext) -> None:
        """Screen, keep the top ``1/eta``, raise the fidelity, until the top rung."""
        space = ctx.space
        order = ctx.rng.permutation(len(space))
        left = ctx.candidates_left()
        if left is not None and left < len(order):
            order = order[:left]
            ctx.note_limit("max_candidates")
        survivors = [space[int(i)] for i in order]
        fidelity = self.min_fidelity
        rung = 0
        while survivors:
            scored: list[tuple[float, int, dict[str, Any]]] = []
            for candidate in survivors:
                trial = ctx.evaluate(candidate, fidelity)
                if trial.ok and trial.time is not None:
                    scored.append((trial.time, len(scored), candidate))
            log.debug(
                "rung %d at fidelity %d: %d of %d candidates ok",
                rung, fidelity, len(scored), len(survivors),
            )
            if fidelity >= self.max_fidelity:
                break
            scored.sort(key=lambda s: (s[0], s[1]))
            keep = math.ceil(len(scored) / self.eta)
            survivors = [c for _, _, c in scored[:keep]]
            if len(survivors) == 1:
                fidelity = self.max_fidelity
            else:
                fidelity = min(fidelity * self.eta, self.max_fidelity)
            rung += 1
