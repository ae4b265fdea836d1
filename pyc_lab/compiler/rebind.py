"""Run a function with some of the objects it reads by name replaced.

An array a function reads from a global or a closure is an input of its graph (see
:mod:`.guards`), so while tracing the function must see that input's proxy wherever it
reads the array — in ``TABLE * x`` but also in ``TABLE[0]`` or ``TABLE.sum()``, which
would otherwise run on the real array, once, and freeze its values. :func:`rebind`
makes a copy of the function whose globals (a copied dict) and closure cells (new
cells) hold the replacements, and does the same for the Python functions it calls by
name, so nothing outside the trace is changed.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

__all__ = ["rebind"]

_LIBRARIES = ("numpy", "cupy", "cupyx", "pyc_lab", "math", "builtins", "scipy", "torch")
_MAX_DEPTH = 3


def _is_library(fn: Any) -> bool:
    mod = getattr(fn, "__module__", None) or ""
    return mod.split(".")[0] in _LIBRARIES


def rebind(fn: Callable, replace: dict[int, Any]) -> Callable:
    """A copy of ``fn`` reading ``replace[id(obj)]`` wherever it (or a function it calls
    by name, a few levels deep) reads ``obj`` from its globals or closure.

    Parameters
    ----------
    fn
        The function; anything but a plain Python function is returned as it is.
    replace
        ``id(original) -> replacement``.
    """
    if not replace or not isinstance(fn, types.FunctionType) \
            or not _reaches(fn, replace, set(), 0):
        return fn
    memo: dict[int, types.FunctionType] = {}
    return _clone(fn, replace, memo, 0)


def _reaches(fn: types.FunctionType, replace: dict[int, Any], seen: set[int],
             depth: int) -> bool:
    """Whether ``fn`` (or a function it calls by name, as deep as :func:`_clone` goes)
    reads one of the replaced objects: otherwise it is left as it is."""
    if id(fn) in seen:
        return False
    seen.add(id(fn))
    values = [fn.__globals__[n] for n in _names(fn.__code__) if n in fn.__globals__]
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    for value in values:
        if id(value) in replace:
            return True
        if isinstance(value, types.FunctionType) and not _is_library(value) \
                and depth < _MAX_DEPTH and _reaches(value, replace, seen, depth + 1):
            return True
    return False


def _clone(fn: types.FunctionType, replace: dict[int, Any],
           memo: dict[int, types.FunctionType], depth: int) -> types.FunctionType:
    if id(fn) in memo:
        return memo[id(fn)]
    scope = dict(fn.__globals__)
    cells = None
    if fn.__closure__ is not None:
        cells = tuple(_cell(c, replace, memo, depth) for c in fn.__closure__)
    new = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, cells)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__dict__.update(fn.__dict__)
    memo[id(fn)] = new
    for name in _names(fn.__code__):
        if name in scope:
            scope[name] = _value(scope[name], replace, memo, depth)
    return new


def _names(code: types.CodeType) -> set[str]:
    """Every name ``code`` and the code nested in it (lambdas, comprehensions) load."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _value(value: Any, replace: dict[int, Any], memo: dict[int, types.FunctionType],
           depth: int) -> Any:
    if id(value) in replace:
        return replace[id(value)]
    if isinstance(value, types.FunctionType) and not _is_library(value) \
            and depth < _MAX_DEPTH:
        return _clone(value, replace, memo, depth + 1)
    return value


def _cell(cell: Any, replace: dict[int, Any], memo: dict[int, types.FunctionType],
          depth: int) -> Any:
    try:
        contents = cell.cell_contents
    except ValueError:  # an empty cell (a name assigned later)
        return cell
    return types.CellType(_value(contents, replace, memo, depth))
