"""NumPy's elementwise Python functions on traced arrays, as the ufuncs and selects they
are made of (``__array_function__`` handlers, dispatched by :mod:`.array_functions`).

``np.select`` (a chain of selects, NumPy's dtype and casting rules), ``np.sinc``,
``np.fix``, ``np.angle``, ``np.real`` and ``np.imag`` of real arrays, and ``np.cross``
of 3-vectors, each by NumPy's own steps, so each fuses into its neighbours instead of
splitting the program at a graph break. A form a handler does not cover raises
:class:`~.function_parts.NotCovered` and runs as written (NumPy's own errors included).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import mutation, ufuncs
from .function_parts import NotCovered
from .values import is_traced

if TYPE_CHECKING:
    from .tracer import Tracer

__all__ = ["HANDLERS"]

_PYTHON_SCALARS = (int, float, complex)


def _select(tracer: Tracer, condlist: Sequence[Any], choicelist: Sequence[Any],
            default: Any = 0) -> Any:
    """``np.select``: NumPy's result dtype (Python scalars weak), its result shape (the
    conditions' broadcast with the choices'), the default cast unsafely (``np.full``)
    and each choice cast ``same_kind`` (``np.copyto``), written in reverse order so
    the first true condition wins: a chain of selects."""
    if not isinstance(condlist, (list, tuple)) or not isinstance(choicelist, (list, tuple)) \
            or len(condlist) != len(choicelist) or not condlist:
        raise NotCovered  # NumPy's errors

    def operand(v: Any) -> Any:
        if type(v) in _PYTHON_SCALARS:
            return v
        return v if is_traced(v) else tracer.lift(v) if tracer.captured_input(v) is not None \
            else np.asarray(v)

    choices = [operand(c) for c in [*choicelist, default]]
    conds = [tracer.lift(c) if is_traced(c) or tracer.captured_input(c) is not None
             else np.asarray(c) for c in condlist]
    if any(c.dtype != np.bool_ for c in conds):
        raise NotCovered  # NumPy's TypeError
    try:
        dtype = np.result_type(*(c.dtype if is_traced(c) else c for c in choices))
        cond_shape = np.broadcast_shapes(*(tuple(c.shape) for c in conds))
        choice_shape = np.broadcast_shapes(*(tuple(c.shape) if is_traced(c) else
                                             np.shape(c) for c in choices))
        shape = cond_shape if not choice_shape else np.broadcast_shapes(cond_shape,
                                                                        choice_shape)
    except (TypeError, ValueError):
        raise NotCovered from None

    def cast(v: Any, casting: str) -> Any:
        if not is_traced(v):
            a = np.asarray(v)
            if not np.can_cast(a.dtype, dtype, casting):
                raise NotCovered
            return tracer.lift(a.astype(dtype))
        if not np.can_cast(v.dtype, dtype, casting):
            raise NotCovered
        return v if v.dtype == dtype else tracer.op("astype", (v,), {"dtype": dtype})

    result = cast(choices[-1], "unsafe")
    if tuple(result.shape) != shape:
        result = tracer.op("broadcast_to", (result,), {"shape": shape})
    for choice, cond in zip(choices[-2::-1], conds[::-1], strict=True):
        result = tracer.op("where", (tracer.lift(cond), cast(choice, "same_kind"), result))
    return result


def _sinc(tracer: Tracer, x: Any) -> Any:
    """``np.sinc``: ``y = where(pi * x, pi * x, eps)``, ``sin(y) / y`` (``eps`` the
    float dtype's machine epsilon, NumPy's guard against 0 / 0)."""
    v = tracer.lift(x)
    if v.dtype.kind not in "biuf":
        raise NotCovered
    t = ufuncs.apply(tracer, "multiply", (math.pi, v))
    eps = np.finfo(t.dtype).eps if t.dtype.kind == "f" else 1e-20
    y = tracer.op("where", (ufuncs.apply(tracer, "not_equal", (t, 0)), t,
                            tracer.lift(np.asarray(eps, dtype=t.dtype))))
    return ufuncs.apply(tracer, "divide", (ufuncs.apply(tracer, "sin", (y,)), y))


def _fix(tracer: Tracer, x: Any, out: Any = None) -> Any:
    """``np.fix``: NumPy's ``np.trunc(x, out=out)``."""
    return ufuncs.apply(tracer, "trunc", (tracer.lift(x),),
                        out=None if out is None else (out,))


