"""NumPy's shape-and-layout functions on traced arrays, as views, concatenations and
selects (``__array_function__`` handlers, dispatched by :mod:`.array_functions`).

Each handler takes the NumPy function's signature and records ops: reversed views
(``np.flip``), concatenations (``np.stack``/``vstack``/``hstack``/``column_stack``/
``dstack``, ``np.roll``, ``np.tile``, ``np.pad``), slices (``np.split`` and friends),
broadcasts (``np.repeat``, ``np.broadcast_arrays``, ``np.outer``), transposes
(``np.rollaxis``, ``np.rot90``), differences (``np.ediff1d``), selects against a
constant mask (``np.tril``/``np.triu``, ``np.diag`` of a vector) and diagonals
(``np.diagonal``, ``np.trace``: flattened axes sliced). A form a
handler does not cover raises :class:`~.function_parts.NotCovered` and runs as written.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import mutation, padding, reductions
from .function_parts import NotCovered
from .ops import normalize_axis

if TYPE_CHECKING:
    from .proxy import Traced
    from .tracer import Tracer

__all__ = ["HANDLERS"]


def _flip(tracer: Tracer, m: Any, axis: Any = None) -> Any:
    """``np.flip``: the reversed view ``m[..., ::-1, ...]`` along the axes."""
    x = tracer.lift(m)
    axes = range(x.ndim) if axis is None else normalize_axis(axis, x.ndim)
    index = tuple(slice(None, None, -1) if d in axes else slice(None) for d in range(x.ndim))
    return x[index]


def _stack_along(axis: int, least: int) -> Callable:
    """``np.vstack`` (``axis=0``, operands made at least 2-D) and ``np.hstack`` (``axis=1``,
    or 0 for 1-D operands): a concatenation of the operands as NumPy shapes them."""
    def handler(tracer: Tracer, tup: Any, *, dtype: Any = None,
                casting: str = "same_kind") -> Traced:
        if dtype is not None or not isinstance(tup, (list, tuple)) or not tup:
            raise NotCovered  # an array as the sequence, or a dtype to cast to
        arrays = [tracer.lift(a) for a in tup]
        if least == 2:
            arrays = [a.reshape(1, -1) if a.ndim == 1 else a for a in arrays]
            if any(a.ndim == 0 for a in arrays):
                raise NotCovered
            return tracer.op("concatenate", tuple(arrays), {"axis": 0})
        one_d = all(a.ndim == 1 for a in arrays)
        if any(a.ndim == 0 for a in arrays):
            raise NotCovered
        return tracer.op("concatenate", tuple(arrays), {"axis": 0 if one_d else axis})

    return handler


def _outer(tracer: Tracer, a: Any, b: Any, out: Any = None) -> Any:
    """``np.outer``: NumPy's ``a.ravel()[:, None] * b.ravel()[None, :]``."""
    if out is not None:
        raise NotCovered
    return tracer.lift(a).ravel()[:, None] * tracer.lift(b).ravel()[None, :]


def _tri_part(lower: bool) -> Callable:
    """``np.tril`` / ``np.triu``: NumPy's ``where(mask, m, 0)`` with its constant mask."""
    def handler(tracer: Tracer, m: Any, k: int = 0) -> Any:
        x = tracer.lift(m)
        if x.ndim < 2 or not isinstance(k, (int, np.integer)):
            raise NotCovered
        rows, cols = x.shape[-2:]
        mask = np.tri(rows, cols, k, dtype=bool) if lower else \
            ~np.tri(rows, cols, k - 1, dtype=bool)
        return tracer.op("where", (tracer.lift(mask), x,
                                   tracer.lift(np.zeros(1, dtype=x.dtype))))

    return handler


