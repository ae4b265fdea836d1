"""Reads at integer indices, traced as ``gather`` ops instead of graph breaks.

The ways users write them become one op (:mod:`.ops_shape`'s ``gather``), which the
elementwise fusion takes into a kernel as a read of its source at data-dependent
positions (:mod:`.views`), so ``w[tokens] * scale``, ``x[:, cols] + b`` or the pick of
a loss are one kernel:

- ``x[idx]``, ``x[:, idx]``, ``x[..., idx]`` — one integer array (traced, NumPy, or a
  list of ints) among full slices: ``np.take(x, idx, axis)``; a traced 0-d index
  (``x[np.argmax(s)]``) too, read as NumPy reads it, as an integer: a scalar of a 1-D
  ``x`` (a view otherwise, into which a write is refused rather than lost);
- ``np.take(a, indices, axis=None)`` with ``mode="raise"`` and no ``out``;
- ``np.take_along_axis(arr, indices, axis)``, and ``x[np.arange(n), y]`` on a 2-D ``x``
  (the pick of a cross-entropy: ``take_along_axis(x, y[:, None], 1)[:, 0]``, one index
  per row).

Semantics: NumPy's, with one difference on the GPU: an index out of range raises
``IndexError`` in NumPy (and on the NumPy backend) but wraps modulo the axis length in
CuPy, whose behaviour the generated kernels share. Negative indices count from the end
in both. Any other advanced index (several arrays, boolean masks, ``None`` beside an
array) stays a graph break, answered by the array library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import mutation
from .function_parts import NotCovered
from .ops import normalize_axis
from .values import is_traced

if TYPE_CHECKING:
    from .proxy import Traced
    from .tracer import Tracer

__all__ = ["HANDLERS", "index_gather"]


def _indices(tracer: Tracer, value: Any) -> Any:
    """``value`` as an integer index array (traced as it is), or None if it is not one."""
    if is_traced(value) or tracer.captured_input(value) is not None:
        dtype = np.dtype(value.dtype)
        return value if dtype.kind in "iu" else None
    if isinstance(value, (bool, np.bool_, int, np.integer, float, slice)) or value is None \
            or value is Ellipsis:
        return None
    if isinstance(value, (list, tuple)) and any(
            is_traced(v) or tracer.captured_input(v) is not None for v in value):
        return None  # a list holding traced values: the graph break takes it as it is
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        return None
    return arr if arr.dtype.kind in "iu" else None


def index_gather(tracer: Tracer, x: Traced, index: Any) -> Traced | None:
    """``x[index]`` as a gather, or None where ``index`` is not one of the forms above."""
    parts = index if isinstance(index, tuple) else (index,)
    arrays = [k for k, p in enumerate(parts) if _indices(tracer, p) is not None]
    if len(arrays) == 2 and len(parts) == 2 and x.ndim == 2:
        return _pick(tracer, x, parts)
    if len(arrays) != 1:
        return None
    (k,) = arrays
    idx = _indices(tracer, parts[k])
    if idx.ndim == 0 and not (is_traced(idx) or tracer.captured_input(idx) is not None):
        return None  # a constant: mutation.getitem reads it as the integer it is
    rest = [p for j, p in enumerate(parts) if j != k]
    if any(not (p is Ellipsis or _full(p)) for p in rest) \
            or sum(p is Ellipsis for p in rest) > 1:
        return None
    ellipsis = [j for j, p in enumerate(parts) if p is Ellipsis]  # (no == on arrays)
    axis = x.ndim - (len(parts) - k) if ellipsis and ellipsis[0] < k else k
    if not 0 <= axis < x.ndim or len(parts) - len(ellipsis) > x.ndim:
        return None
    out = tracer.op("gather", (x, idx), {"axis": axis, "along": False})
    if idx.ndim == 0:  # NumPy reads a 0-d index as an integer: a scalar, or a view
        if x.ndim == 1:
            out._scalar = True
        else:  # a write into it cannot reach x here, so it is refused, not lost
            mutation.opaque_view(x, out, readonly=False)
    return out


def _full(part: Any) -> bool:
    """Whether ``part`` is ``:`` (compared field by field: a bound may be traced)."""
    return isinstance(part, slice) and part.start is None and part.stop is None \
        and part.step is None


def _pick(tracer: Tracer, x: Traced, parts: tuple) -> Traced | None:
    """``x[np.arange(n), y]`` (``n`` = ``x.shape[0]``, ``y`` of shape ``(n,)``) as a
    take along axis 1."""
    rows, cols = (_indices(tracer, p) for p in parts)
    if is_traced(rows) or tracer.captured_input(parts[0]) is not None or rows.ndim != 1 \
            or rows.shape[0] != x.shape[0] \
            or not np.array_equal(rows, np.arange(x.shape[0])):
        return None
    if tuple(cols.shape) != (x.shape[0],):
        return None
    return tracer.op("gather", (x, cols), {"axis": 1, "along": True})


def _take(tracer: Tracer, a: Any, indices: Any, axis: Any = None, out: Any = None,
          mode: str = "raise") -> Any:
    if out is not None or mode != "raise":
        raise NotCovered
    idx = _indices(tracer, indices)
    if idx is None or (idx.ndim == 0 and not is_traced(idx)):
        raise NotCovered  # a scalar index: NumPy's take gives a 0-d result; run as written
    a = tracer.lift(a)
    if axis is None:
        a = a.reshape(-1)
        axis = 0
    (ax,) = normalize_axis(axis, a.ndim)
    return tracer.op("gather", (a, idx), {"axis": ax, "along": False})


def _take_along_axis(tracer: Tracer, arr: Any, indices: Any, axis: Any = -1) -> Any:
    idx = _indices(tracer, indices)
    if idx is None:
        raise NotCovered
    arr = tracer.lift(arr)
    if axis is None:
        if idx.ndim != 1:
            raise NotCovered  # NumPy's own error
        arr = arr.reshape(-1)
        axis = 0
    if idx.ndim != arr.ndim:
        raise NotCovered
    (ax,) = normalize_axis(axis, arr.ndim)
    return tracer.op("gather", (arr, idx), {"axis": ax, "along": True})


#: NumPy function -> handler (dispatched by :mod:`.array_functions`).
HANDLERS = {np.take: _take, np.take_along_axis: _take_along_axis}
