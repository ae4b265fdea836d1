"""Search spaces: the valid candidates of a tuning problem.

A *candidate* is a dict of tuning parameters with JSON-able values, for instance
``{"tile": "128x256x64", "cluster": "2x1x1", "stages": 4}``. A :class:`SearchSpace`
lists the valid candidates: the cartesian product of each parameter's values, filtered
by restrictions; strategies walk it (in order, at random, or from neighbour to
neighbour).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import PycLabError

__all__ = ["Candidate", "RngLike", "SearchSpace", "candidate_key"]

log = logging.getLogger(__name__)

#: A candidate: parameter name -> value (JSON-able).
Candidate = dict[str, Any]
#: What ``rng=`` accepts: a seed, a NumPy generator, or ``None`` (fresh entropy).
RngLike = int | np.random.Generator | None


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
