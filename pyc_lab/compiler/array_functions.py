"""NumPy functions called on traced arrays (``__array_function__``).

Each handler takes the NumPy function's signature (NumPy 2), so arguments bind exactly
as NumPy binds them, and records ops; a form a handler does not cover raises
:class:`_NotCovered` and the call becomes a graph break (run as written). NumPy
functions that write into an argument (``np.copyto``) write through :mod:`.mutation`;
those pyc_lab cannot trace (``np.put``, ``np.place``...) raise a clear error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import einsum, mutation, padding, reductions, scalars, ufuncs
from .errors import CastingError, UnsupportedOperationError
from .ops import normalize_axis
from .values import is_traced

if TYPE_CHECKING:
    from .proxy import Traced
    from .tracer import Tracer

__all__ = ["astype", "clip", "dispatch"]

_NOVALUE: Any = np._NoValue


class _NotCovered(Exception):
    """A handler does not cover this form of the call: trace it as a graph break."""


#: NumPy functions that write into an argument in ways pyc_lab does not trace.
_WRITES = {np.put: "x[indices] = values", np.place: "x = np.where(mask, values, x)",
           np.putmask: "x = np.where(mask, values, x)",
           np.fill_diagonal: "a new array built with np.where",
           np.put_along_axis: "a new array (np.where / item assignment)"}


def dispatch(tracer: Tracer, func: Callable, args: tuple, kwargs: dict) -> Any:
    """What ``Traced.__array_function__`` returns for ``func(*args, **kwargs)``."""
    if func in _WRITES:
        raise UnsupportedOperationError(
            f"np.{func.__name__} writes into its argument in a way pyc_lab does not trace; "
            f"write {_WRITES[func]} instead")
    handler = _HANDLERS.get(func)
    if handler is not None:
        try:
            return handler(tracer, *args, **kwargs)
        except _NotCovered:
            pass
    name = getattr(func, "__name__", repr(func))
    return tracer.eager(func, args, kwargs, f"np.{name} has no op in pyc_lab's registry")


# -- reductions -------------------------------------------------------------------------------
def _sum(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
         keepdims: Any = _NOVALUE, initial: Any = _NOVALUE, where: Any = _NOVALUE) -> Any:
    return reductions.reduce(tracer, "sum", a, axis=axis, dtype=dtype, out=out,
                             keepdims=keepdims, initial=initial, where=where)


def _prod(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
          keepdims: Any = _NOVALUE, initial: Any = _NOVALUE, where: Any = _NOVALUE) -> Any:
    return reductions.reduce(tracer, "prod", a, axis=axis, dtype=dtype, out=out,
                             keepdims=keepdims, initial=initial, where=where)


def _mean(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
          keepdims: Any = _NOVALUE, *, where: Any = _NOVALUE) -> Any:
    return reductions.reduce(tracer, "mean", a, axis=axis, dtype=dtype, out=out,
                             keepdims=keepdims, where=where)


def _extreme(op: str) -> Callable:
    def handler(tracer: Tracer, a: Any, axis: Any = None, out: Any = None,
                keepdims: Any = _NOVALUE, initial: Any = _NOVALUE,
                where: Any = _NOVALUE) -> Any:
        return reductions.reduce(tracer, op, a, axis=axis, out=out, keepdims=keepdims,
                                 initial=initial, where=where)

    return handler


def _spread(op: str) -> Callable:
    def handler(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
                ddof: Any = 0, keepdims: Any = _NOVALUE, *, where: Any = _NOVALUE,
                mean: Any = _NOVALUE, correction: Any = _NOVALUE) -> Any:
        if correction is not _NOVALUE:
            if ddof != 0:
                raise ValueError("ddof and correction can't be provided simultaneously.")
            ddof = correction
        return reductions.reduce(tracer, op, a, axis=axis, dtype=dtype, out=out, ddof=ddof,
                                 keepdims=keepdims, where=where, mean=mean)

    return handler


def _arg(op: str) -> Callable:
    def handler(tracer: Tracer, a: Any, axis: Any = None, out: Any = None, *,
                keepdims: Any = _NOVALUE) -> Any:
        return reductions.reduce(tracer, op, a, axis=axis, out=out, keepdims=keepdims)

    return handler


def _logical(op: str) -> Callable:
    def handler(tracer: Tracer, a: Any, axis: Any = None, out: Any = None,
                keepdims: Any = _NOVALUE, *, where: Any = _NOVALUE) -> Any:
        return reductions.reduce(tracer, op, a, axis=axis, out=out, keepdims=keepdims,
                                 where=where)

    return handler


# -- elementwise and shape functions -----------------------------------------------------------
def _where(tracer: Tracer, condition: Any, x: Any = None, y: Any = None) -> Traced:
    if x is None or y is None:
        raise _NotCovered  # np.where(cond): the indices, a data-dependent shape

    def dtype_of(v: Any) -> Any:
        return v.dtype if is_traced(v) else np.asarray(v).dtype

    if scalars.is_python_scalar(x) and not scalars.is_python_scalar(y):
        x = scalars.where_constant(x, dtype_of(y))
    elif scalars.is_python_scalar(y) and not scalars.is_python_scalar(x):
        y = scalars.where_constant(y, dtype_of(x))
    elif scalars.is_python_scalar(x) and scalars.is_python_scalar(y):
        x, y = scalars.where_constant(x, y), scalars.where_constant(y, x)
    return tracer.op("where", (condition, x, y))


def clip(tracer: Tracer, a: Any, a_min: Any = _NOVALUE, a_max: Any = _NOVALUE,
         out: Any = None, *, min: Any = _NOVALUE, max: Any = _NOVALUE, **kwargs: Any) -> Any:
    """``np.clip`` / ``x.clip``: NumPy 2's argument rules (``min=``/``max=`` keywords
    included) and its handling of integer bounds outside the array's dtype."""
    if a_min is _NOVALUE and a_max is _NOVALUE:
        a_min = None if min is _NOVALUE else min
        a_max = None if max is _NOVALUE else max
    elif min is not _NOVALUE or max is not _NOVALUE:
        raise ValueError("Passing `min` or `max` keyword argument when `a_min` and `a_max` "
                         "are provided is forbidden.")
    else:
        a_min = None if a_min is _NOVALUE else a_min
        a_max = None if a_max is _NOVALUE else a_max
    if kwargs:
        raise _NotCovered
    x = tracer.lift(a)
    if x.dtype.kind in "iu":  # NumPy drops Python-int bounds beyond the dtype's range
        info = np.iinfo(x.dtype)
        if type(a_min) is int and a_min <= info.min:
            a_min = None
        if type(a_max) is int and a_max >= info.max:
            a_max = None
    out = out if out is None or not isinstance(out, tuple) else (out[0] if out else None)
    targets = None if out is None else (out,)
    if a_min is None and a_max is None:
        return ufuncs.apply(tracer, "positive", (x,), out=targets)
    if a_min is None:
        return ufuncs.apply(tracer, "minimum", (x, a_max), out=targets)
    if a_max is None:
        return ufuncs.apply(tracer, "maximum", (x, a_min), out=targets)
    return ufuncs.apply(tracer, "clip", (x, a_min, a_max), out=targets)


