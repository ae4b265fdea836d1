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
in both. Adjacent constant integer arrays and boolean masks (``x[np.triu_indices(n)]``,
``x[:, mask]``) are a gather at the flattened positions they name, known while tracing.
Any other advanced index (traced masks, whose result's shape depends on the values,
several traced arrays, ``None`` beside an array) stays a graph break, answered by the
array library.
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
        picked = _pick(tracer, x, parts)
        if picked is not None:
            return picked
    if len(arrays) >= 2 or any(_mask(tracer, p) is not None for p in parts):
        return _constant_positions(tracer, x, parts)
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


def _mask(tracer: Tracer, value: Any) -> np.ndarray | None:
    """``value`` as a constant boolean mask of at least one dimension, or None."""
    if is_traced(value) or tracer.captured_input(value) is not None \
            or not isinstance(value, (np.ndarray, list, tuple)):
        return None
    if isinstance(value, (list, tuple)) and any(
            is_traced(v) or tracer.captured_input(v) is not None for v in value):
        return None
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        return None
    return arr if arr.dtype == np.bool_ and arr.ndim >= 1 else None


def _constant_positions(tracer: Tracer, x: Traced, parts: tuple) -> Traced | None:
    """``x[..., i0, i1, ..., ...]`` with adjacent constant integer arrays and boolean
    masks (a mask standing for its ``np.nonzero`` arrays) among full slices and one
    ``...``: NumPy's advanced indexing at positions known while tracing — the indexed
    axes flattened into one and gathered at ``np.ravel_multi_index`` of the broadcast
    indices, the broadcast shape where those axes were (``x[np.triu_indices(n)]``,
    ``x[:, mask]``). Anything else, and an index out of range (NumPy's IndexError),
    is None: a graph break."""
    arrays: list[np.ndarray] = []
    kinds = []  # per part: "full", "...", or the number of axes it indexes
    masks: dict[int, tuple[int, ...]] = {}  # part -> the shape of its mask
    for p in parts:
        if p is Ellipsis:
            kinds.append("...")
        elif _full(p):
            kinds.append("full")
        elif (m := _mask(tracer, p)) is not None:
            arrays.extend(np.nonzero(m))
            masks[len(kinds)] = m.shape
            kinds.append(m.ndim)
        else:
            idx = _indices(tracer, p)
            if idx is None or is_traced(idx) or idx.ndim == 0:
                return None
            arrays.append(idx)
            kinds.append(1)
    at = [k for k, kind in enumerate(kinds) if isinstance(kind, int)]
    if kinds.count("...") > 1 or at != list(range(at[0], at[-1] + 1)):
        return None  # advanced indices apart: NumPy moves their axes to the front
    covered = sum(kinds[k] for k in at)
    named = sum(1 if kind == "full" else kind for kind in kinds if kind != "...")
    if named > x.ndim:
        return None  # NumPy's IndexError
    before = sum(1 if kind == "full" else 0 for kind in kinds[:at[0]])
    if "..." in kinds[:at[0]]:
        before = x.ndim - named + before
    dims = tuple(x.shape[before:before + covered])
    axis = before
    for k in at:  # a mask must have the shape of the axes it covers (NumPy's IndexError)
        if k in masks and masks[k] != tuple(x.shape[axis:axis + kinds[k]]):
            return None
        axis += kinds[k]
    try:
        index = np.broadcast_arrays(*arrays)
    except ValueError:
        return None
    if any(((i < -d) | (i >= d)).any() for i, d in zip(index, dims, strict=True)):
        return None  # NumPy's IndexError, raised as written
    flat = np.ravel_multi_index(tuple(np.where(i < 0, i + d, i) for i, d in
                                      zip(index, dims, strict=True)), dims) if dims else \
        np.zeros(index[0].shape, np.intp)
    src = x.reshape((*x.shape[:before], int(np.prod(dims, dtype=np.int64)),
                     *x.shape[before + covered:]))
    return tracer.op("gather", (src, tracer.lift(flat.astype(np.intp))),
                     {"axis": before, "along": False})


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
