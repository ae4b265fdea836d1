"""``np.asarray``, ``np.array``, ``np.asanyarray``, ``np.ascontiguousarray`` and
``np.asfortranarray`` of traced values, as NumPy answers them.

NumPy does not hand these calls to ``__array_function__``: on a traced array they ask
for its values (``__array__``), which exist only when the compiled function runs, so
``x = np.asarray(x, dtype=np.float32)`` — the first line of many NumPy functions —
stopped the trace. While a function is traced, :func:`shims` makes it (and the
functions it calls by name, through :func:`~.rebind.rebind`) see stand-ins instead: the
functions themselves and the ``numpy`` module with those names replaced. A stand-in
given a traced array, or a (nested) list of traced arrays and numbers, answers as NumPy
does — the same array where NumPy returns its argument, a cast (``dtype=``), a copy
(``np.array``'s default, ``copy=True``, an order the layout lacks), NumPy's ValueError
for ``copy=False`` where a copy is needed, ``ndmin`` axes in front, a list stacked in
the dtype NumPy finds (Python numbers as float64 or int64); anything else goes to
NumPy's own function.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import mutation
from .values import is_traced

if TYPE_CHECKING:
    from .proxy import Traced
    from .tracer import Tracer

__all__ = ["shims"]

_COPY_REFUSED = ("Unable to avoid copy while creating an array as requested.\n"
                 "If using `np.array(obj, copy=False)` replace it with `np.asarray(obj)` "
                 "to allow a copy when needed (no behavior change in NumPy 1.x).")


def _holds_traced(obj: Any) -> bool:
    if is_traced(obj):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_holds_traced(o) for o in obj)
    return False


def _stacked(tracer: Tracer, seq: list | tuple) -> Traced:
    """A (nested) sequence of traced arrays and numbers as NumPy builds an array of it:
    the elements' common dtype (a Python number counts as NumPy's default for it), then
    stacked along a new first axis."""
    parts = [_stacked(tracer, e) if isinstance(e, (list, tuple)) and _holds_traced(e)
             else tracer.lift(e if is_traced(e) else np.asarray(e)) for e in seq]
    shapes = {tuple(p.shape) for p in parts}
    if len(shapes) != 1:
        raise ValueError("setting an array element with a sequence. The requested array "
                         "has an inhomogeneous shape after 1 dimensions.")
    dtype = np.result_type(*(p.dtype for p in parts))
    parts = [p if p.dtype == dtype else tracer.op("astype", (p,), {"dtype": dtype})
             for p in parts]
    return tracer.op("concatenate", tuple(p[None] for p in parts), {"axis": 0})


def _convert(tracer: Tracer, a: Any, dtype: Any, order: Any, copy: Any,
             ndmin: int = 0) -> Traced:
    """NumPy's answer to ``np.array(a, dtype, copy=copy, order=order, ndmin=ndmin)``
    for a traced ``a`` (``copy``: True, False or None as in NumPy 2)."""
    fresh = not is_traced(a)  # a sequence: its array is new memory already
    x = a if not fresh else _stacked(tracer, a)
    if not fresh and x._scalar:  # a NumPy scalar becomes a new 0-d array
        x, fresh = tracer.op("copy", (x,)), True
    want = np.dtype(dtype) if dtype is not None else x.dtype
    flags = mutation.layout_of(tracer, x).flags
    relayout = (order == "C" and not flags.c_contiguous) or \
        (order == "F" and not flags.f_contiguous)
    needs_copy = not fresh and (want != x.dtype or relayout)
    if copy is False and needs_copy:
        raise ValueError(_COPY_REFUSED)
    if want != x.dtype:
        x = tracer.op("astype", (x,), {"dtype": want})
    elif not fresh and (copy is True or relayout):
        x = tracer.op("copy", (x,))
    while x.ndim < ndmin:
        x = x[None]
    return x


def _asarray(real: Callable, tracer: Tracer) -> Callable:
    def asarray(a: Any, dtype: Any = None, order: Any = None, *, device: Any = None,
                copy: Any = None, like: Any = None) -> Any:
        if device is None and like is None and _holds_traced(a):
            return _convert(tracer, a, dtype, order, copy)
        given = {"device": device, "copy": copy, "like": like}  # (none before NumPy 2.1
        return real(a, dtype, order, **{k: v for k, v in given.items() if v is not None})

    asarray.__doc__ = real.__doc__
    return asarray


def _array(real: Callable, tracer: Tracer) -> Callable:
    def array(object: Any, dtype: Any = None, *, copy: Any = True, order: Any = "K",
              subok: bool = False, ndmin: int = 0, like: Any = None, **kwargs: Any) -> Any:
        if not kwargs and like is None and _holds_traced(object):
            return _convert(tracer, object, dtype, order, copy, ndmin)
        return real(object, dtype, copy=copy, order=order, subok=subok, ndmin=ndmin,
                    like=like, **kwargs)

    array.__doc__ = real.__doc__
    return array


def _contiguous(real: Callable, tracer: Tracer, order: str) -> Callable:
    def contiguous(a: Any, dtype: Any = None, *, like: Any = None) -> Any:
        if like is None and _holds_traced(a):
            return _convert(tracer, a, dtype, order, None, ndmin=1)
        return real(a, dtype, like=like)

    contiguous.__doc__ = real.__doc__
    return contiguous


class _Numpy(types.ModuleType):
    """The ``numpy`` module with a few names answered by stand-ins."""

    def __init__(self, names: dict[str, Any]) -> None:
        super().__init__(np.__name__, np.__doc__)
        self.__dict__.update(names)

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)


def shims(tracer: Tracer) -> dict[int, Any]:
    """``id(object) -> stand-in`` for NumPy's array constructors above and the
    ``numpy`` module, answering for ``tracer``'s traced values."""
    funcs = {"asarray": _asarray(np.asarray, tracer),
             "asanyarray": _asarray(np.asanyarray, tracer),
             "array": _array(np.array, tracer),
             "ascontiguousarray": _contiguous(np.ascontiguousarray, tracer, "C"),
             "asfortranarray": _contiguous(np.asfortranarray, tracer, "F")}
    out: dict[int, Any] = {id(getattr(np, name)): f for name, f in funcs.items()}
    out[id(np)] = _Numpy(funcs)
    return out
