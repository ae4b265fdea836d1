"""Guards: the globals and closure variables a trace read, re-checked at every call.

A trace bakes what the function reads from outside its arguments into the graph: a
global ``SCALE = 2.0`` becomes a constant, a helper function's body becomes ops. Like
``torch.compile``, a compiled function records a *guard* for every such name and, at
every call, re-traces when one no longer holds — rebinding ``SCALE = 3.0`` is seen.

What is guarded, from the function's bytecode (and that of the functions nested in it
or called by name from it, a few levels deep):

- every global name it loads and every closure variable, with the attribute paths read
  from them (``cfg.scale``);
- plain values (numbers, strings, None, dtypes, and tuples/lists/dicts of them) by type
  and value, with the same typed keys as static arguments (:mod:`.cache_keys`);
- modules, functions and other objects by identity (library modules such as ``numpy``
  by identity only, their attributes are not guarded);
- arrays by type, shape and dtype: an array read from a global or closure is *not* a
  constant but an extra input of the graph, read afresh at every call (so writing into
  it in place is seen, and a write into it inside the function reaches it, as in
  NumPy). Where the backend cannot take it as an input (a NumPy array captured by a
  function running on CuPy arrays), it is a constant guarded by identity.

A bound method (``pl.compile(model.forward)``) is guarded the same way from its
``self``: the attribute paths read from it (``self.w``, ``self.params``) are guards, and
arrays reached so are captured inputs, so a model whose weights are updated in place or
rebound is seen at the next call.

A plain container reached by such a path (a ``dict``, ``list`` or ``tuple`` holding
arrays or other values: ``params["W1"]``, ``layers[0]``), and a user's object reached so
(its ``__dict__``: ``self.encoder.w``, ``self.blocks[3].attn.qkv.w``), is guarded item
by item, :data:`MAX_EXPAND_DEPTH` levels deep and up to :data:`MAX_CONTAINER_ITEMS`
items in all (a warning says where arrays lie past either) — a container's keys or
length, each plain value by value, each array as a captured input read afresh at every
call — whatever key or attribute the function reads it with. Not guarded: larger
containers (guarded by identity only, their items as the trace saw them), values
reached through calls or other expressions, attributes of objects whose module is a
library's. (Arguments are not globals: a dict of arrays is an input per array, and an
object or container holding arrays among other values is refused — see
:mod:`.api` — so ``pl.compile(Model.forward)(model, x)`` asks for ``model.forward``.)
"""

from __future__ import annotations

import builtins
import dis
import logging
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cache_keys import static_key
from .errors import TraceError

logger = logging.getLogger(__name__)

__all__ = ["Guard", "Guards", "RandomInTraceError", "collect", "is_user_object"]

_MISSING = object()
_LIBRARIES = ("numpy", "cupy", "cupyx", "pyc_lab", "math", "builtins", "scipy", "torch")
_MAX_DEPTH = 3

#: The most items of the containers and objects the guarded names lead to that are
#: guarded one by one (past it a container is guarded by identity; each guard is read at
#: every call, a microsecond or so).
MAX_CONTAINER_ITEMS = 512

#: How many levels of containers and objects below a guarded name are guarded.
MAX_EXPAND_DEPTH = 6
_VALUE_TYPES = (type(None), bool, int, float, complex, str, bytes, np.generic, np.dtype,
                slice, type(Ellipsis))


class RandomInTraceError(TraceError):
    """The function draws random numbers, which a trace would freeze into a constant."""


