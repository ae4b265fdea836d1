"""Membership and bin lookups of traced values in constant tables: ``np.isin``,
``np.searchsorted`` and ``np.digitize`` (``__array_function__`` handlers, dispatched by
:mod:`.array_functions`).

With the table a constant (a literal, or an array made inside the function) of at most
:data:`MAX_TABLE` values, each lookup is a chain of comparisons of the traced value
with the table's elements — elementwise, so it fuses with what computes the value and
what reads the result, where NumPy would sort or bisect. The answers are NumPy's: a
membership is NumPy's ``==`` under its promotion (NumPy's own loop for short tables),
a sorted position counts the elements before the value in NumPy's sort order (NaN
after every number). A table that is a traced array (its values unknown while
tracing), a longer one, an unsorted ``searchsorted`` table (NumPy's answer is its
bisection's, not a count) or ``sorter=`` run as written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import ufuncs
from .function_parts import NotCovered
from .values import is_traced

if TYPE_CHECKING:
    from .tracer import Tracer

__all__ = ["HANDLERS", "MAX_TABLE"]

#: Longest table compared element by element.
MAX_TABLE = 64


def _table(tracer: Tracer, values: Any) -> np.ndarray:
    """A constant table's elements (NotCovered for a traced or long one)."""
    if is_traced(values) or tracer.captured_input(values) is not None:
        raise NotCovered
    try:
        table = np.asarray(values)
    except Exception:
        raise NotCovered from None
    if table.dtype.kind not in "biuf" or table.size > MAX_TABLE:
        raise NotCovered
    return table


def _operand(tracer: Tracer, v: Any) -> Any:
    """A traced value looked up (NotCovered where it is a constant: NumPy's call)."""
    if not is_traced(v) and tracer.captured_input(v) is None:
        raise NotCovered
    x = tracer.lift(v)
    if x.dtype.kind not in "biuf":
        raise NotCovered
    return x


def _isin(tracer: Tracer, element: Any, test_elements: Any, assume_unique: bool = False,
          invert: bool = False, *, kind: Any = None) -> Any:
    """``np.isin`` with constant test elements: NumPy's short-table loop,
    ``(x == t0) | (x == t1) ...`` (``invert``: ``(x != t0) & ...``), each comparison
    under NumPy's promotion with the table element's dtype."""
    if kind not in (None, "sort", "table"):
        raise NotCovered  # NumPy's ValueError
    x = _operand(tracer, element)
    table = _table(tracer, test_elements).ravel()
    if x.dtype.kind in "iu" and table.dtype.kind in "iu" \
            and np.result_type(x.dtype, table.dtype).kind == "f":
        raise NotCovered  # uint64 with signed integers: NumPy may sort them as floats
    if table.size == 0:
        return _constant_mask(tracer, x, bool(invert))
    mask = None
    for t in table:
        hit = ufuncs.apply(tracer, "not_equal" if invert else "equal", (x, t))
        mask = hit if mask is None else ufuncs.apply(
            tracer, "logical_and" if invert else "logical_or", (mask, hit))
    return mask


def _constant_mask(tracer: Tracer, x: Any, value: bool) -> Any:
    """All ``value`` in ``x``'s shape (an empty table's answer for floats)."""
    return tracer.op("broadcast_to", (tracer.lift(np.asarray(value)),),
                     {"shape": tuple(x.shape)})


def _position(tracer: Tracer, table: np.ndarray, x: Any, side: str) -> Any:
    """NumPy's ``searchsorted(table, x, side)`` for a sorted ``table``: how many of its
    elements come before ``x`` (``left``: are less; ``right``: are less or equal) in
    NumPy's sort order, where NaN follows every number and equals NaN."""
    if side not in ("left", "right"):
        raise NotCovered  # NumPy's ValueError
    nan_x = ufuncs.apply(tracer, "isnan", (x,)) if x.dtype.kind == "f" else None
    count = None
    for t in table:
        if t != t:  # a NaN element comes before only a NaN value, and only for 'right'
            if side == "left" or nan_x is None:
                continue
            before = nan_x
        else:
            before = ufuncs.apply(tracer, "less" if side == "left" else "less_equal", (t, x))
            if nan_x is not None:
                before = ufuncs.apply(tracer, "logical_or", (before, nan_x))
        one = tracer.op("astype", (before,), {"dtype": np.dtype(np.intp)})
        count = one if count is None else ufuncs.apply(tracer, "add", (count, one))
    if count is None:
        return tracer.op("broadcast_to", (tracer.lift(np.zeros((), np.intp)),),
                         {"shape": tuple(x.shape)})
    return count


def _sorted(table: np.ndarray) -> bool:
    """Whether ``table`` is in NumPy's sort order (NaN last)."""
    return bool(np.array_equal(np.sort(table), table, equal_nan=True))


def _searchsorted(tracer: Tracer, a: Any, v: Any, side: str = "left",
                  sorter: Any = None) -> Any:
    """``np.searchsorted`` of traced values in a constant sorted 1-D table."""
    if sorter is not None:
        raise NotCovered
    table = _table(tracer, a)
    x = _operand(tracer, v)
    if table.ndim != 1 or not _sorted(table) \
            or np.result_type(table.dtype, x.dtype).kind not in "biuf":
        raise NotCovered
    return _position(tracer, table, x, side)


def _digitize(tracer: Tracer, x: Any, bins: Any, right: bool = False) -> Any:
    """``np.digitize`` in constant monotonic bins, NumPy's steps: the sorted position
    (``side='left'`` where ``right``), increasing bins as they are, decreasing ones
    reversed and the position taken from their count."""
    table = _table(tracer, bins)
    v = _operand(tracer, x)
    if table.ndim != 1 or np.isnan(table.astype(np.float64)).any():
        raise NotCovered
    diffs = np.diff(table.astype(np.float64))
    side = "left" if right else "right"
    if (diffs >= 0).all():
        return _position(tracer, table, v, side)
    if (diffs <= 0).all():
        pos = _position(tracer, table[::-1], v, side)
        return ufuncs.apply(tracer, "subtract", (np.intp(table.size), pos))
    raise NotCovered  # NumPy's ValueError


#: NumPy function -> handler.
HANDLERS = {np.isin: _isin, np.searchsorted: _searchsorted, np.digitize: _digitize}
