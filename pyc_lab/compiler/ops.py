"""The op registry: every op's shape/dtype inference, checks and array reference.

Each :class:`OpDef` declares

- ``kind``: ``elementwise``, ``reduction``, ``matmul``, ``norm``, ``shape``, ``source``
  (inputs and constants), ``fused`` or ``eager`` (a graph break);
- ``shape(inputs, attrs)``: the result shape, raising :class:`ShapeError` with a readable
  message when the inputs do not fit;
- ``reference(xp, args, attrs)``: the result computed with an array module ``xp``
  (NumPy on the CPU, CuPy on the GPU) — this is both the semantics of the op and the
  NumPy backend's implementation;
- for elementwise ops, ``cuda``: a C expression template over ``{0}``, ``{1}``, ... used by
  the code generator (``None``: no generated kernel; CuPy runs the reference);
- ``ufunc``: the name of the NumPy ufunc whose semantics the op has, if any. The tracer
  maps ``np.<ufunc>`` calls to the op through it and asks the ufunc how Python scalars
  and ``dtype=`` are resolved (NEP 50).

Result dtypes follow NumPy exactly: they are found by running the reference on
one-element arrays of the input dtypes (NEP 50 promotion, integer division, bool
comparisons included).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import PycLabError
from .errors import DynamicShapeError

__all__ = ["ACTIVATIONS", "REDUCTIONS", "REGISTRY", "UFUNC_OPS", "VIEW_RESULT_OPS",
           "DTypeError", "OpDef", "ShapeError", "basic_index", "check_eager_result",
           "evaluate", "infer", "is_plain_reduction", "normalize_axis", "reduction_kwargs",
           "run_graph"]


class ShapeError(PycLabError):
    """Operands whose shapes or dtypes do not fit the op."""


class DTypeError(ShapeError, TypeError):
    """Operand dtypes the op (NumPy itself) does not take, e.g. ``-x`` on a bool array."""


@dataclass(frozen=True)
class OpDef:
    """What the compiler knows about one op."""

    name: str
    kind: str
    arity: int | None
    shape: Callable[[Sequence[Any], dict[str, Any]], tuple[int, ...]]
    reference: Callable[[Any, Sequence[Any], dict[str, Any]], Any]
    cuda: str | None = None
    dtype: Callable[[Sequence[Any], dict[str, Any]], np.dtype] | None = None
    doc: str = ""
    ufunc: str | None = None
    #: For a library op run between CUDA graphs: ``bind(xp, inputs, attrs, out)`` gives a
    #: call computing the op into ``out`` from ``inputs`` at their fixed addresses (a
    #: replay program's), with per-call conversions done once — or ``None`` to fall back
    #: to the reference each replay.
    bind: Callable[[Any, Sequence[Any], dict[str, Any], Any], Callable[[], None] | None] \
        | None = None


REGISTRY: dict[str, OpDef] = {}


def _register(opdef: OpDef) -> OpDef:
    REGISTRY[opdef.name] = opdef
    return opdef


# -- helpers -------------------------------------------------------------------------------
def normalize_axis(axis: Any, ndim: int) -> tuple[int, ...]:
    """``None`` -> all axes; ints -> sorted non-negative tuple; out of range -> ShapeError."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < max(ndim, 1):
            raise ShapeError(f"axis {a} is out of range for an array of rank {ndim}")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axis in {axis!r}")
    return tuple(sorted(out))


def _broadcast(inputs: Sequence[Any], _attrs: dict) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*[tuple(n.shape) for n in inputs]))
    except ValueError:
        shapes = " and ".join(str(tuple(n.shape)) for n in inputs)
        raise ShapeError(f"shapes {shapes} do not broadcast together") from None


def _same(inputs: Sequence[Any], _attrs: dict) -> tuple[int, ...]:
    return tuple(inputs[0].shape)


def _tiny(dtype: np.dtype, ndim: int = 1) -> np.ndarray:
    return np.ones((1,) * ndim, dtype=dtype)


