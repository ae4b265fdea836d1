"""What :func:`pyc_lab.matmul` refuses, with one clear :class:`PycLabError` each.

Operands that do not multiply, dtypes it does not compute in (integers, booleans,
complex, objects), operands of different array kinds, a bias that is not one value per
output column or cannot be added without changing the product's kind, an ``out`` of the
wrong shape or dtype, a scale that is not a real number. Every check runs before a
device is touched, on shapes and dtype names only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import PycLabError
from .arrays import BF16, FLOATS, dtype_name, kind, result_dtype

__all__ = ["DTYPES", "check_bias", "check_inputs", "result_shape"]

#: The element types ``matmul`` computes in; mixed operands promote as NumPy promotes
#: them (bfloat16 as torch does: with float16 or float32, float32).
DTYPES = FLOATS

_KIND_NAMES = {"cupy": "CuPy", "numpy": "NumPy", "torch": "torch"}


def _dtype_issue(x: Any, name: str) -> str:
    """Why ``x``'s dtype is not one ``matmul`` computes in (``""`` when it is)."""
    try:
        dname = dtype_name(x.dtype)
    except TypeError:
        dname = str(x.dtype)
    if dname in DTYPES:
        return ""
    return (f"matmul: {name} has dtype {dname}; pl.matmul computes in {', '.join(DTYPES)} "
            f"(mixed ones promote as in NumPy); cast it, e.g. {name}.astype(np.float32)")


def result_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``np.matmul`` of operands shaped ``a`` and ``b`` (checked to multiply)."""
    batch = np.broadcast_shapes(a[:-2], b[:-2])
    rows = a[-2:-1]
    cols = b[-1:] if len(b) >= 2 else ()
    return (*batch, *rows, *cols)


def _castable(src: str, dst: str) -> bool:
    """Whether a ``src`` value may be stored as ``dst`` within its kind (floats among
    themselves, bfloat16 included; integers and booleans into floats)."""
    if dst not in FLOATS:
        return False
    if src in FLOATS:
        return True
    return np.dtype(src).kind in "biu"


def check_inputs(a: Any, b: Any, out: Any, alpha: Any, beta: Any, bias: Any,
                 activation: str | None, activations: tuple[str, ...]) -> Any:
    """Refuse what ``matmul`` cannot compute correctly, with one clear error each.

    Parameters
    ----------
    a, b, out, alpha, beta, bias, activation
        ``matmul``'s arguments (torch tensors already viewed as CuPy or NumPy arrays).
    activations
        The activation names accepted.

    Returns
    -------
    bias
        The bias as a vector of one value per output column (``None`` when none), so
        that no path can broadcast it another way.
    """
    if activation is not None and activation not in activations:
        raise PycLabError(f"matmul activation must be None or one of {activations}, got "
                          f"{activation!r}")
    for name, x in (("a", a), ("b", b)):
        if not hasattr(x, "dtype") or not hasattr(x, "shape") or getattr(x, "ndim", 0) < 1:
            raise PycLabError(f"matmul takes arrays with at least one dimension; {name} is "
                              f"{type(x).__name__}")
    ka, kb = kind(a), kind(b)
    if ka != kb:
        raise PycLabError(f"matmul: a is a {_KIND_NAMES[ka]} array and b a {_KIND_NAMES[kb]} "
                          "one; give both on the same device (cupy.asarray or .get())")
    for name, x in (("a", a), ("b", b)):
        issue = _dtype_issue(x, name)
        if issue:
            raise PycLabError(issue)
    if a.shape[-1] != b.shape[0 if b.ndim == 1 else -2]:
        raise PycLabError(f"matmul: a {tuple(a.shape)} and b {tuple(b.shape)} do not "
                          "multiply (inner dimensions differ)")
    try:
        shape = result_shape(tuple(a.shape), tuple(b.shape))
    except ValueError:
        raise PycLabError(f"matmul: the batch dimensions of a {tuple(a.shape)} and b "
                          f"{tuple(b.shape)} do not broadcast") from None
    result = result_dtype(dtype_name(a.dtype), dtype_name(b.dtype))
    for name, value in (("alpha", alpha), ("beta", beta)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(
                value, (int, float, np.integer, np.floating)):
            raise PycLabError(f"matmul {name} must be a real number, got {value!r}")
    if out is not None:
        if not hasattr(out, "dtype") or tuple(getattr(out, "shape", ())) != shape or \
                kind(out) != ka:
            raise PycLabError(f"matmul: out must be a {_KIND_NAMES[ka]} array of shape "
                              f"{shape} (the product's), got {type(out).__name__} "
                              f"{tuple(getattr(out, 'shape', ()))}")
        if ka == "numpy" and not getattr(getattr(out, "flags", None), "writeable", True):
            raise PycLabError(f"matmul: out is read-only (a broadcast view or an array "
                              f"with writeable=False); give a writable array of shape {shape}")
        if not _castable(result, dtype_name(out.dtype)):
            raise PycLabError(f"matmul: out has dtype {dtype_name(out.dtype)}; the product "
                              f"is {result}, so out must be one of {', '.join(DTYPES)}")
    if bias is None:
        return None
    return check_bias(a, b, bias, result)


def check_bias(a: Any, b: Any, bias: Any, result: str) -> Any:
    """``bias`` as one value per output column, or a clear error."""
    if kind(bias) == "cupy" and kind(a) != "cupy":
        raise PycLabError(f"matmul: bias is a CuPy array but a and b are {_KIND_NAMES[kind(a)]}"
                          " arrays; give a bias of their kind (bias.get())")
    if not hasattr(bias, "dtype") or not hasattr(bias, "reshape"):
        bias = np.asarray(bias)
    columns = b.shape[-1] if b.ndim >= 2 else None
    if columns is None:
        raise PycLabError("matmul: a bias needs b with at least two dimensions (one value "
                          "per output column); b is a vector")
    try:
        dname = dtype_name(bias.dtype)
    except TypeError:
        dname = str(bias.dtype)
    ok = dname in FLOATS or _is_int(dname)
    if not ok or (dname != BF16 and result != BF16 and
                  not np.can_cast(np.dtype(dname), np.dtype(result), casting="same_kind")):
        raise PycLabError(f"matmul: bias has dtype {dname}, which cannot be added to a "
                          f"{result} product without changing its kind; give a real "
                          f"floating bias, e.g. bias.astype(np.{result})")
    shape = tuple(bias.shape)
    if not shape or shape[-1] != columns or int(np.prod(shape)) != columns:
        raise PycLabError(f"matmul: bias of shape {shape} for an output of {columns} "
                          f"columns; give one value per column, shape ({columns},)")
    return bias.reshape(-1)


def _is_int(name: str) -> bool:
    try:
        return np.dtype(name).kind in "biu"
    except TypeError:
        return False
