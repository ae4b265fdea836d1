"""What a compiled function's argument is: an array (NumPy or CuPy, by type), an
array-like or container the compiler refuses, or a static value and its cache key.

Arrays are plain ``np.ndarray``/``np.memmap`` and CuPy arrays; an ``ndarray`` subclass
with behaviour of its own (a masked array, ``np.matrix``) and other array-likes (a
pandas Series, a torch tensor) are refused rather than computed without their mask or
compiled in as constants, and so is a container or user's object holding arrays among
other values. A user's object without arrays (a config) is keyed by its attributes'
values, so that changing one re-traces.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import PycLabError
from .cache_keys import static_key
from .guards import is_user_object
from .tracer import is_array

__all__ = ["ARRAY_MODULE", "array_module", "holds_arrays", "static_argument_key"]


#: Argument type -> "numpy" or "cupy" for array types, "" for everything else: every call
#: looks its arguments up here (a dict lookup, where is_array and the module's name cost
#: a microsecond or so per argument on the warm path).
ARRAY_MODULE: dict[type, str] = {}


def holds_arrays(value: Any, depth: int = 0) -> bool:
    """Whether a dict, list or tuple (not of arrays only), or a user's object, holds an
    array somewhere within three levels."""
    if depth > 3:
        return False
    if type(value) is dict:
        items: Any = value.values()
    elif type(value) in (list, tuple):
        items = value
    elif is_user_object(value):
        items = vars(value).values()
    else:
        return False
    return any(is_array(v) or holds_arrays(v, depth + 1) for v in items)


def static_argument_key(value: Any) -> Any:
    """A static argument's key: a user's object (a config) by its type and attributes'
    values, so that changing one re-traces; anything else by :func:`static_key`."""
    if is_user_object(value):
        try:
            return ("object", type(value), static_key(dict(vars(value))))
        except RecursionError:
            return static_key(value)
    return static_key(value)


def array_module(value: Any) -> str:
    """``"numpy"``/``"cupy"`` for an array argument, ``""`` otherwise; remembered by type.

    A subclass of ``np.ndarray`` other than ``np.memmap`` (a masked array, ``np.matrix``,
    a unit-carrying quantity) is refused: it behaves otherwise than its values (a mask,
    ``*`` as a matrix product, units), which compiled code would silently drop.
    """
    kind = type(value)
    if isinstance(value, np.ndarray) and kind is not np.ndarray \
            and not isinstance(value, np.memmap):
        raise PycLabError(
            f"a {kind.__module__}.{kind.__name__} was passed: compiled functions take plain "
            "NumPy arrays (np.ndarray, np.memmap) and CuPy arrays; its own "
            "behaviour (a mask, matrix products, units) would be lost. Pass np.asarray(x) "
            "to compute on its values, or call the function uncompiled")
    module = ""
    if is_array(value):
        module = "cupy" if kind.__module__.startswith("cupy") else "numpy"
    if len(ARRAY_MODULE) < 256:  # types seen in a session: a handful
        ARRAY_MODULE[kind] = module
    return module