def _reference_dtype(op: str, inputs: Sequence[Any], attrs: dict[str, Any]) -> np.dtype:
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. var(ddof=1) of one element
            out = REGISTRY[op].reference(np, [_tiny(n.dtype, len(n.shape)) for n in inputs],
                                         attrs)
    except (TypeError, ValueError) as exc:
        dtypes = ", ".join(np.dtype(n.dtype).name for n in inputs)
        raise DTypeError(f"{op} does not take ({dtypes}): NumPy says: {exc}") from None
    return np.asarray(out).dtype


# -- elementwise ---------------------------------------------------------------------------
def _gelu(xp: Any, x: Any) -> Any:
    # Constants as NumPy scalars of x's dtype: CuPy takes those, not 0-d NumPy arrays.
    c, k = x.dtype.type(math.sqrt(2.0 / math.pi)), x.dtype.type(0.044715)
    return 0.5 * x * (1 + xp.tanh(c * (x + k * x * x * x)))


def _sigmoid(xp: Any, x: Any) -> Any:
    return 1 / (1 + xp.exp(-x))


#: Activations usable as GEMM epilogues, with their references.
ACTIVATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "relu": lambda xp, x: xp.maximum(x, x.dtype.type(0)),
    "gelu": _gelu,
    "sigmoid": _sigmoid,
    "silu": lambda xp, x: x * _sigmoid(xp, x),
    "tanh": lambda xp, x: xp.tanh(x),
}

_BINARY = {
    # name: (reference, cuda template, NumPy ufunc)
    "add": (lambda xp, a, b: a + b, "({0} + {1})", "add"),
    "subtract": (lambda xp, a, b: a - b, "({0} - {1})", "subtract"),
    "multiply": (lambda xp, a, b: a * b, "({0} * {1})", "multiply"),
    "divide": (lambda xp, a, b: a / b, "({0} / {1})", "divide"),
    "power": (lambda xp, a, b: xp.power(a, b), "pow({0}, {1})", "power"),
    "maximum": (lambda xp, a, b: xp.maximum(a, b),
                "(({0}) != ({0}) ? ({0}) : (({1}) != ({1}) ? ({1}) : "
                "(({0}) > ({1}) ? ({0}) : ({1}))))", "maximum"),
    "minimum": (lambda xp, a, b: xp.minimum(a, b),
                "(({0}) != ({0}) ? ({0}) : (({1}) != ({1}) ? ({1}) : "
                "(({0}) < ({1}) ? ({0}) : ({1}))))", "minimum"),
    "less": (lambda xp, a, b: a < b, "({0} < {1})", "less"),
    "less_equal": (lambda xp, a, b: a <= b, "({0} <= {1})", "less_equal"),
    "greater": (lambda xp, a, b: a > b, "({0} > {1})", "greater"),
    "greater_equal": (lambda xp, a, b: a >= b, "({0} >= {1})", "greater_equal"),
    "equal": (lambda xp, a, b: a == b, "({0} == {1})", "equal"),
    "not_equal": (lambda xp, a, b: a != b, "({0} != {1})", "not_equal"),
    # NumPy's floor division and remainder (Python semantics, float special cases) and
    # its shifts (defined past the bit width) have no C operator: CuPy runs them.
    "floor_divide": (lambda xp, a, b: xp.floor_divide(a, b), None, "floor_divide"),
    "remainder": (lambda xp, a, b: xp.remainder(a, b), None, "remainder"),
    "left_shift": (lambda xp, a, b: xp.left_shift(a, b), None, "left_shift"),
    "right_shift": (lambda xp, a, b: xp.right_shift(a, b), None, "right_shift"),
    "bitwise_and": (lambda xp, a, b: xp.bitwise_and(a, b), "({0} & {1})", "bitwise_and"),
    "bitwise_or": (lambda xp, a, b: xp.bitwise_or(a, b), "({0} | {1})", "bitwise_or"),
    "bitwise_xor": (lambda xp, a, b: xp.bitwise_xor(a, b), "({0} ^ {1})", "bitwise_xor"),
    "logical_and": (lambda xp, a, b: xp.logical_and(a, b), "({0} && {1})", "logical_and"),
    "logical_or": (lambda xp, a, b: xp.logical_or(a, b), "({0} || {1})", "logical_or"),
    "logical_xor": (lambda xp, a, b: xp.logical_xor(a, b), "({0} != {1})", "logical_xor"),
}
_UNARY = {
    "exp": (lambda xp, x: xp.exp(x), "exp({0})", "exp"),
    "log": (lambda xp, x: xp.log(x), "log({0})", "log"),
    "tanh": (lambda xp, x: xp.tanh(x), "tanh({0})", "tanh"),
    "sqrt": (lambda xp, x: xp.sqrt(x), "sqrt({0})", "sqrt"),
    "rsqrt": (lambda xp, x: 1 / xp.sqrt(x), "rsqrt({0})", None),
    "abs": (lambda xp, x: xp.abs(x), "abs({0})", "absolute"),
    "negative": (lambda xp, x: -x, "(-{0})", "negative"),
    "positive": (lambda xp, x: xp.positive(x), "{0}", "positive"),
    "square": (lambda xp, x: xp.square(x), "({0} * {0})", "square"),
    "reciprocal": (lambda xp, x: xp.reciprocal(x), "(1 / {0})", "reciprocal"),
    "invert": (lambda xp, x: xp.invert(x), "(~{0})", "invert"),
    "logical_not": (lambda xp, x: xp.logical_not(x), "(!{0})", "logical_not"),
    # a new array with x's values: what keeps a result from sharing memory with an input
    # where NumPy's would not (see passes/aliasing.py), and np.copy / x.copy()
    "copy": (lambda xp, x: xp.array(x, copy=True), "{0}", None),
    # NumPy's maximum(x, 0): NaN stays NaN, and -0.0 gives +0.0 (maximum returns its
    # second operand when the two compare equal)
    "relu": (lambda xp, x: ACTIVATIONS["relu"](xp, x),
             "((({0}) > 0 || ({0}) != ({0})) ? ({0}) : 0)", None),
    "gelu": (lambda xp, x: _gelu(xp, x),
             "(0.5 * ({0}) * (1 + tanh(0.7978845608028654 * (({0}) + 0.044715 * ({0}) * "
             "({0}) * ({0})))))", None),
    "sigmoid": (lambda xp, x: _sigmoid(xp, x), "(1 / (1 + exp(-({0}))))", None),
    "silu": (lambda xp, x: ACTIVATIONS["silu"](xp, x), "(({0}) / (1 + exp(-({0}))))", None),
}