def _angle(tracer: Tracer, z: Any, deg: bool = False) -> Any:
    """``np.angle`` of a real array: NumPy's ``arctan2(0, z)``, times ``180 / pi`` in
    place for degrees."""
    v = tracer.lift(z)
    if v.dtype.kind not in "biuf":
        raise NotCovered
    a = ufuncs.apply(tracer, "arctan2", (0, v))
    if deg:
        a = ufuncs.apply(tracer, "multiply", (a, 180 / math.pi))
    return a


def _real(tracer: Tracer, val: Any) -> Any:
    """``np.real`` of a real array: the array itself (NumPy's ``val.real``)."""
    v = tracer.lift(val)
    if v.dtype.kind not in "biuf":
        raise NotCovered
    return v


def _imag(tracer: Tracer, val: Any) -> Any:
    """``np.imag`` of a real array: NumPy's read-only zeros of its dtype and shape."""
    v = tracer.lift(val)
    if v.dtype.kind not in "biuf":
        raise NotCovered
    return mutation.view_op(tracer, tracer.lift(np.zeros((), dtype=v.dtype)), "broadcast_to",
                            {"shape": tuple(v.shape)})


def _cross(tracer: Tracer, a: Any, b: Any, axisa: int = -1, axisb: int = -1,
           axisc: int = -1, axis: Any = None) -> Any:
    """``np.cross`` of 3-vectors, NumPy's steps: the working axes moved last, both cast
    to the promoted dtype, ``a1 b2 - a2 b1``, ``a2 b0 - a0 b2``, ``a0 b1 - a1 b0``
    stacked last and moved to ``axisc``. 2-vectors (deprecated in NumPy) run as
    written."""
    if axis is not None:
        axisa = axisb = axisc = axis
    x, y = tracer.lift(a), tracer.lift(b)
    if x.ndim < 1 or y.ndim < 1:
        raise NotCovered
    try:
        x = np.moveaxis(x, axisa, -1)
        y = np.moveaxis(y, axisb, -1)
        dtype = np.promote_types(x.dtype, y.dtype)
    except (TypeError, ValueError, np.exceptions.AxisError):
        raise NotCovered from None
    if x.shape[-1] != 3 or y.shape[-1] != 3 or dtype.kind not in "iuf" \
            or not isinstance(axisc, (int, np.integer)):
        raise NotCovered
    shape = np.broadcast_shapes(tuple(x.shape[:-1]), tuple(y.shape[:-1]))
    if not -len(shape) - 1 <= axisc <= len(shape):
        raise NotCovered  # NumPy's AxisError
    x = x if x.dtype == dtype else tracer.op("astype", (x,), {"dtype": dtype})
    y = y if y.dtype == dtype else tracer.op("astype", (y,), {"dtype": dtype})

    def part(i: int, j: int) -> Any:
        return ufuncs.apply(tracer, "subtract",
                            (ufuncs.apply(tracer, "multiply", (x[..., i], y[..., j])),
                             ufuncs.apply(tracer, "multiply", (x[..., j], y[..., i]))))

    parts = []
    for p in (part(1, 2), part(2, 0), part(0, 1)):
        if tuple(p.shape) != shape:
            p = tracer.op("broadcast_to", (p,), {"shape": shape})
        parts.append(p[..., None])
    cp = tracer.op("concatenate", tuple(parts), {"axis": len(shape)})
    return np.moveaxis(cp, -1, axisc)


#: NumPy function -> handler.
HANDLERS = {np.select: _select, np.sinc: _sinc, np.fix: _fix, np.angle: _angle,
            np.real: _real, np.imag: _imag, np.cross: _cross}
