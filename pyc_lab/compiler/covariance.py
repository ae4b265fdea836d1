"""``np.cov``, ``np.corrcoef`` and ``np.average`` of traced arrays, by NumPy's own steps
(``__array_function__`` handlers, dispatched by :mod:`.array_functions`).

A covariance is a mean over the observations, the deviations from it, one matrix
product of the deviations with their transpose (a GEMM on the GPU: a library or tuned
kernel, the rest fused around it) and a scale; a correlation divides by the square
roots of its diagonal and clips to ``[-1, 1]``. Every dtype rule is NumPy's (float64 at
least unless ``dtype=`` is given; the scale ``1 / (n - ddof)`` is a float64 NumPy
scalar, so a float32 covariance is scaled in float64 and rounded back, as NumPy's
in-place multiply does). Forms whose checks depend on the values (weights, which NumPy
checks for negatives or a zero sum) or that NumPy answers with a warning (no degrees of
freedom left) raise :class:`~.function_parts.NotCovered` and run as written; so do
complex arrays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from . import reductions, ufuncs
from .array_shapes import HANDLERS as SHAPES
from .function_parts import NOVALUE, NotCovered
from .values import is_traced

if TYPE_CHECKING:
    from .tracer import Tracer

__all__ = ["HANDLERS"]


def _real_operand(tracer: Tracer, a: Any) -> Any:
    """``a`` lifted, or NotCovered for what NumPy's covariance conjugates or refuses."""
    x = tracer.lift(a)
    if x.dtype.kind not in "biuf" or x.ndim > 2:
        raise NotCovered
    return x


def _observations(tracer: Tracer, x: Any, dt: np.dtype, rowvar: bool, ndim: int,
                  transpose_single: bool) -> Any:
    """NumPy's ``array(x, ndmin=2, dtype=dt)``, transposed where ``rowvar`` is false
    (``transpose_single``: also a single row, as NumPy treats ``m``)."""
    if x.dtype != dt:
        x = tracer.op("astype", (x,), {"dtype": dt})
    if x.ndim == 0:
        raise NotCovered
    if x.ndim == 1:
        x = x[None, :]
    if not rowvar and (ndim != 1 if transpose_single else x.shape[0] != 1):
        x = x.T
    return x


def _cov(tracer: Tracer, m: Any, y: Any = None, rowvar: bool = True, bias: bool = False,
         ddof: Any = None, fweights: Any = None, aweights: Any = None, *,
         dtype: Any = None) -> Any:
    """``np.cov`` without weights: ``X -= X.mean(axis=1)``, ``X @ X.T``, times
    ``np.true_divide(1, n - ddof)``, squeezed."""
    if fweights is not None or aweights is not None:
        raise NotCovered  # NumPy checks the weights' values
    x = _real_operand(tracer, m)
    other = None if y is None else _real_operand(tracer, y)
    if dtype is None:
        dt = np.result_type(x.dtype, np.float64) if other is None else \
            np.result_type(x.dtype, other.dtype, np.float64)
    else:
        dt = np.dtype(dtype)
    if dt.kind != "f":
        raise NotCovered
    X = _observations(tracer, x, dt, bool(rowvar), x.ndim, True)
    if X.shape[0] == 0:
        raise NotCovered  # NumPy's empty (0, 0) result
    if other is not None:
        Y = _observations(tracer, other, dt, bool(rowvar), other.ndim, False)
        X = tracer.op("concatenate", (X, Y), {"axis": 0})
    if ddof is None:
        ddof = 0 if bias else 1
    try:
        if ddof != int(ddof):
            raise NotCovered  # NumPy's ValueError
        ddof = int(ddof)
    except (TypeError, ValueError):
        raise NotCovered from None
    fact = X.shape[1] - ddof
    if fact <= 0:
        raise NotCovered  # NumPy warns and divides by zero
    avg = reductions.reduce(tracer, "mean", X, axis=1)
    X = ufuncs.apply(tracer, "subtract", (X, avg[:, None]))
    c = tracer.op("matmul", (X, X.T))
    scaled = ufuncs.apply(tracer, "multiply", (c, np.true_divide(1, fact)))
    if scaled.dtype != c.dtype:  # c *= ...: computed in float64, written back
        scaled = tracer.op("astype", (scaled,), {"dtype": c.dtype})
    axes = tuple(d for d, n in enumerate(scaled.shape) if n == 1)
    return tracer.op("squeeze", (scaled,), {"axis": axes}) if axes else scaled


