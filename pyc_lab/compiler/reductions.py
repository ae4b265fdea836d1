"""Reductions on traced arrays with NumPy's arguments: ``axis``, ``dtype``, ``out``,
``keepdims``, ``initial``, ``where``, ``ddof``.

The ``ndarray`` methods (:class:`~pyc_lab.compiler.proxy.Traced`) and the NumPy functions
(:mod:`.array_functions`) take NumPy's signatures, positional order included, and end
here. Every argument becomes an attribute of the reduction node (``where`` a second
input), whose reference calls the NumPy function with them — nothing is dropped.
``var``/``std`` with ``mean=`` (NumPy 2's precomputed mean) is a graph break.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import mutation
from .errors import CastingError, UnsupportedOperationError
from .ops import normalize_axis
from .values import is_traced

if TYPE_CHECKING:
    from .tracer import Tracer

__all__ = ["reduce"]

_NOVALUE: Any = np._NoValue


def _given(value: Any) -> bool:
    return value is not _NOVALUE


def reduce(tracer: Tracer, op: str, x: Any, *, axis: Any = None, dtype: Any = None,
           out: Any = None, keepdims: Any = False, initial: Any = _NOVALUE,
           where: Any = True, ddof: Any = 0, mean: Any = _NOVALUE) -> Any:
    """``np.<op>(x, axis=..., ...)`` recorded as one reduction node.

    Returns
    -------
    Traced
        The result (``out`` itself when it is given, after the write).
    """
    x = tracer.lift(x)
    keepdims = False if not _given(keepdims) else bool(keepdims)
    where = True if not _given(where) else where
    if _given(mean):
        kwargs = {"axis": axis, "dtype": dtype, "ddof": ddof, "keepdims": keepdims,
                  "where": where, "mean": mean}
        return _out(tracer, op, tracer.eager(getattr(np, op), (x,), kwargs,
                                             f"np.{op} with mean= is not compiled"), out)
    if op in ("argmax", "argmin") and isinstance(axis, (tuple, list)):
        raise TypeError(f"'{type(axis).__name__}' object cannot be interpreted as an integer")
    attrs: dict[str, Any] = {
        "axis": None if axis is None else normalize_axis(axis, x.ndim),
        "keepdims": keepdims,
    }
    if dtype is not None:
        attrs["dtype"] = np.dtype(dtype)
    if _given(initial) and initial is not None:
        if is_traced(initial):
            raise UnsupportedOperationError(
                f"np.{op}(..., initial=<traced array>): initial must be a scalar known when "
                "the function is traced (NumPy takes only scalars there)")
        attrs["initial"] = initial
    if op in ("var", "std") and ddof is not None and not (
            isinstance(ddof, (int, float)) and ddof == 0):
        if is_traced(ddof):
            raise UnsupportedOperationError(f"np.{op}(..., ddof=<traced array>) is not "
                                            "supported; ddof must be a number")
        attrs["ddof"] = ddof
    inputs: list[Any] = [x]
    if where is not True:
        mask = tracer.lift(where)
        if mask.dtype != np.dtype(bool):
            raise CastingError(f"np.{op}(..., where=...): where must be a bool array, got "
                               f"{mask.dtype} (NumPy refuses it too)")
        inputs.append(mask)
    return _out(tracer, op, tracer.op(op, tuple(inputs), attrs), out)


def _out(tracer: Tracer, op: str, result: Any, out: Any) -> Any:
    if isinstance(out, tuple):
        out = out[0] if out else None
    if out is None:
        result._scalar = result.ndim == 0  # NumPy returns a scalar, not a 0-d array
        return result
    return mutation.write(tracer, out, None, result, casting="unsafe",
                          what=f"np.{op}(..., out=x)")