def _roll(tracer: Tracer, a: Any, shift: Any, axis: Any = None) -> Any:
    """``np.roll`` along given axes: a concatenation of the two slices of each axis."""
    x = tracer.lift(a)
    if axis is None:
        if not isinstance(shift, (int, np.integer)):
            raise NotCovered
        return _roll(tracer, x.ravel(), shift, 0).reshape(x.shape)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    shifts = (shift,) * len(axes) if isinstance(shift, (int, np.integer)) else tuple(shift)
    if len(shifts) != len(axes) or not all(isinstance(v, (int, np.integer))
                                           for v in shifts + axes):
        raise NotCovered  # traced shifts: data-dependent slices
    for ax, sh in zip(axes, shifts, strict=True):
        (d,) = normalize_axis(ax, x.ndim)
        n = x.shape[d]
        s = int(sh) % n if n else 0
        if not s:
            continue
        head = [slice(None)] * x.ndim
        tail = [slice(None)] * x.ndim
        head[d], tail[d] = slice(n - s, None), slice(0, n - s)
        x = tracer.op("concatenate", (x[tuple(head)], x[tuple(tail)]), {"axis": d})
    return x


def _tile(tracer: Tracer, A: Any, reps: Any) -> Any:
    """``np.tile`` with constant repeat counts: copies concatenated along each axis (the
    array first given NumPy's leading unit axes when ``reps`` is longer)."""
    reps = tuple(reps) if isinstance(reps, (tuple, list)) else (reps,)
    if not all(isinstance(r, (int, np.integer)) and r >= 0 for r in reps):
        raise NotCovered
    x = tracer.lift(A)
    if len(reps) > x.ndim:
        x = x.reshape((1,) * (len(reps) - x.ndim) + tuple(x.shape))
    reps = (1,) * (x.ndim - len(reps)) + reps
    if all(r == 1 for r in reps):
        return tracer.op("copy", (x,))
    for axis, r in enumerate(reps):
        if r == 0:
            raise NotCovered  # an empty result
        if r > 1:
            x = tracer.op("concatenate", (x,) * int(r), {"axis": axis})
    return x


def _repeat(tracer: Tracer, a: Any, repeats: Any, axis: Any = None) -> Any:
    """``np.repeat`` by one constant count: each element followed by its copies (a
    broadcast along a new axis, flattened into ``axis``)."""
    if not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise NotCovered  # per-element counts: a data-dependent layout
    x = tracer.lift(a)
    if axis is None:
        x, axis = x.ravel(), 0
    (d,) = normalize_axis(axis, x.ndim)
    shape = tuple(x.shape)
    spread = x.reshape((*shape[:d + 1], 1, *shape[d + 1:]))
    spread = mutation.view_op(tracer, spread, "broadcast_to",
                              {"shape": (*shape[:d + 1], int(repeats), *shape[d + 1:])})
    return spread.reshape((*shape[:d], shape[d] * int(repeats), *shape[d + 1:]))


def _pad(tracer: Tracer, array: Any, pad_width: Any, mode: Any = "constant",
         **kwargs: Any) -> Any:
    """``np.pad`` in the modes made of views (:mod:`.padding`): constant (one scalar),
    edge, reflect and symmetric (within one reflection) and wrap; the others, and
    per-axis constants, stay graph breaks."""
    if not isinstance(mode, str) or mode not in padding.MODES:
        raise NotCovered
    value = kwargs.pop("constant_values", 0)
    if kwargs.pop("reflect_type", "even") != "even" or kwargs or \
            not isinstance(value, (int, float, np.integer, np.floating, bool)):
        raise NotCovered
    x = tracer.lift(array)
    try:
        widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (x.ndim, 2))
    except (ValueError, TypeError):
        raise NotCovered from None
    try:
        return padding.pad_axes(x, [tuple(int(v) for v in w) for w in widths], mode, value)
    except ValueError:
        raise NotCovered from None  # beyond one reflection, an empty axis: NumPy's rules