for _name, (_ref, _cuda, _ufunc) in _BINARY.items():
    _register(OpDef(_name, "elementwise", 2, _broadcast,
                    (lambda f: lambda xp, args, attrs: f(xp, *args))(_ref), _cuda,
                    ufunc=_ufunc))
for _name, (_ref, _cuda, _ufunc) in _UNARY.items():
    _register(OpDef(_name, "elementwise", 1, _same,
                    (lambda f: lambda xp, args, attrs: f(xp, *args))(_ref), _cuda,
                    ufunc=_ufunc))

_register(OpDef(
    # np.clip: NaN in any operand gives NaN; otherwise max(x, lo) then min(., hi), the
    # first operand kept on ties (so clip(-0.0, 0.0, 1.0) is -0.0, as in NumPy)
    "clip", "elementwise", 3, _broadcast,
    lambda xp, args, attrs: xp.clip(*args),
    "(({1}) != ({1}) ? ({1}) : (({2}) != ({2}) ? ({2}) : "
    "(((({0}) < ({1})) ? ({1}) : ({0})) > ({2}) ? ({2}) : "
    "((({0}) < ({1})) ? ({1}) : ({0})))))",
    ufunc="clip",
))
_register(OpDef(
    "where", "elementwise", 3, _broadcast,
    lambda xp, args, attrs: xp.where(*args), "({0} ? {1} : {2})",
))
_register(OpDef(
    "astype", "elementwise", 1, _same,
    lambda xp, args, attrs: args[0].astype(attrs["dtype"]), "{0}",
    dtype=lambda inputs, attrs: np.dtype(attrs["dtype"]),
))


