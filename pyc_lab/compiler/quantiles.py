"""``np.quantile`` and ``np.percentile`` as one op (``quantile``), NumPy's values on
either backend.

``q`` is known when the function is traced (a number or a sequence; its dtype kept, as
NumPy's promotion depends on it); the methods are those NumPy and CuPy both have:
linear, lower, higher, midpoint, nearest, inverted_cdf. On the numpy backend the op is
NumPy's own function, so its answers are NumPy's bit for bit. On the GPU:

- the selecting methods (lower, higher, nearest, inverted_cdf) are CuPy's — a selection
  computes nothing, so its values are NumPy's;
- the interpolating ones (linear, midpoint) sort with CuPy (CUB's radix sort, NaN last)
  and interpolate as NumPy's ``_lerp`` does, each step in the dtype NumPy's promotion
  gives it (``q`` a Python number is weak; an array ``q`` and the ``gamma`` derived
  from it keep their dtype), so that a float16 median of an even count rounds as
  NumPy's does (CuPy's own interpolation rounds it differently);
- a slice holding a NaN gives NaN (NumPy's rule) and the result has NumPy's dtype.

``q`` as a traced array, ``out=``, ``weights=``, the other methods and complex values
stay graph breaks (NumPy's own call). One difference, from a NumPy dtype that depends on
the values: a single quantile (a 0-d result) of values holding a NaN is, in NumPy, the
array's own NaN — float16 for float16 data even where ``q`` (a float32, say) gives every
other answer float32; pyc_lab's answer keeps the dtype of the others.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .function_parts import NotCovered
from .op_registry import REGISTRY, OpDef, normalize_axis, register
from .values import is_traced

if TYPE_CHECKING:
    from .proxy import Traced
    from .tracer import Tracer

__all__ = ["HANDLERS", "QUANTILE_METHODS", "interpolated"]

#: The quantile methods both NumPy and CuPy have.
QUANTILE_METHODS = ("linear", "lower", "higher", "midpoint", "nearest", "inverted_cdf")
#: The methods that interpolate between two sorted values (the others select one).
_INTERPOLATING = ("linear", "midpoint")


def _axes(attrs: dict[str, Any], ndim: int) -> tuple[int, ...]:
    axis = attrs["axis"]
    return tuple(range(ndim)) if axis is None else normalize_axis(axis, ndim)


def _q(attrs: dict[str, Any]) -> Any:
    """``q`` as the user passed it to NumPy: a number as it was (a Python float is
    weak in NumPy's promotion), a sequence as an array of its dtype."""
    q = attrs["q"]
    return q if np.ndim(q) == 0 else np.asarray(q, dtype=attrs.get("q_dtype"))


def _shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    shape = tuple(inputs[0].shape)
    axes = _axes(attrs, len(shape))
    kept = tuple(1 if k in axes else d for k, d in enumerate(shape)) if attrs["keepdims"] \
        else tuple(d for k, d in enumerate(shape) if k not in axes)
    return tuple(np.shape(attrs["q"])) + kept


def _dtype(inputs: Sequence[Any], attrs: dict[str, Any]) -> np.dtype:
    q = attrs["q"]
    scalar = q if np.ndim(q) == 0 else None
    return _result_dtype(np.dtype(inputs[0].dtype), scalar, type(scalar).__name__,
                         attrs.get("q_dtype"), attrs["method"], attrs["percentile"])


@functools.lru_cache(maxsize=256)
def _result_dtype(dtype: np.dtype, scalar: Any, scalar_type: str, q_dtype: str | None,
                  method: str, percentile: bool) -> np.dtype:
    """NumPy's result dtype for these arguments, from NumPy itself on a one-value probe
    (cached: the GPU reference asks at every call; ``scalar_type`` in the key, as
    ``0.5 == np.float64(0.5)`` but only the first is weak in NumPy's promotion)."""
    q = scalar if scalar is not None else np.zeros(1, dtype=q_dtype)
    fn = np.percentile if percentile else np.quantile
    return np.asarray(fn(np.ones(1, dtype=dtype), q, method=method)).dtype


def _fractions(q: Any, percentile: bool) -> Any:
    """``q`` as NumPy's quantile sees it: a percentile divided by 100 in NumPy's
    arithmetic (``np.true_divide(q, 100)``), a quantile as an array."""
    return np.true_divide(q, 100) if percentile else np.asanyarray(q)


def _positions(n: int, qs: np.ndarray, method: str) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray]:
    """The indices of the two sorted neighbours of each quantile and the interpolation
    weight ``gamma`` (in the dtype of NumPy's virtual indices), as NumPy's
    ``_quantile`` computes them for ``n`` values."""
    if method == "linear":
        virtual = np.asanyarray((n - 1) * qs)
    else:  # midpoint
        virtual = np.asanyarray(0.5 * (np.floor((n - 1) * qs) + np.ceil((n - 1) * qs)))
    previous = np.floor(virtual, out=...)
    following = np.add(previous, 1, out=...)
    above = virtual >= n - 1
    previous[above] = -1
    following[above] = -1
    below = virtual < 0
    previous[below] = 0
    following[below] = 0
    previous, following = previous.astype(np.intp), following.astype(np.intp)
    gamma = np.asanyarray(virtual - previous)
    if method == "midpoint":
        gamma = np.full(gamma.shape, 0.5)
        gamma[virtual % 1 == 0] = 0.0
    return previous, following, np.asanyarray(gamma, dtype=virtual.dtype)