@dataclass(frozen=True)
class Guard:
    """One checked fact: ``source`` (e.g. ``global SCALE``) still has the value seen."""

    source: str
    read: Callable[[], Any] = field(repr=False)
    kind: str  # "value", "identity", "array" or "missing"
    expected: Any = field(repr=False)
    shown: str = ""

    def holds(self) -> bool:
        """Whether the fact still holds."""
        try:
            value = self.read()
        except Exception:
            value = _MISSING
        if self.kind == "missing":
            return value is _MISSING
        if value is _MISSING:
            return False
        if self.kind == "identity":
            return value is self.expected
        if self.kind == "array":
            return _array_key(value) == self.expected
        return static_key(value) == self.expected

    def describe(self) -> str:
        """One deterministic line (no addresses)."""
        if self.kind == "missing":
            return f"{self.source} is undefined"
        if self.kind == "array":
            kind, shape, dtype, _ = self.expected
            return f"{self.source} is a {kind.__module__.split('.')[0]} array " \
                   f"{np.dtype(dtype).name}{list(shape)} (an input of the graph)"
        if self.kind == "identity":
            if isinstance(self.expected, types.ModuleType):
                return f"{self.source} is the module {self.expected.__name__}"
            return f"{self.source} is the same object"
        return f"{self.source} == {self.shown}"


def _array_key(value: Any) -> tuple:
    """What a trace assumed of a captured array: its kind, shape, dtype and layout."""
    return (type(value), tuple(value.shape), value.dtype, bool(value.flags.c_contiguous))


def _short(value: Any) -> str:
    text = f"{value!r} ({type(value).__name__})"
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class Guards:
    """Every guard of one trace and the captured arrays that became graph inputs."""

    guards: list[Guard] = field(default_factory=list)
    #: ``id(array) -> (name, array)`` for the tracer (arrays to make inputs)
    captured: dict[int, tuple[str, Any]] = field(default_factory=dict)
    #: name -> reader of the current value, for the captured inputs
    readers: dict[str, Callable[[], Any]] = field(default_factory=dict)
    #: container items left to guard one by one (see :func:`_expand`)
    items_left: int = MAX_CONTAINER_ITEMS
    #: the sources of :attr:`guards`, so that no fact is guarded twice
    sources: set[str] = field(default_factory=set)

    def add(self, guard: Guard) -> None:
        """Guard one more fact (its source is new)."""
        self.guards.append(guard)
        self.sources.add(guard.source)

    def failing(self) -> Guard | None:
        """The first guard that no longer holds, or None."""
        for guard in self.guards:
            if not guard.holds():
                return guard
        return None

    def describe(self) -> list[str]:
        """One line per guard."""
        return [g.describe() for g in self.guards]


def _is_library(value: Any) -> bool:
    mod = value.__name__ if isinstance(value, types.ModuleType) else \
        getattr(value, "__module__", None) or ""
    return isinstance(mod, str) and mod.split(".")[0] in _LIBRARIES


def _is_plain_value(value: Any) -> bool:
    if isinstance(value, _VALUE_TYPES):
        return True
    if type(value) in (tuple, list):
        return all(_is_plain_value(v) for v in value)
    if type(value) is dict:
        return all(_is_plain_value(k) and _is_plain_value(v) for k, v in value.items())
    return False


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or type(value).__module__.startswith("cupy")


def _paths(code: types.CodeType, free: frozenset[str],
           self_name: str | None = None) -> list[tuple[str, str, tuple]]:
    """``(kind, name, attributes)`` for every global/closure load of ``code`` and of the
    code nested in it; kind is ``"global"``, ``"closure"`` or (loads of a bound method's
    first parameter ``self_name``, in ``code`` itself) ``"self"``."""
    out: list[tuple[str, str, tuple]] = []
    stack = [code]
    while stack:
        c = stack.pop()
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        current: list[Any] | None = None
        for ins in dis.get_instructions(c):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                current = ["global", ins.argval, []]
                out.append(current)  # type: ignore[arg-type]
            elif ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF") and ins.argval in free:
                current = ["closure", ins.argval, []]
                out.append(current)  # type: ignore[arg-type]
            elif ins.opname.startswith("LOAD_FAST") and c is code and self_name is not None \
                    and ins.argval == self_name:
                current = ["self", ins.argval, []]
                out.append(current)  # type: ignore[arg-type]
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and current is not None:
                current[2].append(ins.argval)
            elif ins.opname not in ("CACHE", "EXTENDED_ARG", "PRECALL"):
                current = None
    seen: set[tuple] = set()
    paths = []
    for kind, name, attrs in out:
        key = (kind, name, tuple(attrs))
        if key not in seen:
            seen.add(key)
            paths.append(key)
    return paths


