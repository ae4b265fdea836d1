"""The proxy array a function sees while it is traced: :class:`Traced`.

A :class:`Traced` stands for one array value of the function. Its operators, methods
and NumPy protocol hooks record ops into the tracer's graph instead of computing.
Everything follows NumPy's semantics for the same expression:

- operators and ``np.<ufunc>`` calls go through :mod:`.ufuncs` (NEP 50 scalars,
  ``dtype=``, ``out=``; ``x ** 2`` is ``np.square`` as in NumPy);
- reductions take NumPy's signatures exactly (:mod:`.reductions`);
- in-place operators, item assignment and ``out=`` write *functionally*
  (:mod:`.mutation`): the proxy is rebound to the written value, views of the same
  memory are rebound too, and a written function argument is copied back into the
  caller's array after every call, as NumPy would have changed it;
- other ``ndarray`` methods map to the NumPy function of the same name (a graph break
  when pyc_lab has no op for it); methods that would need the values in Python
  (``item``, ``tolist``, ``bool(x)``) raise :class:`TraceError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from . import array_functions, mutation, reductions, scalars, ufuncs
from .errors import TraceError, UnsupportedOperationError
from .ops import normalize_axis

if TYPE_CHECKING:
    from .tracer import Tracer

__all__ = ["Traced"]

_NOVALUE: Any = np._NoValue

#: ndarray methods that write into the array, and what to write instead.
_INPLACE_METHODS = {
    "put": "x[indices] = values",
    "resize": "np.resize(x, shape) (a new array)",
    "itemset": "x[index] = value",
    "setfield": "a new array",
    "partition": "x = np.partition(x, kth)",
    "byteswap": "x.byteswap() outside the compiled function",
    "setflags": "nothing: flags have no meaning inside a compiled function",
}
#: ndarray methods that need the values in Python.
_CONCRETE_METHODS = frozenset({"item", "tolist", "tobytes", "tofile", "dump", "dumps",
                               "__array_interface__", "ctypes", "data"})


class Traced:
    """A stand-in for an array while a function is traced."""

    __array_priority__ = 1000
    __pyc_traced__ = True  # see values.is_traced

    def __init__(self, tracer: Tracer, node_id: int) -> None:
        self.tracer = tracer
        self.node_id = node_id
        #: whose memory this value is a view of (see :mod:`.mutation`), if anyone's
        self._memory: mutation.View | None = None
        #: the proxies viewing this array's memory (weak references)
        self._views: list[Any] = []
        #: why the value may no longer be read (an opaque view whose base was written)
        self._stale: str | None = None
        #: a strided stand-in with this value's layout (see :func:`mutation.layout_of`)
        self._layout: np.ndarray | None = None
        #: whether NumPy's value here is a scalar (``np.float64``), not a 0-d array: a
        #: 0-d ufunc or reduction result, a full integer index. Scalars are immutable:
        #: ``s += 1`` rebinds, ``s[...] = 1`` is a TypeError, as in NumPy.
        self._scalar = False

    # -- array attributes ----------------------------------------------------------------
    @property
    def node(self) -> Any:
        return self.tracer.graph.nodes[self.node_id]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> np.dtype:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def T(self) -> Traced:
        return self.transpose()

    @property
    def mT(self) -> Traced:
        if self.ndim < 2:
            raise ValueError("matrix transpose with ndim < 2 is undefined")
        return self.swapaxes(-1, -2)

    def __repr__(self) -> str:
        return f"Traced(%{self.node_id}: {self.node.type_text})"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Iterator[Traced]:
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    # -- no data-dependent control flow --------------------------------------------------
    def _concrete(self, what: str) -> TraceError:
        return TraceError(
            f"{what} of a traced array: the function's control flow depends on array "
            "values, which pyc_lab cannot trace. Use np.where(...) instead of if/else on "
            "values, or call the function without pyc_lab.compile"
        )

    def __bool__(self) -> bool:
        raise self._concrete("bool()")

    def __float__(self) -> float:
        raise self._concrete("float()")

    def __int__(self) -> int:
        raise self._concrete("int()")

    def __complex__(self) -> complex:
        raise self._concrete("complex()")

    def __index__(self) -> int:
        raise self._concrete("using as an index")

    # -- operators ----------------------------------------------------------------------
    def _ufunc(self, name: str, *operands: Any) -> Any:
        return ufuncs.apply(self.tracer, name, operands)

    def __add__(self, o: Any) -> Any: return self._ufunc("add", self, o)
    def __radd__(self, o: Any) -> Any: return self._ufunc("add", o, self)
    def __sub__(self, o: Any) -> Any: return self._ufunc("subtract", self, o)
    def __rsub__(self, o: Any) -> Any: return self._ufunc("subtract", o, self)
    def __mul__(self, o: Any) -> Any: return self._ufunc("multiply", self, o)
    def __rmul__(self, o: Any) -> Any: return self._ufunc("multiply", o, self)
    def __truediv__(self, o: Any) -> Any: return self._ufunc("divide", self, o)
    def __rtruediv__(self, o: Any) -> Any: return self._ufunc("divide", o, self)
    def __floordiv__(self, o: Any) -> Any: return self._ufunc("floor_divide", self, o)
    def __rfloordiv__(self, o: Any) -> Any: return self._ufunc("floor_divide", o, self)
    def __mod__(self, o: Any) -> Any: return self._ufunc("remainder", self, o)
    def __rmod__(self, o: Any) -> Any: return self._ufunc("remainder", o, self)
    def __divmod__(self, o: Any) -> Any: return (self // o, self % o)
    def __rdivmod__(self, o: Any) -> Any: return (o // self, o % self)
    def __pow__(self, o: Any) -> Any: return ufuncs.power_operator(self.tracer, self, o)
    def __rpow__(self, o: Any) -> Any: return self._ufunc("power", o, self)
    def __matmul__(self, o: Any) -> Any: return ufuncs.matmul(self.tracer, self, o)
    def __rmatmul__(self, o: Any) -> Any: return ufuncs.matmul(self.tracer, o, self)
    def __and__(self, o: Any) -> Any: return self._ufunc("bitwise_and", self, o)
    def __rand__(self, o: Any) -> Any: return self._ufunc("bitwise_and", o, self)
    def __or__(self, o: Any) -> Any: return self._ufunc("bitwise_or", self, o)
    def __ror__(self, o: Any) -> Any: return self._ufunc("bitwise_or", o, self)
    def __xor__(self, o: Any) -> Any: return self._ufunc("bitwise_xor", self, o)
    def __rxor__(self, o: Any) -> Any: return self._ufunc("bitwise_xor", o, self)
    def __lshift__(self, o: Any) -> Any: return self._ufunc("left_shift", self, o)
    def __rlshift__(self, o: Any) -> Any: return self._ufunc("left_shift", o, self)
    def __rshift__(self, o: Any) -> Any: return self._ufunc("right_shift", self, o)
    def __rrshift__(self, o: Any) -> Any: return self._ufunc("right_shift", o, self)
    def __lt__(self, o: Any) -> Any: return self._ufunc("less", self, o)
    def __le__(self, o: Any) -> Any: return self._ufunc("less_equal", self, o)
    def __gt__(self, o: Any) -> Any: return self._ufunc("greater", self, o)
    def __ge__(self, o: Any) -> Any: return self._ufunc("greater_equal", self, o)
    def __eq__(self, o: Any) -> Any: return self._ufunc("equal", self, o)  # type: ignore[override]
    def __ne__(self, o: Any) -> Any: return self._ufunc("not_equal", self, o)  # type: ignore[override]
    def __neg__(self) -> Any: return self._ufunc("negative", self)
    def __pos__(self) -> Any: return self._ufunc("positive", self)
    def __abs__(self) -> Any: return self._ufunc("absolute", self)
    def __invert__(self) -> Any: return self._ufunc("invert", self)

    # in place: NumPy's ``np.<ufunc>(x, o, out=x)`` (a scalar has no in-place operators)
    def _inplace(self, name: str, o: Any) -> Traced:
        if self._scalar:
            return self._ufunc(name, self, o)
        return ufuncs.apply(self.tracer, name, (self, o), out=(self,))

    def __iadd__(self, o: Any) -> Traced: return self._inplace("add", o)
    def __isub__(self, o: Any) -> Traced: return self._inplace("subtract", o)
    def __imul__(self, o: Any) -> Traced: return self._inplace("multiply", o)
    def __itruediv__(self, o: Any) -> Traced: return self._inplace("divide", o)
    def __ifloordiv__(self, o: Any) -> Traced: return self._inplace("floor_divide", o)
    def __imod__(self, o: Any) -> Traced: return self._inplace("remainder", o)
    def __iand__(self, o: Any) -> Traced: return self._inplace("bitwise_and", o)
    def __ior__(self, o: Any) -> Traced: return self._inplace("bitwise_or", o)
    def __ixor__(self, o: Any) -> Traced: return self._inplace("bitwise_xor", o)
    def __ilshift__(self, o: Any) -> Traced: return self._inplace("left_shift", o)
    def __irshift__(self, o: Any) -> Traced: return self._inplace("right_shift", o)

    def __ipow__(self, o: Any) -> Traced:
        return ufuncs.power_operator(self.tracer, self, o, inplace=not self._scalar)

    def __imatmul__(self, o: Any) -> Traced:
        return ufuncs.matmul(self.tracer, self, o, out=None if self._scalar else self)

    __hash__ = object.__hash__

    # -- indexing -------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> Traced:
        return mutation.getitem(self.tracer, self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        mutation.setitem(self.tracer, self, index, value)

    # -- shape methods --------------------------------------------------------------------
    def reshape(self, *shape: Any, order: str = "C", copy: bool | None = None) -> Traced:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if order != "C":
            return self.tracer.eager(lambda x: x.reshape(shape, order=order), (self,), {},
                                     f"reshape with order={order!r}")
        return mutation.view_op(self.tracer, self, "reshape",
                                {"shape": tuple(int(d) for d in shape)}, copy=copy)

    def transpose(self, *axes: Any) -> Traced:
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = tuple(axes[0] or ())
        axes = tuple(axes) if axes else tuple(reversed(range(self.ndim)))
        if len(axes) != self.ndim:
            raise ValueError("axes don't match array")
        axes = tuple(normalize_axis(a, self.ndim)[0] for a in axes)
        return mutation.view_op(self.tracer, self, "transpose", {"axes": axes})

    def swapaxes(self, axis1: int, axis2: int) -> Traced:
        axes = list(range(self.ndim))
        i, j = normalize_axis(axis1, self.ndim)[0], normalize_axis(axis2, self.ndim)[0]
        axes[i], axes[j] = axes[j], axes[i]
        return self.transpose(tuple(axes))

    def squeeze(self, axis: Any = None) -> Traced:
        if axis is None:
            axis = tuple(i for i, d in enumerate(self.shape) if d == 1)
        return mutation.view_op(self.tracer, self, "squeeze",
                                {"axis": normalize_axis(axis, self.ndim)})

    def ravel(self, order: str = "C") -> Traced:
        if order not in ("C", "A", "K"):
            return self.tracer.eager(lambda x: x.ravel(order=order), (self,), {},
                                     f"ravel with order={order!r}")
        return self.reshape(-1)

    def flatten(self, order: str = "C") -> Traced:
        if order not in ("C", "A", "K"):
            return self.tracer.eager(lambda x: x.flatten(order=order), (self,), {},
                                     f"flatten with order={order!r}")
        return self.tracer.op("copy", (self.reshape(-1),))

    def copy(self, order: str = "C") -> Traced:
        out = self.tracer.op("copy", (self,))
        out._scalar = self._scalar
        return out

    def __copy__(self) -> Traced:
        return self.copy()

    def __deepcopy__(self, memo: Any) -> Traced:
        return self.copy()

    def astype(self, dtype: Any, order: str = "K", casting: str = "unsafe",
               subok: bool = True, copy: bool = True) -> Traced:
        return array_functions.astype(self.tracer, self, dtype, casting=casting, copy=copy)

    def view(self, *args: Any, **kwargs: Any) -> Any:
        raise UnsupportedOperationError(
            "x.view(...) reinterprets memory, which a compiled function does not have; "
            "use x.astype(dtype) for a conversion, or call the function without "
            "pyc_lab.compile")

    def fill(self, value: Any) -> None:
        if self._scalar:  # NumPy's scalar.fill converts the value, then does nothing
            if scalars.is_python_scalar(value):
                scalars.typed_constant(value, self.dtype)  # raises where NumPy raises
            return
        mutation.setitem(self.tracer, self, Ellipsis, value)

    def sort(self, axis: int = -1, kind: Any = None, order: Any = None) -> None:
        mutation.setitem(self.tracer, self, Ellipsis,
                         np.sort(self, axis=axis, kind=kind, order=order))

    def clip(self, min: Any = _NOVALUE, max: Any = _NOVALUE, out: Any = None,
             **kwargs: Any) -> Any:
        return array_functions.clip(self.tracer, self, min, max, out, **kwargs)

    def dot(self, b: Any, out: Any = None) -> Any:
        return np.dot(self, b, out=out)

    def conjugate(self) -> Any:
        """NumPy's ``x.conjugate()``: a real array is returned itself (the ufunc
        ``np.conjugate`` makes a copy, of booleans in int8)."""
        return self if self.dtype.kind != "c" else np.conjugate(self)

    conj = conjugate

    # -- reductions (NumPy's ndarray method signatures, positional order included) --------
    def sum(self, axis: Any = None, dtype: Any = None, out: Any = None,
            keepdims: Any = False, initial: Any = _NOVALUE, where: Any = True) -> Any:
        return reductions.reduce(self.tracer, "sum", self, axis=axis, dtype=dtype, out=out,
                                 keepdims=keepdims, initial=initial, where=where)

    def prod(self, axis: Any = None, dtype: Any = None, out: Any = None,
             keepdims: Any = False, initial: Any = _NOVALUE, where: Any = True) -> Any:
        return reductions.reduce(self.tracer, "prod", self, axis=axis, dtype=dtype, out=out,
                                 keepdims=keepdims, initial=initial, where=where)

    def mean(self, axis: Any = None, dtype: Any = None, out: Any = None,
             keepdims: Any = False, *, where: Any = True) -> Any:
        return reductions.reduce(self.tracer, "mean", self, axis=axis, dtype=dtype, out=out,
                                 keepdims=keepdims, where=where)

    def max(self, axis: Any = None, out: Any = None, keepdims: Any = False,
            initial: Any = _NOVALUE, where: Any = True) -> Any:
        return reductions.reduce(self.tracer, "max", self, axis=axis, out=out,
                                 keepdims=keepdims, initial=initial, where=where)

    def min(self, axis: Any = None, out: Any = None, keepdims: Any = False,
            initial: Any = _NOVALUE, where: Any = True) -> Any:
        return reductions.reduce(self.tracer, "min", self, axis=axis, out=out,
                                 keepdims=keepdims, initial=initial, where=where)

    def var(self, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0,
            keepdims: Any = False, *, where: Any = True, mean: Any = _NOVALUE) -> Any:
        return reductions.reduce(self.tracer, "var", self, axis=axis, dtype=dtype, out=out,
                                 keepdims=keepdims, where=where, ddof=ddof, mean=mean)

    def std(self, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0,
            keepdims: Any = False, *, where: Any = True, mean: Any = _NOVALUE) -> Any:
        return reductions.reduce(self.tracer, "std", self, axis=axis, dtype=dtype, out=out,
                                 keepdims=keepdims, where=where, ddof=ddof, mean=mean)

    def argmax(self, axis: Any = None, out: Any = None, *, keepdims: Any = False) -> Any:
        return reductions.reduce(self.tracer, "argmax", self, axis=axis, out=out,
                                 keepdims=keepdims)

    def argmin(self, axis: Any = None, out: Any = None, *, keepdims: Any = False) -> Any:
        return reductions.reduce(self.tracer, "argmin", self, axis=axis, out=out,
                                 keepdims=keepdims)

    def any(self, axis: Any = None, dtype: Any = None, out: Any = None,
            keepdims: Any = False, *, where: Any = True) -> Any:
        return reductions.reduce(self.tracer, "any", self, axis=axis, dtype=dtype, out=out,
                                 keepdims=keepdims, where=where)

    def all(self, axis: Any = None, dtype: Any = None, out: Any = None,
            keepdims: Any = False, *, where: Any = True) -> Any:
        return reductions.reduce(self.tracer, "all", self, axis=axis, dtype=dtype, out=out,
                                 keepdims=keepdims, where=where)

    # -- every other ndarray method: the NumPy function of the same name -----------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not hasattr(np.ndarray, name):
            raise AttributeError(f"'Traced' object (a traced array) has no attribute "
                                 f"{name!r}")
        if name in _INPLACE_METHODS:
            raise UnsupportedOperationError(
                f"x.{name}(...) writes into the array in a way pyc_lab does not trace; "
                f"write {_INPLACE_METHODS[name]} instead")
        if name in _CONCRETE_METHODS:
            raise self._concrete(f"x.{name}")
        if not callable(getattr(np.ndarray, name)):  # an attribute, not a method
            if name in ("real", "imag"):
                return getattr(np, name)(self)
            raise UnsupportedOperationError(
                f"x.{name} describes an array's memory, which a traced array does not "
                "have; compute without it, or call the function without pyc_lab.compile")
        fn = getattr(np, name, None)
        if not callable(fn):
            raise UnsupportedOperationError(
                f"x.{name} of a traced array is not supported; call the function without "
                "pyc_lab.compile, or compute it from supported operations")
        return _bound(fn, self)

    # -- NumPy protocols -----------------------------------------------------------------
    def __array__(self, *_: Any, **__: Any) -> np.ndarray:
        raise TraceError(
            "a traced array cannot become a NumPy array (np.asarray, np.array, or storing "
            "it into a NumPy array made inside the function): its values exist only when "
            "the compiled function runs. Build arrays from traced values instead "
            "(np.zeros_like(x), np.where, np.concatenate); to index a NumPy array made "
            "inside the function with a traced one (np.eye(n)[labels]), pass that array "
            "as an argument or keep it in a global, so it is traced too (w[labels])")

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any,
                        **kwargs: Any) -> Any:
        return ufuncs.array_ufunc(self.tracer, ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Callable, types: Any, args: tuple,
                           kwargs: dict) -> Any:
        return array_functions.dispatch(self.tracer, func, args, kwargs)


def _bound(fn: Callable, x: Traced) -> Callable:
    def method(*args: Any, **kwargs: Any) -> Any:
        return fn(x, *args, **kwargs)

    method.__name__ = getattr(fn, "__name__", "method")
    return method