def _round(tracer: Tracer, a: Any, decimals: Any = 0, out: Any = None) -> Any:
    """``np.round`` / ``x.round``: NumPy's own steps — ``rint(x * 10**d) / 10**d`` (for a
    negative ``d``: ``rint(x / 10**-d) * 10**-d``) in ``x``'s dtype, ``rint`` alone for
    ``d == 0``; an integer array with ``d >= 0`` is copied."""
    x = tracer.lift(a)
    if out is not None or not isinstance(decimals, (int, np.integer)) or x.dtype.kind == "b":
        raise _NotCovered
    d = int(decimals)
    if x.dtype.kind in "iu":
        if d < 0:
            raise _NotCovered  # NumPy rounds integers to tens through float division
        return tracer.op("copy", (x,))
    if d == 0:  # x * 1.0 and y / 1.0 are exact: rint alone gives the same bits
        return ufuncs.apply(tracer, "rint", (x,))
    first, second = ("multiply", "divide") if d > 0 else ("divide", "multiply")
    scale = 10.0 ** abs(d)
    y = ufuncs.apply(tracer, "rint", (ufuncs.apply(tracer, first, (x, scale)),))
    return ufuncs.apply(tracer, second, (y, scale))


def _norm(tracer: Tracer, x: Any, ord: Any = None, axis: Any = None,
          keepdims: bool = False) -> Any:
    """``np.linalg.norm`` for the vector norms NumPy computes by reductions: the 2-norm
    (over one axis, or over everything without ``ord``, as NumPy's ``sqrt(x . x)``), the
    1-norm and the max/min-abs norms over one axis; an integer array is converted to
    float64 first, as NumPy does."""
    v = tracer.lift(x)
    if not np.issubdtype(v.dtype, np.inexact):
        if v.dtype.kind not in "iub":
            raise _NotCovered  # bfloat16 (not np.inexact to NumPy) and the like
        v = tracer.op("astype", (v,), {"dtype": np.dtype(np.float64)})
    if axis is None:
        if ord is not None and not (ord in ("f", "fro") and v.ndim == 2) \
                and not (ord == 2 and v.ndim == 1):
            raise _NotCovered
        total = reductions.reduce(tracer, "sum", v * v, axis=None, keepdims=keepdims)
        return ufuncs.apply(tracer, "sqrt", (total,))
    if isinstance(axis, tuple):
        if len(axis) != 1:
            raise _NotCovered  # matrix norms
        axis = axis[0]
    if not isinstance(axis, (int, np.integer)):
        raise _NotCovered
    if ord is None or ord == 2:
        total = reductions.reduce(tracer, "sum", v * v, axis=axis, keepdims=keepdims)
        return ufuncs.apply(tracer, "sqrt", (total,))
    magnitude = ufuncs.apply(tracer, "absolute", (v,))
    if ord == 1:
        return reductions.reduce(tracer, "sum", magnitude, axis=axis, keepdims=keepdims)
    if ord in (np.inf, -np.inf):
        return reductions.reduce(tracer, "max" if ord > 0 else "min", magnitude, axis=axis,
                                 keepdims=keepdims)
    raise _NotCovered