def _lerp(xp: Any, a: Any, b: Any, t: Any) -> Any:
    """NumPy's ``_lerp(a, b, t)``: ``a + (b - a) * t``, or ``b - (b - a) * (1 - t)``
    where ``t >= 0.5``, each operation in the dtype NumPy's promotion gives it (``t`` a
    Python float is weak, an array's dtype is its own)."""
    diff = b - a
    t_dtype = np.result_type(diff.dtype, t)
    low = a.astype(np.result_type(a.dtype, t_dtype)) \
        + (diff.astype(t_dtype) * xp.asarray(t, dtype=t_dtype)).astype(
            np.result_type(a.dtype, t_dtype))
    one_minus = 1 - t
    u_dtype = np.result_type(diff.dtype, one_minus)
    high = b.astype(low.dtype) - (diff.astype(u_dtype)
                                   * xp.asarray(one_minus, dtype=u_dtype)).astype(low.dtype)
    upper = xp.asarray(np.asarray(t) >= 0.5)
    return xp.where(upper, high, low)


def interpolated(xp: Any, x: Any, attrs: dict[str, Any]) -> Any:
    """The quantiles of ``x`` by a linear or midpoint method, NumPy's values with array
    module ``xp``: sorted along the reduced axes (NaN last), the neighbours taken and
    interpolated as NumPy does; before NumPy's NaN rule and result dtype.

    Parameters
    ----------
    xp : module
        ``numpy`` or ``cupy``.
    x : array
        The values (real).
    attrs : dict
        The op's attributes (``q``, ``axis``, ``keepdims``, ``method``, ``percentile``).

    Returns
    -------
    array
        The quantiles, shaped as the op's result.
    """
    axes = _axes(attrs, x.ndim)
    kept = [k for k in range(x.ndim) if k not in axes]
    n = int(np.prod([x.shape[k] for k in axes], dtype=np.int64))
    rows = xp.transpose(x, kept + list(axes)).reshape([x.shape[k] for k in kept] + [n])
    ordered = xp.sort(rows, axis=-1)
    q = _q(attrs)
    weak = type(q) in (int, float)
    qs = _fractions(q, attrs["percentile"])
    if qs.dtype.kind in "iu" and attrs["method"] == "linear":
        virtual = (n - 1) * qs  # whole positions: NumPy takes the values as they are
        picked = xp.moveaxis(ordered[..., xp.asarray(virtual.reshape(-1))], -1, 0)
        return picked.reshape(_shape([x], attrs))
    previous, following, gamma = _positions(n, qs, attrs["method"])
    a = xp.moveaxis(ordered[..., xp.asarray(previous.reshape(-1))], -1, 0)
    b = xp.moveaxis(ordered[..., xp.asarray(following.reshape(-1))], -1, 0)
    a = a.reshape(previous.shape + a.shape[1:])
    b = b.reshape(previous.shape + b.shape[1:])
    t = float(gamma) if weak else gamma.reshape(gamma.shape + (1,) * (a.ndim - gamma.ndim))
    return _lerp(xp, a, b, t).reshape(_shape([x], attrs))


def _reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    (x,) = args
    fn = getattr(xp, "percentile" if attrs["percentile"] else "quantile")
    axis, keep = attrs["axis"], attrs["keepdims"]
    if xp is np:
        return fn(x, _q(attrs), axis=axis, method=attrs["method"], keepdims=keep)
    if attrs["method"] in _INTERPOLATING:
        out = interpolated(xp, x, attrs)
    else:
        out = fn(x, _q(attrs), axis=axis, method=attrs["method"], keepdims=keep)
    if x.dtype.kind == "f":  # NumPy's rule: a slice holding a NaN gives NaN
        out = xp.where(xp.isnan(x).any(axis=axis, keepdims=keep), xp.nan, out)
    return out.astype(_dtype([x], attrs), copy=False)


if "quantile" not in REGISTRY:
    register(OpDef("quantile", "scan", 1, _shape, _reference, dtype=_dtype,
                   doc="quantiles (or percentiles) along axes: NumPy's values"))


def _handler(percentile: bool) -> Callable:
    def handler(tracer: Tracer, a: Any, q: Any, axis: Any = None, out: Any = None,
                overwrite_input: bool = False, method: str = "linear", keepdims: bool = False,
                *, weights: Any = None, interpolation: Any = None) -> Traced:
        if out is not None or weights is not None or interpolation is not None \
                or is_traced(q) or method not in QUANTILE_METHODS:
            raise NotCovered  # NumPy's own call: a graph break
        x = tracer.lift(a)
        qs = np.asarray(q)
        if x.dtype.kind not in "biuf" or qs.dtype.kind not in "biuf" or qs.ndim > 1 \
                or x.size == 0:
            raise NotCovered  # NumPy's errors, complex values, empty slices
        bound = 100.0 if percentile else 1.0
        if not ((qs >= 0) & (qs <= bound)).all():
            raise NotCovered  # NumPy's ValueError, from the eager call
        if axis is not None and not isinstance(axis, (int, np.integer, tuple)):
            raise NotCovered
        if isinstance(axis, tuple):
            axis = tuple(int(k) for k in axis)
        elif axis is not None:
            axis = int(axis)
        attrs = {"q": q if np.ndim(q) == 0 else tuple(qs.tolist()), "axis": axis,
                 "keepdims": bool(keepdims), "method": method, "percentile": percentile}
        if np.ndim(q) != 0:
            attrs["q_dtype"] = qs.dtype.str  # NumPy's promotion follows it
        result = tracer.op("quantile", (x,), attrs)
        result._scalar = result.ndim == 0
        return result
    return handler


#: NumPy function -> handler (see :mod:`.array_functions`).
HANDLERS: dict[Callable, Callable] = {np.quantile: _handler(False),
                                      np.percentile: _handler(True)}
