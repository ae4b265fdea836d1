"""Telling traced values apart without importing the proxy class.

The tracing helpers (:mod:`.ufuncs`, :mod:`.reductions`, :mod:`.mutation`,
:mod:`.array_functions`) are imported by :mod:`.proxy`; they recognise its proxies by a
class marker instead of importing it back, so no import runs in a circle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["is_foreign_array", "is_traced", "map_structure"]


def is_traced(value: Any) -> bool:
    """Whether ``value`` is a :class:`~pyc_lab.compiler.proxy.Traced` proxy."""
    return bool(getattr(type(value), "__pyc_traced__", False))


def is_foreign_array(value: Any) -> bool:
    """Whether ``value`` is an array-like that is not a NumPy or CuPy array or scalar, a
    list or tuple, a type or dtype — a pandas Series, a torch tensor, an object with
    ``__array__``: a compiled function would take it in as a constant."""
    if isinstance(value, (np.ndarray, np.generic, np.dtype, type, list, tuple, bool, int,
                          float, complex, str, bytes)) \
            or type(value).__module__.startswith("cupy"):
        return False  # (a dtype's scalar type, np.float16, has __array__ too)
    return any(hasattr(value, a) for a in ("__array__", "__array_interface__",
                                           "__cuda_array_interface__", "__dlpack__"))


def map_structure(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """``obj`` rebuilt with ``leaf`` applied to everything but its containers: tuples
    (named ones too), lists and dicts, nested, keep their types. How a compiled
    function's result is taken apart into outputs and put back together."""
    if isinstance(obj, dict):
        return type(obj)((k, map_structure(v, leaf)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_structure(o, leaf) for o in obj))
    if isinstance(obj, list):
        return [map_structure(o, leaf) for o in obj]
    if isinstance(obj, tuple):
        return tuple(map_structure(o, leaf) for o in obj)
    return leaf(obj)