def _nan_to_num(tracer: Tracer, x: Any, copy: bool = True, nan: Any = 0.0,
                posinf: Any = None, neginf: Any = None) -> Any:
    """``np.nan_to_num`` of a real array: NaN, +inf and -inf replaced (by default with 0
    and the dtype's largest and lowest values); other dtypes copied, as NumPy does
    (bfloat16 included: it is not ``np.inexact`` to NumPy)."""
    v = tracer.lift(x)
    if not copy:
        raise _NotCovered  # in place
    if not np.issubdtype(v.dtype, np.floating):
        if np.issubdtype(v.dtype, np.complexfloating):
            raise _NotCovered
        return tracer.op("copy", (v,))
    info = np.finfo(v.dtype)
    big = float(info.max) if posinf is None else posinf
    low = float(info.min) if neginf is None else neginf
    out = _where(tracer, ufuncs.apply(tracer, "equal", (v, -np.inf)), low, v)
    out = _where(tracer, ufuncs.apply(tracer, "equal", (v, np.inf)), big, out)
    return _where(tracer, ufuncs.apply(tracer, "isnan", (v,)), nan, out)


def astype(tracer: Tracer, x: Any, dtype: Any, *, casting: str = "unsafe",
           copy: bool = True) -> Traced:
    """``x.astype(dtype)``: a new array (``copy=False`` and the same dtype: ``x``
    itself, as in NumPy)."""
    x = tracer.lift(x)
    dtype = np.dtype(dtype)
    if not np.can_cast(x.dtype, dtype, casting=casting):
        raise CastingError(f"Cannot cast array data from {x.dtype!r} to {dtype!r} according "
                           f"to the rule {casting!r}")
    if dtype == x.dtype and not copy:
        return x
    out = tracer.op("astype", (x,), {"dtype": dtype})
    out._scalar = x._scalar  # a scalar's astype is a scalar
    return out


