"""SciPy's Python-level special functions, traced as the NumPy operations they are.

``scipy.special.softmax``, ``log_softmax`` and ``logsumexp`` are Python functions that
turn their argument into a NumPy array first, which a traced array cannot become: called
inside a compiled function they would stop the trace. While a function is traced,
:func:`shims` makes it (and the functions it calls by name) see stand-ins instead —
the functions themselves, and the ``scipy`` and ``scipy.special`` modules with those
names replaced — that compute the same result with NumPy operations on the traced
values, SciPy's steps and dtypes (integers in float64; ``axis=None`` over every element;
a row's maximum taken out first, an infinite maximum replaced by 0). The compiler then
fuses them like the hand-written forms (``reduction_fusion`` and row fusion make a
softmax one kernel). On arrays that are not traced, the stand-ins call SciPy itself.
``logsumexp`` with weights (``b=``) or ``return_sign=True`` runs SciPy's own function as
a graph break.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np

from .values import is_traced

__all__ = ["shims"]


def _floating(x: Any) -> Any:
    """``x`` with SciPy's ``force_floating``: integers and bools in float64."""
    dtype = np.dtype(x.dtype)
    return x.astype(np.float64) if dtype.kind in "iub" else x


def _finite_max(x: Any, axis: Any) -> Any:
    m = np.max(x, axis=axis, keepdims=True)
    return np.where(np.isfinite(m), m, 0)


def _softmax(real: Any) -> Any:
    def softmax(x: Any, axis: Any = None) -> Any:
        if not is_traced(x):
            return real(x, axis=axis)
        shifted = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return shifted / np.sum(shifted, axis=axis, keepdims=True)

    softmax.__doc__ = real.__doc__
    return softmax


def _log_softmax(real: Any) -> Any:
    def log_softmax(x: Any, axis: Any = None) -> Any:
        if not is_traced(x):
            return real(x, axis=axis)
        tmp = x - _finite_max(x, axis)
        return tmp - np.log(np.sum(np.exp(tmp), axis=axis, keepdims=True))

    log_softmax.__doc__ = real.__doc__
    return log_softmax


def _logsumexp(real: Any) -> Any:
    def logsumexp(a: Any, axis: Any = None, b: Any = None, keepdims: bool = False,
                  return_sign: bool = False) -> Any:
        if not is_traced(a) and not is_traced(b):
            return real(a, axis=axis, b=b, keepdims=keepdims, return_sign=return_sign)
        if b is not None or return_sign:
            tracer = a.tracer if is_traced(a) else b.tracer
            return tracer.eager(real, (a,), {"axis": axis, "b": b, "keepdims": keepdims,
                                             "return_sign": return_sign},
                                "scipy.special.logsumexp with b= or return_sign=")
        a = _floating(a)
        if a.ndim == 0:
            a = a.reshape(1)
        m = _finite_max(a, axis)
        out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
        return out if keepdims else np.squeeze(out, axis=axis)

    logsumexp.__doc__ = real.__doc__
    return logsumexp


class _Module(types.ModuleType):
    """A module that answers a few names its own way and every other from ``real``."""

    def __init__(self, real: types.ModuleType, names: dict[str, Any]) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__.update(names)
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def shims() -> dict[int, Any]:
    """``id(object) -> stand-in`` for the SciPy functions and modules above, where SciPy
    is already imported (a function that uses it imported it); empty otherwise."""
    special = sys.modules.get("scipy.special")
    if special is None:
        return {}
    funcs = {name: make(getattr(special, name)) for name, make in
             (("softmax", _softmax), ("log_softmax", _log_softmax),
              ("logsumexp", _logsumexp)) if hasattr(special, name)}
    out: dict[int, Any] = {id(getattr(special, name)): f for name, f in funcs.items()}
    special_shim = _Module(special, funcs)
    out[id(special)] = special_shim
    scipy = sys.modules.get("scipy")
    if scipy is not None:
        out[id(scipy)] = _Module(scipy, {"special": special_shim})
    return out