def _stack(tracer: Tracer, arrays: Any, axis: int = 0, out: Any = None, *,
           dtype: Any = None, casting: str = "same_kind") -> Any:
    """``np.stack``: each array given a new axis, then concatenated along it."""
    if out is not None or dtype is not None or not isinstance(arrays, (list, tuple)) \
            or not arrays:
        raise NotCovered
    parts = [tracer.lift(a) for a in arrays]
    if len({tuple(p.shape) for p in parts}) != 1:
        raise NotCovered  # NumPy's error
    (d,) = normalize_axis(axis, parts[0].ndim + 1)
    parts = [mutation.view_op(tracer, p, "expand_dims", {"axis": d}) for p in parts]
    return tracer.op("concatenate", tuple(parts), {"axis": d})


def _at_least(dims: int) -> Callable:
    """``np.atleast_1d`` / ``_2d`` / ``_3d``: views with NumPy's unit axes added."""
    def shaped(x: Any) -> Any:
        shape = tuple(x.shape)
        if x.ndim >= dims:
            return x
        if dims == 1 or x.ndim == 0:
            return x.reshape((1,) * dims)
        if dims == 2 or x.ndim == 2:  # (N,) -> (1, N); for 3-D: (M, N) -> (M, N, 1)
            return x.reshape((1, *shape)) if dims == 2 else x.reshape((*shape, 1))
        return x.reshape((1, *shape, 1))  # 3-D from (N,)

    def handler(tracer: Tracer, *arys: Any) -> Any:
        out = [shaped(tracer.lift(a)) for a in arys]
        return out[0] if len(out) == 1 else tuple(out)

    return handler


def _column_stack(tracer: Tracer, tup: Any) -> Any:
    """``np.column_stack``: 1-D arrays as columns, 2-D ones as they are, side by side."""
    if not isinstance(tup, (list, tuple)) or not tup:
        raise NotCovered
    parts = [tracer.lift(a) for a in tup]
    if any(p.ndim == 0 for p in parts):
        raise NotCovered
    parts = [p.reshape(-1, 1) if p.ndim == 1 else p for p in parts]
    return tracer.op("concatenate", tuple(parts), {"axis": 1})


def _dstack(tracer: Tracer, tup: Any) -> Any:
    """``np.dstack``: the arrays made at least 3-D, concatenated along the third axis."""
    if not isinstance(tup, (list, tuple)) or not tup:
        raise NotCovered
    parts = _at_least(3)(tracer, *tup)
    parts = parts if isinstance(parts, tuple) else (parts,)
    return tracer.op("concatenate", parts, {"axis": 2})


def _splitter(kind: str) -> Callable:
    """``np.split`` (even sections only), ``np.array_split`` (the first ``n % k``
    sections one longer) and ``np.hsplit``/``vsplit``/``dsplit``: a list of slices."""
    def handler(tracer: Tracer, ary: Any, indices_or_sections: Any, axis: int = 0) -> Any:
        x = tracer.lift(ary)
        if kind == "h":
            axis = 1 if x.ndim > 1 else 0
        elif kind in ("v", "d"):
            axis = 0 if kind == "v" else 2
            if x.ndim < (2 if kind == "v" else 3):
                raise NotCovered  # NumPy's error
        (d,) = normalize_axis(axis, x.ndim)
        n = int(x.shape[d])
        if isinstance(indices_or_sections, (int, np.integer)):
            k = int(indices_or_sections)
            if k <= 0 or (kind != "array" and n % k):
                raise NotCovered  # NumPy's error: sections that do not divide it
            size, extra = divmod(n, k)
            bounds = [i * size + min(i, extra) for i in range(k + 1)]
        elif isinstance(indices_or_sections, (list, tuple)) and all(
                isinstance(i, (int, np.integer)) for i in indices_or_sections):
            bounds = [0, *(int(i) for i in indices_or_sections), n]
        else:
            raise NotCovered
        out = []
        for start, stop in itertools.pairwise(bounds):
            index = [slice(None)] * x.ndim
            index[d] = slice(start, stop)
            out.append(x[tuple(index)])
        return out

    return handler


