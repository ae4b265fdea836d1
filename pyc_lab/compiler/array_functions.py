"""NumPy functions called on traced arrays (``__array_function__``).

Each handler takes the NumPy function's signature (NumPy 2), so arguments bind exactly
as NumPy binds them, and records ops; a form a handler does not cover raises
:class:`~.function_parts.NotCovered` and the call becomes a graph break (run as
written). This module holds the reductions, ``np.where``/``np.clip``, casts, copies and
reshapes; the shape-and-layout functions are in :mod:`.array_shapes`, the numeric ones in
:mod:`.array_numerics`, covariances in :mod:`.covariance`, NumPy's elementwise helpers
(``np.select``, ``np.sinc``...) in :mod:`.elementwise_functions`, lookups in constant
tables (``np.isin``, ``np.digitize``...) in :mod:`.lookups`, NumPy 2's array-API names
(``np.matrix_transpose``, ``np.linalg.vector_norm``...) in :mod:`.array_api`, the reads
at integer indices in :mod:`.gathers`, questions about shapes and dtypes (``np.shape``,
``np.result_type``...) in :mod:`.queries`. NumPy functions that write into an argument
(``np.copyto``) write through :mod:`.mutation`; those pyc_lab
cannot trace (``np.put``, ``np.place``...) raise a clear error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import (
    array_api,
    array_numerics,
    array_shapes,
    covariance,
    creation,
    elementwise_functions,
    gathers,
    lookups,
    mutation,
    quantiles,
    queries,
    reductions,
    scans,
    ufuncs,
)
from .errors import CastingError, UnsupportedOperationError
from .function_parts import NOVALUE, NotCovered, select
from .ops import normalize_axis

if TYPE_CHECKING:
    from .proxy import Traced
    from .tracer import Tracer

__all__ = ["astype", "clip", "dispatch"]

#: NumPy functions that write into an argument in ways pyc_lab does not trace.
_WRITES = {np.put: "x[indices] = values", np.place: "x = np.where(mask, values, x)",
           np.putmask: "x = np.where(mask, values, x)",
           np.fill_diagonal: "a new array built with np.where",
           np.put_along_axis: "a new array (np.where / item assignment)"}


def dispatch(tracer: Tracer, func: Callable, args: tuple, kwargs: dict) -> Any:
    """What ``Traced.__array_function__`` returns for ``func(*args, **kwargs)``."""
    if func in _WRITES:
        raise UnsupportedOperationError(
            f"np.{func.__name__} writes into its argument in a way pyc_lab does not trace; "
            f"write {_WRITES[func]} instead")
    handler = _HANDLERS.get(func)
    if handler is not None:
        try:
            return handler(tracer, *args, **kwargs)
        except NotCovered:
            pass
    name = getattr(func, "__name__", repr(func))
    return tracer.eager(func, args, kwargs, f"np.{name} has no op in pyc_lab's registry")


# -- reductions -------------------------------------------------------------------------------
def _sum(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
         keepdims: Any = NOVALUE, initial: Any = NOVALUE, where: Any = NOVALUE) -> Any:
    return reductions.reduce(tracer, "sum", a, axis=axis, dtype=dtype, out=out,
                             keepdims=keepdims, initial=initial, where=where)


def _prod(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
          keepdims: Any = NOVALUE, initial: Any = NOVALUE, where: Any = NOVALUE) -> Any:
    return reductions.reduce(tracer, "prod", a, axis=axis, dtype=dtype, out=out,
                             keepdims=keepdims, initial=initial, where=where)


def _mean(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
          keepdims: Any = NOVALUE, *, where: Any = NOVALUE) -> Any:
    return reductions.reduce(tracer, "mean", a, axis=axis, dtype=dtype, out=out,
                             keepdims=keepdims, where=where)


def _extreme(op: str) -> Callable:
    def handler(tracer: Tracer, a: Any, axis: Any = None, out: Any = None,
                keepdims: Any = NOVALUE, initial: Any = NOVALUE,
                where: Any = NOVALUE) -> Any:
        return reductions.reduce(tracer, op, a, axis=axis, out=out, keepdims=keepdims,
                                 initial=initial, where=where)

    return handler


def _spread(op: str) -> Callable:
    def handler(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
                ddof: Any = 0, keepdims: Any = NOVALUE, *, where: Any = NOVALUE,
                mean: Any = NOVALUE, correction: Any = NOVALUE) -> Any:
        if correction is not NOVALUE:
            if ddof != 0:
                raise ValueError("ddof and correction can't be provided simultaneously.")
            ddof = correction
        return reductions.reduce(tracer, op, a, axis=axis, dtype=dtype, out=out, ddof=ddof,
                                 keepdims=keepdims, where=where, mean=mean)

    return handler


def _arg(op: str) -> Callable:
    def handler(tracer: Tracer, a: Any, axis: Any = None, out: Any = None, *,
                keepdims: Any = NOVALUE) -> Any:
        return reductions.reduce(tracer, op, a, axis=axis, out=out, keepdims=keepdims)

    return handler


def _logical(op: str) -> Callable:
    def handler(tracer: Tracer, a: Any, axis: Any = None, out: Any = None,
                keepdims: Any = NOVALUE, *, where: Any = NOVALUE) -> Any:
        return reductions.reduce(tracer, op, a, axis=axis, out=out, keepdims=keepdims,
                                 where=where)

    return handler


# -- elementwise and shape functions -----------------------------------------------------------
def _where(tracer: Tracer, condition: Any, x: Any = None, y: Any = None) -> Traced:
    if x is None or y is None:
        raise NotCovered  # np.where(cond): the indices, a data-dependent shape
    return select(tracer, condition, x, y)


def clip(tracer: Tracer, a: Any, a_min: Any = NOVALUE, a_max: Any = NOVALUE,
         out: Any = None, *, min: Any = NOVALUE, max: Any = NOVALUE, **kwargs: Any) -> Any:
    """``np.clip`` / ``x.clip``: NumPy 2's argument rules (``min=``/``max=`` keywords
    included) and its handling of integer bounds outside the array's dtype."""
    if a_min is NOVALUE and a_max is NOVALUE:
        a_min = None if min is NOVALUE else min
        a_max = None if max is NOVALUE else max
    elif min is not NOVALUE or max is not NOVALUE:
        raise ValueError("Passing `min` or `max` keyword argument when `a_min` and `a_max` "
                         "are provided is forbidden.")
    else:
        a_min = None if a_min is NOVALUE else a_min
        a_max = None if a_max is NOVALUE else a_max
    if kwargs:
        raise NotCovered
    x = tracer.lift(a)
    if x.dtype.kind in "iu":  # NumPy drops Python-int bounds beyond the dtype's range
        info = np.iinfo(x.dtype)
        if type(a_min) is int and a_min <= info.min:
            a_min = None
        if type(a_max) is int and a_max >= info.max:
            a_max = None
    out = out if out is None or not isinstance(out, tuple) else (out[0] if out else None)
    targets = None if out is None else (out,)
    if a_min is None and a_max is None:
        return ufuncs.apply(tracer, "positive", (x,), out=targets)
    if a_min is None:
        return ufuncs.apply(tracer, "minimum", (x, a_max), out=targets)
    if a_max is None:
        return ufuncs.apply(tracer, "maximum", (x, a_min), out=targets)
    return ufuncs.apply(tracer, "clip", (x, a_min, a_max), out=targets)


