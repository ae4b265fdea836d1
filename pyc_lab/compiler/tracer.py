"""Trace a NumPy-style function into a :class:`~pyc_lab.compiler.ir.Graph`.

The function is called once with :class:`~pyc_lab.compiler.proxy.Traced` proxies in
place of its array arguments; the proxies record every operation (see
:mod:`.proxy`). A NumPy function pyc_lab has no op for becomes an ``eager`` node — a
graph break — that runs that function as-is at execution time, so results stay
correct and the break is reported. A graph break is called once while tracing, on the
real argument values (:mod:`.probes`), to learn its result's shape; a break whose
result shape depends on the values (``np.unique``, boolean masks) is marked dynamic,
and every call checks that the shape is still the traced one.

Writes into arguments (``x += 1``, ``x[0] = 0``, ``out=x``) are traced functionally
(:mod:`.mutation`); the graph's ``writeback`` lists, per written input, the node whose
value must be copied back into the caller's array after each call, as NumPy would have
changed it.

Data-dependent Python control flow (``if x.sum() > 0:``) cannot be traced and raises
:class:`TraceError` saying so.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import conversions, mutation, scalars, scipy_special
from .errors import ScalarOverflowError, TraceError, UnsupportedOperationError
from .ir import Graph
from .ops import ShapeError
from .probes import Probe
from .proxy import Traced
from .rebind import rebind
from .values import is_foreign_array, map_structure

__all__ = ["TraceError", "Traced", "Tracer", "is_array", "trace"]

#: NumPy functions whose result shape depends on the values of their arguments.
DATA_DEPENDENT = frozenset(f for f in (
    np.unique, np.nonzero, np.flatnonzero, np.argwhere, np.extract, np.compress,
    np.trim_zeros, np.setdiff1d, np.intersect1d, np.union1d, np.setxor1d,
    getattr(np, "unique_values", None), getattr(np, "unique_counts", None),
    getattr(np, "unique_inverse", None), getattr(np, "unique_all", None)) if f is not None)


class Tracer:
    """Builds the graph while the function runs on proxies.

    Parameters
    ----------
    name
        The graph's name.
    captured
        Arrays the function reads from globals or closures that become graph inputs
        (``id(array) -> name``); their current values are passed at every call.
    """

    def __init__(self, name: str, captured: dict[int, tuple[str, Any]] | None = None) -> None:
        self.graph = Graph(name=name)
        self.breaks: list[dict[str, Any]] = []
        self.probe = Probe(self.graph)
        self._captured = dict(captured or {})
        self._captured_proxies: dict[int, Traced] = {}
        #: (input node id, proxy) of every graph input, in input order
        self.inputs: list[tuple[int, Traced]] = []
        self._strides: dict[int, tuple[int, ...]] = {}

    # -- values -------------------------------------------------------------------------
    def input(self, name: str, value: Any) -> Traced:
        """A graph input standing for ``value`` (a NumPy or CuPy array)."""
        dt = np.dtype(value.dtype)  # (ml_dtypes' bfloat16 and float8 are kind "V" too)
        if dt.kind in "OUS" or (dt.kind == "V" and (dt.names is not None or dt.type is np.void)):
            raise TraceError(
                f"argument {name!r} has dtype {value.dtype}: compiled functions take arrays "
                "of numbers, booleans, datetimes and timedeltas; call the function "
                "uncompiled for objects, strings or structured records")
        node = self.graph.add("input", (), {"index": len(self.graph.inputs)}, name=name,
                              shape=tuple(value.shape), dtype=value.dtype)
        self.probe.set(node.id, value)
        self._strides[node.id] = tuple(int(s) for s in value.strides)
        proxy = Traced(self, node.id)
        self.inputs.append((node.id, proxy))
        return proxy

    def strides_of(self, node_id: int) -> tuple[int, ...] | None:
        """The caller's strides of an input node (None: a computed, C-ordered value)."""
        return self._strides.get(node_id)

    def constant(self, value: Any, like: Sequence[Any] = ()) -> Traced:
        """A scalar or array as a constant node (Python scalars typed as NumPy would)."""
        if scalars.is_python_scalar(value):
            others = [t.dtype for t in like if isinstance(t, Traced)]
            try:
                dtype = np.result_type(*others, value) if others else \
                    np.asarray(value).dtype
            except OverflowError as exc:
                raise ScalarOverflowError(f"Python scalar {value!r}: {exc}") from None
            arr = scalars.typed_constant(value, dtype)
        else:
            if is_foreign_array(value):
                raise TraceError(
                    f"a {type(value).__module__}.{type(value).__name__} read inside the "
                    "function would be compiled in as a constant (its later contents "
                    "unseen); pass it as an argument, as a NumPy or CuPy array")
            arr = np.asarray(value)
            if arr.dtype == object:
                raise TraceError(f"cannot trace a constant of type {type(value).__name__}")
        node = self.graph.add("constant", (), {"value": arr})
        self.probe.set(node.id, arr)
        return Traced(self, node.id)

    def lift(self, value: Any, like: Sequence[Any] = ()) -> Traced:
        """``value`` as a traced value: proxies as they are, captured arrays as their
        graph input, anything else as a constant."""
        if isinstance(value, Traced):
            if value.tracer is not self:
                raise TraceError("a traced value from another compilation leaked in")
            if value._stale is not None:
                raise UnsupportedOperationError(f"reading an array after a write: {value._stale}")
            return value
        captured = self.captured_input(value)
        if captured is not None:
            return captured
        if _is_device_array(value):
            raise TraceError(
                "a CuPy array captured from outside the function cannot be traced as a "
                "constant; pass it as an argument"
            )
        return self.constant(value, like)

    def captured_input(self, value: Any) -> Traced | None:
        """The graph input of a captured array (made at the first use), or None."""
        if not self._captured or not is_array(value):
            return None
        entry = self._captured.get(id(value))
        if entry is None or entry[1] is not value:
            return None
        proxy = self._captured_proxies.get(id(value))
        if proxy is None:
            proxy = self.input(entry[0], value)
            self._captured_proxies[id(value)] = proxy
        return proxy

    def target(self, value: Any, what: str) -> Traced:
        """The proxy an in-place write goes to: a traced value or a captured array."""
        if isinstance(value, Traced) and value._scalar:
            raise TypeError(f"{what}: return arrays must be of ArrayType (a NumPy scalar "
                            "cannot be written into)")
        if isinstance(value, Traced) or self.captured_input(value) is not None:
            return self.lift(value)
        raise UnsupportedOperationError(
            f"{what}: writes into a NumPy array that is not traced (one made inside the "
            "function by np.zeros/np.empty, or reached through an attribute), whose later "
            "reads pyc_lab could not follow. Make it from a traced array "
            "(np.zeros_like(x), x.copy()), pass it as an argument, or assign the result "
            "instead")

    def op(self, name: str, args: Sequence[Any], attrs: dict[str, Any] | None = None) -> Traced:
        """Record ``name(*args; attrs)``; non-traced arguments become constants."""
        like = [a for a in args if isinstance(a, Traced)]
        ids = [self.lift(a, like).node_id for a in args]
        try:
            node = self.graph.add(name, ids, attrs or {})
        except ShapeError as exc:
            # name the op once: many shape rules already start their message with it
            text = str(exc)
            raise type(exc)(text if text.startswith(name) else f"{name}: {text}") from None
        return Traced(self, node.id)

    # -- graph breaks -------------------------------------------------------------------
    def eager(self, fn: Callable, args: tuple, kwargs: dict, reason: str,
              dynamic: bool = False) -> Any:
        """Record a call pyc_lab cannot compile; it will run as-is at execution time.

        The call runs once now on the real argument values, for its result's shape and
        dtype. A result that is a tuple of arrays gives one graph break per element.
        """
        leaves: list[Traced] = []

        def collect(obj: Any) -> Any:
            if isinstance(obj, Traced) or self.captured_input(obj) is not None:
                leaves.append(self.lift(obj))
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

        values = [self.probe.value(leaf.node_id) for leaf in leaves]
        a, k = rebuild(values)
        try:
            with np.errstate(all="ignore"):
                result = fn(*a, **k)
        except Exception as exc:
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised by {_name(fn)}, a graph break, called on the "
                             "function's real inputs while pyc_lab traced it)")
            raise
        dynamic = dynamic or fn in DATA_DEPENDENT or (
            fn is np.where and len(args) == 1 and not kwargs)
        if isinstance(result, (tuple, list)) and result and all(
                is_array(r) or isinstance(r, np.generic) for r in result):
            return tuple(self._break(_Pick(fn, i), leaves, rebuild, r, values, reason,
                                     dynamic) for i, r in enumerate(result))
        return self._break(fn, leaves, rebuild, result, values, reason, dynamic)

    def _break(self, fn: Callable, leaves: list[Traced], rebuild: Callable, result: Any,
               values: list[Any], reason: str, dynamic: bool) -> Traced:
        xp = _module_of(result)
        arr = xp.asarray(result)
        if arr.dtype == object:
            raise TraceError(f"{_name(fn)} returned something that is not an array")
        attrs = {"fn": _name(fn), "reason": reason, "_fn": fn, "_rebuild": rebuild}
        if dynamic:
            attrs["dynamic"] = True
        node = self.graph.add("eager", [t.node_id for t in leaves], attrs,
                              shape=tuple(arr.shape), dtype=arr.dtype)
        self.probe.set(node.id, arr)
        entry: dict[str, Any] = {"node": node.id, "op": _name(fn), "reason": reason}
        if dynamic:
            entry["dynamic"] = ("its result's shape depends on the input values: checked at "
                                "every call; the function runs as written when it changes")
        self.breaks.append(entry)
        proxy = Traced(self, node.id)
        proxy._scalar = isinstance(result, np.generic)
        for leaf, value in zip(leaves, values, strict=True):
            if _may_share_memory(arr, value):
                mutation.opaque_view(leaf, proxy,
                                     readonly=not getattr(getattr(arr, "flags", None),
                                                          "writeable", True))
                break
        return proxy

    # -- the end ---------------------------------------------------------------------------
    def writebacks(self) -> list[tuple[int, int]]:
        """``(input position, node id)`` for every input written by the function."""
        out = []
        for k, (nid, proxy) in enumerate(self.inputs):
            if proxy.node_id != nid:
                out.append((k, proxy.node_id))
        return out