# -- reductions ----------------------------------------------------------------------------
#: Reductions: ``op(x[, where]; axis, keepdims[, dtype][, initial][, ddof][, form])``.
#: ``axis`` is a sorted tuple or None (every axis); ``where`` (NumPy's ``where=``) is an
#: optional second input; ``dtype``, ``initial`` and ``ddof`` are NumPy's arguments,
#: present only when given. The reference is the NumPy function itself, so every
#: accumulation rule is NumPy's (float16 ``mean`` through float32, integer ``sum`` in
#: int64...). ``var`` also has ``form``: ``"np.var"`` (default, ``np.var``'s own
#: computation) or ``"mean_square"``, the hand-written ``mean((x - mean(x))**2)`` that
#: reduction fusion recognises — for float16 the two differ (``np.var`` sums the squares
#: in float16, ``np.mean`` through float32), so the fused node keeps what was written.
REDUCTIONS = ("sum", "mean", "max", "min", "var", "std", "prod", "argmax", "argmin", "any",
              "all")
_ARG_REDUCTIONS = ("argmax", "argmin")


def _reduce_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    shape = tuple(inputs[0].shape)
    axes = normalize_axis(attrs.get("axis"), len(shape))
    if len(inputs) == 2:
        where = tuple(inputs[1].shape)
        try:
            if tuple(np.broadcast_shapes(where, shape)) != shape:
                raise ValueError
        except ValueError:
            raise ShapeError(f"where= of shape {where} does not broadcast to the reduced "
                             f"array's {shape}") from None
    if attrs.get("keepdims"):
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def reduction_kwargs(attrs: dict[str, Any], where: Any = None) -> dict[str, Any]:
    """NumPy keyword arguments of a reduction node (``axis`` as NumPy takes it)."""
    axis = attrs.get("axis")
    kw: dict[str, Any] = {"axis": None if axis is None else tuple(axis),
                          "keepdims": bool(attrs.get("keepdims"))}
    for key in ("dtype", "initial", "ddof"):
        if attrs.get(key) is not None:
            kw[key] = attrs[key]
    if where is not None:
        kw["where"] = where
    return kw


def is_plain_reduction(node: Any) -> bool:
    """Whether a reduction node has none of ``where``/``dtype``/``initial``/``ddof``
    (the only reductions pattern matchers and generated row kernels take)."""
    return len(node.inputs) == 1 and all(node.attrs.get(k) is None
                                         for k in ("dtype", "initial", "ddof"))


#: Reductions that accumulate: on bfloat16 they run in float32 and round once (see
#: ``_reduction``).
_ACCUMULATING = ("sum", "mean", "var", "std", "prod")


def _reduction(name: str) -> None:
    def reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
        x = args[0]
        if name in _ACCUMULATING and np.dtype(x.dtype).name == "bfloat16" \
                and attrs.get("dtype") is None:
            # ml_dtypes' loops accumulate in bfloat16 (np.ones(1000, bf16).sum() is 256):
            # float32 inside, as NumPy's float16 and torch do, one rounding, bf16 out
            out = reference(xp, [x.astype(np.float32), *args[1:]], attrs)
            return out.astype(x.dtype)
        kw = reduction_kwargs(attrs, args[1] if len(args) == 2 else None)
        if name == "var" and attrs.get("form") == "mean_square":
            m = xp.mean(x, axis=kw["axis"], keepdims=True)
            d = x - m
            return xp.asarray(xp.mean(d * d, axis=kw["axis"], keepdims=kw["keepdims"]))
        if name in _ARG_REDUCTIONS and kw["axis"] is not None:
            kw["axis"] = kw["axis"][0] if x.ndim else None
        if xp is not np and ("where" in kw or "initial" in kw):
            # CuPy's reductions take neither argument: NumPy computes them on the host
            host = getattr(np, name)(xp.asnumpy(x), **{
                k: xp.asnumpy(v) if k == "where" and not isinstance(v, (bool, np.ndarray))
                else v for k, v in kw.items()})
            return xp.asarray(host)
        return xp.asarray(getattr(xp, name)(x, **kw))

    _register(OpDef(name, "reduction", None, _reduce_shape, reference))


for _name in REDUCTIONS:
    _reduction(_name)


# -- matmul (with transposes and a bias + activation epilogue) -----------------------------
def _mm_operand_shape(shape: tuple[int, ...], transpose: bool) -> tuple[int, ...]:
    if transpose and len(shape) >= 2:
        return (*shape[:-2], shape[-1], shape[-2])
    return shape


