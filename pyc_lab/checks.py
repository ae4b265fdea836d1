"""Argument checks shared by constructors: bad settings fail at once, clearly.

A belt or worker pool built with ``depth=2.5``, ``timeout_s=nan`` or a prepare function
that is not callable would otherwise fail later, on a worker thread, mid-run, or never
(a NaN timeout never fires). These checks raise at construction with what was wrong and
what to pass instead.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .errors import PycLabError

__all__ = ["check_callable", "check_seconds", "check_whole", "is_seconds", "is_whole"]


def _shown(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def is_whole(value: Any) -> bool:
    """Whether ``value`` is a whole number: an integer (NumPy's too), not a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_seconds(value: Any) -> bool:
    """Whether ``value`` is a finite real number of seconds ``> 0`` (not a ``bool``)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and math.isfinite(float(value)) and float(value) > 0


def check_whole(owner: str, name: str, value: Any, *, minimum: int = 1,
                error: type[PycLabError] = PycLabError) -> int:
    """``value`` as an ``int`` if it is a whole number ``>= minimum``; raise otherwise.

    ``bool`` (``True`` would read as 1), floats (even ``3.0``) and strings are refused:
    a count that is not an integer is a mistake upstream, not something to round.

    Examples
    --------
    >>> check_whole("Pipeline", "depth", 3)
    3
    """
    if not is_whole(value):
        raise error(f"{owner} {name} must be a whole number >= {minimum} (an int), got "
                    f"{_shown(value)}; pass e.g. {name}={max(minimum, 1)}")
    if int(value) < minimum:
        raise error(f"{owner} {name} must be >= {minimum}, got {value!r}")
    return int(value)


def check_seconds(owner: str, name: str, value: Any, *,
                  error: type[PycLabError] = PycLabError) -> float | None:
    """``value`` as a ``float`` if it is ``None`` or a finite number of seconds ``> 0``.

    NaN (which never compares greater than anything, so a deadline built on it never
    fires), infinities, zero, negatives, ``bool`` and strings are refused.

    Examples
    --------
    >>> check_seconds("Pipeline", "timeout_s", 2)
    2.0
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{owner} {name} must be a number of seconds or None, got "
                    f"{_shown(value)}; pass e.g. {name}=30.0, or None for no limit")
    if not is_seconds(value):
        raise error(f"{owner} {name} must be a positive, finite number of seconds, got "
                    f"{value!r}; pass e.g. {name}=30.0, or None for no limit")
    return float(value)


def check_callable(owner: str, name: str, value: Any, usage: str, *,
                   error: type[PycLabError] = PycLabError) -> None:
    """Raise unless ``value`` can be called; ``usage`` says how it will be called."""
    if not callable(value):
        raise error(f"{owner} {name} must be callable ({usage}), got {_shown(value)}")