def _np_astype(tracer: Tracer, x: Any, dtype: Any, /, *, copy: bool = True,
               device: Any = None) -> Traced:
    return astype(tracer, x, dtype, copy=copy)


def _copy(tracer: Tracer, a: Any, order: str = "K", subok: bool = False) -> Traced:
    return tracer.op("copy", (tracer.lift(a),))


def _copyto(tracer: Tracer, dst: Any, src: Any, casting: str = "same_kind",
            where: Any = True) -> None:
    mask = None if where is True else tracer.lift(where)
    mutation.write(tracer, dst, None, src, casting=casting, what="np.copyto(dst, src)",
                   mask=mask)


def _reshape(tracer: Tracer, a: Any, /, shape: Any = None, order: str = "C", *,
             newshape: Any = None, copy: Any = None) -> Traced:
    if shape is None:
        shape = newshape
    if shape is None or order != "C":
        raise _NotCovered
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return tracer.lift(a).reshape(shape, copy=copy)


def _ravel(tracer: Tracer, a: Any, order: str = "C") -> Traced:
    return tracer.lift(a).ravel(order)


def _transpose(tracer: Tracer, a: Any, axes: Any = None) -> Traced:
    return tracer.lift(a).transpose(*(() if axes is None else (tuple(axes),)))


def _swapaxes(tracer: Tracer, a: Any, axis1: int, axis2: int) -> Traced:
    return tracer.lift(a).swapaxes(axis1, axis2)


def _concatenate(tracer: Tracer, arrays: Any, /, axis: Any = 0, out: Any = None, *,
                 dtype: Any = None, casting: str = "same_kind") -> Traced:
    if out is not None or dtype is not None or axis is None:
        raise _NotCovered
    return tracer.op("concatenate", tuple(arrays), {"axis": int(axis)})


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
            raise _NotCovered  # an array as the sequence, or a dtype to cast to
        arrays = [tracer.lift(a) for a in tup]
        if least == 2:
            arrays = [a.reshape(1, -1) if a.ndim == 1 else a for a in arrays]
            if any(a.ndim == 0 for a in arrays):
                raise _NotCovered
            return tracer.op("concatenate", tuple(arrays), {"axis": 0})
        one_d = all(a.ndim == 1 for a in arrays)
        if any(a.ndim == 0 for a in arrays):
            raise _NotCovered
        return tracer.op("concatenate", tuple(arrays), {"axis": 0 if one_d else axis})

    return handler