def astype(tracer: Tracer, x: Any, dtype: Any, *, casting: str = "unsafe",
           copy: bool = True) -> Traced:
    """``x.astype(dtype)``: a new array (``copy=False`` and the same dtype: ``x``
    itself, as in NumPy)."""
    x = tracer.lift(x)
    dtype = np.dtype(dtype)
    if not np.can_cast(x.dtype, dtype, casting=casting):
        raise CastingError(f"Cannot cast array data from {x.dtype!r} to {dtype!r} according "
                           f"to the rule {casting!r}")
    if dtype == x.dtype and not copy:
        return x
    out = tracer.op("astype", (x,), {"dtype": dtype})
    out._scalar = x._scalar  # a scalar's astype is a scalar
    return out


def _np_astype(tracer: Tracer, x: Any, dtype: Any, /, *, copy: bool = True,
               device: Any = None) -> Traced:
    return astype(tracer, x, dtype, copy=copy)


def _copy(tracer: Tracer, a: Any, order: str = "K", subok: bool = False) -> Traced:
    return tracer.op("copy", (tracer.lift(a),))


def _copyto(tracer: Tracer, dst: Any, src: Any, casting: str = "same_kind",
            where: Any = True) -> None:
    mask = None if where is True else tracer.lift(where)
    mutation.write(tracer, dst, None, src, casting=casting, what="np.copyto(dst, src)",
                   mask=mask)


