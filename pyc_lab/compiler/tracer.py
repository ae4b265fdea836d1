"""Trace a NumPy-style function into a :class:`~pyc_lab.compiler.ir.Graph`.

The function is called once with :class:`Traced` proxies in place of its array
arguments. Proxies implement the operators, ``__array_ufunc__`` (so ``np.tanh(x)`` and
``x @ w`` are recorded) and ``__array_function__`` (so ``np.sum``, ``np.where``,
``np.concatenate``... are recorded). A NumPy function pyc_lab has no op for becomes an
``eager`` node — a graph break — that runs that function as-is at execution time, so
results stay correct and the break is reported.

Data-dependent Python control flow (``if x.sum() > 0:``) cannot be traced and raises
:class:`TraceError` saying so.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import PycLabError
from .ir import Graph
from .ops import ShapeError, normalize_axis

__all__ = ["TraceError", "Traced", "trace"]


class TraceError(PycLabError):
    """The function cannot be traced (data-dependent control flow, unsupported output)."""


_UFUNCS = {
    "add": "add", "subtract": "subtract", "multiply": "multiply", "true_divide": "divide",
    "divide": "divide", "power": "power", "maximum": "maximum", "minimum": "minimum",
    "exp": "exp", "log": "log", "tanh": "tanh", "sqrt": "sqrt", "absolute": "abs",
    "negative": "negative", "less": "less", "less_equal": "less_equal", "greater": "greater",
    "greater_equal": "greater_equal", "equal": "equal", "not_equal": "not_equal",
}


class Tracer:
    """Builds the graph while the function runs on proxies."""

    def __init__(self, name: str) -> None:
        self.graph = Graph(name=name)
        self.breaks: list[dict[str, Any]] = []

    # -- values -------------------------------------------------------------------------
    def input(self, name: str, shape: tuple[int, ...], dtype: Any) -> Traced:
        node = self.graph.add("input", (), {"index": len(self.graph.inputs)}, name=name,
                              shape=tuple(shape), dtype=dtype)
        return Traced(self, node.id)

    def constant(self, value: Any, like: Sequence[Any] = ()) -> Traced:
        """A Python scalar or array as a constant node (scalars typed as NumPy would)."""
        if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
            others = [t.dtype for t in like if isinstance(t, Traced)]
            dtype = np.result_type(*others, value) if others else np.asarray(value).dtype
            arr = np.asarray(value, dtype=dtype)
        else:
            arr = np.asarray(value)
            if arr.dtype == object:
                raise TraceError(f"cannot trace a constant of type {type(value).__name__}")
        node = self.graph.add("constant", (), {"value": arr})
        return Traced(self, node.id)

    def lift(self, value: Any, like: Sequence[Any] = ()) -> Traced:
        if isinstance(value, Traced):
            if value.tracer is not self:
                raise TraceError("a traced value from another compilation leaked in")
            return value
        if _is_device_array(value):
            raise TraceError(
                "a CuPy array captured from outside the function cannot be traced as a "
                "constant; pass it as an argument"
            )
        return self.constant(value, like)

    def op(self, name: str, args: Sequence[Any], attrs: dict[str, Any] | None = None) -> Traced:
        like = [a for a in args if isinstance(a, Traced)]
        ids = [self.lift(a, like).node_id for a in args]
        try:
            node = self.graph.add(name, ids, attrs or {})
        except ShapeError as exc:
            raise ShapeError(f"{name}: {exc}") from None
        return Traced(self, node.id)

    # -- graph breaks -------------------------------------------------------------------
    def eager(self, fn: Callable, args: tuple, kwargs: dict, reason: str) -> Any:
        """Record a call pyc_lab cannot compile; it will run as-is at execution time."""
        leaves: list[Traced] = []

        def collect(obj: Any) -> Any:
            if isinstance(obj, Traced):
                leaves.append(obj)
                return _Slot(len(leaves) - 1)
            if isinstance(obj, (list, tuple)):
                return type(obj)(collect(o) for o in obj)
            if isinstance(obj, dict):
                return {k: collect(v) for k, v in obj.items()}
            return obj

        template_args, template_kwargs = collect(args), collect(kwargs)

        def rebuild(values: list[Any]) -> tuple[tuple, dict]:
            def put(obj: Any) -> Any:
                if isinstance(obj, _Slot):
                    return values[obj.index]
                if isinstance(obj, (list, tuple)):
                    return type(obj)(put(o) for o in obj)
                if isinstance(obj, dict):
                    return {k: put(v) for k, v in obj.items()}
                return obj

            return put(template_args), put(template_kwargs)

        probe = [np.zeros(leaf.shape, leaf.dtype) for leaf in leaves]
        a, k = rebuild(probe)
        try:
            result = np.asarray(fn(*a, **k))
        except Exception as exc:
            raise TraceError(f"{_name(fn)} failed on example inputs while tracing: {exc}") \
                from None
        if result.dtype == object:
            raise TraceError(f"{_name(fn)} returned something that is not one array")
        node = self.graph.add("eager", [t.node_id for t in leaves],
                              {"fn": _name(fn), "reason": reason, "_fn": fn,
                               "_rebuild": rebuild},
                              shape=result.shape, dtype=result.dtype)
        self.breaks.append({"node": node.id, "op": _name(fn), "reason": reason})
        return Traced(self, node.id)


class _Slot:
    def __init__(self, index: int) -> None:
        self.index = index


def _name(fn: Any) -> str:
    mod = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__name__", repr(fn))
    return f"np.{name}" if mod.startswith("numpy") or isinstance(fn, np.ufunc) else name


def _is_device_array(value: Any) -> bool:
    return type(value).__module__.startswith("cupy")


class Traced:
    """A stand-in for an array while a function is traced."""

    __array_priority__ = 1000

    def __init__(self, tracer: Tracer, node_id: int) -> None:
        self.tracer = tracer
        self.node_id = node_id

    # -- array attributes ----------------------------------------------------------------
    @property
    def node(self) -> Any:
        return self.tracer.graph.nodes[self.node_id]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> np.dtype:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def T(self) -> Traced:
        return self.transpose()

    def __repr__(self) -> str:
        return f"Traced(%{self.node_id}: {self.node.type_text})"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d traced array")
        return self.shape[0]

    # -- no data-dependent control flow --------------------------------------------------
    def _concrete(self, what: str) -> TraceError:
        return TraceError(
            f"{what} of a traced array: the function's control flow depends on array "
            "values, which pyc_lab cannot trace. Use np.where(...) instead of if/else on "
            "values, or call the function without pyc_lab.compile"
        )

    def __bool__(self) -> bool:
        raise self._concrete("bool()")

    def __float__(self) -> float:
        raise self._concrete("float()")

    def __int__(self) -> int:
        raise self._concrete("int()")

    def __index__(self) -> int:
        raise self._concrete("using as an index")

    def __iter__(self):
        raise self._concrete("iterating over the values")

    # -- operators ----------------------------------------------------------------------
    def _bin(self, op: str, other: Any, reverse: bool = False) -> Traced:
        args = (other, self) if reverse else (self, other)
        return self.tracer.op(op, args)

    def __add__(self, o: Any) -> Traced: return self._bin("add", o)
    def __radd__(self, o: Any) -> Traced: return self._bin("add", o, True)
    def __sub__(self, o: Any) -> Traced: return self._bin("subtract", o)
    def __rsub__(self, o: Any) -> Traced: return self._bin("subtract", o, True)
    def __mul__(self, o: Any) -> Traced: return self._bin("multiply", o)
    def __rmul__(self, o: Any) -> Traced: return self._bin("multiply", o, True)
    def __truediv__(self, o: Any) -> Traced: return self._bin("divide", o)
    def __rtruediv__(self, o: Any) -> Traced: return self._bin("divide", o, True)
    def __pow__(self, o: Any) -> Traced: return self._bin("power", o)
    def __rpow__(self, o: Any) -> Traced: return self._bin("power", o, True)
    def __matmul__(self, o: Any) -> Traced: return self._bin("matmul", o)
    def __rmatmul__(self, o: Any) -> Traced: return self._bin("matmul", o, True)
    def __lt__(self, o: Any) -> Traced: return self._bin("less", o)
    def __le__(self, o: Any) -> Traced: return self._bin("less_equal", o)
    def __gt__(self, o: Any) -> Traced: return self._bin("greater", o)
    def __ge__(self, o: Any) -> Traced: return self._bin("greater_equal", o)
    def __eq__(self, o: Any) -> Traced: return self._bin("equal", o)  # type: ignore[override]
    def __ne__(self, o: Any) -> Traced: return self._bin("not_equal", o)  # type: ignore[override]
    def __neg__(self) -> Traced: return self.tracer.op("negative", (self,))
    def __pos__(self) -> Traced: return self
    def __abs__(self) -> Traced: return self.tracer.op("abs", (self,))

    __hash__ = object.__hash__

    def __getitem__(self, index: Any) -> Traced:
        parts = _encode_index(index)
        if parts is None:
            return self.tracer.eager(lambda x, i=index: x[i], (self,), {},
                                     "advanced (array) indexing")
        return self.tracer.op("slice", (self,), {"index": parts})

    # -- methods --------------------------------------------------------------------------
    def reshape(self, *shape: Any) -> Traced:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return self.tracer.op("reshape", (self,), {"shape": tuple(int(d) for d in shape)})

    def transpose(self, *axes: Any) -> Traced:
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        axes = tuple(axes) if axes else tuple(reversed(range(self.ndim)))
        return self.tracer.op("transpose", (self,), {"axes": tuple(int(a) for a in axes)})

    def astype(self, dtype: Any, **_: Any) -> Traced:
        return self.tracer.op("astype", (self,), {"dtype": np.dtype(dtype)})

    def sum(self, axis: Any = None, keepdims: bool = False, **kw: Any) -> Traced:
        return _reduce("sum", self, axis, keepdims, kw)

    def mean(self, axis: Any = None, keepdims: bool = False, **kw: Any) -> Traced:
        return _reduce("mean", self, axis, keepdims, kw)

    def max(self, axis: Any = None, keepdims: bool = False, **kw: Any) -> Traced:
        return _reduce("max", self, axis, keepdims, kw)

    def min(self, axis: Any = None, keepdims: bool = False, **kw: Any) -> Traced:
        return _reduce("min", self, axis, keepdims, kw)

    def var(self, axis: Any = None, keepdims: bool = False, **kw: Any) -> Traced:
        return _reduce("var", self, axis, keepdims, kw)

    def squeeze(self, axis: Any = None) -> Traced:
        if axis is None:
            axis = tuple(i for i, d in enumerate(self.shape) if d == 1)
        return self.tracer.op("squeeze", (self,),
                              {"axis": normalize_axis(axis, self.ndim)})

    # -- NumPy protocols -----------------------------------------------------------------
    def __array__(self, *_: Any, **__: Any) -> np.ndarray:
        raise self._concrete("converting to a NumPy array")

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        tracer = self.tracer
        if method != "__call__" or kwargs.get("out") is not None or kwargs.get("where") \
                is not None:
            return tracer.eager(getattr(ufunc, method), inputs, kwargs,
                                f"np.{ufunc.__name__}.{method} with out=/where= or a ufunc "
                                "method is not compiled")
        kwargs.pop("out", None)
        dtype = kwargs.pop("dtype", None)
        if kwargs:
            return tracer.eager(ufunc, inputs, kwargs,
                                f"np.{ufunc.__name__} with {sorted(kwargs)} is not compiled")
        name = ufunc.__name__
        if name == "matmul":
            out = tracer.op("matmul", inputs)
        elif name == "square":
            out = tracer.op("multiply", (inputs[0], inputs[0]))
        elif name == "reciprocal":
            out = tracer.op("divide", (1.0, inputs[0]))
        elif name == "positive":
            out = tracer.lift(inputs[0])
        elif name in _UFUNCS:
            out = tracer.op(_UFUNCS[name], inputs)
        else:
            return tracer.eager(ufunc, inputs, {},
                                f"np.{name} has no op in pyc_lab's registry")
        if dtype is not None:
            out = out.astype(dtype)
        return out

    def __array_function__(self, func: Callable, types: Any, args: tuple, kwargs: dict) -> Any:
        handler = _FUNCTIONS.get(func)
        if handler is not None:
            try:
                return handler(self.tracer, *args, **kwargs)
            except TypeError:
                pass  # an argument form the handler does not cover: run it eagerly
        return self.tracer.eager(func, args, kwargs,
                                 f"{_name(func)} has no op in pyc_lab's registry")


def _reduce(op: str, x: Any, axis: Any, keepdims: bool, kw: dict) -> Traced:
    tracer = x.tracer
    if kw.get("dtype") is not None or kw.get("out") is not None or kw.get("ddof"):
        fn = getattr(np, op)
        return tracer.eager(fn, (x,), {"axis": axis, "keepdims": keepdims, **kw},
                            f"np.{op} with {sorted(k for k in kw if kw[k] is not None)}")
    x = tracer.lift(x)
    return tracer.op(op, (x,), {"axis": normalize_axis(axis, x.ndim) if axis is not None
                                else None, "keepdims": bool(keepdims)})


def _encode_index(index: Any) -> tuple | None:
    if not isinstance(index, tuple):
        index = (index,)
    out: list[tuple] = []
    for part in index:
        if isinstance(part, slice):
            if any(isinstance(v, Traced) for v in (part.start, part.stop, part.step)):
                return None
            out.append(("s", part.start, part.stop, part.step))
        elif isinstance(part, (int, np.integer)) and not isinstance(part, bool):
            out.append(("i", int(part)))
        elif part is None:
            out.append(("n",))
        elif part is Ellipsis:
            out.append(("e",))
        else:
            return None
    return tuple(out)


def _f_reduce(op: str) -> Callable:
    def handler(tracer: Tracer, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
                keepdims: bool = False, **kw: Any) -> Traced:
        kw = {k: v for k, v in kw.items() if v is not np._NoValue}
        if kw:
            raise TypeError
        return _reduce(op, tracer.lift(a), axis, keepdims, {"dtype": dtype, "out": out})

    return handler


def _f_where(tracer: Tracer, cond: Any, x: Any = None, y: Any = None) -> Traced:
    if x is None or y is None:
        raise TypeError  # np.where(cond) with one argument: eager
    return tracer.op("where", (cond, x, y))


def _f_reshape(tracer: Tracer, a: Any, shape: Any = None, *args: Any, **kw: Any) -> Traced:
    if shape is None:
        shape = kw.pop("newshape", None)
    if args or kw.get("order", "C") != "C":
        raise TypeError
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return tracer.lift(a).reshape(shape)


def _f_transpose(tracer: Tracer, a: Any, axes: Any = None) -> Traced:
    a = tracer.lift(a)
    return a.transpose(*(axes or ()))


def _f_swapaxes(tracer: Tracer, a: Any, axis1: int, axis2: int) -> Traced:
    a = tracer.lift(a)
    axes = list(range(a.ndim))
    i, j = normalize_axis(axis1, a.ndim)[0], normalize_axis(axis2, a.ndim)[0]
    axes[i], axes[j] = axes[j], axes[i]
    return a.transpose(axes)


def _f_concatenate(tracer: Tracer, arrays: Any, axis: int = 0, **kw: Any) -> Traced:
    if kw.get("out") is not None or kw.get("dtype") is not None or axis is None:
        raise TypeError
    return tracer.op("concatenate", tuple(arrays), {"axis": int(axis)})


def _f_expand_dims(tracer: Tracer, a: Any, axis: Any) -> Traced:
    return tracer.op("expand_dims", (a,), {"axis": axis})


def _f_squeeze(tracer: Tracer, a: Any, axis: Any = None) -> Traced:
    return tracer.lift(a).squeeze(axis)


def _f_broadcast_to(tracer: Tracer, a: Any, shape: Any, subok: bool = False) -> Traced:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return tracer.op("broadcast_to", (a,), {"shape": shape})


def _f_dot(tracer: Tracer, a: Any, b: Any, out: Any = None) -> Traced:
    a, b = tracer.lift(a), tracer.lift(b)
    if out is not None or a.ndim > 2 or b.ndim > 2 or a.ndim == 0 or b.ndim == 0:
        raise TypeError
    return tracer.op("matmul", (a, b))


def _f_clip(tracer: Tracer, a: Any, a_min: Any = None, a_max: Any = None, **kw: Any) -> Traced:
    if kw.get("out") is not None:
        raise TypeError
    out = tracer.lift(a)
    if a_min is not None:
        out = tracer.op("maximum", (out, a_min))
    if a_max is not None:
        out = tracer.op("minimum", (out, a_max))
    return out


def _f_astype(tracer: Tracer, x: Any, dtype: Any, **_: Any) -> Traced:
    return tracer.lift(x).astype(dtype)


_FUNCTIONS: dict[Callable, Callable] = {
    np.sum: _f_reduce("sum"), np.mean: _f_reduce("mean"), np.max: _f_reduce("max"),
    np.amax: _f_reduce("max"), np.min: _f_reduce("min"), np.amin: _f_reduce("min"),
    np.var: _f_reduce("var"), np.where: _f_where, np.reshape: _f_reshape,
    np.transpose: _f_transpose, np.swapaxes: _f_swapaxes, np.concatenate: _f_concatenate,
    np.expand_dims: _f_expand_dims, np.squeeze: _f_squeeze, np.broadcast_to: _f_broadcast_to,
    np.dot: _f_dot, np.clip: _f_clip,
}
if hasattr(np, "astype"):
    _FUNCTIONS[np.astype] = _f_astype


def is_array(value: Any) -> bool:
    """Whether ``value`` is an array argument (NumPy or CuPy), i.e. becomes a graph input."""
    return isinstance(value, np.ndarray) or _is_device_array(value)


def trace(fn: Callable, args: Sequence[Any], kwargs: dict[str, Any] | None = None) \
        -> tuple[Graph, list[dict[str, Any]]]:
    """Trace ``fn(*args, **kwargs)``; array arguments become inputs, others stay static.

    Returns
    -------
    (Graph, list of graph breaks)
    """
    kwargs = dict(kwargs or {})
    tracer = Tracer(getattr(fn, "__name__", "f"))
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        names = list(bound.arguments)
        values = list(bound.arguments.values())
    except (TypeError, ValueError):
        names = [f"arg{i}" for i in range(len(args))]
        values = list(args)
        bound = None
    proxies: list[Any] = []
    for name, value in zip(names, values, strict=True):
        if is_array(value):
            proxies.append(tracer.input(name, tuple(value.shape), value.dtype))
        else:
            proxies.append(value)
    if bound is not None:
        for name, proxy in zip(names, proxies, strict=True):
            bound.arguments[name] = proxy
        result = fn(*bound.args, **bound.kwargs)
    else:
        result = fn(*proxies, **kwargs)
    graph = tracer.graph
    outputs: list[int] = []

    def pack(obj: Any) -> Any:
        if isinstance(obj, (tuple, list)):
            return tuple(pack(o) for o in obj)
        if obj is None:
            raise TraceError("the function returned None; it must return arrays")
        outputs.append(tracer.lift(obj).node_id)
        return len(outputs) - 1

    tree = pack(result)
    graph.outputs = outputs
    graph.output_tree = tree
    return graph, tracer.breaks