def _einsum(tracer: Tracer, *operands: Any, out: Any = None, dtype: Any = None,
            order: str = "K", casting: str = "safe", optimize: Any = False) -> Any:
    """``np.einsum`` on arrays (:mod:`.einsum`): sums, transposes and batched matmuls;
    other forms (diagonals, broadcasting without ``...``, ``out``/``dtype``) stay graph
    breaks."""
    if out is not None or dtype is not None or len(operands) < 2 \
            or not isinstance(operands[0], str):
        raise _NotCovered
    arrays = [tracer.lift(a) for a in operands[1:]]
    try:
        terms, output = einsum.parse(operands[0], [a.ndim for a in arrays])
    except einsum.NotPlanned:
        raise _NotCovered from None
    sizes: dict[str, int] = {}
    for term, a in zip(terms, arrays, strict=True):
        for c, n in zip(term, a.shape, strict=True):
            if sizes.setdefault(c, int(n)) != int(n):
                raise _NotCovered  # size-1 broadcasting of a label: NumPy's rules
    if any(c not in sizes for c in output):
        raise ValueError(f"einsum: output label {output!r} not among the operands'")

    def size(labels: str) -> int:
        return int(np.prod([sizes[c] for c in labels], dtype=np.int64))

    current, labels = None, ""
    for i, (term, a) in enumerate(zip(terms, arrays, strict=True)):
        others = output + "".join(t for j, t in enumerate(terms) if j != i)
        drop = tuple(p for p, c in enumerate(term) if c not in others)
        if drop:  # a label of this operand alone: summed out, in its own dtype
            a = reductions.reduce(tracer, "sum", a, axis=drop, dtype=a.dtype)
            term = "".join(c for c in term if c in others)
        if current is None:
            current, labels = a, term
            continue
        keep = output + "".join(terms[i + 1:])
        try:
            c = einsum.plan_pair(labels, term, keep)
        except einsum.NotPlanned:
            raise _NotCovered from None
        lhs, rhs = current.transpose(c.a_order), a.transpose(c.b_order)
        nb, nm, nk, nn = len(c.batch), len(c.m), len(c.k), len(c.n)
        if not c.k or not (c.m or c.n):
            # no contraction (an outer or elementwise product), or a dot per batch entry:
            # broadcast products (and a sum over k) that fuse, not a GEMM of 1x1 tiles
            lhs = lhs.reshape(lhs.shape[:nb + nm] + (1,) * nn + lhs.shape[nb + nm:])
            rhs = rhs.reshape(rhs.shape[:nb] + (1,) * nm + rhs.shape[nb + nk:]
                              + rhs.shape[nb:nb + nk])
            current = lhs * rhs
            if c.k:
                current = reductions.reduce(
                    tracer, "sum", current, axis=tuple(range(nb + nm + nn, current.ndim)),
                    dtype=current.dtype)
        else:
            lhs = lhs.reshape((size(c.batch), size(c.m), size(c.k)) if c.batch
                              else (size(c.m), size(c.k)))
            rhs = rhs.reshape((size(c.batch), size(c.k), size(c.n)) if c.batch
                              else (size(c.k), size(c.n)))
            product = ufuncs.matmul(tracer, lhs, rhs)
            current = product.reshape(tuple(sizes[x] for x in c.out_labels))
        labels = c.out_labels
    if sorted(labels) != sorted(output):
        raise _NotCovered
    if labels != output:
        current = current.transpose(tuple(labels.index(x) for x in output))
    return current


def _outer(tracer: Tracer, a: Any, b: Any, out: Any = None) -> Any:
    """``np.outer``: NumPy's ``a.ravel()[:, None] * b.ravel()[None, :]``."""
    if out is not None:
        raise _NotCovered
    return tracer.lift(a).ravel()[:, None] * tracer.lift(b).ravel()[None, :]


def _tri_part(lower: bool) -> Callable:
    """``np.tril`` / ``np.triu``: NumPy's ``where(mask, m, 0)`` with its constant mask."""
    def handler(tracer: Tracer, m: Any, k: int = 0) -> Any:
        x = tracer.lift(m)
        if x.ndim < 2 or not isinstance(k, (int, np.integer)):
            raise _NotCovered
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
            raise _NotCovered
        return _roll(tracer, x.ravel(), shift, 0).reshape(x.shape)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    shifts = (shift,) * len(axes) if isinstance(shift, (int, np.integer)) else tuple(shift)
    if len(shifts) != len(axes) or not all(isinstance(v, (int, np.integer))
                                           for v in shifts + axes):
        raise _NotCovered  # traced shifts: data-dependent slices
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
        raise _NotCovered
    x = tracer.lift(A)
    if len(reps) > x.ndim:
        x = x.reshape((1,) * (len(reps) - x.ndim) + tuple(x.shape))
    reps = (1,) * (x.ndim - len(reps)) + reps
    if all(r == 1 for r in reps):
        return tracer.op("copy", (x,))
    for axis, r in enumerate(reps):
        if r == 0:
            raise _NotCovered  # an empty result
        if r > 1:
            x = tracer.op("concatenate", (x,) * int(r), {"axis": axis})
    return x


def _repeat(tracer: Tracer, a: Any, repeats: Any, axis: Any = None) -> Any:
    """``np.repeat`` by one constant count: each element followed by its copies (a
    broadcast along a new axis, flattened into ``axis``)."""
    if not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise _NotCovered  # per-element counts: a data-dependent layout
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
        raise _NotCovered
    value = kwargs.pop("constant_values", 0)
    if kwargs.pop("reflect_type", "even") != "even" or kwargs or \
            not isinstance(value, (int, float, np.integer, np.floating, bool)):
        raise _NotCovered
    x = tracer.lift(array)
    try:
        widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (x.ndim, 2))
    except (ValueError, TypeError):
        raise _NotCovered from None
    try:
        return padding.pad_axes(x, [tuple(int(v) for v in w) for w in widths], mode, value)
    except ValueError:
        raise _NotCovered from None  # beyond one reflection, an empty axis: NumPy's rules