class _Slot:
    def __init__(self, index: int) -> None:
        self.index = index


class _Pick:
    """Element ``index`` of a graph break returning several arrays."""

    def __init__(self, fn: Callable, index: int) -> None:
        self.fn = fn
        self.index = index
        self.__name__ = f"{getattr(fn, '__name__', 'f')}[{index}]"
        self.__module__ = getattr(fn, "__module__", "") or ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)[self.index]


def _name(fn: Any) -> str:
    mod = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__name__", repr(fn))
    return f"np.{name}" if mod.startswith("numpy") or isinstance(fn, np.ufunc) else name


def _is_device_array(value: Any) -> bool:
    return type(value).__module__.startswith("cupy")


def _module_of(value: Any) -> Any:
    if _is_device_array(value):
        import cupy

        return cupy
    return np


def _may_share_memory(a: Any, b: Any) -> bool:
    try:
        return bool(_module_of(a).may_share_memory(a, b))
    except Exception:  # other array kinds: assume nothing is shared
        return False


def is_array(value: Any) -> bool:
    """Whether ``value`` is an array argument (NumPy or CuPy), i.e. becomes a graph input."""
    return isinstance(value, np.ndarray) or _is_device_array(value)


#: Values a dict argument may hold beside its arrays (static: part of the key by value).
_MAPPING_STATICS = (type(None), bool, int, float, str, np.generic)


