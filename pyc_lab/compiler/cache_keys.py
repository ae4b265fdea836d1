"""Typed cache keys for the Python values a compiled function is specialised on.

A trace bakes static arguments and guarded globals into the graph, so two values share
a cache entry only when they would trace to the same graph. Python's ``==`` is not
that test: ``1 == 1.0 == True`` (an int, a float and a bool promote differently under
NEP 50), ``0.0 == -0.0`` (``x * -0.0`` differs from ``x * 0.0`` in the sign of zero),
and ``nan != nan`` (a NaN argument would never hit the cache). :func:`static_key` keys a
value by its exact type and its value, recursively through tuples, lists, dicts and
slices; floats by their bits. Values with no natural key (arbitrary objects) are keyed
by identity.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["Identity", "static_key"]


class Identity:
    """Key of an object by identity (holds it, so its ``id`` is not reused)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and other.obj is self.obj

    def __repr__(self) -> str:
        return f"<{type(self.obj).__name__} object>"


def _float(value: float) -> str:
    return "nan" if math.isnan(value) else float(value).hex()


def static_key(value: Any) -> Any:
    """A hashable key equal for two values exactly when they trace the same way.

    Examples
    --------
    >>> static_key(1) == static_key(1.0)
    False
    >>> static_key(float("nan")) == static_key(float("nan"))
    True
    >>> static_key(0.0) == static_key(-0.0)
    False
    """
    t = type(value)
    if value is None or value is Ellipsis or t in (bool, str, bytes, int):
        return (t.__name__, value)
    if t is float:
        return ("float", _float(value))
    if t is complex:
        return ("complex", _float(value.real), _float(value.imag))
    if isinstance(value, np.generic):
        return ("np", value.dtype.str, value.tobytes())
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    if t in (tuple, list):
        return (t.__name__, tuple(static_key(v) for v in value))
    if t is dict:
        return ("dict", tuple((static_key(k), static_key(v)) for k, v in value.items()))
    if t is slice:
        return ("slice", static_key(value.start), static_key(value.stop),
                static_key(value.step))
    if isinstance(value, type):
        return ("type", value)
    try:
        hash(value)
    except TypeError:
        return ("id", Identity(value))
    if isinstance(value, (tuple, frozenset)):  # subclasses (namedtuples, ...)
        return (t, tuple(static_key(v) for v in value))
    return ("obj", t, value)