def _reshape(tracer: Tracer, a: Any, /, shape: Any = None, order: str = "C", *,
             newshape: Any = None, copy: Any = None) -> Traced:
    if shape is None:
        shape = newshape
    if shape is None or order != "C":
        raise NotCovered
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return tracer.lift(a).reshape(shape, copy=copy)


def _ravel(tracer: Tracer, a: Any, order: str = "C") -> Traced:
    return tracer.lift(a).ravel(order)


def _transpose(tracer: Tracer, a: Any, axes: Any = None) -> Traced:
    return tracer.lift(a).transpose(*(() if axes is None else (tuple(axes),)))


def _swapaxes(tracer: Tracer, a: Any, axis1: int, axis2: int) -> Traced:
    return tracer.lift(a).swapaxes(axis1, axis2)


def _concatenate(tracer: Tracer, arrays: Any, /, axis: Any = 0, out: Any = None, *,
                 dtype: Any = None, casting: str = "same_kind") -> Traced:
    if out is not None or dtype is not None:
        raise NotCovered
    if axis is None:  # NumPy flattens every operand first
        arrays, axis = [tracer.lift(a).ravel() for a in arrays], 0
    return tracer.op("concatenate", tuple(arrays), {"axis": int(axis)})


def _expand_dims(tracer: Tracer, a: Any, axis: Any) -> Traced:
    return mutation.view_op(tracer, a, "expand_dims", {"axis": axis})


def _squeeze(tracer: Tracer, a: Any, axis: Any = None) -> Traced:
    return tracer.lift(a).squeeze(axis)


def _broadcast_to(tracer: Tracer, array: Any, shape: Any, subok: bool = False) -> Traced:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return mutation.view_op(tracer, array, "broadcast_to", {"shape": shape})


def _dot(tracer: Tracer, a: Any, b: Any, out: Any = None) -> Any:
    a, b = tracer.lift(a), tracer.lift(b)
    if a.ndim > 2 or b.ndim > 2 or a.ndim == 0 or b.ndim == 0:
        raise NotCovered
    return ufuncs.matmul(tracer, a, b, out=out)


def _moveaxis(tracer: Tracer, a: Any, source: Any, destination: Any) -> Traced:
    x = tracer.lift(a)
    src = normalize_axis(source, x.ndim) if isinstance(source, (int, np.integer)) else \
        tuple(normalize_axis(s, x.ndim)[0] for s in source)
    dst = normalize_axis(destination, x.ndim) if isinstance(destination, (int, np.integer)) \
        else tuple(normalize_axis(d, x.ndim)[0] for d in destination)
    if len(src) != len(dst):
        raise ValueError("`source` and `destination` arguments must have the same number "
                         "of elements")
    order = [n for n in range(x.ndim) if n not in src]
    for d, s in sorted(zip(dst, src, strict=True)):
        order.insert(d, s)
    return x.transpose(tuple(order))


_HANDLERS: dict[Callable, Callable] = {
    np.sum: _sum, np.prod: _prod, np.mean: _mean,
    np.max: _extreme("max"), np.amax: _extreme("max"),
    np.min: _extreme("min"), np.amin: _extreme("min"),
    np.var: _spread("var"), np.std: _spread("std"),
    np.argmax: _arg("argmax"), np.argmin: _arg("argmin"),
    np.any: _logical("any"), np.all: _logical("all"),
    np.where: _where, np.clip: clip, np.copy: _copy, np.copyto: _copyto,
    np.reshape: _reshape, np.ravel: _ravel, np.transpose: _transpose,
    np.swapaxes: _swapaxes, np.moveaxis: _moveaxis, np.concatenate: _concatenate,
    np.expand_dims: _expand_dims, np.squeeze: _squeeze, np.broadcast_to: _broadcast_to,
    np.dot: _dot, **array_shapes.HANDLERS, **array_numerics.HANDLERS, **gathers.HANDLERS,
    **scans.HANDLERS, **quantiles.HANDLERS, **creation.HANDLERS, **covariance.HANDLERS,
    **elementwise_functions.HANDLERS, **lookups.HANDLERS, **array_api.HANDLERS,
    **queries.HANDLERS,
}
if hasattr(np, "astype"):
    _HANDLERS[np.astype] = _np_astype