def _broadcast_arrays(tracer: Tracer, *args: Any, subok: bool = False) -> Any:
    """``np.broadcast_arrays``: each operand as a broadcast view of the common shape."""
    parts = [tracer.lift(a) for a in args]
    shape = np.broadcast_shapes(*(tuple(p.shape) for p in parts))
    return tuple(p if tuple(p.shape) == shape else
                 mutation.view_op(tracer, p, "broadcast_to", {"shape": shape}) for p in parts)


def _rollaxis(tracer: Tracer, a: Any, axis: int, start: int = 0) -> Any:
    """``np.rollaxis``: NumPy's moveaxis rule for it."""
    x = tracer.lift(a)
    (d,) = normalize_axis(axis, x.ndim)
    if not -x.ndim <= start <= x.ndim:
        raise NotCovered  # NumPy's AxisError
    start = start + x.ndim if start < 0 else start
    if d < start:
        start -= 1
    if d == start:
        return x
    order = [i for i in range(x.ndim) if i != d]
    order.insert(start, d)
    return x.transpose(tuple(order))



def _axis_pair(x: Traced, axis1: Any, axis2: Any) -> tuple[int, int]:
    """Two distinct axes of ``x``, non-negative (NotCovered: NumPy's own error)."""
    try:
        a1, a2 = operator.index(axis1), operator.index(axis2)
    except TypeError:
        raise NotCovered from None
    if not (-x.ndim <= a1 < x.ndim and -x.ndim <= a2 < x.ndim) or a1 % x.ndim == a2 % x.ndim:
        raise NotCovered
    return a1 % x.ndim, a2 % x.ndim


def _diagonal(tracer: Tracer, a: Any, offset: Any = 0, axis1: Any = 0, axis2: Any = 1) -> Any:
    """``np.diagonal`` (and ``x.diagonal()``): the two axes moved last and flattened into
    one, sliced from the first diagonal element with a step of one more than the second
    axis' length — NumPy's diagonal axis last. NumPy returns a read-only view: so is
    this one where the steps are views (a write through it is refused, a write into
    ``a`` is seen through it); where they copy, it is an opaque read-only view (reading
    it after ``a`` was written is refused, never stale)."""
    x = tracer.lift(a)
    if x.ndim < 2:
        raise NotCovered  # NumPy's ValueError
    try:
        k = operator.index(offset)
    except TypeError:
        raise NotCovered from None
    a1, a2 = _axis_pair(x, axis1, axis2)
    if a1 > a2:  # the same elements in the same order, and a view of more layouts
        a1, a2, k = a2, a1, -k
    n, m = x.shape[a1], x.shape[a2]
    count = max(0, min(n, m - k) if k >= 0 else min(n + k, m))
    start = k if k >= 0 else -k * m
    order = [d for d in range(x.ndim) if d not in (a1, a2)] + [a1, a2]
    moved = x if order == list(range(x.ndim)) else x.transpose(tuple(order))
    flat = moved.reshape((*moved.shape[:-2], n * m))
    step = m + 1
    stop = start + (count - 1) * step + 1 if count else start
    out = flat[..., start:stop:step] if count else flat[..., :0]
    mem = out._memory
    root = x._memory.root if x._memory is not None else x
    if mem is not None and mem.steps is not None and mem.root is root:
        out._memory = mutation.View(mem.root, mem.steps, True)
    else:
        mutation.opaque_view(x, out, readonly=True)
    return out


