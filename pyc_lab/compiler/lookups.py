"""Membership, bin and interpolation lookups of traced values in constant tables:
``np.isin``, ``np.searchsorted``, ``np.digitize`` and ``np.interp``
(``__array_function__`` handlers, dispatched by :mod:`.array_functions`).

With the table a constant (a literal, or an array made inside the function) of at most
:data:`MAX_TABLE` values, each lookup is a chain of comparisons of the traced value
with the table's elements — elementwise, so it fuses with what computes the value and
what reads the result, where NumPy would sort or bisect. The answers are NumPy's: a
membership is NumPy's ``==`` under its promotion (NumPy's own loop for short tables),
a sorted position counts the elements before the value in NumPy's sort order (NaN
after every number). A table that is a traced array (its values unknown while
tracing), a longer one, an unsorted ``searchsorted`` or ``interp`` table (NumPy's answer
is its bisection's, not a count) or ``sorter=`` run as written.
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


def _interp(tracer: Tracer, x: Any, xp: Any, fp: Any, left: Any = None, right: Any = None,
            period: Any = None) -> Any:
    """``np.interp`` of traced points in constant sorted sample points, NumPy's C
    steps in float64: the segment ``j`` is the count of sample points at or below the
    point less one (what NumPy's bisection finds in sorted points); left of the first
    point ``left``, right of the last ``right``, on the last ``fp[-1]``, on a sample
    point its value, else ``slope * (x - xp[j]) + fp[j]`` with the slope NumPy computes,
    and NumPy's retries where that is NaN (from the right end, then ``fp[j]`` for a
    flat segment); a NaN point gives NaN. The segment's values are gathers from the
    constant tables."""
    if period is not None:
        raise NotCovered
    v = _operand(tracer, x)
    try:
        xs = np.asarray(_table(tracer, xp), dtype=np.float64)
        fs = np.asarray(_table(tracer, fp), dtype=np.float64)
        lval = fs[0] if left is None else np.float64(float(left))
        rval = fs[-1] if right is None else np.float64(float(right))
    except (TypeError, ValueError, IndexError):
        raise NotCovered from None  # NumPy's errors (empty, 2-D or complex tables)
    if xs.ndim != 1 or fs.shape != xs.shape or np.isnan(xs).any() \
            or not (np.diff(xs) >= 0).all():
        raise NotCovered

    def apply(name: str, *operands: Any) -> Any:
        return ufuncs.apply(tracer, name, operands)

    def where(cond: Any, a: Any, b: Any) -> Any:
        return tracer.op("where", (cond, tracer.lift(a), tracer.lift(b)))

    z = v if v.dtype == np.float64 else tracer.op("astype", (v,), {"dtype": np.dtype(np.float64)})
    if xs.size == 1:  # NumPy's single-point rule (a NaN point gives fp[0] there)
        return where(apply("less", z, xs[0]), lval, where(apply("greater", z, xs[0]), rval,
                                                               fs[0]))
    n = xs.size
    j = apply("subtract", _position(tracer, xs, z, "right"), np.intp(1))
    k = apply("clip", j, 0, n - 2)
    slopes = (fs[1:] - fs[:-1]) / (xs[1:] - xs[:-1])
    x0, x1 = tracer.lift(xs)[k], tracer.lift(xs[1:])[k]
    y0, y1 = tracer.lift(fs)[k], tracer.lift(fs[1:])[k]
    slope = tracer.lift(slopes)[k]
    ahead = apply("add", apply("multiply", slope, apply("subtract", z, x0)), y0)
    behind = apply("add", apply("multiply", slope, apply("subtract", z, x1)), y1)
    flat = apply("logical_and", apply("isnan", behind), apply("equal", y0, y1))
    inside = where(apply("isnan", ahead), where(flat, y0, behind), ahead)
    inside = where(apply("equal", x0, z), y0, inside)
    inside = where(apply("equal", j, np.intp(n - 1)), fs[-1], inside)
    result = where(apply("greater", z, xs[-1]), rval,
                   where(apply("less", z, xs[0]), lval, inside))
    return where(apply("isnan", z), z, result)


#: NumPy function -> handler.
HANDLERS = {np.isin: _isin, np.searchsorted: _searchsorted, np.digitize: _digitize,
            np.interp: _interp}