def _matmul_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    a = _mm_operand_shape(tuple(inputs[0].shape), bool(attrs.get("transpose_a")))
    b = _mm_operand_shape(tuple(inputs[1].shape), bool(attrs.get("transpose_b")))
    if not a or not b:
        raise ShapeError("matmul does not take 0-d operands (use multiply)")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(
            f"matmul: inner dimensions differ: {a} @ {b} ({a2[-1]} != {b2[-2]})"
        )
    try:
        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        raise ShapeError(f"matmul: batch dimensions {a2[:-2]} and {b2[:-2]} do not "
                         "broadcast") from None
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = (*out[:-2], out[-1])
    if len(b) == 1:
        out = out[:-1]
    if len(inputs) == 3:
        try:
            np.broadcast_shapes(out, tuple(inputs[2].shape))
        except ValueError:
            raise ShapeError(f"matmul bias of shape {tuple(inputs[2].shape)} does not "
                             f"broadcast to the product's {out}") from None
    return out


def _matmul_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    a, b = args[0], args[1]
    if attrs.get("transpose_a") and a.ndim >= 2:
        a = xp.swapaxes(a, -1, -2)
    if attrs.get("transpose_b") and b.ndim >= 2:
        b = xp.swapaxes(b, -1, -2)
    out = xp.matmul(a, b)
    if len(args) == 3:
        out = out + args[2]
    act = attrs.get("activation")
    if act:
        out = ACTIVATIONS[act](xp, out)
    return out


def _matmul_dtype(inputs: Sequence[Any], attrs: dict[str, Any]) -> np.dtype:
    dt = np.result_type(inputs[0].dtype, inputs[1].dtype)
    if len(inputs) == 3:
        dt = np.result_type(dt, inputs[2].dtype)
    if attrs.get("activation"):
        with np.errstate(all="ignore"):
            dt = ACTIVATIONS[attrs["activation"]](np, _tiny(dt)).dtype
    return dt


_register(OpDef("matmul", "matmul", None, _matmul_shape, _matmul_reference,
                dtype=_matmul_dtype))


# -- normalisations ------------------------------------------------------------------------
def _float_of(dtype: np.dtype) -> np.dtype:
    return dtype if dtype.kind == "f" else np.dtype(np.float64)


def _softmax_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    x = args[0]
    x = x.astype(_float_of(x.dtype)) if x.dtype.kind != "f" else x
    axis = attrs["axis"]
    e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    return e / xp.sum(e, axis=axis, keepdims=True)


def _softmax_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    normalize_axis(attrs["axis"], len(inputs[0].shape))
    return tuple(inputs[0].shape)


_register(OpDef("softmax", "norm", 1, _softmax_shape, _softmax_reference,
                dtype=lambda inputs, attrs: _float_of(inputs[0].dtype)))


def _layer_norm_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    x = args[0]
    x = x.astype(_float_of(x.dtype)) if x.dtype.kind != "f" else x
    mean = xp.mean(x, axis=-1, keepdims=True)
    if attrs.get("variance") == "np.var":  # written with x.var(): NumPy's own variance
        var = xp.var(x, axis=-1, keepdims=True)
    else:  # written as mean((x - m) * (x - m)) or mean((x - m)**2)
        var = xp.mean((x - mean) * (x - mean), axis=-1, keepdims=True)
    y = (x - mean) / xp.sqrt(var + x.dtype.type(attrs.get("eps", 1e-5)))
    if len(args) >= 2:
        y = y * args[1]
    if len(args) == 3:
        y = y + args[2]
    return y


def _layer_norm_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    shape = tuple(inputs[0].shape)
    if not shape:
        raise ShapeError("layer_norm needs at least one dimension")
    for extra in inputs[1:]:
        if tuple(extra.shape) not in ((shape[-1],), ()):
            raise ShapeError(f"layer_norm scale/shift must have shape ({shape[-1]},), got "
                             f"{tuple(extra.shape)}")
    return shape


def _layer_norm_dtype(inputs: Sequence[Any], attrs: dict[str, Any]) -> np.dtype:
    dt = _float_of(inputs[0].dtype)
    for extra in inputs[1:]:
        dt = np.result_type(dt, extra.dtype)
    return dt


_register(OpDef("layer_norm", "norm", None, _layer_norm_shape, _layer_norm_reference,
                dtype=_layer_norm_dtype))