def _diag(tracer: Tracer, v: Any, k: Any = 0) -> Any:
    """``np.diag``: of a matrix, its diagonal (:func:`_diagonal`); of a vector, NumPy's
    zero matrix with the vector on diagonal ``k`` — a select against the constant mask
    ``np.eye(n, k=k)`` of the vector padded to the columns it lands in."""
    x = tracer.lift(v)
    try:
        k = operator.index(k)
    except TypeError:
        raise NotCovered from None
    if x.ndim == 2:
        return _diagonal(tracer, x, k)
    if x.ndim != 1:
        raise NotCovered  # NumPy's ValueError
    n = x.shape[0] + abs(k)
    pad = tracer.lift(np.zeros(abs(k), dtype=x.dtype))
    row = x if k == 0 else tracer.op("concatenate", (pad, x) if k > 0 else (x, pad),
                                     {"axis": 0})
    mask = tracer.lift(np.eye(n, k=k, dtype=bool))
    return tracer.op("where", (mask, row[None, :], tracer.lift(np.zeros(1, dtype=x.dtype))))


def _trace(tracer: Tracer, a: Any, offset: Any = 0, axis1: Any = 0, axis2: Any = 1,
           dtype: Any = None, out: Any = None) -> Any:
    """``np.trace``: NumPy's sum of the diagonal (:func:`_diagonal`) over its last axis,
    in the sum's dtype."""
    if out is not None:
        raise NotCovered
    return reductions.reduce(tracer, "sum", _diagonal(tracer, a, offset, axis1, axis2),
                             axis=-1, dtype=dtype)



def _rot90(tracer: Tracer, m: Any, k: Any = 1, axes: Any = (0, 1)) -> Any:
    """``np.rot90``: NumPy's flips and transposes (views, as NumPy's result is)."""
    x = tracer.lift(m)
    try:
        a0, a1 = (operator.index(v) for v in axes)
        k = operator.index(k) % 4
    except (TypeError, ValueError):
        raise NotCovered from None
    if a0 == a1 or abs(a0 - a1) == x.ndim or not (-x.ndim <= a0 < x.ndim
                                                 and -x.ndim <= a1 < x.ndim):
        raise NotCovered  # NumPy's ValueError
    if k == 0:
        return x[:]
    if k == 2:
        return _flip(tracer, _flip(tracer, x, a0), a1)
    order = list(range(x.ndim))
    order[a0], order[a1] = order[a1], order[a0]
    if k == 1:
        return _flip(tracer, x, a1).transpose(tuple(order))
    return _flip(tracer, x.transpose(tuple(order)), a1)


def _ediff1d(tracer: Tracer, ary: Any, to_end: Any = None, to_begin: Any = None) -> Any:
    """``np.ediff1d`` without ends: NumPy's ``ary.ravel()[1:] - ary.ravel()[:-1]``."""
    if to_end is not None or to_begin is not None:
        raise NotCovered
    flat = tracer.lift(ary).ravel()
    return flat[1:] - flat[:-1]


#: NumPy function -> handler.
HANDLERS: dict[Callable, Callable] = {
    np.flip: _flip, np.fliplr: lambda tracer, m: _flip(tracer, m, 1),
    np.flipud: lambda tracer, m: _flip(tracer, m, 0),
    np.vstack: _stack_along(0, 2), np.hstack: _stack_along(1, 1), np.stack: _stack,
    np.column_stack: _column_stack, np.dstack: _dstack,
    np.atleast_1d: _at_least(1), np.atleast_2d: _at_least(2), np.atleast_3d: _at_least(3),
    np.split: _splitter("even"), np.array_split: _splitter("array"),
    np.hsplit: _splitter("h"), np.vsplit: _splitter("v"), np.dsplit: _splitter("d"),
    np.outer: _outer, np.tril: _tri_part(True), np.triu: _tri_part(False), np.roll: _roll,
    np.tile: _tile, np.repeat: _repeat, np.pad: _pad,
    np.broadcast_arrays: _broadcast_arrays, np.rollaxis: _rollaxis,
    np.diagonal: _diagonal, np.diag: _diag, np.trace: _trace, np.rot90: _rot90,
    np.ediff1d: _ediff1d,
}