def _reader(fn: Any, kind: str, name: str, attrs: tuple) -> Callable[[], Any]:
    if kind == "self":
        owner = fn.__self__

        def root() -> Any:
            return owner
    elif kind == "closure":
        index = fn.__code__.co_freevars.index(name)
        cell = fn.__closure__[index]  # type: ignore[index]

        def root() -> Any:
            return cell.cell_contents
    else:
        scope = fn.__globals__

        def root() -> Any:
            if name in scope:
                return scope[name]
            return getattr(builtins, name, _MISSING)

    if not attrs:
        return root

    def read() -> Any:
        value = root()
        for a in attrs:
            value = getattr(value, a)
        return value

    return read


def collect(fn: Callable, capture: Callable[[Any], bool]) -> Guards:
    """The guards of ``fn`` as it is now.

    Parameters
    ----------
    fn
        The function being compiled.
    capture
        Whether an array read from outside becomes a graph input (True) or a constant
        guarded by identity (False).
    """
    out = Guards()
    _collect(fn, capture, out, set(), 0, "")
    return out


def _items(value: Any) -> list[tuple[Any, Any]] | None:
    """``(key, item)`` of a plain container (dict, list, tuple) or the attributes of a
    plain object of the user's (its ``__dict__``), else None."""
    if type(value) is dict:
        return list(value.items())
    if type(value) in (list, tuple):
        return list(enumerate(value))
    if is_user_object(value):
        return list(vars(value).items())
    return None


def is_user_object(value: Any) -> bool:
    """An instance of a user's class with a ``__dict__`` (not a function, module, type,
    array or a library's object)."""
    return not isinstance(value, (types.FunctionType, types.MethodType, types.ModuleType,
                                  type, np.ndarray, np.generic)) \
        and hasattr(value, "__dict__") and not _is_library(value) \
        and not type(value).__module__.startswith("cupy")


def _item_reader(parent: Callable[[], Any], key: Any, attribute: bool) -> Callable[[], Any]:
    if attribute:
        def read() -> Any:
            return getattr(parent(), key)
    else:
        def read() -> Any:
            return parent()[key]
    return read


def _expand(source: str, reader: Callable[[], Any], value: Any,
            capture: Callable[[Any], bool], out: Guards, depth: int = 0) -> None:
    """Guards for the items of plain container ``value`` or the attributes of a user's
    object (and of the containers and objects in them, down to
    :data:`MAX_EXPAND_DEPTH`), within ``out.items_left`` items; none where they would not all
    fit."""
    items = _items(value)
    if items is None or _is_plain_value(value):
        return
    if len(items) > out.items_left or depth >= MAX_EXPAND_DEPTH:
        if _has_array(value):
            logger.warning("%s holds arrays past the %d items and %d levels guarded one "
                           "by one: they are compiled in as they are now (pass them as "
                           "arguments to have them read at every call)", source,
                           MAX_CONTAINER_ITEMS, MAX_EXPAND_DEPTH)
        return
    out.items_left -= len(items)
    attribute = is_user_object(value)
    if not attribute and f"{source} keys" not in out.sources:
        shape = tuple(k for k, _ in items) if type(value) is dict else len(items)
        out.add(Guard(f"{source} keys", lambda: _shape_of(reader()), "value",
                      static_key(shape), _short(shape)))
    for key, item in items:
        item_source = f"{source}.{key}" if attribute else f"{source}[{key!r}]"
        if item_source in out.sources:
            continue
        item_reader = _item_reader(reader, key, attribute)
        out.add(_guard(item_source, item_reader, item, capture, out))
        _expand(item_source, item_reader, item, capture, out, depth + 1)


def _has_array(value: Any, depth: int = 0) -> bool:
    """Whether a container or user's object holds an array, a few levels down."""
    items = _items(value)
    if items is None or depth > 4:
        return False
    return any(_is_array(v) or _has_array(v, depth + 1) for _, v in items)


