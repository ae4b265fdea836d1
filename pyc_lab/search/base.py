"""The pieces every search strategy shares: space, outcome, trial, budget, result.

A *candidate* is a dict of tuning parameters with JSON-able values, for instance
``{"tile_m": 128, "tile_n": 256, "tile_k": 64, "cluster": "2x1x1", "stages": 4}``. A
:class:`SearchSpace` lists the valid candidates: the cartesian product of each
parameter's values, filtered by the user's restrictions.

An *objective* is a callable ``evaluate(candidate, fidelity) -> Outcome``. ``fidelity``
is the number of timing iterations: more iterations give a less noisy time at a
higher cost. A candidate that fails — does not compile, returns wrong numbers, raises —
is recorded and skipped; it never stops the search.

A :class:`Strategy` decides which candidates to evaluate and at which fidelity, within a
:class:`Budget` (a number of candidates, a number of seconds, or both). Each evaluation
becomes a :class:`Trial`; an optional observer sees every trial as it happens (a live
widget) and may raise :class:`StopSearch` (a stop button). The search returns a
:class:`SearchResult` holding every trial, the best one and why the search stopped.

Writing a strategy means subclassing :class:`Strategy` and implementing
:meth:`Strategy.search`, which asks :meth:`SearchContext.evaluate` for measurements; the
context enforces the budget, catches failures, times and records the trials and calls
the observer.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PycLabError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "DEFAULT_FIDELITY",
    "STOP_REASONS",
    "Budget",
    "Candidate",
    "Evaluate",
    "Observer",
    "Outcome",
    "RngLike",
    "SearchContext",
    "SearchResult",
    "SearchSpace",
    "StopSearch",
    "Strategy",
    "Trial",
    "candidate_key",
    "select_best",
]

log = logging.getLogger(__name__)

#: A candidate: parameter name -> value (JSON-able).
Candidate = dict[str, Any]
#: ``evaluate(candidate, fidelity) -> Outcome``.
Evaluate = Callable[[Candidate, int], "Outcome"]
#: ``observer(trial)``, called after every evaluation; may raise :class:`StopSearch`.
Observer = Callable[["Trial"], None]
#: What ``rng=`` accepts: a seed, a NumPy generator, or ``None`` (fresh entropy).
RngLike = int | np.random.Generator | None

#: Timing iterations used by the single-fidelity strategies unless told otherwise; also
#: the default top rung of successive halving (1, 3, 9, 27 with ``eta=3``).
DEFAULT_FIDELITY = 27

#: The values of :attr:`SearchResult.stopped_by`.
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


def candidate_key(candidate: Mapping[str, Any]) -> str:
    """A canonical, hashable key of a candidate: its JSON with sorted keys.

    Parameters
    ----------
    candidate
        Parameter name -> value.

    Returns
    -------
    str
        The same string for equal candidates whatever their key order.
    """
    return json.dumps(dict(candidate), sort_keys=True, separators=(",", ":"), default=repr)


def _value_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Outcome:
    """What one evaluation of one candidate gave.

    Parameters
    ----------
    status
        ``"ok"`` for a correct, timed run; anything else names a failure, e.g.
        ``"compile_error"``, ``"wrong_result"``, ``"nan"``, ``"timeout"``. The search
        itself uses ``"error"`` when ``evaluate`` raised or returned something unusable.
    time
        The measured time (lower is better) when ``status == "ok"``, in whatever unit
        the objective uses throughout one search (milliseconds, typically).
    message
        A human-readable detail: the compiler's error, the mismatch found, ...
    """

    status: str
    time: float | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        """Whether the candidate ran, was correct and was timed."""
        return self.status == "ok"


def _normalise_outcome(result: Any) -> Outcome:
    """Turn what ``evaluate`` returned into a well-formed :class:`Outcome`."""
    if not isinstance(result, Outcome):
        return Outcome("error", None, f"evaluate returned {type(result).__name__}, not an Outcome")
    if not result.ok:
        return result
    t = result.time
    if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)):
        return Outcome("error", None, f"status 'ok' without a numeric time (time={t!r})")
    t = float(t)
    if math.isnan(t) or math.isinf(t):
        return Outcome("nan", t, f"status 'ok' with a non-finite time ({t})")
    if t < 0:
        return Outcome("error", t, f"status 'ok' with a negative time ({t})")
    return Outcome("ok", t, result.message)


@dataclass(frozen=True)
class Trial:
    """One evaluation of one candidate at one fidelity.

    Parameters
    ----------
    index
        Position in the search (0, 1, 2, ...), i.e. in :attr:`SearchResult.trials`.
    candidate
        The candidate evaluated (a copy: changing it changes nothing else).
    fidelity
        The number of timing iterations asked for.
    outcome
        What the evaluation gave.
    elapsed_s
        Wall-clock seconds the evaluation took (compile + run + check), by the
        budget's clock.
    started_s
        Seconds from the start of the search to the start of this evaluation.
    """

    index: int
    candidate: Candidate
    fidelity: int
    outcome: Outcome
    elapsed_s: float
    started_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the outcome is ``"ok"``."""
        return self.outcome.ok

    @property
    def time(self) -> float | None:
        """The outcome's time (``None`` for most failures)."""
        return self.outcome.time

    @property
    def status(self) -> str:
        """The outcome's status."""
        return self.outcome.status

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the trial (for a tuning database or a log)."""
        return {
            "index": self.index,
            "candidate": dict(self.candidate),
            "fidelity": self.fidelity,
            "status": self.outcome.status,
            "time": self.outcome.time,
            "message": self.outcome.message,
            "elapsed_s": self.elapsed_s,
            "started_s": self.started_s,
        }


def select_best(trials: Sequence[Trial]) -> Trial | None:
    """The best trial: lowest time among ``"ok"`` trials, at the highest fidelity reached.

    Each candidate is represented by its trial at the highest fidelity it reached (the
    latest one if it was measured several times there); it is eligible only if that
    trial is ``"ok"`` — a candidate that passed a cheap screen and then failed a longer
    run is not trusted. Among eligible candidates, one measured at a higher fidelity
    beats one measured at a lower fidelity (its time is the better estimate); at equal
    fidelity the lower time wins, then the earlier trial.

    Parameters
    ----------
    trials
        Trials in evaluation order.

    Returns
    -------
    Trial or None
        ``None`` when no candidate is eligible.
    """
    top: dict[str, Trial] = {}
    for t in trials:
        key = candidate_key(t.candidate)
        prev = top.get(key)
        if prev is None or t.fidelity >= prev.fidelity:
            top[key] = t
    eligible = [t for t in top.values() if t.ok and t.time is not None]
    if not eligible:
        return None
    return min(eligible, key=lambda t: (-t.fidelity, t.time, t.index))


# --------------------------------------------------------------------------- budget


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
        A monotonic clock in seconds; injectable for tests.

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


# --------------------------------------------------------------------------- space


class SearchSpace:
    """The valid candidates: a cartesian product of parameter values, filtered.

    Parameters
    ----------
    params
        Parameter name -> the list of its values, in a meaningful order: neighbours
        differ by one step in such a list (``[64, 128, 256]``: 128 neighbours 64 and
        256). Values must be JSON-able and distinct within a list.
    restrictions
        Callables ``restriction(candidate) -> bool``; a candidate is valid only if
        every restriction returns true, e.g.
        ``lambda c: c["tile_m"] * c["tile_k"] <= 16384``.

    Notes
    -----
    Candidates are enumerated in :func:`itertools.product` order over ``params``'
    insertion order (the last parameter varies fastest) and the valid ones are kept in
    memory the first time they are needed; that suits spaces up to a few hundred
    thousand points.

    Raises
    ------
    PycLabError
        For an empty space definition, an empty or duplicated value list, a value
        that is not JSON-able, or a restriction that is not callable.
    """

    def __init__(
        self,
        params: Mapping[str, Sequence[Any]],
        restrictions: Sequence[Callable[[Candidate], bool]] | None = None,
    ) -> None:
        if not isinstance(params, Mapping) or not params:
            raise PycLabError(
                "SearchSpace needs a non-empty dict of parameter name -> list of values."
            )
        self._names: list[str] = []
        self._values: dict[str, list[Any]] = {}
        self._positions: dict[str, dict[str, int]] = {}
        for name, values in params.items():
            if not isinstance(name, str):
                raise PycLabError(f"SearchSpace parameter names must be strings, got {name!r}.")
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise PycLabError(
                    f"SearchSpace parameter {name!r}: give a list of values, got {values!r}."
                )
            values = list(values)
            if not values:
                raise PycLabError(f"SearchSpace parameter {name!r} has no values.")
            positions: dict[str, int] = {}
            for i, v in enumerate(values):
                try:
                    vk = _value_key(v)
                except (TypeError, ValueError) as exc:
                    raise PycLabError(
                        f"SearchSpace parameter {name!r}: value {v!r} is not JSON-able "
                        "(use numbers, strings, booleans or None)."
                    ) from exc
                if vk in positions:
                    raise PycLabError(
                        f"SearchSpace parameter {name!r}: value {v!r} appears twice."
                    )
                positions[vk] = i
            self._names.append(name)
            self._values[name] = values
            self._positions[name] = positions
        self._restrictions = list(restrictions or [])
        for r in self._restrictions:
            if not callable(r):
                raise PycLabError(f"SearchSpace restriction {r!r} is not callable.")
        self._valid: list[Candidate] | None = None
        self._index: dict[str, int] | None = None

    # -- description
    @property
    def names(self) -> list[str]:
        """The parameter names, in order."""
        return list(self._names)

    @property
    def params(self) -> dict[str, list[Any]]:
        """Parameter name -> its values (a copy)."""
        return {n: list(v) for n, v in self._values.items()}

    @property
    def restrictions(self) -> list[Callable[[Candidate], bool]]:
        """The restrictions (a copy of the list)."""
        return list(self._restrictions)

    @property
    def grid_size(self) -> int:
        """The size of the unrestricted cartesian product."""
        return math.prod(len(v) for v in self._values.values())

    def __repr__(self) -> str:
        dims = " x ".join(f"{n}[{len(self._values[n])}]" for n in self._names)
        valid = len(self._candidates())
        return (
            f"SearchSpace({dims}: {valid} valid of {self.grid_size}, "
            f"{len(self._restrictions)} restriction(s))"
        )

    # -- validity
    def _passes(self, candidate: Candidate) -> bool:
        for r in self._restrictions:
            try:
                ok = r(dict(candidate))
            except Exception as exc:
                name = getattr(r, "__name__", repr(r))
                raise PycLabError(
                    f"SearchSpace restriction {name} raised {type(exc).__name__}: {exc} "
                    f"on candidate {candidate!r}; make it return True/False for every point "
                    "of the grid."
                ) from exc
            if not ok:
                return False
        return True

    def _on_grid(self, candidate: Mapping[str, Any]) -> bool:
        if not isinstance(candidate, Mapping) or set(candidate) != set(self._names):
            return False
        try:
            return all(
                _value_key(candidate[n]) in self._positions[n] for n in self._names
            )
        except (TypeError, ValueError):
            return False

    def is_valid(self, candidate: Mapping[str, Any]) -> bool:
        """Whether ``candidate`` is on the grid and passes every restriction."""
        return self._on_grid(candidate) and self._passes(dict(candidate))

    def __contains__(self, candidate: object) -> bool:
        return isinstance(candidate, Mapping) and self.is_valid(candidate)

    # -- enumeration
    def _candidates(self) -> list[Candidate]:
        if self._valid is None:
            valid = []
            for combo in itertools.product(*(self._values[n] for n in self._names)):
                cand = dict(zip(self._names, combo, strict=True))
                if self._passes(cand):
                    valid.append(cand)
            self._valid = valid
            self._index = {candidate_key(c): i for i, c in enumerate(valid)}
            log.debug("search space: %d valid candidates of %d", len(valid), self.grid_size)
        return self._valid

    def __len__(self) -> int:
        return len(self._candidates())

    def __iter__(self) -> Iterator[Candidate]:
        for c in self._candidates():
            yield dict(c)

    def __getitem__(self, i: int) -> Candidate:
        return dict(self._candidates()[i])

    def index_of(self, candidate: Mapping[str, Any]) -> int:
        """The position of a valid candidate in enumeration order.

        Raises
        ------
        PycLabError
            If ``candidate`` is not a valid candidate of this space.
        """
        self._candidates()
        assert self._index is not None
        try:
            return self._index[candidate_key(candidate)]
        except KeyError:
            raise PycLabError(f"{candidate!r} is not a valid candidate of {self!r}.") from None

    def sample(self, k: int, rng: RngLike = None) -> list[Candidate]:
        """Up to ``k`` distinct valid candidates, uniformly at random.

        Parameters
        ----------
        k
            How many; more than :func:`len` gives them all (in random order).
        rng
            A seed or a NumPy generator.

        Returns
        -------
        list of dict
        """
        if k < 0:
            raise PycLabError(f"SearchSpace.sample(k={k}): k must be >= 0.")
        gen = np.random.default_rng(rng)
        pool = self._candidates()
        picks = gen.choice(len(pool), size=min(k, len(pool)), replace=False)
        return [dict(pool[int(i)]) for i in picks]

    def neighbours(self, candidate: Mapping[str, Any]) -> list[Candidate]:
        """The valid candidates one step away: one parameter moved to an adjacent value.

        Parameters
        ----------
        candidate
            A point of the grid (it need not pass the restrictions itself).

        Returns
        -------
        list of dict
            In parameter order, the lower value before the higher one.

        Raises
        ------
        PycLabError
            If ``candidate`` is not a point of the grid.
        """
        if not self._on_grid(candidate):
            raise PycLabError(
                f"{dict(candidate)!r} is not a point of the grid of {self!r} "
                f"(parameters {self._names})."
            )
        out = []
        for n in self._names:
            values = self._values[n]
            i = self._positions[n][_value_key(candidate[n])]
            for j in (i - 1, i + 1):
                if 0 <= j < len(values):
                    other = dict(candidate)
                    other[n] = values[j]
                    if self._passes(other):
                        out.append(other)
        return out


# --------------------------------------------------------------------------- result


_FIXED_COLUMNS = ["fidelity", "status", "time", "message", "elapsed_s", "started_s", "best"]


@dataclass
class SearchResult:
    """Everything a search measured.

    Parameters
    ----------
    trials
        Every evaluation, in order.
    best
        See :func:`select_best`; ``None`` when nothing succeeded.
    stopped_by
        ``"exhausted"`` (the strategy finished), ``"max_candidates"`` or
        ``"max_seconds"`` (the budget ran out), ``"observer"`` (:class:`StopSearch`).
    strategy
        The strategy's name.
    """

    trials: list[Trial]
    best: Trial | None
    stopped_by: str
    strategy: str = ""

    def __repr__(self) -> str:
        best = "None" if self.best is None else f"{self.best.candidate!r} @ {self.best.time:g}"
        return (
            f"SearchResult(strategy={self.strategy!r}, trials={len(self.trials)}, "
            f"candidates={self.n_candidates}, best={best}, stopped_by={self.stopped_by!r})"
        )

    @property
    def n_evaluations(self) -> int:
        """The number of trials."""
        return len(self.trials)

    @property
    def n_candidates(self) -> int:
        """The number of distinct candidates evaluated."""
        return len({candidate_key(t.candidate) for t in self.trials})

    @property
    def failures(self) -> list[Trial]:
        """The trials whose status is not ``"ok"``."""
        return [t for t in self.trials if not t.ok]

    def to_frame(self) -> pd.DataFrame:
        """One row per trial.

        Returns
        -------
        pandas.DataFrame
            Columns ``index``, one column per parameter (prefixed ``param_`` if its name
            clashes with another column), then ``fidelity``, ``status``, ``time``,
            ``message``, ``elapsed_s``, ``started_s`` and ``best`` (true on the row of
            :attr:`best`).
        """
        import pandas as pd

        names: list[str] = []
        for t in self.trials:
            for n in t.candidate:
                if n not in names:
                    names.append(n)
        reserved = {"index", *_FIXED_COLUMNS}
        column = {n: (f"param_{n}" if n in reserved else n) for n in names}
        best_index = None if self.best is None else self.best.index
        rows = []
        for t in self.trials:
            row: dict[str, Any] = {"index": t.index}
            for n in names:
                row[column[n]] = t.candidate.get(n)
            row.update(
                fidelity=t.fidelity,
                status=t.status,
                time=t.time,
                message=t.outcome.message,
                elapsed_s=t.elapsed_s,
                started_s=t.started_s,
                best=t.index == best_index,
            )
            rows.append(row)
        columns = ["index", *(column[n] for n in names), *_FIXED_COLUMNS]
        return pd.DataFrame(rows, columns=columns)


# --------------------------------------------------------------------------- context


class SearchContext:
    """What a strategy's :meth:`Strategy.search` works with.

    It evaluates candidates under the budget, records each :class:`Trial`, catches
    failures and calls the observer. Strategies read :attr:`space` and :attr:`rng` and
    call :meth:`evaluate`; when the budget is spent, :meth:`evaluate` raises an internal
    signal that :meth:`Strategy.run` catches (strategies must not catch it: avoid bare
    ``except Exception`` around :meth:`evaluate`).
    """

    def __init__(
        self,
        space: SearchSpace,
        evaluate: Evaluate,
        budget: Budget,
        rng: np.random.Generator,
        observer: Observer | None = None,
    ) -> None:
        self.space = space
        self.rng = rng
        self.budget = budget
        self.trials: list[Trial] = []
        self._evaluate = evaluate
        self._observer = observer
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
        if self._observer is not None:
            try:
                self._observer(trial)
            except StopSearch:
                raise
            except Exception:
                self._observer_errors += 1
                if self._observer_errors == 1:
                    log.exception("the search observer raised; the search goes on")
        return trial


# --------------------------------------------------------------------------- strategy


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
        observer: Observer | None = None,
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
            Called with each :class:`Trial` right after its evaluation; raising
            :class:`StopSearch` ends the search (``stopped_by="observer"``). Other
            exceptions are logged and the search goes on.

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
        ctx = SearchContext(space, evaluate, budget, np.random.default_rng(rng), observer)
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