# -- shape ops -----------------------------------------------------------------------------
def _reshape_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    src = tuple(inputs[0].shape)
    want = tuple(int(d) for d in attrs["shape"])
    size = int(np.prod(src, dtype=np.int64))
    if want.count(-1) > 1:
        raise ShapeError(f"reshape {want}: at most one -1")
    known = int(np.prod([d for d in want if d != -1], dtype=np.int64))
    if -1 in want:
        if known == 0 or size % known:
            raise ShapeError(f"cannot reshape {src} into {want}")
        want = tuple(size // known if d == -1 else d for d in want)
    if int(np.prod(want, dtype=np.int64)) != size:
        raise ShapeError(f"cannot reshape an array of shape {src} (size {size}) into {want}")
    return want


def _transpose_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    src = tuple(inputs[0].shape)
    axes = tuple(attrs["axes"])
    if sorted(axes) != list(range(len(src))):
        raise ShapeError(f"transpose axes {axes} are not a permutation of {len(src)} axes")
    return tuple(src[a] for a in axes)


def _broadcast_to_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    src, want = tuple(inputs[0].shape), tuple(attrs["shape"])
    try:
        if np.broadcast_shapes(src, want) != want:
            raise ValueError
    except ValueError:
        raise ShapeError(f"cannot broadcast {src} to {want}") from None
    return want


def _expand_dims_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    src = list(inputs[0].shape)
    axes = normalize_axis(attrs["axis"], len(src) + len(tuple(np.atleast_1d(attrs["axis"]))))
    for a in axes:
        src.insert(a, 1)
    return tuple(src)


def _squeeze_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    src = tuple(inputs[0].shape)
    axes = normalize_axis(attrs["axis"], len(src))
    for a in axes:
        if src[a] != 1:
            raise ShapeError(f"cannot squeeze axis {a} of size {src[a]}")
    return tuple(d for i, d in enumerate(src) if i not in axes)


def _concat_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    shapes = [tuple(n.shape) for n in inputs]
    if not shapes:
        raise ShapeError("concatenate needs at least one array")
    rank = len(shapes[0])
    if rank == 0 or any(len(s) != rank for s in shapes):
        raise ShapeError(f"concatenate needs arrays of one rank >= 1, got {shapes}")
    (axis,) = normalize_axis(attrs["axis"], rank)
    for s in shapes[1:]:
        if any(s[i] != shapes[0][i] for i in range(rank) if i != axis):
            raise ShapeError(f"concatenate along axis {axis}: shapes {shapes} differ "
                             "elsewhere")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return tuple(out)


def _concat_dtype(inputs: Sequence[Any], attrs: dict[str, Any]) -> np.dtype:
    return np.result_type(*[n.dtype for n in inputs])


def _slice_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    return tuple(np.empty(tuple(inputs[0].shape), dtype=np.uint8)[basic_index(attrs)].shape) \
        if int(np.prod(inputs[0].shape, dtype=np.int64)) < 2**20 else \
        _slice_shape_big(tuple(inputs[0].shape), attrs)


def _slice_shape_big(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, ...]:
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape, (0,) * len(shape))
    return tuple(probe[basic_index(attrs)].shape)


def basic_index(attrs: dict[str, Any]) -> tuple:
    """The NumPy index of a ``slice``/``setitem`` node (its ``index`` attribute)."""
    out: list[Any] = []
    for part in attrs["index"]:
        kind = part[0]
        if kind == "s":
            out.append(slice(part[1], part[2], part[3]))
        elif kind == "i":
            out.append(int(part[1]))
        elif kind == "n":
            out.append(None)
        elif kind == "e":
            out.append(Ellipsis)
    return tuple(out)


def _setitem_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    base = tuple(inputs[0].shape)
    region = _slice_shape([inputs[0]], attrs)
    value = list(inputs[1].shape)
    while len(value) > len(region) and value and value[0] == 1:
        value.pop(0)  # NumPy drops leading size-1 dims of the value
    try:
        if tuple(np.broadcast_shapes(tuple(value), region)) != region:
            raise ValueError
    except ValueError:
        raise ShapeError(f"could not broadcast a value of shape {tuple(inputs[1].shape)} "
                         f"into the region {region} of an array of shape {base}") from None
    return base


