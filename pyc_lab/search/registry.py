"""The strategies by name: what ``strategy="successive_halving"`` means everywhere."""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import PycLabError
from .evolutionary import Evolutionary
from .exhaustive import Exhaustive
from .random_search import RandomSearch
from .strategy import Strategy
from .successive_halving import SuccessiveHalving

__all__ = ["STRATEGIES", "get_strategy", "normalise_name"]

#: Strategy name -> class.
STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (Exhaustive, RandomSearch, SuccessiveHalving, Evolutionary)
}


def normalise_name(name: str) -> str:
    """The registry key of a strategy name (case and ``-``/``_`` do not matter).

    Raises
    ------
    PycLabError
        For an unknown name; the message lists the known ones.
    """
    key = str(name).strip().lower().replace("-", "_")
    if key not in STRATEGIES:
        raise PycLabError(
            f"unknown search strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}."
        )
    return key


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
    key = normalise_name(name)
    cls = STRATEGIES[key]
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p in params if p != "self"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise PycLabError(
            f"search strategy {key!r} takes no option(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(accepted) or 'none'}."
        )
    return cls(**options)
