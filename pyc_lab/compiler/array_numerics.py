"""NumPy's numeric functions on traced arrays, as the ops they are made of
(``__array_function__`` handlers, dispatched by :mod:`.array_functions`).

``np.round`` (NumPy's own steps), ``np.linalg.norm`` (vector norms as reductions),
``np.nan_to_num`` and the NaN-skipping reductions and scans (selects, then reductions or
scans; ``np.nanvar`` and ``np.nanstd`` by NumPy's own steps),
``np.einsum``/``np.tensordot``/``np.inner`` (:mod:`.einsum`: transposes, sums and batched
matmuls), ``np.diff``, ``np.gradient`` and ``np.trapezoid`` (arithmetic on slices),
``np.ptp``,
``np.count_nonzero`` and ``np.isclose``. A form a handler does not cover raises
:class:`~.function_parts.NotCovered` and runs as written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import einsum, mutation, reductions, scans, ufuncs
from .function_parts import NOVALUE, NotCovered, select
from .ops import normalize_axis
from .values import is_traced

if TYPE_CHECKING:
    from .tracer import Tracer

__all__ = ["HANDLERS"]


def _round(tracer: Tracer, a: Any, decimals: Any = 0, out: Any = None) -> Any:
    """``np.round`` / ``x.round``: NumPy's own steps — ``rint(x * 10**d) / 10**d`` (for a
    negative ``d``: ``rint(x / 10**-d) * 10**-d``) in ``x``'s dtype, ``rint`` alone for
    ``d == 0``; an integer array with ``d >= 0`` is copied. Each step is stored in ``x``'s
    dtype, as NumPy's ``out=`` array holds it: a bfloat16 ``x`` times a Python float is
    float32 to ml_dtypes, and NumPy rounds it back to bfloat16 before ``rint``."""
    x = tracer.lift(a)
    if out is not None or not isinstance(decimals, (int, np.integer)) or x.dtype.kind == "b":
        raise NotCovered
    d = int(decimals)
    if x.dtype.kind in "iu":
        if d < 0:
            raise NotCovered  # NumPy rounds integers to tens through float division
        return tracer.op("copy", (x,))
    if d == 0:  # x * 1.0 and y / 1.0 are exact: rint alone gives the same bits
        return ufuncs.apply(tracer, "rint", (x,))
    first, second = ("multiply", "divide") if d > 0 else ("divide", "multiply")
    scale = 10.0 ** abs(d)

    def stored(v: Any) -> Any:
        return v if v.dtype == x.dtype else tracer.op("astype", (v,), {"dtype": x.dtype})

    y = ufuncs.apply(tracer, "rint", (stored(ufuncs.apply(tracer, first, (x, scale))),))
    return stored(ufuncs.apply(tracer, second, (y, scale)))


def _norm(tracer: Tracer, x: Any, ord: Any = None, axis: Any = None,
          keepdims: bool = False) -> Any:
    """``np.linalg.norm`` for the norms NumPy computes by reductions, by NumPy's steps:
    the 2-norm (over axes, or over everything without ``ord``, as NumPy's
    ``sqrt(x . x)``), the 1-norm, the max/min-abs norms and the count of nonzeros over
    one axis, and the Frobenius, 1, -1, inf and -inf matrix norms over two axes (or a
    2-d array's ``axis=None``); an integer or bfloat16 array is converted to float64
    first, as NumPy does. Complex arrays (NumPy's ``(x.conj() * x).real``) and the SVD
    norms run as written."""
    v = tracer.lift(x)
    if not np.issubdtype(v.dtype, np.inexact):
        if v.dtype.kind not in "iub" and v.dtype.name != "bfloat16":
            raise NotCovered
        # bfloat16 too: not np.inexact to NumPy, which converts it to float64 first
        v = tracer.op("astype", (v,), {"dtype": np.dtype(np.float64)})
    if v.dtype.kind == "c":
        raise NotCovered
    if axis is None and (ord is None or (ord in ("f", "fro") and v.ndim == 2)
                         or (ord == 2 and v.ndim == 1)):
        total = reductions.reduce(tracer, "sum", v * v, axis=None, keepdims=keepdims)
        return ufuncs.apply(tracer, "sqrt", (total,))
    if axis is None:
        axis = tuple(range(v.ndim))
    elif not isinstance(axis, tuple):
        if not isinstance(axis, (int, np.integer)):
            raise NotCovered
        axis = (int(axis),)
    if len(axis) == 2:
        return _matrix_norm(tracer, v, ord, axis, keepdims)
    if len(axis) != 1:
        raise NotCovered  # NumPy's ValueError
    axis = axis[0]
    if ord is None or ord == 2:
        total = reductions.reduce(tracer, "sum", v * v, axis=axis, keepdims=keepdims)
        return ufuncs.apply(tracer, "sqrt", (total,))
    if ord == 0:
        nonzero = tracer.op("astype", (ufuncs.apply(tracer, "not_equal", (v, 0)),),
                            {"dtype": v.dtype})
        return reductions.reduce(tracer, "sum", nonzero, axis=axis, keepdims=keepdims)
    magnitude = ufuncs.apply(tracer, "absolute", (v,))
    if ord == 1:
        return reductions.reduce(tracer, "sum", magnitude, axis=axis, keepdims=keepdims)
    if ord in (np.inf, -np.inf):
        return reductions.reduce(tracer, "max" if ord > 0 else "min", magnitude, axis=axis,
                                 keepdims=keepdims)
    raise NotCovered


def _matrix_norm(tracer: Tracer, v: Any, ord: Any, axis: tuple, keepdims: bool) -> Any:
    """The matrix norms of :func:`_norm` over axes ``(row, col)``, NumPy's steps: the
    Frobenius norm ``sqrt(sum(x * x))`` over both, the 1/-1 norms the max/min over
    ``col`` of the column sums of ``|x|``, the inf/-inf norms the max/min over ``row``
    of the row sums."""
    try:
        row, col = (normalize_axis(k, v.ndim)[0] for k in axis)
    except Exception:
        raise NotCovered from None  # NumPy's AxisError
    if row == col:
        raise NotCovered  # NumPy's ValueError
    if ord is None or ord in ("fro", "f"):
        result = ufuncs.apply(tracer, "sqrt", (reductions.reduce(
            tracer, "sum", v * v, axis=(row, col)),))
    elif ord in (1, -1, np.inf, -np.inf):
        first, second = (row, col) if ord in (1, -1) else (col, row)
        if second > first:
            second -= 1
        sums = reductions.reduce(tracer, "sum", ufuncs.apply(tracer, "absolute", (v,)),
                                 axis=first)
        result = reductions.reduce(tracer, "max" if ord > 0 else "min", sums, axis=second)
    else:
        raise NotCovered  # the SVD norms (2, -2, 'nuc') and NumPy's errors
    if keepdims:
        shape = [1 if k in (row, col) else d for k, d in enumerate(v.shape)]
        result = tracer.op("reshape", (result,), {"shape": tuple(shape)})
    result._scalar = result.ndim == 0
    return result


def _nan_to_num(tracer: Tracer, x: Any, copy: bool = True, nan: Any = 0.0,
                posinf: Any = None, neginf: Any = None) -> Any:
    """``np.nan_to_num`` of a real array: NaN, +inf and -inf replaced (by default with 0
    and the dtype's largest and lowest values); other dtypes copied, as NumPy does
    (bfloat16 included: it is not ``np.inexact`` to NumPy)."""
    v = tracer.lift(x)
    if not copy:
        raise NotCovered  # in place
    if not np.issubdtype(v.dtype, np.floating):
        if np.issubdtype(v.dtype, np.complexfloating):
            raise NotCovered
        out = tracer.op("copy", (v,))
    else:
        info = np.finfo(v.dtype)
        big = float(info.max) if posinf is None else posinf
        low = float(info.min) if neginf is None else neginf
        out = select(tracer, ufuncs.apply(tracer, "equal", (v, -np.inf)), low, v)
        out = select(tracer, ufuncs.apply(tracer, "equal", (v, np.inf)), big, out)
        out = select(tracer, ufuncs.apply(tracer, "isnan", (v,)), nan, out)
    out._scalar = out.ndim == 0  # NumPy returns x[()] for a 0-d x: a scalar
    return out


def _einsum(tracer: Tracer, *operands: Any, out: Any = None, dtype: Any = None,
            order: str = "K", casting: str = "safe", optimize: Any = False) -> Any:
    """``np.einsum`` on arrays (:mod:`.einsum`): sums, transposes and batched matmuls;
    other forms (diagonals, broadcasting without ``...``, ``out``/``dtype``) stay graph
    breaks."""
    if out is not None or dtype is not None or len(operands) < 2 \
            or not isinstance(operands[0], str):
        raise NotCovered
    arrays = [tracer.lift(a) for a in operands[1:]]
    try:
        terms, output = einsum.parse(operands[0], [a.ndim for a in arrays])
    except einsum.NotPlanned:
        raise NotCovered from None
    sizes: dict[str, int] = {}
    for term, a in zip(terms, arrays, strict=True):
        for c, n in zip(term, a.shape, strict=True):
            if sizes.setdefault(c, int(n)) != int(n):
                raise NotCovered  # size-1 broadcasting of a label: NumPy's rules
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
            raise NotCovered from None
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
        raise NotCovered
    if labels != output:
        current = current.transpose(tuple(labels.index(x) for x in output))
    return current


def _diff(tracer: Tracer, a: Any, n: int = 1, axis: int = -1, prepend: Any = NOVALUE,
          append: Any = NOVALUE) -> Any:
    """``np.diff``: ``x[1:] - x[:-1]`` along ``axis``, ``n`` times (booleans: ``!=``), the
    ``prepend``/``append`` values concatenated first as NumPy does."""
    x = tracer.lift(a)
    if not isinstance(n, (int, np.integer)) or n < 0 or x.ndim == 0:
        raise NotCovered
    (d,) = normalize_axis(axis, x.ndim)
    ends = []
    for value in (prepend, append):
        if value is NOVALUE:
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


def _trapezoid(tracer: Tracer, y: Any, x: Any = None, dx: Any = 1.0, axis: int = -1) -> Any:
    """``np.trapezoid``: NumPy's own steps, ``(d * (y[1:] + y[:-1]) / 2.0).sum(axis)``,
    with ``d`` the spacing ``dx`` or ``np.diff`` of the sample points ``x`` (a 1-d ``x``
    shaped to lie along ``axis``)."""
    v = tracer.lift(y)
    if v.ndim == 0 or not isinstance(axis, (int, np.integer)) or is_traced(dx):
        raise NotCovered
    (k,) = normalize_axis(int(axis), v.ndim)
    if x is None:
        d = dx
    else:
        t = tracer.lift(x)
        if t.ndim == 1:
            d = _diff(tracer, t)
            shape = [1] * v.ndim
            shape[k] = d.shape[0]
            d = d.reshape(tuple(shape))
        else:
            d = _diff(tracer, t, axis=k)
    head = [slice(None)] * v.ndim
    tail = [slice(None)] * v.ndim
    head[k], tail[k] = slice(1, None), slice(None, -1)
    pairs = ufuncs.apply(tracer, "add", (v[tuple(head)], v[tuple(tail)]))
    area = ufuncs.apply(tracer, "divide", (ufuncs.apply(tracer, "multiply", (d, pairs)), 2.0))
    return reductions.reduce(tracer, "sum", area, axis=k)


def _gradient(tracer: Tracer, f: Any, *varargs: Any, axis: Any = None,
              edge_order: int = 1) -> Any:
    """``np.gradient`` with uniform (scalar) spacings: NumPy's own arithmetic — central
    differences inside, one-sided ones (first or second order) at the ends — on slices
    concatenated along each axis, in NumPy's result dtype (integers as float64)."""
    x = tracer.lift(f)
    if x.dtype == np.bool_ or not (np.issubdtype(x.dtype, np.inexact)
                                   or np.issubdtype(x.dtype, np.integer)) \
            or edge_order not in (1, 2) or x.ndim == 0:
        raise NotCovered
    axes = tuple(range(x.ndim)) if axis is None else normalize_axis(axis, x.ndim)
    if not all(np.ndim(v) == 0 and not is_traced(v) for v in varargs):
        raise NotCovered  # coordinate arrays: non-uniform spacing
    if not varargs:
        dx = [1.0] * len(axes)
    elif len(varargs) == 1:
        dx = list(varargs) * len(axes)
    elif len(varargs) == len(axes):
        dx = list(varargs)
    else:
        raise NotCovered  # NumPy's TypeError
    otype = x.dtype if np.issubdtype(x.dtype, np.inexact) else np.dtype(np.float64)
    if np.issubdtype(x.dtype, np.integer):
        x = tracer.op("astype", (x,), {"dtype": np.dtype(np.float64)})

    def apply(name: str, *operands: Any) -> Any:
        return ufuncs.apply(tracer, name, operands)

    outs = []
    for d, h in zip(axes, dx, strict=True):
        if x.shape[d] < edge_order + 1:
            raise NotCovered  # NumPy's "too small" error

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


def _tensordot(tracer: Tracer, a: Any, b: Any, axes: Any = 2) -> Any:
    """``np.tensordot`` as the einsum it is (:func:`_einsum`)."""
    x, y = tracer.lift(a), tracer.lift(b)
    if isinstance(axes, (int, np.integer)):
        k = int(axes)
        ax_a, ax_b = list(range(x.ndim - k, x.ndim)), list(range(k))
    else:
        try:
            ax_a, ax_b = ([int(v)] if np.ndim(v) == 0 else [int(i) for i in v] for v in axes)
        except (TypeError, ValueError):
            raise NotCovered from None
    if len(ax_a) != len(ax_b) or x.ndim + y.ndim > 52:
        raise NotCovered
    ax_a = [i % x.ndim for i in ax_a]
    ax_b = [i % y.ndim for i in ax_b]
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    la = [next(letters) for _ in range(x.ndim)]
    lb = [next(letters) for _ in range(y.ndim)]
    for i, j in zip(ax_a, ax_b, strict=True):
        lb[j] = la[i]
    out = [c for i, c in enumerate(la) if i not in ax_a] + \
        [c for j, c in enumerate(lb) if j not in ax_b]
    return _einsum(tracer, f"{''.join(la)},{''.join(lb)}->{''.join(out)}", x, y)


def _inner(tracer: Tracer, a: Any, b: Any) -> Any:
    """``np.inner``: the sum over both operands' last axes."""
    x, y = tracer.lift(a), tracer.lift(b)
    if x.ndim == 0 or y.ndim == 0:
        raise NotCovered  # a scalar product: NumPy multiplies
    return _tensordot(tracer, x, y, ([-1], [-1]))


def _ptp(tracer: Tracer, a: Any, axis: Any = None, out: Any = None,
         keepdims: Any = NOVALUE) -> Any:
    """``np.ptp``: the maximum less the minimum."""
    if out is not None:
        raise NotCovered
    top = reductions.reduce(tracer, "max", a, axis=axis, keepdims=keepdims)
    low = reductions.reduce(tracer, "min", a, axis=axis, keepdims=keepdims)
    return ufuncs.apply(tracer, "subtract", (top, low))


def _count_nonzero(tracer: Tracer, a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:
    """``np.count_nonzero`` along axes (as ``intp``); over everything NumPy returns a
    Python int, which stays a graph break."""
    if axis is None:
        raise NotCovered
    x = tracer.lift(a)
    nonzero = x if x.dtype == np.bool_ else ufuncs.apply(tracer, "not_equal", (x, 0))
    return reductions.reduce(tracer, "sum", nonzero, axis=axis, dtype=np.intp,
                             keepdims=keepdims)


def _by_count(tracer: Tracer, total: Any, count: Any) -> Any:
    """``total / count`` as NumPy's NaN-skipping reductions divide: in place into the
    total (``casting='unsafe'``), so the total's dtype stays."""
    q = ufuncs.apply(tracer, "divide", (total, count))
    return q if q.dtype == total.dtype else tracer.op("astype", (q,), {"dtype": total.dtype})


def _nan_reduction(op: str) -> Callable:
    """``np.nansum``/``nanmean``/``nanmax``/``nanmin`` of floats: NaN replaced by the
    operation's identity (NumPy's ``_replace_nan``); ``nanmean`` divides by the count of
    non-NaN values, an all-NaN ``nanmax``/``nanmin`` slice gives NaN as NumPy does."""
    def handler(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None,
                out: Any = None, keepdims: Any = NOVALUE, **kwargs: Any) -> Any:
        x = tracer.lift(a)
        if out is not None or kwargs or (dtype is not None and op in ("max", "min")) \
                or not np.issubdtype(x.dtype, np.floating):
            raise NotCovered  # integers: NumPy's plain reduction; where=/initial=: rare
        nan = ufuncs.apply(tracer, "isnan", (x,))
        fill = {"sum": 0.0, "mean": 0.0, "max": -np.inf, "min": np.inf}[op]
        clean = select(tracer, nan, fill, x)
        kw = {"axis": axis, "keepdims": keepdims}
        if op in ("sum", "mean"):
            total = reductions.reduce(tracer, "sum", clean, dtype=dtype, **kw)
            if op == "sum":
                return total
            count = reductions.reduce(tracer, "sum", ufuncs.apply(tracer, "logical_not",
                                                                  (nan,)),
                                      dtype=np.intp, **kw)
            return _by_count(tracer, total, count)
        extreme = reductions.reduce(tracer, op, clean, **kw)
        every = reductions.reduce(tracer, "all", nan, **kw)
        return select(tracer, every, np.nan, extreme)

    return handler


def _nan_scan(op: str) -> Callable:
    """``np.nancumsum``/``np.nancumprod``, NumPy's steps: NaN replaced by 0 (1) in a
    float array (``_replace_nan``; other dtypes as they are), then the scan."""
    def handler(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None,
                out: Any = None) -> Any:
        if out is not None:
            raise NotCovered
        x = tracer.lift(a)
        if x.dtype.kind == "f":
            x = select(tracer, ufuncs.apply(tracer, "isnan", (x,)),
                       0.0 if op == "cumsum" else 1.0, x)
        return scans.HANDLERS[getattr(np, op)](tracer, x, axis=axis, dtype=dtype)

    return handler


def _nan_variance(root: bool) -> Callable:
    """``np.nanvar``/``np.nanstd`` of floats, NumPy's steps: NaN replaced by 0, the mean
    of the rest (its sum divided by their count, in the sum's dtype), the deviations
    with NaN's zeroed, their squares summed and divided by ``count - ddof`` — NaN where
    that is not positive (NumPy also warns there) — then ``np.sqrt`` for ``nanstd``."""
    def handler(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
                ddof: Any = 0, keepdims: Any = NOVALUE, *, where: Any = NOVALUE,
                mean: Any = NOVALUE, correction: Any = NOVALUE) -> Any:
        x = tracer.lift(a)
        if out is not None or where is not NOVALUE or mean is not NOVALUE \
                or not np.issubdtype(x.dtype, np.floating) \
                or (dtype is not None and not np.issubdtype(np.dtype(dtype), np.floating)) \
                or (correction is not NOVALUE and ddof != 0) \
                or not isinstance(ddof if correction is NOVALUE else correction,
                                  (int, float, np.integer, np.floating)):
            raise NotCovered  # integers (NumPy's np.var), NumPy's errors, rare forms
        if correction is not NOVALUE:
            ddof = correction
        keep = bool(keepdims) if keepdims is not NOVALUE else False

        def apply(name: str, *operands: Any) -> Any:
            return ufuncs.apply(tracer, name, operands)

        nan = apply("isnan", x)
        clean = select(tracer, nan, 0.0, x)
        present = apply("logical_not", nan)
        count = reductions.reduce(tracer, "sum", present, axis=axis, dtype=np.intp,
                                  keepdims=True)
        avg = _by_count(tracer, reductions.reduce(tracer, "sum", clean, axis=axis, dtype=dtype,
                                         keepdims=True), count)
        dev = apply("subtract", clean, avg)
        if dev.dtype != clean.dtype:  # subtract(arr, avg, out=arr, casting='unsafe')
            dev = tracer.op("astype", (dev,), {"dtype": clean.dtype})
        dev = select(tracer, nan, 0.0, dev)
        total = reductions.reduce(tracer, "sum", apply("multiply", dev, dev), axis=axis,
                                  dtype=dtype, keepdims=keep)
        dof = apply("subtract", reductions.reduce(tracer, "sum", present, axis=axis,
                                                  dtype=np.intp, keepdims=keep), ddof)
        var = _by_count(tracer, total, dof)
        var = select(tracer, apply("less_equal", dof, 0), np.nan, var)
        result = apply("sqrt", var) if root else var
        result._scalar = result.ndim == 0  # NumPy returns a scalar, not a 0-d array
        return result

    return handler


def _isclose(tracer: Tracer, a: Any, b: Any, rtol: Any = 1e-05, atol: Any = 1e-08,
             equal_nan: bool = False) -> Any:
    """``np.isclose`` with Python-number tolerances, as NumPy computes it:
    ``|x - y| <= atol + rtol * |y|`` where ``y`` (made inexact) is finite, or ``x == y``
    (and both NaN with ``equal_nan``)."""
    numbers = (int, float)
    if not all(isinstance(t, numbers) and not isinstance(t, bool) and math.isfinite(t)
               for t in (rtol, atol)):
        raise NotCovered  # array tolerances, or NumPy's invalid-tolerance warning
    x = a if isinstance(a, numbers) else tracer.lift(a)
    y = b if isinstance(b, numbers) else tracer.lift(b)
    if not isinstance(y, numbers):
        dt = np.result_type(y.dtype, 1.)
        if y.dtype != dt:
            y = tracer.op("astype", (y,), {"dtype": dt})
    elif isinstance(y, int):
        y = float(y)

    def apply(name: str, *operands: Any) -> Any:
        return ufuncs.apply(tracer, name, operands)

    def absolute(v: Any) -> Any:
        return abs(v) if isinstance(v, numbers) else apply("absolute", v)

    finite = math.isfinite(y) if isinstance(y, float) else apply("isfinite", y)
    near = apply("less_equal", absolute(apply("subtract", x, y)),
                 apply("add", atol, apply("multiply", rtol, absolute(y)))
                 if not isinstance(y, numbers) else atol + rtol * abs(y))
    result = apply("logical_or", apply("logical_and", near, finite), apply("equal", x, y))
    if equal_nan:
        both = apply("logical_and", apply("isnan", x), apply("isnan", y))
        result = apply("logical_or", result, both)
    return result


#: NumPy function -> handler.
HANDLERS: dict[Callable, Callable] = {
    np.round: _round, np.linalg.norm: _norm, np.nan_to_num: _nan_to_num,
    np.einsum: _einsum, np.tensordot: _tensordot, np.inner: _inner, np.diff: _diff,
    np.gradient: _gradient, np.ptp: _ptp, np.count_nonzero: _count_nonzero,
    np.nansum: _nan_reduction("sum"), np.nanmean: _nan_reduction("mean"),
    np.nanmax: _nan_reduction("max"), np.nanmin: _nan_reduction("min"),
    np.nanvar: _nan_variance(False), np.nanstd: _nan_variance(True), np.isclose: _isclose,
    np.nancumsum: _nan_scan("cumsum"), np.nancumprod: _nan_scan("cumprod"),
    np.trapezoid: _trapezoid,
}
if hasattr(np, "around"):
    HANDLERS[np.around] = _round