def _setitem_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    out = xp.array(args[0], copy=True)
    out[basic_index(attrs)] = args[1]
    return out


_register(OpDef("reshape", "shape", 1, _reshape_shape,
                lambda xp, args, attrs: xp.reshape(args[0], tuple(attrs["shape"])),
                dtype=lambda inputs, attrs: inputs[0].dtype))
_register(OpDef("transpose", "shape", 1, _transpose_shape,
                lambda xp, args, attrs: xp.transpose(args[0], tuple(attrs["axes"])),
                dtype=lambda inputs, attrs: inputs[0].dtype))
_register(OpDef("broadcast_to", "shape", 1, _broadcast_to_shape,
                lambda xp, args, attrs: xp.broadcast_to(args[0], tuple(attrs["shape"])),
                dtype=lambda inputs, attrs: inputs[0].dtype))
_register(OpDef("expand_dims", "shape", 1, _expand_dims_shape,
                lambda xp, args, attrs: xp.expand_dims(args[0], attrs["axis"]),
                dtype=lambda inputs, attrs: inputs[0].dtype))
_register(OpDef("squeeze", "shape", 1, _squeeze_shape,
                lambda xp, args, attrs: xp.squeeze(args[0], tuple(attrs["axis"])),
                dtype=lambda inputs, attrs: inputs[0].dtype))
_register(OpDef("concatenate", "shape", None, _concat_shape,
                lambda xp, args, attrs: xp.concatenate(list(args), axis=attrs["axis"]),
                dtype=_concat_dtype))
_register(OpDef("slice", "shape", 1, _slice_shape,
                lambda xp, args, attrs: args[0][basic_index(attrs)],
                dtype=lambda inputs, attrs: inputs[0].dtype))
# ``base[index] = value`` as a new array (in-place writes are traced functionally: the
# written array's later readers read this node); ``value`` is cast to the base's dtype
_register(OpDef("setitem", "shape", 2, _setitem_shape, _setitem_reference,
                dtype=lambda inputs, attrs: inputs[0].dtype))


# -- sources, fused groups and graph breaks ------------------------------------------------
def _no_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    raise ShapeError("this op's shape is given when it is built")


def _constant_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    return xp.asarray(attrs["value"])


_register(OpDef("input", "source", 0, _no_shape,
                lambda xp, args, attrs: (_ for _ in ()).throw(
                    PycLabError("an input node has no reference"))))
_register(OpDef("constant", "source", 0,
                lambda inputs, attrs: tuple(np.shape(attrs["value"])), _constant_reference,
                dtype=lambda inputs, attrs: np.asarray(attrs["value"]).dtype))


def _fused_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    return run_graph(attrs["body"], list(args), xp)[0]  # a node's value: the first output


def _fused_extra_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    return run_graph(attrs["body"], list(args[1:]), xp)[attrs["output"]]


def _fused_extra_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    body = attrs["body"]
    return tuple(body.nodes[body.outputs[attrs["output"]]].shape)


def _fused_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    body = attrs["body"]
    return tuple(body.nodes[body.outputs[0]].shape)


_register(OpDef("fused", "fused", None, _fused_shape, _fused_reference,
                dtype=lambda inputs, attrs: attrs["body"].nodes[attrs["body"].outputs[0]].dtype))


# ``fused_rows``: a row program (row fusion) — elementwise prologue, reductions over the
# last axis of its row space ``attrs["space"]`` and an elementwise epilogue, one body graph
# with one output, computed as written (its reference runs the body op by op).
_register(OpDef("fused_rows", "norm", None, _fused_shape, _fused_reference,
                dtype=lambda inputs, attrs: attrs["body"].nodes[attrs["body"].outputs[0]].dtype))

# ``fused_extra``: output ``attrs["output"]`` (>= 1) of a fused node whose body has several
# outputs (its input 0, which the generated kernel writes in the same pass); its other
# inputs are the fused node's, so that its reference can compute it alone.
_register(OpDef("fused_extra", "extra", None, _fused_extra_shape, _fused_extra_reference,
                dtype=lambda inputs, attrs: attrs["body"].nodes[
                    attrs["body"].outputs[attrs["output"]]].dtype))