def _corrcoef(tracer: Tracer, x: Any, y: Any = None, rowvar: bool = True, *,
              dtype: Any = None) -> Any:
    """``np.corrcoef``: the covariance (:func:`_cov`) divided by the square roots of its
    diagonal along rows, then along columns, clipped to ``[-1, 1]``; a single variable's
    ``c / c``."""
    c = _cov(tracer, x, y, rowvar, dtype=dtype)
    if c.ndim != 2:
        return ufuncs.apply(tracer, "divide", (c, c))
    stddev = ufuncs.apply(tracer, "sqrt", (SHAPES[np.diag](tracer, c),))
    c = ufuncs.apply(tracer, "divide", (c, stddev[:, None]))
    c = ufuncs.apply(tracer, "divide", (c, stddev[None, :]))
    return ufuncs.apply(tracer, "clip", (c, -1, 1))


def _average(tracer: Tracer, a: Any, axis: Any = None, weights: Any = None,
             returned: bool = False, *, keepdims: Any = NOVALUE) -> Any:
    """``np.average``: the mean without weights; with constant weights NumPy's
    ``multiply(a, w, dtype=r).sum(axis) / w.sum(axis, dtype=r)`` (the weights checked
    here, as NumPy checks them: shape, and a zero sum is NumPy's ZeroDivisionError).
    Weights that are traced arrays (NumPy checks their sum's values) and ``returned``
    run as written."""
    if returned:
        raise NotCovered
    if weights is None:
        return reductions.reduce(tracer, "mean", a, axis=axis, keepdims=keepdims)
    x = tracer.lift(a)
    kw = {} if keepdims is NOVALUE else {"keepdims": keepdims}
    if x.dtype.kind not in "biuf" or is_traced(weights) \
            or tracer.captured_input(weights) is not None:
        raise NotCovered
    try:
        wgt = np.asanyarray(weights)
        axes = None if axis is None else normalize_axis_tuple(axis, x.ndim)
    except (TypeError, ValueError):
        raise NotCovered from None  # NumPy's own error, raised as written
    if wgt.dtype.kind not in "biuf":
        raise NotCovered
    if tuple(wgt.shape) != tuple(x.shape):
        if axes is None or tuple(wgt.shape) != tuple(x.shape[d] for d in axes):
            raise NotCovered  # NumPy's TypeError / ValueError
        wgt = wgt.transpose(np.argsort(axes))
        wgt = wgt.reshape(tuple(n if d in axes else 1 for d, n in enumerate(x.shape)))
    r = np.result_type(x.dtype, wgt.dtype, "f8") if x.dtype.kind in "biu" else \
        np.result_type(x.dtype, wgt.dtype)
    scl = wgt.sum(axis=axes, dtype=r, **kw)
    if np.any(scl == 0.0):
        raise NotCovered  # NumPy's ZeroDivisionError, raised as written
    xr = x if x.dtype == r else tracer.op("astype", (x,), {"dtype": r})
    total = reductions.reduce(tracer, "sum", ufuncs.apply(tracer, "multiply",
                                                          (xr, wgt.astype(r))),
                              axis=axes, **kw)
    return ufuncs.apply(tracer, "divide", (total, scl))


#: NumPy function -> handler.
HANDLERS = {np.cov: _cov, np.corrcoef: _corrcoef, np.average: _average}
