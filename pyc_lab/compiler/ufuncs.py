"""NumPy ufunc calls on traced arrays: operators, ``np.<ufunc>(...)``, ``out=``, ``dtype=``.

A ufunc with an op in the registry (:data:`~pyc_lab.compiler.ops.UFUNC_OPS`) becomes
that op; Python scalars and ``dtype=`` are resolved by NumPy's own rules
(:mod:`.scalars`), so the traced graph computes in the dtype NumPy computes in
(``np.add(a_int8, b_int8, dtype=np.float32)`` adds in float32). ``out=`` and the
in-place operators write through :mod:`.mutation` with NumPy's ``same_kind`` casting
check. ``x ** 2``, ``x ** -1`` and ``x ** 0.5`` are ``np.square``, ``np.reciprocal`` and
``np.sqrt`` exactly where NumPy's ``ndarray.__pow__`` takes that shortcut (so a bool
``x ** 2`` is int8, as in NumPy). A ufunc without an op is a graph break.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from . import mutation, reductions, scalars, scans
from .errors import UnsupportedOperationError
from .ops import UFUNC_OPS
from .values import is_traced

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .proxy import Traced
    from .tracer import Tracer

__all__ = ["apply", "array_ufunc", "matmul", "power_operator", "ufunc_named"]


def ufunc_named(name: str) -> np.ufunc:
    """The NumPy ufunc ``name`` (``clip`` is ``np._core.umath.clip``)."""
    fn = getattr(np, name, None)
    if isinstance(fn, np.ufunc):
        return fn
    return getattr(np._core.umath, name)


def _dtype_of(value: Any) -> np.dtype | None:
    return value.dtype if is_traced(value) else None


def apply(tracer: Tracer, name: str, operands: tuple[Any, ...], *, out: Any = None,
          dtype: Any = None, where: Any = True, casting: str = "same_kind",
          ufunc: np.ufunc | None = None) -> Any:
    """``np.<name>(*operands, out=out, dtype=dtype, where=where)`` on traced values.

    ``out`` is a tuple (or None); ``where`` only applies together with ``out``. ``ufunc``
    is the ufunc object when it is not NumPy's own (``scipy.special.erf``).
    """
    ufunc = ufunc if ufunc is not None else ufunc_named(name)
    what = f"np.{name}"
    op = UFUNC_OPS[name]
    result: Traced
    if dtype is not None or any(scalars.is_python_scalar(v) for v in operands):
        got = scalars.resolve(ufunc, operands, _dtype_of, dtype, what)
        if isinstance(got, scalars.ConstantComparison):
            arr = next(v for v in operands if not scalars.is_python_scalar(v))
            arr = tracer.lift(arr)
            # an integer array has no NaN: x == x is True everywhere, x != x False
            result = tracer.op("equal" if got.value else "not_equal", (arr, arr))
        else:
            ins = []
            for value, cast in zip(got.operands, got.casts, strict=True):
                if cast is not None:
                    value = tracer.op("astype", (tracer.lift(value),), {"dtype": cast})
                ins.append(value)
            result = tracer.op(op, tuple(ins))
            if dtype is not None and result.dtype != np.dtype(dtype):
                result = tracer.op("astype", (result,), {"dtype": np.dtype(dtype)})
    else:
        result = tracer.op(op, operands)
    result._scalar = result.ndim == 0  # NumPy unwraps a 0-d ufunc result (without out=)
    return _store(tracer, result, out, where, casting, what)


def _store(tracer: Tracer, result: Traced, out: Any, where: Any, casting: str,
           what: str) -> Any:
    """Write ``result`` into ``out`` (a tuple of one target, or None)."""
    targets = _targets(out)
    if not targets:
        return result
    mask = None if where is True else tracer.lift(where)
    if mask is not None and mask.dtype != np.dtype(bool):
        mask = tracer.op("astype", (mask,), {"dtype": np.dtype(bool)})
    (target,) = targets
    return mutation.write(tracer, target, None, result, casting=casting,
                          what=f"{what}(..., out=x)", mask=mask)


def _targets(out: Any) -> tuple[Any, ...]:
    if out is None:
        return ()
    if not isinstance(out, tuple):
        out = (out,)
    return tuple(o for o in out if o is not None)


def power_operator(tracer: Tracer, x: Traced, exponent: Any, inplace: bool = False) -> Any:
    """``x ** exponent`` as ``ndarray.__pow__`` computes it.

    Arrays take NumPy's fast paths (``** 2`` is ``np.square``, which keeps a bool array's
    result int8); a NumPy scalar (the 0-d result of a reduction or a ufunc) has none and
    goes through ``np.power`` (``np.True_ ** 2`` is int64).
    """
    name = "power"
    operands: tuple[Any, ...] = (x, exponent)
    floating = x.dtype.kind in "fc"
    if getattr(x, "_scalar", False):
        pass
    elif type(exponent) is int and exponent == 2:
        name, operands = "square", (x,)
    elif type(exponent) is int and exponent == -1 and floating:
        name, operands = "reciprocal", (x,)
    elif type(exponent) is float and exponent == 0.5 and floating:
        name, operands = "sqrt", (x,)
    return apply(tracer, name, operands, out=(x,) if inplace else None)


def matmul(tracer: Tracer, a: Any, b: Any, out: Any = None) -> Any:
    """``a @ b`` (``out``: ``a @= b``)."""
    result = tracer.op("matmul", (a, b))
    result._scalar = result.ndim == 0
    if out is None:
        return result
    return mutation.write(tracer, out, None, result, casting="same_kind", what="a @= b")


#: ``np.<ufunc>.reduce`` as the reduction it is.
_REDUCE_OPS = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min",
               "logical_and": "all", "logical_or": "any"}
#: Keywords those reductions take (``dtype`` too, for ``add`` and ``multiply``).
_REDUCE_KEYWORDS = frozenset({"axis", "keepdims", "initial", "where"})


def _ufunc_at(base: Any, indices: Any, *operand: Any, ufunc: str) -> Any:
    """``np.<ufunc>.at`` applied to a copy of ``base``: NumPy's for NumPy arrays;
    for CuPy arrays ``cupyx.scatter_add`` (CuPy's documented twin of ``np.add.at``) or
    CuPy's own through the array protocol, and where CuPy takes neither (a dtype its
    atomics lack, int64 say) NumPy's on a host copy, with a warning."""
    out = base.copy()
    if not type(out).__module__.startswith("cupy"):
        getattr(np, ufunc).at(out, indices, *operand)
        return out
    try:
        if ufunc == "add":
            import cupyx

            cupyx.scatter_add(out, indices, *operand)
        else:
            getattr(np, ufunc).at(out, indices, *operand)
        return out
    except Exception as exc:  # any refusal of CuPy's: NumPy's on the host
        import cupy

        log.warning("np.%s.at on %s arrays: CuPy refused (%s); computing it with NumPy on "
                    "a host copy", ufunc, out.dtype, exc)

        def host(v: Any) -> Any:
            if isinstance(v, tuple):
                return tuple(host(e) for e in v)
            return cupy.asnumpy(v) if isinstance(v, cupy.ndarray) else v

        result = cupy.asnumpy(base).copy()
        getattr(np, ufunc).at(result, host(indices), *(host(v) for v in operand))
        return cupy.asarray(result)