def is_array_mapping(value: Any) -> bool:
    """Whether ``value`` is a dict of arrays (a model's parameters by name), perhaps with
    numbers, strings or None beside them (``{"w": w, "eps": 1e-5}``): an argument whose
    arrays are each an input, in the dict's order, and whose other values are static."""
    if type(value) is not dict or not value:
        return False
    values = value.values()
    return any(is_array(v) for v in values) and all(
        is_array(v) or isinstance(v, _MAPPING_STATICS) for v in values)


def is_array_sequence(value: Any) -> bool:
    """Whether ``value`` is a non-empty list or tuple of arrays (an optimiser's
    parameters): an argument whose arrays are each an input."""
    return isinstance(value, (list, tuple)) and bool(value) and all(is_array(v)
                                                                    for v in value)


def trace(fn: Callable, args: Sequence[Any], kwargs: dict[str, Any] | None = None, *,
          captured: dict[int, tuple[str, Any]] | None = None) \
        -> tuple[Graph, list[dict[str, Any]]]:
    """Trace ``fn(*args, **kwargs)``; array arguments (and the arrays of a list or tuple
    of arrays, or of a dict of arrays) become inputs, others stay static.

    Parameters
    ----------
    fn
        The function.
    args, kwargs
        Its arguments; the arrays among them are the real inputs (graph breaks are
        called on them while tracing).
    captured
        Arrays read from globals/closures to make graph inputs (after the arguments),
        ``id(array) -> (name, array)``; see :class:`Tracer`.

    Returns
    -------
    (Graph, list of graph breaks)
        ``graph.writeback`` lists ``(input position, output position)`` for every input
        the function writes into; ``graph.scalar_outputs`` the results NumPy returns as
        scalars (``x.sum()``); captured arrays that became inputs follow the arguments,
        named as in ``captured``.
    """
    kwargs = dict(kwargs or {})
    tracer = Tracer(getattr(fn, "__name__", "f"), captured)
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
            proxies.append(tracer.input(name, value))
        elif is_array_sequence(value):  # an input per array
            proxies.append(type(value)(tracer.input(f"{name}[{i}]", v)
                                       for i, v in enumerate(value)))
        elif is_array_mapping(value):  # an input per array, by key; the rest static
            proxies.append({k: tracer.input(f"{name}[{k!r}]", v) if is_array(v) else v
                            for k, v in value.items()})
        else:
            proxies.append(value)
    # captured arrays: inputs after the arguments, read through their proxies everywhere
    # the function reads them by name (indexing and methods included)
    # (and SciPy's Python-level softmax/log_softmax/logsumexp, and NumPy's array
    # constructors, as traceable stand-ins)
    fn = rebind(fn, {**scipy_special.shims(), **conversions.shims(tracer),
                     **{key: tracer.captured_input(value)
                        for key, (_, value) in (captured or {}).items()}})
    if bound is not None:
        for name, proxy in zip(names, proxies, strict=True):
            bound.arguments[name] = proxy
        result = fn(*bound.args, **bound.kwargs)
    else:
        result = fn(*proxies, **kwargs)
    graph = tracer.graph
    outputs: list[int] = []
    scalars_out: list[int] = []

    def pack(obj: Any) -> Any:  # one array of the result -> its output position
        if obj is None:  # beside arrays (an optional result): returned as it is
            return None
        value = tracer.lift(obj)
        if value._scalar or isinstance(obj, np.generic) or (
                scalars.is_python_scalar(obj)):
            scalars_out.append(len(outputs))
        outputs.append(value.node_id)
        return len(outputs) - 1

    if result is None:
        raise TraceError("the function returned None; it must return arrays")
    tree = map_structure(result, pack)  # the result's structure, positions for arrays
    writeback = []
    for position, nid in tracer.writebacks():
        writeback.append((position, len(outputs)))
        outputs.append(nid)
    graph.outputs = outputs
    graph.output_tree = tree
    graph.writeback = writeback
    graph.scalar_outputs = tuple(scalars_out)
    return graph, tracer.breaks
