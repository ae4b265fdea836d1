"""Pieces shared by the handlers of NumPy functions on traced arrays
(:mod:`.array_functions`, :mod:`.array_shapes`, :mod:`.array_numerics`).

:class:`NotCovered` is what a handler raises for a form of the call it does not cover:
the call then runs as written (a graph break). :func:`select` is ``np.where(cond, x, y)``
with NumPy's rules for Python scalars, which several functions are made of.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import scalars
from .values import is_traced

if TYPE_CHECKING:
    from .proxy import Traced
    from .tracer import Tracer

__all__ = ["NOVALUE", "NotCovered", "select"]

#: NumPy's "argument not given" marker.
NOVALUE: Any = np._NoValue


class NotCovered(Exception):
    """A handler does not cover this form of the call: trace it as a graph break."""


def select(tracer: Tracer, condition: Any, x: Any, y: Any) -> Traced:
    """``np.where(condition, x, y)``: a Python scalar takes the other operand's dtype
    as NumPy's weak scalars do."""
    def dtype_of(v: Any) -> Any:
        return v.dtype if is_traced(v) else np.asarray(v).dtype

    if scalars.is_python_scalar(x) and not scalars.is_python_scalar(y):
        x = scalars.where_constant(x, dtype_of(y))
    elif scalars.is_python_scalar(y) and not scalars.is_python_scalar(x):
        y = scalars.where_constant(y, dtype_of(x))
    elif scalars.is_python_scalar(x) and scalars.is_python_scalar(y):
        x, y = scalars.where_constant(x, y), scalars.where_constant(y, x)
    return tracer.op("where", (condition, x, y))