def _diff(tracer: Tracer, a: Any, n: int = 1, axis: int = -1, prepend: Any = _NOVALUE,
          append: Any = _NOVALUE) -> Any:
    """``np.diff``: ``x[1:] - x[:-1]`` along ``axis``, ``n`` times (booleans: ``!=``), the
    ``prepend``/``append`` values concatenated first as NumPy does."""
    x = tracer.lift(a)
    if not isinstance(n, (int, np.integer)) or n < 0 or x.ndim == 0:
        raise _NotCovered
    (d,) = normalize_axis(axis, x.ndim)
    ends = []
    for value in (prepend, append):
        if value is _NOVALUE:
            ends.append(None)
            continue
        v = tracer.lift(value)
        if v.ndim == 0:
            shape = list(x.shape)
            shape[d] = 1
            v = mutation.view_op(tracer, v, "broadcast_to", {"shape": tuple(shape)})
        ends.append(v)
    if ends[0] is not None or ends[1] is not None:
        parts = [v for v in (ends[0], x, ends[1]) if v is not None]
        x = tracer.op("concatenate", tuple(parts), {"axis": d})
    for _ in range(int(n)):
        head = [slice(None)] * x.ndim
        tail = [slice(None)] * x.ndim
        head[d], tail[d] = slice(1, None), slice(None, -1)
        later, earlier = x[tuple(head)], x[tuple(tail)]
        x = ufuncs.apply(tracer, "not_equal" if x.dtype == np.bool_ else "subtract",
                         (later, earlier))
    return x


def _gradient(tracer: Tracer, f: Any, *varargs: Any, axis: Any = None,
              edge_order: int = 1) -> Any:
    """``np.gradient`` with uniform (scalar) spacings: NumPy's own arithmetic — central
    differences inside, one-sided ones (first or second order) at the ends — on slices
    concatenated along each axis, in NumPy's result dtype (integers as float64)."""
    x = tracer.lift(f)
    if x.dtype == np.bool_ or not (np.issubdtype(x.dtype, np.inexact)
                                   or np.issubdtype(x.dtype, np.integer)) \
            or edge_order not in (1, 2) or x.ndim == 0:
        raise _NotCovered
    axes = tuple(range(x.ndim)) if axis is None else normalize_axis(axis, x.ndim)
    if not all(np.ndim(v) == 0 and not is_traced(v) for v in varargs):
        raise _NotCovered  # coordinate arrays: non-uniform spacing
    if not varargs:
        dx = [1.0] * len(axes)
    elif len(varargs) == 1:
        dx = list(varargs) * len(axes)
    elif len(varargs) == len(axes):
        dx = list(varargs)
    else:
        raise _NotCovered  # NumPy's TypeError
    otype = x.dtype if np.issubdtype(x.dtype, np.inexact) else np.dtype(np.float64)
    if np.issubdtype(x.dtype, np.integer):
        x = tracer.op("astype", (x,), {"dtype": np.dtype(np.float64)})

    def apply(name: str, *operands: Any) -> Any:
        return ufuncs.apply(tracer, name, operands)

    outs = []
    for d, h in zip(axes, dx, strict=True):
        if x.shape[d] < edge_order + 1:
            raise _NotCovered  # NumPy's "too small" error

        def at(start: int | None, stop: int | None, d: int = d) -> Any:
            index = [slice(None)] * x.ndim
            index[d] = slice(start, stop)
            return x[tuple(index)]

        inner = apply("divide", apply("subtract", at(2, None), at(None, -2)), 2. * h)
        if edge_order == 1:
            first = apply("divide", apply("subtract", at(1, 2), at(0, 1)), h)
            last = apply("divide", apply("subtract", at(-1, None), at(-2, -1)), h)
        else:
            a, b, c = -1.5 / h, 2. / h, -0.5 / h
            first = apply("add", apply("add", apply("multiply", a, at(0, 1)),
                                       apply("multiply", b, at(1, 2))),
                          apply("multiply", c, at(2, 3)))
            a, b, c = 0.5 / h, -2. / h, 1.5 / h
            last = apply("add", apply("add", apply("multiply", a, at(-3, -2)),
                                      apply("multiply", b, at(-2, -1))),
                         apply("multiply", c, at(-1, None)))
        parts = [p if p.dtype == otype else tracer.op("astype", (p,), {"dtype": otype})
                 for p in (first, inner, last)]
        outs.append(tracer.op("concatenate", tuple(parts), {"axis": d}))
    return outs[0] if len(outs) == 1 else tuple(outs)


