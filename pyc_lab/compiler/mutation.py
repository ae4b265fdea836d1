"""Views and in-place writes, traced functionally with NumPy's aliasing.

The graph is pure: a write ``x[i] = v`` (or ``x += 1``, ``np.add(a, b, out=x)``,
``x.fill(0)``) records a new value — ``setitem(x, v)``, or the computed result cast to
``x``'s dtype — and *rebinds* the proxy ``x`` to it, so every later read of ``x`` reads
the written value.

NumPy views share memory, so a write through one is seen through all of them. Every
proxy made by a view op (basic slicing, transpose, reshape where NumPy returns a view,
expand_dims, squeeze, broadcast_to) remembers its *root* (the array whose memory it is)
and the view ops from the root (:class:`View`). A write into a view becomes a write into
the root — the written region put back through the inverse of each view op — and then
every view of that root is re-derived from the root's new value.

Whether NumPy returns a view is decided the way NumPy decides it: each proxy keeps a
*layout*, a zero-memory strided stand-in with the value's shape and strides (graph
inputs: the caller's strides; computed values: C order), and the view op is applied to
it (``np.reshape(..., copy=False)`` fails exactly where NumPy's reshape copies; an
integer index of every axis gives a scalar, not a view).

A graph break whose result shares memory with its input (``np.matrix_transpose``, say)
is an *opaque* view: pyc_lab cannot follow a write through it, so writing into it
raises :class:`UnsupportedOperationError`, and reading it after its root was written
raises too (NumPy would show the write). ``broadcast_to`` views are read-only, as in
NumPy. Writes into graph inputs are copied back into the caller's arrays after each call
(see :func:`pyc_lab.compiler.tracer.trace`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import scalars
from .errors import CastingError, ReadOnlyError, UnsupportedOperationError
from .ops import ShapeError, basic_index
from .values import is_traced

if TYPE_CHECKING:
    from .proxy import Traced
    from .tracer import Tracer

__all__ = ["View", "encode_index", "getitem", "layout_of", "setitem", "view_op", "write"]

#: View ops whose result NumPy may return as a view of the operand.
VIEW_OPS = ("slice", "transpose", "reshape", "expand_dims", "squeeze", "broadcast_to")


@dataclass(frozen=True)
class View:
    """Where a view's memory comes from.

    Attributes
    ----------
    root
        The proxy of the array owning the memory.
    steps
        The view ops ``(op, attrs)`` leading from ``root`` to the view; None for an
        opaque view (a graph break's result sharing memory with ``root``).
    readonly
        Whether NumPy forbids writing through it (``broadcast_to``, ``diagonal``).
    """

    root: Traced
    steps: tuple[tuple[str, dict[str, Any]], ...] | None
    readonly: bool = False


# -- layouts -------------------------------------------------------------------------------
def _stand_in(shape: tuple[int, ...], dtype: np.dtype, strides: tuple[int, ...] | None) \
        -> np.ndarray:
    """A zero-memory array with this shape and these strides (never read or written)."""
    base = np.zeros(1, dtype=dtype)
    if strides is None:
        acc, out = dtype.itemsize, []
        for d in reversed(shape):
            out.append(acc)
            acc *= max(d, 1)
        strides = tuple(reversed(out))
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides,
                                           writeable=False)


def layout_of(tracer: Tracer, x: Traced) -> np.ndarray:
    """The strided stand-in of ``x`` (computed values are C-ordered)."""
    if x._layout is None or tuple(x._layout.shape) != tuple(x.shape):
        x._layout = _stand_in(tuple(x.shape), x.dtype, tracer.strides_of(x.node_id))
    return x._layout


def _apply_layout(layout: np.ndarray, op: str, attrs: dict[str, Any]) -> Any:
    """The stand-in of ``op`` applied to ``layout``: an array (NumPy returns a view), a
    NumPy scalar (an integer index of every axis), or None (NumPy copies)."""
    try:
        if op == "slice":
            out = layout[basic_index(attrs)]
        elif op == "transpose":
            out = layout.transpose(tuple(attrs["axes"]))
        elif op == "reshape":
            out = np.reshape(layout, tuple(attrs["shape"]), copy=False)
        elif op == "expand_dims":
            out = np.expand_dims(layout, attrs["axis"])
        elif op == "squeeze":
            out = np.squeeze(layout, tuple(attrs["axis"]))
        elif op == "broadcast_to":
            out = np.broadcast_to(layout, tuple(attrs["shape"]))
        else:
            return None
    except ValueError:
        return None
    return out if isinstance(out, (np.ndarray, np.generic)) else None


# -- views -----------------------------------------------------------------------------------
def _register_view(root: Traced, view: Traced) -> None:
    root._views.append(weakref.ref(view))


def view_op(tracer: Tracer, src: Any, op: str, attrs: dict[str, Any],
            copy: bool | None = None) -> Traced:
    """``op`` applied to ``src``, remembered as a view of ``src``'s memory when NumPy's
    result would be one."""
    src = tracer.lift(src)
    result = tracer.op(op, (src,), attrs)
    if copy:
        return tracer.op("copy", (result,))
    layout = _apply_layout(layout_of(tracer, src), op, attrs)
    if isinstance(layout, np.generic):
        result._scalar = True  # x[i, j] of every axis: a scalar, a copy
        return result
    if layout is None:
        if op == "reshape" and copy is False:
            raise ValueError("Unable to avoid creating a copy while reshaping.")
        return result  # NumPy returns a new array here
    result._layout = layout
    mem = src._memory
    readonly = op == "broadcast_to" or bool(mem is not None and mem.readonly)
    if mem is None:
        result._memory = View(src, ((op, dict(attrs)),), readonly)
        _register_view(src, result)
    else:
        steps = None if mem.steps is None else (*mem.steps, (op, dict(attrs)))
        result._memory = View(mem.root, steps, readonly)
        _register_view(mem.root, result)
    return result


def opaque_view(root: Traced, view: Traced, readonly: bool) -> None:
    """Record that ``view`` (a graph break's result) shares memory with ``root``."""
    mem = root._memory
    owner = mem.root if mem is not None else root
    view._memory = View(owner, None, readonly)
    _register_view(owner, view)


def encode_index(index: Any) -> tuple | None:
    """A basic index as a hashable attribute, or None for advanced (array) indexing."""
    if not isinstance(index, tuple):
        index = (index,)
    out: list[tuple] = []
    for part in index:
        if isinstance(part, slice):
            if any(is_traced(v) for v in (part.start, part.stop, part.step)):
                return None
            out.append(("s", part.start, part.stop, part.step))
        elif isinstance(part, (int, np.integer)) and not isinstance(part, (bool, np.bool_)):
            out.append(("i", int(part)))
        elif part is None:
            out.append(("n",))
        elif part is Ellipsis:
            out.append(("e",))
        else:
            return None
    return tuple(out)


def getitem(tracer: Tracer, x: Traced, index: Any) -> Traced:
    """``x[index]``: a view for basic indices, a gather for one integer array among full
    slices (:mod:`.gathers`), a graph break for other advanced ones."""
    parts = encode_index(_integers(index))
    if parts is None:
        from .gathers import index_gather

        gathered = index_gather(tracer, x, index)
        if gathered is not None:
            return gathered
        if is_traced(index) and index.dtype == np.dtype(bool) and 1 <= index.ndim <= x.ndim \
                and tuple(index.shape) == tuple(x.shape[:index.ndim]):
            from .selections import Selection  # lazy until used: see selections.written

            return Selection(tracer, x.node_id, index, (), _take)
        return tracer.eager(_take, (x, index), {}, "advanced (array) indexing",
                            dynamic=_is_mask(index))
    return view_op(tracer, x, "slice", {"index": parts})


def _integers(index: Any) -> Any:
    """``index`` with its constant 0-d integer arrays as the integers NumPy reads them as."""
    def one(p: Any) -> Any:
        if isinstance(p, np.ndarray) and p.ndim == 0 and p.dtype.kind in "iu":
            return int(p)
        return p

    return tuple(one(p) for p in index) if isinstance(index, tuple) else one(index)


def _take(x: Any, index: Any) -> Any:
    return x[index]


def _is_mask(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(getattr(p, "dtype", None) == np.dtype(bool) or isinstance(p, (bool, list))
               for p in parts)


# -- writes ------------------------------------------------------------------------------------
def setitem(tracer: Tracer, x: Any, index: Any, value: Any) -> None:
    """``x[index] = value`` with NumPy's casting (unsafe for arrays; Python integers that
    do not fit raise OverflowError, as in NumPy)."""
    if getattr(x, "_scalar", False):
        raise TypeError(f"'numpy.{x.dtype.name}' object does not support item assignment")
    write(tracer, x, index, value, casting="unsafe", what=f"x[{_index_text(index)}] = ...")


def _index_text(index: Any) -> str:
    parts = index if isinstance(index, tuple) else (index,)
    out = []
    for p in parts:
        if isinstance(p, slice):
            out.append(":".join("" if v is None else str(v)
                                for v in (p.start, p.stop, p.step)).rstrip(":") or ":")
        elif p is Ellipsis:
            out.append("...")
        elif isinstance(p, (int, np.integer)):
            out.append(str(int(p)))
        else:
            out.append("<array>")
    return ", ".join(out)


def write(tracer: Tracer, target: Any, index: Any, value: Any, *, casting: str,
          what: str, mask: Any = None) -> Traced:
    """Write ``value`` into ``target[index]`` (``index`` None: the whole array, as an
    ``out=`` argument is written) and rebind every proxy of that memory.

    Parameters
    ----------
    casting
        NumPy's casting rule for the value (``"same_kind"`` for ufunc outputs,
        ``"unsafe"`` for item assignment and reduction outputs).
    what
        The expression, for error messages.
    mask
        ``where=`` of a ufunc writing into ``out``: only where it is True.

    Returns
    -------
    Traced
        ``target``, now reading the written value.
    """
    target = tracer.target(target, what)
    mem = target._memory
    if mem is not None and mem.readonly:
        raise ReadOnlyError(f"{what}: assignment destination is read-only (a read-only "
                            "view such as np.broadcast_to's or np.diagonal's result; NumPy "
                            "raises ValueError too). Write into a copy: .copy() it first")
    if mem is not None and mem.steps is None:
        raise UnsupportedOperationError(
            f"{what}: this array is one NumPy returns as a view of its input (the result "
            "of a graph break such as np.matrix_transpose, or x[i] by a traced 0-d index), and "
            "pyc_lab cannot follow a write through it. Write into the original array, or "
            ".copy() the result first")
    new = _written(tracer, target, index, value, casting, mask, what)
    if mem is None:
        _rebind(tracer, target, new, what)
    else:
        _rebind(tracer, mem.root, _scatter(tracer, mem.root, mem.steps or (), new), what)
    return target


def _cast_value(tracer: Tracer, value: Any, dtype: np.dtype, what: str) -> Traced:
    if is_traced(value):
        value = tracer.lift(value)
        return value if value.dtype == dtype else tracer.op("astype", (value,),
                                                            {"dtype": dtype})
    if scalars.is_python_scalar(value):
        return tracer.lift(scalars.typed_constant(value, dtype))
    arr = np.asarray(value)
    if arr.dtype == object:
        raise UnsupportedOperationError(f"{what}: cannot store a {type(value).__name__}")
    with np.errstate(all="ignore"):
        return tracer.lift(arr.astype(dtype))


def _written(tracer: Tracer, t: Traced, index: Any, value: Any, casting: str, mask: Any,
             what: str) -> Traced:
    """The new value of the whole of ``t``."""
    if index is None:  # an out= argument: the whole array
        v = value if is_traced(value) else tracer.lift(value, (t,))
        v = tracer.lift(v)
        if not np.can_cast(v.dtype, t.dtype, casting=casting):
            raise CastingError(f"{what}: cannot cast the result from {v.dtype} to {t.dtype} "
                               f"with casting rule {casting!r} (NumPy raises too); write "
                               f"into an array of dtype {v.dtype}, or cast explicitly")
        try:
            ok = tuple(np.broadcast_shapes(tuple(v.shape), tuple(t.shape))) == tuple(t.shape)
        except ValueError:
            ok = False
        if not ok:
            raise ShapeError(f"{what}: non-broadcastable output operand with shape "
                             f"{t.shape} doesn't match the broadcast shape {v.shape}")
        if v.dtype != t.dtype:
            v = tracer.op("astype", (v,), {"dtype": t.dtype})
        if mask is not None:
            return tracer.op("where", (mask, v, t))
        if tuple(v.shape) != tuple(t.shape):
            v = tracer.op("broadcast_to", (v,), {"shape": tuple(t.shape)})
        return v
    from .selections import written  # x[mask] op= v: a select of the whole array

    selected = written(tracer, t, index, value)
    if selected is not None:
        return selected
    v = _cast_value(tracer, value, t.dtype, what)
    parts = encode_index(index)
    if parts is not None:
        return tracer.op("setitem", (t, v), {"index": parts})
    if (is_traced(index) or isinstance(index, np.ndarray)) and index.dtype == np.dtype(bool) \
            and tuple(index.shape) == tuple(t.shape) and v.ndim == 0:
        return tracer.op("where", (index, v, t))
    return tracer.eager(_assigned, (t, index, v), {}, "item assignment with an array index")


def _assigned(base: Any, index: Any, value: Any) -> Any:
    out = base.copy()
    out[index] = value
    return out


def _scatter(tracer: Tracer, root: Traced, steps: tuple[tuple[str, dict[str, Any]], ...],
             leaf: Traced) -> Traced:
    """The root's new value when the view at the end of ``steps`` becomes ``leaf``."""
    parents: list[Traced] = [root]
    for op, attrs in steps[:-1]:
        parents.append(tracer.op(op, (parents[-1],), attrs))
    value = leaf
    for (op, attrs), parent in zip(reversed(steps), reversed(parents), strict=True):
        if op == "slice":
            value = tracer.op("setitem", (parent, value), {"index": attrs["index"]})
        elif op == "transpose":
            inverse = tuple(int(i) for i in np.argsort(attrs["axes"]))
            value = tracer.op("transpose", (value,), {"axes": inverse})
        elif op in ("reshape", "expand_dims", "squeeze"):
            value = tracer.op("reshape", (value,), {"shape": tuple(parent.shape)})
        else:  # broadcast_to views are read-only and refused before this
            raise UnsupportedOperationError(f"a write through a {op} view")
    return value


def _rebind(tracer: Tracer, root: Traced, new: Traced, what: str) -> None:
    """Point ``root`` at its new value and re-derive every live view of it."""
    root.node_id = new.node_id
    live = []
    for ref in root._views:
        view = ref()
        if view is None:
            continue
        live.append(ref)
        steps = view._memory.steps if view._memory is not None else None
        if steps is None:
            view._stale = (f"it is a view NumPy keeps of an array written later ({what}) "
                           "that pyc_lab cannot follow (a graph break's result, or a "
                           "diagonal of a transposed or strided array); pyc_lab cannot show "
                           "the write through it. Take the view after the write, or "
                           ".copy() it")
            continue
        cur = root
        for op, attrs in steps:
            cur = tracer.op(op, (cur,), attrs)
        view.node_id = cur.node_id
    root._views = live