def _at(tracer: Tracer, name: str, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``np.<ufunc>.at(a, indices[, b])`` into a traced ``a``: a graph break computing the
    written array (repeated indices accumulate, as in NumPy), then a write of all of
    ``a`` — so later reads of ``a`` and of its views see it, and a written input is
    copied back to the caller as any other write is."""
    if kwargs or len(inputs) not in (2, 3) or not is_traced(inputs[0]):
        raise UnsupportedOperationError(
            f"np.{name}.at writes into its first argument, which here is a NumPy array "
            "pyc_lab does not trace (one made inside the function by np.zeros(...), say): "
            "make it from an argument instead (np.zeros_like(x, shape=...)), or compute "
            "the result as a new array")
    new = tracer.eager(_ufunc_at, tuple(inputs), {"ufunc": name},
                       f"np.{name}.at (a write at repeated indices) is not compiled")
    mutation.write(tracer, inputs[0], None, new, casting="unsafe", what=f"np.{name}.at(...)")


def array_ufunc(tracer: Tracer, ufunc: np.ufunc, method: str, inputs: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    """What ``Traced.__array_ufunc__`` returns."""
    name = ufunc.__name__
    if method == "at":
        return _at(tracer, name, inputs, kwargs)
    kwargs = dict(kwargs)
    out = kwargs.pop("out", None)
    if method == "reduce" and name in _REDUCE_OPS and len(inputs) == 1 and not _targets(out) \
            and set(kwargs) <= _REDUCE_KEYWORDS | (
                {"dtype"} if name in ("add", "multiply") else set()):
        # np.add.reduce(x) is np.sum(x, axis=0): the reduction with the ufunc's axis default
        return reductions.reduce(tracer, _REDUCE_OPS[name], inputs[0],
                                 axis=kwargs.pop("axis", 0), **kwargs)
    if method == "accumulate" and name in ("add", "multiply") and len(inputs) == 1 \
            and is_traced(inputs[0]) and inputs[0].dtype.kind in "biuf" \
            and not _targets(out) and set(kwargs) <= {"axis", "dtype"} \
            and isinstance(kwargs.get("axis", 0), (int, np.integer)):
        # np.add.accumulate(x) is np.cumsum(x, axis=0): the same dtype rule (small
        # integers and booleans accumulate in the platform integer) and the same steps
        return scans.HANDLERS[np.cumsum if name == "add" else np.cumprod](
            tracer, inputs[0], axis=int(kwargs.get("axis", 0)), dtype=kwargs.get("dtype"))
    if name == "conjugate" and method == "__call__" and len(inputs) == 1 and not kwargs \
            and not _targets(out) and is_traced(inputs[0]) and inputs[0].dtype.kind in "biuf":
        # of a real array: a copy in the dtype of NumPy's loop (booleans: int8)
        x = inputs[0]
        dtype = np.conjugate(np.empty(0, dtype=x.dtype)).dtype
        return tracer.op("copy", (x,)) if dtype == x.dtype else \
            tracer.op("astype", (x,), {"dtype": dtype})
    if method == "outer" and len(inputs) == 2 and not kwargs and not _targets(out) \
            and name in UFUNC_OPS and not any(scalars.is_python_scalar(v) for v in inputs):
        # np.add.outer(a, b) is a's axes then b's: a broadcast of the ufunc
        a, b = (tracer.lift(v) for v in inputs)
        return apply(tracer, name, (a.reshape(tuple(a.shape) + (1,) * b.ndim), b),
                     ufunc=ufunc)
    if method != "__call__":
        if _targets(out):
            raise UnsupportedOperationError(
                f"np.{name}.{method} with out= is not traced; assign the result instead")
        return tracer.eager(getattr(ufunc, method), inputs, kwargs,
                            f"np.{name}.{method} is not compiled")
    where = kwargs.pop("where", True)
    dtype = kwargs.pop("dtype", None)
    casting = kwargs.pop("casting", "same_kind")
    kwargs.pop("order", None)
    kwargs.pop("subok", None)
    if name == "matmul" and not kwargs and where is True and dtype is None:
        targets = _targets(out)
        return matmul(tracer, *inputs, out=targets[0] if targets else None)
    if name == "divmod" and not kwargs and where is True and not _targets(out):
        return (apply(tracer, "floor_divide", inputs, dtype=dtype),
                apply(tracer, "remainder", inputs, dtype=dtype))
    if kwargs or name not in UFUNC_OPS or (where is not True and not _targets(out)):
        extra = sorted(kwargs) + (["where"] if where is not True else [])
        reason = (f"np.{name} has no op in pyc_lab's registry" if name not in UFUNC_OPS
                  else f"np.{name} with {', '.join(extra)} is not compiled")
        call = dict(kwargs)
        if dtype is not None:
            call["dtype"] = dtype
        if where is not True and not _targets(out):
            call["where"] = where
        result = tracer.eager(ufunc, inputs, call, reason)
        if _targets(out):
            return _store(tracer, result, out, where, casting, f"np.{name}")
        return result
    return apply(tracer, name, inputs, out=out, dtype=dtype, where=where, casting=casting,
                 ufunc=ufunc)
