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

Not guarded: values reached other than by name and attribute (``cfg["scale"]``,
``items[0]``), and attributes of objects whose module is a library's.
"""

from __future__ import annotations

import builtins
import dis
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cache_keys import static_key

__all__ = ["Guard", "Guards", "collect"]

_MISSING = object()
_LIBRARIES = ("numpy", "cupy", "cupyx", "pyc_lab", "math", "builtins", "scipy", "torch")
_MAX_DEPTH = 3
_VALUE_TYPES = (type(None), bool, int, float, complex, str, bytes, np.generic, np.dtype,
                slice, type(Ellipsis))


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


def _paths(code: types.CodeType, free: frozenset[str]) -> list[tuple[str, str, tuple]]:
    """``(kind, name, attributes)`` for every global/closure load of ``code`` and of the
    code nested in it; kind is ``"global"`` or ``"closure"``."""
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


def _reader(fn: types.FunctionType, kind: str, name: str, attrs: tuple) -> Callable[[], Any]:
    if kind == "closure":
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


def _collect(fn: Any, capture: Callable[[Any], bool], out: Guards, visited: set[int],
             depth: int, prefix: str) -> None:
    code = getattr(fn, "__code__", None)
    if not isinstance(fn, types.FunctionType) or code is None or id(fn) in visited:
        return
    visited.add(id(fn))
    free = frozenset(code.co_freevars)
    known = {g.source for g in out.guards}
    for kind, name, attrs in _paths(code, free):
        if kind == "global" and name not in fn.__globals__ and hasattr(builtins, name):
            continue  # a builtin (len, range, ...)
        read_root = _reader(fn, kind, name, ())
        try:
            root = read_root()
        except ValueError:  # an empty closure cell
            continue
        label = f"{prefix}{kind} {name}"
        steps: list[tuple[str, tuple]] = [(label, ())]
        if root is not _MISSING and not _is_library(root):
            steps += [(f"{label}.{'.'.join(attrs[:k])}", attrs[:k])
                      for k in range(1, len(attrs) + 1)]
        for source, path in steps:
            if source in known:
                continue
            known.add(source)
            reader = _reader(fn, kind, name, path)
            try:
                value = reader()
            except Exception:
                break
            out.guards.append(_guard(source, reader, value, capture, out))
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
