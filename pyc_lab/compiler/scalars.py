"""Python scalars and ``dtype=`` in traced ufunc calls, resolved exactly as NumPy 2 does.

Under NEP 50 a Python ``int``/``float``/``complex`` operand is *weak*: the ufunc loop is
chosen from the array operands, and the scalar is converted to that loop's dtype — so
``x_int32 * 1.0`` is float64, ``x_float16 + 1.0`` stays float16, ``x_uint8 / -3``
computes in float64, and ``x_uint8 + 300`` raises ``OverflowError``. Comparisons are the
exception: ``x_uint8 < 300`` is simply True everywhere (NumPy 2 compares with the
mathematical value). A Python ``bool`` is NumPy's bool.

:func:`resolve` asks NumPy itself — ``ufunc.resolve_dtypes`` for the loop, and one call
of the ufunc on one-element arrays for the errors NumPy raises — and returns the
operands as the graph should hold them: Python scalars as 0-d constants of the loop's
dtype, traced operands cast to the loop's dtype when ``dtype=`` asks for a computation
in another dtype. A constant typed that way promotes exactly as the weak scalar did.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import CastingError, ScalarOverflowError

__all__ = ["ConstantComparison", "Resolved", "is_python_scalar", "resolve", "typed_constant",
           "where_constant"]

_COMPARISONS = frozenset({"less", "less_equal", "greater", "greater_equal", "equal",
                          "not_equal"})


def is_python_scalar(value: Any) -> bool:
    """A Python ``bool``/``int``/``float``/``complex`` (not a NumPy scalar, which is typed)."""
    return isinstance(value, (bool, int, float, complex)) and not isinstance(value, np.generic)


@dataclass(frozen=True)
class ConstantComparison:
    """A comparison whose answer does not depend on the array: an integer array against a
    Python integer outside its dtype's range (``x_uint8 == -1`` is False everywhere)."""

    value: bool


@dataclass(frozen=True)
class Resolved:
    """Operands ready for the graph and the dtype each array operand is computed in.

    ``casts[k]`` is the dtype array operand ``k`` must be cast to first (``dtype=`` only),
    or None.
    """

    operands: tuple[Any, ...]
    casts: tuple[np.dtype | None, ...]


def _descriptor(value: Any, dtype_of: Any) -> Any:
    """What ``ufunc.resolve_dtypes`` takes for an operand: a dtype, or the Python type of
    a weak scalar."""
    if is_python_scalar(value):
        return np.dtype(bool) if isinstance(value, bool) else type(value)
    if dtype_of(value) is not None:
        return dtype_of(value)
    return np.asarray(value).dtype


def _probe(value: Any, dtype_of: Any) -> Any:
    """A one-element stand-in for ``value`` (Python scalars stay as they are)."""
    if is_python_scalar(value):
        return value
    dt = dtype_of(value)
    return np.ones(1, dtype=np.asarray(value).dtype if dt is None else dt)


def _numpy_call(ufunc: np.ufunc, probes: list[Any], dtype: Any, what: str) -> Any:
    """Call the ufunc as NumPy would be called; re-raise its errors as ours."""
    kwargs = {} if dtype is None else {"dtype": dtype}
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ufunc(*probes, **kwargs)
    except OverflowError as exc:
        raise ScalarOverflowError(
            f"{what}: {exc} (NumPy raises OverflowError here too); cast the array to a "
            "wider dtype first, e.g. x.astype(np.int64)") from None
    except TypeError as exc:
        raise CastingError(f"{what}: NumPy refuses these operands: {exc}") from None


def resolve(ufunc: np.ufunc, operands: Sequence[Any], dtype_of: Any, dtype: Any = None,
            what: str = "") -> Resolved | ConstantComparison:
    """Resolve a ufunc call with Python scalars and/or ``dtype=`` as NumPy 2 does.

    Parameters
    ----------
    ufunc
        The NumPy ufunc whose semantics the op has.
    operands
        The call's inputs: traced arrays, NumPy arrays or scalars, Python scalars.
    dtype_of
        ``dtype_of(value)``: the dtype of a traced operand, None for anything else.
    dtype
        The call's ``dtype=`` (the dtype NumPy computes in), or None.
    what
        The expression, for error messages.

    Returns
    -------
    Resolved or ConstantComparison

    Raises
    ------
    ScalarOverflowError
        NumPy raises ``OverflowError`` for this expression (``x_uint8 + 300``).
    CastingError
        No loop takes these dtypes, or ``dtype=`` asks for a cast NumPy refuses.
    """
    what = what or f"np.{ufunc.__name__}"
    dtype = None if dtype is None else np.dtype(dtype)
    descr = tuple(_descriptor(v, dtype_of) for v in operands)
    kwargs = {} if dtype is None else {"signature": (None,) * ufunc.nin + (dtype,) * ufunc.nout}
    try:
        loop = ufunc.resolve_dtypes(descr + (None,) * ufunc.nout, **kwargs)
    except TypeError as exc:
        raise CastingError(f"{what}: NumPy has no loop for these operands: {exc}") from None
    result = _numpy_call(ufunc, [_probe(v, dtype_of) for v in operands], dtype, what)
    out: list[Any] = []
    casts: list[np.dtype | None] = []
    for value, loop_dt in zip(operands, loop[:ufunc.nin], strict=True):
        if not is_python_scalar(value):
            out.append(value)
            own = dtype_of(value)
            casts.append(np.dtype(loop_dt) if dtype is not None and own is not None
                         and own != loop_dt else None)
            continue
        try:
            out.append(typed_constant(value, loop_dt))
        except ScalarOverflowError:
            if ufunc.__name__ in _COMPARISONS:
                # NumPy 2 compares with the mathematical value: one answer everywhere
                return ConstantComparison(bool(np.asarray(result).reshape(-1)[0]))
            raise
        casts.append(None)
    return Resolved(tuple(out), tuple(casts))


def typed_constant(value: Any, dtype: Any) -> np.ndarray:
    """``value`` as a 0-d array of ``dtype``, converted as NumPy converts a weak scalar.

    A float too large for a float16/float32 loop becomes ``inf`` (as in NumPy); an
    integer outside an integer dtype's range raises :class:`ScalarOverflowError`.
    """
    dtype = np.dtype(dtype)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.asarray(value, dtype=dtype)
    except OverflowError as exc:
        raise ScalarOverflowError(f"Python scalar {value!r} does not fit {dtype.name}: {exc}") \
            from None


def where_constant(value: Any, other: Any) -> np.ndarray:
    """A Python scalar branch of ``np.where`` as NumPy converts it.

    ``other`` is the other branch: a dtype, or a Python scalar. The scalar becomes a 0-d
    array of the branches' result dtype, converted as ``np.where`` converts it (``-1``
    beside a uint8 branch is 255; an integer too large for any dtype raises
    :class:`ScalarOverflowError`, as in NumPy).
    """
    probe = other if is_python_scalar(other) else np.ones(1, dtype=other)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = np.where(np.zeros(1, dtype=bool), probe, value)
    except OverflowError as exc:
        raise ScalarOverflowError(f"np.where with {value!r}: {exc} (NumPy raises "
                                  "OverflowError here too)") from None
    return np.asarray(got).reshape(())
