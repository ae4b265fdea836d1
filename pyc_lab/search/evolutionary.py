"""Evolutionary search: a genetic algorithm over the candidates, guided by measured times.

A population of candidates (random at first) breeds the next generation: parents are
picked by *tournament* (the fastest of a few drawn at random), a child mixes two
parents parameter by parameter (*uniform crossover*, kept only if it passes the
restrictions) and is *mutated* by stepping to a neighbour in the space (one parameter
moved to an adjacent value). The best few members survive unchanged (*elitism*).

Each candidate is evaluated at most once: a child that was already measured is walked
further through its neighbours, and failing that replaced by a random unmeasured
candidate, so every evaluation buys new information. Failed candidates rank last.
Every random choice comes from the run's rng: a fixed seed repeats the search.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ..errors import PycLabError
from .context import SearchContext
from .space import Candidate
from .strategy import DEFAULT_FIDELITY, Strategy, _check_int, _check_rate

__all__ = ["Evolutionary"]

log = logging.getLogger(__name__)

_Member = tuple[Candidate, float]


class Evolutionary(Strategy):
    """A genetic algorithm with tournament selection, neighbour mutation and elitism.

    Parameters
    ----------
    population
        Members per generation (>= 2). The first generation is a uniform random sample.
    generations
        Generations bred after the first; ``None`` runs until the budget or the space
        runs out. Evaluations are at most
        ``population + generations * (population - elite)``.
    tournament_size
        Members drawn (with replacement) per parent selection; the fastest wins.
        Larger means greedier.
    elite
        Best members carried unchanged into the next generation (``0 <= elite <
        population``).
    crossover_rate
        Probability that a child mixes two parents rather than copying one.
    mutation_rate
        Probability that a child takes a neighbour step even when it is new.
    fidelity
        Timing iterations for every evaluation.
    max_walk
        Neighbour steps tried to turn an already-measured child into a new one before
        falling back to a random unmeasured candidate.
    """

    name = "evolutionary"

    def __init__(
        self,
        population: int = 16,
        generations: int | None = 20,
        *,
        tournament_size: int = 3,
        elite: int = 2,
        crossover_rate: float = 0.5,
        mutation_rate: float = 0.5,
        fidelity: int = DEFAULT_FIDELITY,
        max_walk: int = 8,
    ) -> None:
        owner = "Evolutionary"
        self.population = _check_int(owner, "population", population, 2)
        self.generations = (
            None if generations is None else _check_int(owner, "generations", generations, 0)
        )
        self.tournament_size = _check_int(owner, "tournament_size", tournament_size, 1)
        self.elite = _check_int(owner, "elite", elite, 0)
        if self.elite >= self.population:
            raise PycLabError(
                f"Evolutionary(elite={elite}, population={population}): elite must be "
                "smaller than population, or no child is ever bred."
            )
        self.crossover_rate = _check_rate(owner, "crossover_rate", crossover_rate)
        self.mutation_rate = _check_rate(owner, "mutation_rate", mutation_rate)
        self.fidelity = _check_int(owner, "fidelity", fidelity, 1)
        self.max_walk = _check_int(owner, "max_walk", max_walk, 0)

    def options(self) -> dict[str, Any]:
        """The options, as given to ``__init__``."""
        return {
            "population": self.population,
            "generations": self.generations,
            "tournament_size": self.tournament_size,
            "elite": self.elite,
            "crossover_rate": self.crossover_rate,
            "mutation_rate": self.mutation_rate,
            "fidelity": self.fidelity,
            "max_walk": self.max_walk,
        }

    # -- the algorithm
    def search(self, ctx: SearchContext) -> None:
        """Evolve generations until ``generations``, the budget or the space ends."""
        members = [self._measure(ctx, c) for c in ctx.space.sample(self.population, ctx.rng)]
        generation = 0
        while members and (self.generations is None or generation < self.generations):
            ranked = sorted(members, key=lambda m: m[1])  # stable: ties keep their order
            next_members = ranked[: self.elite]
            for _ in range(self.population - len(next_members)):
                child = self._breed(ctx, members)
                if child is None:  # every candidate of the space has been measured
                    break
                next_members.append(self._measure(ctx, child))
            generation += 1
            best = min((m[1] for m in next_members), default=math.inf)
            log.debug("generation %d: %d members, best %g", generation, len(next_members), best)
            if len(next_members) == len(ranked[: self.elite]):
                break  # nothing new could be bred
            members = next_members

    def _measure(self, ctx: SearchContext, candidate: Candidate) -> _Member:
        trial = ctx.evaluate(candidate, self.fidelity)
        fitness = trial.time if trial.ok and trial.time is not None else math.inf
        return candidate, fitness

    def _tournament(self, ctx: SearchContext, members: list[_Member]) -> Candidate:
        picks = ctx.rng.integers(len(members), size=self.tournament_size)
        winner = min((int(i) for i in picks), key=lambda i: (members[i][1], i))
        return members[winner][0]

    def _step(self, ctx: SearchContext, candidate: Candidate) -> Candidate | None:
        neighbours = ctx.space.neighbours(candidate)
        if not neighbours:
            return None
        return neighbours[int(ctx.rng.integers(len(neighbours)))]

    def _breed(self, ctx: SearchContext, members: list[_Member]) -> Candidate | None:
        space, rng = ctx.space, ctx.rng
        child = dict(self._tournament(ctx, members))
        if len(members) > 1 and rng.random() < self.crossover_rate:
            other = self._tournament(ctx, members)
            mixed = {n: (child[n] if rng.random() < 0.5 else other[n]) for n in space.names}
            if space.is_valid(mixed):
                child = mixed
        if rng.random() < self.mutation_rate:
            child = self._step(ctx, child) or child
        walked: Candidate | None = child
        for _ in range(self.max_walk + 1):
            if walked is None:
                break
            if not ctx.seen(walked):
                return walked
            walked = self._step(ctx, walked)
        return self._immigrant(ctx)

    def _immigrant(self, ctx: SearchContext) -> Candidate | None:
        """A uniformly random candidate not measured yet, or ``None`` if none is left."""
        space, rng = ctx.space, ctx.rng
        n = len(space)
        if ctx.n_candidates >= n:
            return None
        for _ in range(32):
            candidate = space[int(rng.integers(n))]
            if not ctx.seen(candidate):
                return candidate
        unseen = [c for c in space if not ctx.seen(c)]
        if not unseen:
            return None
        return unseen[int(rng.integers(len(unseen)))]
