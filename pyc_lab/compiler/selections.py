"""``x[mask] op= v``, ``x[mask] = f(x[mask])`` and ``x[mask].mean()`` for a traced boolean
mask, as a select or a masked reduction.

``x[mask]`` with a mask computed from the data has a shape only the values tell, so it
runs as a graph break (with a guard on that shape). Written back into ``x`` under the
same mask — ``y[y > t] -= t``, ``x[x < 0] *= 0.1``, ``x[m] = np.sqrt(x[m])`` — the
selection never needs to exist: the same elementwise steps applied to all of ``x`` and
selected where the mask holds give NumPy's result, ``np.where(mask, f(x), x)``, one
fused kernel. :class:`Selection` is what ``x[mask]`` returns while tracing: it records
elementwise steps with scalars (operators, in-place operators with NumPy's same-kind
cast, one-operand ufunc calls) and, written back into the array it came from (unchanged
since) under the same mask, becomes that select (:func:`written`); its sum or mean over
every selected value (``loss[mask].mean()``) is the reduction of the whole array with
``where=`` the mask. Any other use — its shape, another reduction, a second array,
returning it — reads its node, which makes it the
graph break it always was, with the recorded steps applied to the selected values, so
nothing changes for programs that use the selection as an array.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import reductions, ufuncs
from .errors import CastingError
from .function_parts import NOVALUE as _NOVALUE
from .proxy import Traced
from .values import is_traced

if TYPE_CHECKING:
    from .tracer import Tracer

__all__ = ["Selection", "written"]

Step = Callable[[Traced], Traced]


def _scalar_like(value: Any) -> bool:
    """A Python or NumPy scalar, or a 0-d traced value: the same for every element."""
    if isinstance(value, Selection):
        return False
    if is_traced(value):
        return value.ndim == 0
    return isinstance(value, (bool, int, float, np.generic))


class Selection(Traced):
    """``x[mask]`` while tracing: lazy until it is used as an array (see the module)."""

    def __init__(self, tracer: Tracer, source: int, mask: Traced,
                 steps: tuple[Step, ...], take: Callable[..., Any],
                 full: Traced | None = None) -> None:
        self._node: int | None = None
        super().__init__(tracer, None)  # type: ignore[arg-type]
        self._source = source
        self._mask = mask
        self._steps = steps
        self._take = take
        self._full = full if full is not None else Traced(tracer, source)

    @property  # type: ignore[override]
    def node_id(self) -> int:
        if self._node is None:  # used as an array: the graph break, then the steps
            value = self.tracer.eager(self._take, (Traced(self.tracer, self._source),
                                                   self._mask), {},
                                      "advanced (array) indexing", dynamic=True)
            for step in self._steps:
                value = step(value)
            self._node = value.node_id
        return self._node

    @node_id.setter
    def node_id(self, value: int | None) -> None:
        self._node = value

    def full(self) -> Traced:
        """The recorded steps applied to the whole array the selection came from (built
        step by step as they are recorded, the source's version fixed)."""
        return self._full

    def mask_for(self, ndim: int) -> Traced:
        """The mask with axes of length one after it: a mask of the leading axes
        selects whole rows of a ``ndim``-dimensional array."""
        mask = self._mask
        if mask.ndim < ndim:
            mask = mask.reshape(tuple(mask.shape) + (1,) * (ndim - mask.ndim))
        return mask

    def _then(self, step: Step) -> Selection:
        full = step(self._full)  # NumPy's errors now, where the call gives them
        return Selection(self.tracer, self._source, self._mask, (*self._steps, step),
                         self._take, full)

    def _masked(self, op: str, axis: Any, dtype: Any, out: Any, keepdims: Any,
                **rest: Any) -> Traced | None:
        """``sel.sum()``/``sel.mean()`` over every selected value as the reduction of the
        whole array with ``where=`` the mask (NumPy's dtype rules, NaN and a warning for
        the mean of nothing); None where the selection must exist (another axis,
        ``out``, ``keepdims``, ``initial``/``where``, a selection already made)."""
        full = self._full
        if self._node is not None or out is not None or keepdims or rest \
                or axis not in (None, 0, -1, (0,)) \
                or (axis is not None and self._mask.ndim != full.ndim):
            return None
        result = reductions.reduce(self.tracer, op, full, dtype=dtype,
                                   where=self.mask_for(full.ndim))
        result._scalar = True
        return result

    def sum(self, axis: Any = None, dtype: Any = None, out: Any = None,  # type: ignore[override]
            keepdims: Any = False, initial: Any = _NOVALUE, where: Any = True) -> Any:
        extra = {} if initial is _NOVALUE and where is True else {"initial": initial,
                                                                  "where": where}
        got = self._masked("sum", axis, dtype, out, keepdims, **extra)
        return got if got is not None else super().sum(axis, dtype, out, keepdims, initial,
                                                       where)

    def mean(self, axis: Any = None, dtype: Any = None, out: Any = None,  # type: ignore[override]
             keepdims: Any = False, *, where: Any = True) -> Any:
        got = self._masked("mean", axis, dtype, out, keepdims,
                           **({} if where is True else {"where": where}))
        return got if got is not None else super().mean(axis, dtype, out, keepdims,
                                                        where=where)

    def __array_function__(self, func: Callable, types: Any, args: tuple,
                           kwargs: dict) -> Any:
        if func in (np.sum, np.mean) and len(args) == 1 and args[0] is self:
            return getattr(self, func.__name__)(**kwargs)
        return super().__array_function__(func, types, args, kwargs)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any,
                        **kwargs: Any) -> Any:
        if method == "__call__" and not kwargs and ufunc.nout == 1 \
                and sum(i is self for i in inputs) == 1 \
                and all(i is self or _scalar_like(i) for i in inputs):
            tracer = self.tracer

            def call(v: Traced) -> Traced:
                args = tuple(v if i is self else i for i in inputs)
                return ufuncs.array_ufunc(tracer, ufunc, method, args, {})

            return self._then(call)
        return super().__array_ufunc__(ufunc, method, *inputs, **kwargs)