def _expand_dims(tracer: Tracer, a: Any, axis: Any) -> Traced:
    return mutation.view_op(tracer, a, "expand_dims", {"axis": axis})


def _squeeze(tracer: Tracer, a: Any, axis: Any = None) -> Traced:
    return tracer.lift(a).squeeze(axis)


def _broadcast_to(tracer: Tracer, array: Any, shape: Any, subok: bool = False) -> Traced:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return mutation.view_op(tracer, array, "broadcast_to", {"shape": shape})


def _dot(tracer: Tracer, a: Any, b: Any, out: Any = None) -> Any:
    a, b = tracer.lift(a), tracer.lift(b)
    if a.ndim > 2 or b.ndim > 2 or a.ndim == 0 or b.ndim == 0:
        raise _NotCovered
    return ufuncs.matmul(tracer, a, b, out=out)


def _moveaxis(tracer: Tracer, a: Any, source: Any, destination: Any) -> Traced:
    x = tracer.lift(a)
    src = normalize_axis(source, x.ndim) if isinstance(source, (int, np.integer)) else \
        tuple(normalize_axis(s, x.ndim)[0] for s in source)
    dst = normalize_axis(destination, x.ndim) if isinstance(destination, (int, np.integer)) \
        else tuple(normalize_axis(d, x.ndim)[0] for d in destination)
    if len(src) != len(dst):
        raise ValueError("`source` and `destination` arguments must have the same number "
                         "of elements")
    order = [n for n in range(x.ndim) if n not in src]
    for d, s in sorted(zip(dst, src, strict=True)):
        order.insert(d, s)
    return x.transpose(tuple(order))


_HANDLERS: dict[Callable, Callable] = {
    np.sum: _sum, np.prod: _prod, np.mean: _mean,
    np.max: _extreme("max"), np.amax: _extreme("max"),
    np.min: _extreme("min"), np.amin: _extreme("min"),
    np.var: _spread("var"), np.std: _spread("std"),
    np.argmax: _arg("argmax"), np.argmin: _arg("argmin"),
    np.any: _logical("any"), np.all: _logical("all"),
    np.where: _where, np.clip: clip, np.copy: _copy, np.copyto: _copyto,
    np.reshape: _reshape, np.ravel: _ravel, np.transpose: _transpose,
    np.swapaxes: _swapaxes, np.moveaxis: _moveaxis, np.concatenate: _concatenate,
    np.expand_dims: _expand_dims, np.squeeze: _squeeze, np.broadcast_to: _broadcast_to,
    np.dot: _dot, np.round: _round, np.linalg.norm: _norm, np.nan_to_num: _nan_to_num,
    np.flip: _flip, np.fliplr: lambda tracer, m: _flip(tracer, m, 1),
    np.flipud: lambda tracer, m: _flip(tracer, m, 0),
    np.vstack: _stack_along(0, 2), np.hstack: _stack_along(1, 1),
    np.einsum: _einsum, np.outer: _outer, np.tril: _tri_part(True),
    np.triu: _tri_part(False), np.roll: _roll, np.tile: _tile, np.repeat: _repeat,
    np.pad: _pad, np.diff: _diff, np.gradient: _gradient,
}
if hasattr(np, "around"):
    _HANDLERS[np.around] = _round
if hasattr(np, "astype"):
    _HANDLERS[np.astype] = _np_astype
