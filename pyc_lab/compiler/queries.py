"""NumPy's questions about arrays, answered from a traced array's static shape and dtype
(``__array_function__`` handlers, dispatched by :mod:`.array_functions`).

``np.shape``, ``np.ndim``, ``np.size``, ``np.result_type``, ``np.can_cast``,
``np.iscomplexobj`` and ``np.isrealobj`` return Python values (and dtypes) that a
function branches on or computes with — ``x / np.size(x)`` scales by a Python int,
which NumPy keeps in ``x``'s dtype. Run as graph breaks they became arrays computed at
run time: a branch on them stopped the trace, arithmetic with them promoted to int64's
float64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .function_parts import NotCovered
from .values import is_traced

if TYPE_CHECKING:
    from .tracer import Tracer

__all__ = ["HANDLERS"]


def _dtype_or_value(tracer: Tracer, v: Any) -> Any:
    """A traced array (or captured input) as its dtype — what NumPy 2's promotion reads
    of an array — and anything else as it is."""
    if is_traced(v) or tracer.captured_input(v) is not None:
        return tracer.lift(v).dtype
    return v


def _shape(tracer: Tracer, a: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in tracer.lift(a).shape)


def _ndim(tracer: Tracer, a: Any) -> int:
    return int(tracer.lift(a).ndim)


def _size(tracer: Tracer, a: Any, axis: Any = None) -> int:
    shape = _shape(tracer, a)
    if axis is None:
        return int(np.prod(shape, dtype=np.int64))
    try:
        axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
        return int(np.prod([shape[a] for a in axes], dtype=np.int64))
    except (IndexError, TypeError):
        raise NotCovered from None  # NumPy's own error


def _result_type(tracer: Tracer, *arrays_and_dtypes: Any) -> np.dtype:
    return np.result_type(*(_dtype_or_value(tracer, v) for v in arrays_and_dtypes))


def _can_cast(tracer: Tracer, from_: Any, to: Any, casting: str = "safe") -> bool:
    return bool(np.can_cast(_dtype_or_value(tracer, from_), to, casting))


def _complex_object(complex_: bool) -> Callable:
    def handler(tracer: Tracer, x: Any) -> bool:
        kind = tracer.lift(x).dtype.kind == "c"
        return kind if complex_ else not kind

    return handler


#: NumPy function -> handler.
HANDLERS: dict[Callable, Callable] = {
    np.shape: _shape, np.ndim: _ndim, np.size: _size, np.result_type: _result_type,
    np.can_cast: _can_cast, np.iscomplexobj: _complex_object(True),
    np.isrealobj: _complex_object(False),
}