#: Ops whose ``attrs["body"]`` is a graph computed as one kernel.
FUSED_OPS = ("fused", "fused_rows")

#: Ops whose NumPy result is a view of their operand (no data is computed).
VIEW_RESULT_OPS = frozenset({"slice", "transpose", "reshape", "expand_dims", "squeeze",
                             "broadcast_to"})


def _eager_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    fn = attrs["_fn"]
    call_args, call_kwargs = attrs["_rebuild"](list(args))
    return fn(*call_args, **call_kwargs)


_register(OpDef("eager", "eager", None, _no_shape, _eager_reference))


#: NumPy ufunc name -> the op with its semantics (``np.true_divide`` is ``"divide"``).
UFUNC_OPS: dict[str, str] = {d.ufunc: name for name, d in REGISTRY.items() if d.ufunc}


# -- entry points --------------------------------------------------------------------------
def infer(op: str, inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[tuple[int, ...],
                                                                           np.dtype]:
    """Shape and dtype of ``op`` applied to nodes (anything with .shape and .dtype)."""
    opdef = REGISTRY.get(op)
    if opdef is None:
        raise ShapeError(f"unknown op {op!r}")
    if opdef.arity is not None and len(inputs) != opdef.arity:
        raise ShapeError(f"{op} takes {opdef.arity} input(s), got {len(inputs)}")
    shape = opdef.shape(inputs, attrs)
    if opdef.dtype is not None:
        dtype = np.dtype(opdef.dtype(inputs, attrs))
    else:
        dtype = _reference_dtype(op, inputs, attrs)
    return tuple(int(d) for d in shape), dtype


def evaluate(op: str, xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    """Run ``op``'s reference with array module ``xp``."""
    return REGISTRY[op].reference(xp, args, attrs)


def check_eager_result(node: Any, out: Any) -> None:
    """Raise :class:`~pyc_lab.compiler.errors.DynamicShapeError` when a graph break's result
    has a shape or dtype other than the one seen while tracing: everything after it was
    specialised to that shape (sizes read from it became constants), so the compiled
    graph cannot be trusted for these inputs."""
    if tuple(out.shape) != tuple(node.shape) or out.dtype != node.dtype:
        raise DynamicShapeError(
            f"graph break %{node.id} ({node.attrs.get('fn', 'eager')}) returned "
            f"{replace(node, shape=tuple(out.shape), dtype=np.dtype(out.dtype)).type_text} "
            "where the trace saw "
            f"{node.type_text}: its result depends on the input values")


def run_graph(graph: Any, args: Sequence[Any], xp: Any) -> list[Any]:
    """Evaluate a :class:`~pyc_lab.compiler.ir.Graph` on ``args`` (one per graph input)
    with array module ``xp``, node by node through the references: the NumPy backend,
    eager segments and the meaning of a fused node's body.

    Values are dropped as soon as their last reader has run, so peak memory follows the
    graph's liveness rather than its size.
    """
    values: dict[int, Any] = dict(zip(graph.inputs, args, strict=True))
    last_use: dict[int, int] = {}
    for pos, n in enumerate(graph.nodes.values()):
        for i in n.inputs:
            last_use[i] = pos
    keep = set(graph.outputs)
    several: dict[int, list[Any]] = {}  # a fused node's outputs, for its fused_extra nodes
    for pos, n in enumerate(graph.nodes.values()):
        if n.op == "input":
            continue
        body = n.attrs.get("body")
        if n.op == "fused" and len(body.outputs) > 1:
            several[n.id] = run_graph(body, [values[i] for i in n.inputs], xp)
            out = xp.asarray(several[n.id][0])
        elif n.op == "fused_extra" and n.inputs[0] in several:
            out = xp.asarray(several[n.inputs[0]][n.attrs["output"]])  # computed once
        else:
            out = xp.asarray(evaluate(n.op, xp, [values[i] for i in n.inputs], n.attrs))
        if n.op == "eager":
            check_eager_result(n, out)
        if out.dtype != n.dtype:
            out = out.astype(n.dtype)
        values[n.id] = out
        for i in set(n.inputs):
            if last_use.get(i) == pos and i not in keep:
                values.pop(i, None)
                several.pop(i, None)
    return [values[o] for o in graph.outputs]