def _shape_of(value: Any) -> Any:
    """A container's keys (dict) or length (list, tuple); None for anything else."""
    if type(value) is dict:
        return tuple(value)
    if type(value) in (list, tuple):
        return len(value)
    return None


#: Modules whose functions draw random numbers: called while tracing, they would draw
#: once and the draw would be compiled in as a constant.
_RANDOM_MODULES = ("numpy.random", "cupy.random", "random")


def _draws_random(value: Any, attrs: tuple) -> bool:
    """Whether a load of ``value`` followed by attribute reads ``attrs`` reaches a random
    number generator: ``np.random.*``, Python's ``random``, a ``np.random.Generator`` or
    ``RandomState`` (or CuPy's), or a function of those modules."""
    values = [value]
    for a in attrs:
        try:
            values.append(getattr(values[-1], a))
        except Exception:
            break
    for v in values:
        if isinstance(v, types.ModuleType):
            name = v.__name__
        else:
            name = getattr(v, "__module__", None) or type(v).__module__ or ""
            if isinstance(v, types.FunctionType) or not isinstance(name, str):
                name = name if isinstance(name, str) else ""
        if any(name == m or name.startswith(m + ".") for m in _RANDOM_MODULES):
            return True
    return False


def _collect(fn: Any, capture: Callable[[Any], bool], out: Guards, visited: set[int],
             depth: int, prefix: str) -> None:
    method = fn if isinstance(fn, types.MethodType) else None
    if method is not None:
        fn = method.__func__
    code = getattr(fn, "__code__", None)
    if not isinstance(fn, types.FunctionType) or code is None or id(fn) in visited:
        return
    visited.add(id(fn))
    free = frozenset(code.co_freevars)
    self_name = code.co_varnames[0] if method is not None and code.co_argcount else None
    for kind, name, attrs in _paths(code, free, self_name):
        if kind == "global" and name not in fn.__globals__ and hasattr(builtins, name):
            continue  # a builtin (len, range, ...)
        owner = method if kind == "self" else fn
        read_root = _reader(owner, kind, name, ())
        try:
            root = read_root()
        except ValueError:  # an empty closure cell
            continue
        label = f"{prefix}{kind} {name}"
        if root is not _MISSING and _draws_random(root, attrs):
            raise RandomInTraceError(
                f"{getattr(fn, '__name__', 'the function')} draws random numbers "
                f"({label.split(' ', 1)[-1]}{''.join('.' + a for a in attrs)}): while "
                "tracing they would be drawn once and compiled in as a constant, the same "
                "at every call. Draw them outside the compiled function and pass them as "
                "an argument (a dropout mask, noise)")
        steps: list[tuple[str, tuple]] = [(label, ())]
        if root is not _MISSING and not _is_library(root):
            steps += [(f"{label}.{'.'.join(attrs[:k])}", attrs[:k])
                      for k in range(1, len(attrs) + 1)]
        for source, path in steps:
            if source in out.sources:
                continue
            reader = _reader(owner, kind, name, path)
            try:
                value = reader()
            except Exception:
                break
            out.add(_guard(source, reader, value, capture, out))
            if not _is_library(value):
                _expand(source, reader, value, capture, out)
            if isinstance(value, types.FunctionType) and not _is_library(value) \
                    and depth < _MAX_DEPTH:
                _collect(value, capture, out, visited, depth + 1, f"{source} -> ")


def _guard(source: str, reader: Callable[[], Any], value: Any,
           capture: Callable[[Any], bool], out: Guards) -> Guard:
    if value is _MISSING:
        return Guard(source, reader, "missing", None)
    if _is_array(value):
        if capture(value):
            name = source.split(" ", 1)[1] if " " in source else source
            out.captured[id(value)] = (name, value)
            out.readers[name] = reader
            return Guard(source, reader, "array", _array_key(value))
        return Guard(source, reader, "identity", value)
    if _is_plain_value(value):
        return Guard(source, reader, "value", static_key(value), _short(value))
    return Guard(source, reader, "identity", value)
