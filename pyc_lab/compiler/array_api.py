"""NumPy 2's array-API functions on traced arrays, by NumPy's own steps
(``__array_function__`` handlers, dispatched by :mod:`.array_functions`).

``np.matrix_transpose``/``np.linalg.matrix_transpose`` (the last two axes swapped, a
view), ``np.linalg.vector_norm`` (the axes moved first and flattened into one, then
``np.linalg.norm``'s vector norm), ``np.linalg.matrix_norm`` (``np.linalg.norm`` over
the last two axes), ``np.cumulative_sum``/``np.cumulative_prod`` (the ufunc's
accumulate, with ``include_initial``'s identity in front) and ``np.append``. A form a
handler does not cover raises :class:`~.function_parts.NotCovered` and runs as written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from . import array_numerics, scans
from .function_parts import NotCovered
from .values import is_traced

if TYPE_CHECKING:
    from .tracer import Tracer

__all__ = ["HANDLERS"]


def _matrix_transpose(tracer: Tracer, x: Any) -> Any:
    """``np.matrix_transpose``: the last two axes swapped (a view)."""
    v = tracer.lift(x)
    if v.ndim < 2:
        raise NotCovered  # NumPy's ValueError
    order = (*range(v.ndim - 2), v.ndim - 1, v.ndim - 2)
    return v.transpose(order)


def _vector_norm(tracer: Tracer, x: Any, *, axis: Any = None, keepdims: bool = False,
                 ord: Any = 2) -> Any:
    """``np.linalg.vector_norm``: NumPy's steps — every axis, or a tuple of axes moved
    to the front and flattened into one, then the vector norm over it (reshaped back
    to ``keepdims``' shape)."""
    v = tracer.lift(x)
    shape = tuple(v.shape)
    if axis is None:
        flat, over = v.ravel(), 0
    elif isinstance(axis, tuple):
        try:
            axes = normalize_axis_tuple(axis, v.ndim)
        except (TypeError, ValueError):
            raise NotCovered from None
        rest = tuple(d for d in range(v.ndim) if d not in axes)
        flat = v.transpose(axes + rest).reshape(
            (math.prod(shape[d] for d in axes), *(shape[d] for d in rest)))
        over = 0
    else:
        flat, over = v, axis
    result = array_numerics.HANDLERS[np.linalg.norm](tracer, flat, ord=ord, axis=over)
    if keepdims:
        kept = normalize_axis_tuple(range(v.ndim) if axis is None else axis, v.ndim)
        result = result.reshape(tuple(1 if d in kept else n for d, n in enumerate(shape)))
    return result


def _matrix_norm(tracer: Tracer, x: Any, *, keepdims: bool = False, ord: Any = "fro") -> Any:
    """``np.linalg.matrix_norm``: ``np.linalg.norm`` over the last two axes."""
    return array_numerics.HANDLERS[np.linalg.norm](tracer, tracer.lift(x), ord=ord,
                                                     axis=(-2, -1), keepdims=keepdims)


def _cumulative(ufunc: np.ufunc) -> Callable:
    """``np.cumulative_sum``/``np.cumulative_prod``: the ufunc's accumulate (a scan with
    NumPy's dtype rule) along ``axis`` (required past one dimension), the identity in
    front for ``include_initial``."""
    scan = np.cumsum if ufunc is np.add else np.cumprod

    def handler(tracer: Tracer, x: Any, *, axis: Any = None, dtype: Any = None,
                out: Any = None, include_initial: bool = False) -> Any:
        v = tracer.lift(x)
        if out is not None or (v.ndim > 1 and axis is None):
            raise NotCovered  # NumPy's ValueError, or a write into out
        if v.ndim == 0:
            v = v[None]
        axis = 0 if axis is None else axis
        res = scans.HANDLERS[scan](tracer, v, axis=axis, dtype=dtype)
        if not include_initial:
            return res
        (a,) = normalize_axis_tuple(axis, res.ndim)
        first = np.full(tuple(1 if d == a else n for d, n in enumerate(res.shape)),
                        ufunc.identity, dtype=res.dtype)
        return tracer.op("concatenate", (tracer.lift(first), res), {"axis": a})

    return handler


def _append(tracer: Tracer, arr: Any, values: Any, axis: Any = None) -> Any:
    """``np.append``: NumPy's concatenation of both (flattened where ``axis`` is None)."""
    if isinstance(values, (list, tuple)) and any(is_traced(e) for e in values):
        raise NotCovered
    a = tracer.lift(arr)
    v = tracer.lift(values if not isinstance(values, (list, tuple)) else np.asarray(values))
    if axis is None:
        a, v = a.ravel(), v.ravel()
        axis = 0
    return np.concatenate((a, v), axis=axis)


#: NumPy function -> handler.
HANDLERS: dict[Callable, Callable] = {
    np.matrix_transpose: _matrix_transpose, np.linalg.matrix_transpose: _matrix_transpose,
    np.linalg.vector_norm: _vector_norm, np.linalg.matrix_norm: _matrix_norm,
    np.append: _append,
}
if hasattr(np, "cumulative_sum"):  # NumPy 2.1
    HANDLERS[np.cumulative_sum] = _cumulative(np.add)
    HANDLERS[np.cumulative_prod] = _cumulative(np.multiply)
