"""Scans and sorts along one axis as ops: ``np.cumsum``, ``np.cumprod``, ``np.sort`` and
``np.argsort`` (their array methods too, and ``x.sort()`` in place through
:mod:`.mutation`), and ``np.median`` made of a sort and the mean of its middle
(``np.quantile``/``np.percentile``: :mod:`.quantiles`).

Their results have static shapes, so they need no graph break: each call is one node
whose reference is the array module's own function — NumPy's on the numpy backend,
CuPy's on the GPU (CUB's device scans, radix sorts), run as a library call between the
generated kernels of the same launch list. NumPy's semantics are kept: ``axis=None``
scans or sorts the flattened array; ``cumsum``/``cumprod`` take ``dtype=`` and
otherwise accumulate small integers and booleans in the platform integer, as NumPy
does; a sort puts NaN last.

Two differences, stated where they can show: ``np.argsort`` is computed stably on both
backends (ties in their original order), which is one of the orders NumPy's default
unstable sort may give, and the one it gives for ``kind="stable"``; on the GPU a
float16 scan's running sums may round differently from NumPy's float16 steps. A call
with ``out=`` or ``order=`` stays a graph break.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .function_parts import NOVALUE, NotCovered
from .op_registry import REGISTRY, OpDef, normalize_axis, register

if TYPE_CHECKING:
    from .proxy import Traced
    from .tracer import Tracer

__all__ = ["HANDLERS", "SCAN_OPS"]

#: The ops of this module (kind ``"scan"``).
SCAN_OPS = ("cumsum", "cumprod", "sort", "argsort")


def _shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    shape = tuple(inputs[0].shape)
    normalize_axis(attrs["axis"], max(len(shape), 1))  # a ShapeError when out of range
    return shape


def _dtype(op: str) -> Callable[[Sequence[Any], dict[str, Any]], np.dtype]:
    def rule(inputs: Sequence[Any], attrs: dict[str, Any]) -> np.dtype:
        if op == "argsort":
            return np.dtype(np.intp)
        if op == "sort":
            return np.dtype(inputs[0].dtype)
        probe = np.empty(0, dtype=inputs[0].dtype)  # NumPy's own accumulation rule
        return getattr(np, op)(probe, dtype=attrs.get("dtype")).dtype
    return rule


def _reference(op: str) -> Callable[[Any, Sequence[Any], dict[str, Any]], Any]:
    def run(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
        (x,) = args
        axis = attrs["axis"]
        if op in ("cumsum", "cumprod"):
            return getattr(xp, op)(x, axis=axis, dtype=attrs.get("dtype"))
        if op == "sort":
            return xp.sort(x, axis=axis)
        if xp is np:
            return np.argsort(x, axis=axis, kind="stable")
        return xp.argsort(x, axis=axis)  # CuPy's sort is stable
    return run


_DOCS = {"cumsum": "running sums along an axis", "cumprod": "running products along an axis",
         "sort": "the values sorted along an axis (NaN last)",
         "argsort": "the indices that sort along an axis (stable: ties in order)"}
for _op in SCAN_OPS:
    if _op not in REGISTRY:
        register(OpDef(_op, "scan", 1, _shape, _reference(_op), dtype=_dtype(_op),
                       doc=_DOCS[_op]))


def _along(tracer: Tracer, a: Any, axis: Any) -> tuple[Traced, int]:
    """``a`` traced (flattened for ``axis=None``) and the axis as a non-negative int."""
    x = tracer.lift(a)
    if axis is None:
        x = x.ravel()
        return x, 0
    if not isinstance(axis, (int, np.integer)):
        raise NotCovered  # a tuple of axes: NumPy's own TypeError, from the eager call
    if x.ndim == 0:
        raise NotCovered  # NumPy's answer for a 0-d array (an error or a 1-d result)
    (k,) = normalize_axis(int(axis), x.ndim)
    return x, k


def _scan(op: str) -> Callable:
    def handler(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None,
                out: Any = None) -> Traced:
        if out is not None:
            raise NotCovered
        x, k = _along(tracer, a, axis)
        attrs: dict[str, Any] = {"axis": k}
        if dtype is not None:
            attrs["dtype"] = np.dtype(dtype)
        return tracer.op(op, (x,), attrs)
    return handler


def _sorting(op: str) -> Callable:
    def handler(tracer: Tracer, a: Any, axis: Any = -1, kind: Any = None, order: Any = None,
                *, stable: Any = NOVALUE) -> Traced:
        if order is not None:
            raise NotCovered  # structured arrays only
        x, k = _along(tracer, a, axis)
        return tracer.op(op, (x,), {"axis": k})
    return handler


def _median(tracer: Tracer, a: Any, axis: Any = None, out: Any = None,
            overwrite_input: bool = False, keepdims: bool = False) -> Any:
    """``np.median`` over one axis (or the flattened array): the middle of the sorted
    values, or the mean of the middle two, as NumPy takes it — through ``np.mean`` (a
    float16 pair averaged in float32, integers in float64) — and NaN wherever the slice
    holds a NaN (NumPy's check of the sorted slice's last value)."""
    if out is not None:
        raise NotCovered
    x, k = _along(tracer, a, axis)
    n = x.shape[k]
    if n == 0 or x.dtype.kind not in "biuf":
        raise NotCovered  # NumPy's warning and NaN for an empty slice; complex values
    s = np.moveaxis(tracer.op("sort", (x,), {"axis": k}), k, -1)
    mid = s[..., (n - 1) // 2: n // 2 + 1]
    result = np.mean(mid, axis=-1)
    if x.dtype.kind == "f":
        result = np.where(np.isnan(s[..., -1]), s[..., -1], result)
    if keepdims:
        if axis is None:
            result = result.reshape((1,) * tracer.lift(a).ndim)
        else:
            result = np.expand_dims(result, k)
    result._scalar = result.ndim == 0  # NumPy returns a scalar, not a 0-d array
    return result


#: NumPy function -> handler (see :mod:`.array_functions`).
HANDLERS: dict[Callable, Callable] = {
    np.cumsum: _scan("cumsum"), np.cumprod: _scan("cumprod"),
    np.sort: _sorting("sort"), np.argsort: _sorting("argsort"), np.median: _median,
}