def _binary(name: str) -> Callable[[Selection, Any], Any]:
    plain = getattr(Traced, name)

    def method(self: Selection, other: Any) -> Any:
        if _scalar_like(other):
            return self._then(lambda v: plain(v, other))
        return plain(self, other)

    method.__name__ = name
    return method


def _unary(name: str) -> Callable[[Selection], Any]:
    plain = getattr(Traced, name)

    def method(self: Selection) -> Any:
        return self._then(plain)

    method.__name__ = name
    return method


def _inplace(name: str) -> Callable[[Selection, Any], Any]:
    """``sel op= other`` on the selected copy: the operator, then NumPy's same-kind cast
    back into the selection's dtype (its error where NumPy gives one)."""
    plain = getattr(Traced, name)

    def method(self: Selection, other: Any) -> Any:
        if not _scalar_like(other):
            return getattr(Traced, f"__i{name[2:]}")(self, other)

        def step(v: Traced) -> Traced:
            r = plain(v, other)
            if r.dtype == v.dtype:
                return r
            if not np.can_cast(r.dtype, v.dtype, "same_kind"):
                raise CastingError(f"Cannot cast ufunc output from {r.dtype} to {v.dtype} "
                                   "with casting rule 'same_kind' (NumPy raises too)")
            return v.tracer.op("astype", (r,), {"dtype": v.dtype})

        return self._then(step)

    method.__name__ = f"__i{name[2:]}"
    return method


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
              "__rmod__", "__pow__", "__rpow__"):
    setattr(Selection, _name, _binary(_name))
for _name in ("__neg__", "__pos__", "__abs__"):
    setattr(Selection, _name, _unary(_name))
for _name in ("__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__",
              "__pow__"):
    setattr(Selection, f"__i{_name[2:]}", _inplace(_name))


def _same(graph: Any, a: int, b: int, depth: int = 4) -> bool:
    """Whether nodes ``a`` and ``b`` compute the same value: the same node, or the same
    op with equal attributes (constants by value) on inputs that are the same, a few
    levels up — ``y[y > 0] = -y[y > 0]`` computes its mask twice."""
    if a == b:
        return True
    na, nb = graph.nodes[a], graph.nodes[b]
    if depth == 0 or na.op != nb.op or na.op == "input" or len(na.inputs) != len(nb.inputs) \
            or na.attrs.keys() != nb.attrs.keys():
        return False
    for key, va in na.attrs.items():
        vb = nb.attrs[key]
        if isinstance(va, np.ndarray) or isinstance(vb, np.ndarray):
            if not (isinstance(va, np.ndarray) and isinstance(vb, np.ndarray)
                    and va.dtype == vb.dtype and np.array_equal(va, vb, equal_nan=True)):
                return False
            continue
        try:
            if bool(va != vb):
                return False
        except (TypeError, ValueError):  # attributes that do not compare: not the same
            return False
    return all(_same(graph, i, j, depth - 1) for i, j in zip(na.inputs, nb.inputs,
                                                                 strict=True))


def written(tracer: Tracer, t: Traced, index: Any, value: Any) -> Traced | None:
    """``t[index] = value`` as ``np.where(mask, f(t), t)`` where ``value`` is a selection
    of ``t`` itself (unchanged since) under the same mask ``index``; else None."""
    if not isinstance(value, Selection) or value._node is not None \
            or not is_traced(index) or value._source != t.node_id \
            or not _same(tracer.graph, index.node_id, value._mask.node_id):
        return None
    full = value.full()
    if full.dtype != t.dtype:  # item assignment casts unsafely
        full = tracer.op("astype", (full,), {"dtype": t.dtype})
    return tracer.op("where", (value.mask_for(t.ndim), full, t))
