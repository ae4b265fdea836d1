"""``np.zeros_like``, ``np.ones_like``, ``np.empty_like`` and ``np.full_like`` of traced
arrays, as the ops they are made of (``__array_function__`` handlers, dispatched by
:mod:`.array_functions`).

Each result is a new, writable array of the prototype's shape and dtype (or the ``shape=``
and ``dtype=`` given): the fill value cast to that dtype as NumPy's ``copyto(...,
casting="unsafe")`` casts it, broadcast to the shape and copied — so it fuses into the
kernels that read it (``np.where(m, x, np.zeros_like(x))`` is one kernel) and item
assignment into it is traced as into any other array. ``np.empty_like`` is filled with
zeros (NumPy leaves its values undefined). A traced ``fill_value`` (``np.full_like(x,
x.max())``) is cast and broadcast the same way. ``order="F"``, ``device=`` and fill
values that do not broadcast stay NumPy's own call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .function_parts import NotCovered
from .values import is_traced

if TYPE_CHECKING:
    from .proxy import Traced
    from .tracer import Tracer

__all__ = ["HANDLERS"]


def _filled(tracer: Tracer, a: Any, fill: Any, dtype: Any, order: Any, shape: Any,
            device: Any) -> Traced:
    x = tracer.lift(a)
    if order not in ("K", "A", "C", None) or device not in (None, "cpu"):
        raise NotCovered  # a Fortran layout; a device placement
    dt = np.dtype(dtype) if dtype is not None else x.dtype
    if shape is None:
        target = tuple(x.shape)
    elif isinstance(shape, (int, np.integer)):
        target = (int(shape),)
    elif isinstance(shape, (tuple, list)) and all(isinstance(d, (int, np.integer))
                                                  for d in shape):
        target = tuple(int(d) for d in shape)
    else:
        raise NotCovered
    if any(d < 0 for d in target) or dt.kind in "OSUV":
        raise NotCovered  # NumPy's error; object, string or record dtypes
    if is_traced(fill):
        value = tracer.lift(fill)
        if value.dtype != dt:
            value = tracer.op("astype", (value,), {"dtype": dt})
    else:
        with np.errstate(all="ignore"):  # copyto(casting="unsafe"): NumPy's own cast
            try:
                constant = np.asarray(fill).astype(dt)
            except (TypeError, ValueError):
                raise NotCovered from None  # NumPy's error, from the eager call
        value = tracer.lift(constant)
    try:
        if tuple(np.broadcast_shapes(tuple(value.shape), target)) != target:
            raise NotCovered
    except ValueError:
        raise NotCovered from None  # NumPy's broadcast error, from the eager call
    spread = tracer.op("broadcast_to", (value,), {"shape": target})
    return tracer.op("copy", (spread,))


def _constant_like(fill: int) -> Callable:
    def handler(tracer: Tracer, a: Any, dtype: Any = None, order: Any = "K",
                subok: bool = True, shape: Any = None, *, device: Any = None) -> Traced:
        return _filled(tracer, a, fill, dtype, order, shape, device)
    return handler


def _full_like(tracer: Tracer, a: Any, fill_value: Any, dtype: Any = None, order: Any = "K",
               subok: bool = True, shape: Any = None, *, device: Any = None) -> Traced:
    return _filled(tracer, a, fill_value, dtype, order, shape, device)


#: NumPy function -> handler.
HANDLERS: dict[Callable, Callable] = {
    np.zeros_like: _constant_like(0), np.ones_like: _constant_like(1),
    np.empty_like: _constant_like(0),
    np.full_like: _full_like,
}
