"""The compiler's computing ops: elementwise (with their CUDA expressions), reductions,
matmul with its epilogue, normalisations, sources, fused groups and graph breaks —
registered in :mod:`.op_registry` with their shape/dtype inference and NumPy references.

Importing this module registers every op (the shape ops through :mod:`.ops_shape`); it
also re-exports the registry's names, so ``from .ops import REGISTRY, run_graph`` keeps
working.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import PycLabError
from .op_registry import (
    REGISTRY,
    DTypeError,
    OpDef,
    ShapeError,
    broadcast_shape,
    check_eager_result,
    evaluate,
    infer,
    normalize_axis,
    register,
    run_graph,
    same_shape,
    tiny,
)
from .ops_shape import VIEW_RESULT_OPS, basic_index

__all__ = ["ACTIVATIONS", "REDUCTIONS", "REGISTRY", "UFUNC_OPS", "VIEW_RESULT_OPS",
           "DTypeError", "OpDef", "ShapeError", "basic_index", "check_eager_result",
           "evaluate", "infer", "is_plain_reduction", "normalize_axis", "reduction_kwargs",
           "run_graph"]


# -- elementwise ---------------------------------------------------------------------------
def _gelu(xp: Any, x: Any) -> Any:
    # Constants as NumPy scalars of x's dtype: CuPy takes those, not 0-d NumPy arrays;
    # and bfloat16 (ml_dtypes) turns Python floats into float32, its own scalars not.
    t = x.dtype.type
    c, k = t(math.sqrt(2.0 / math.pi)), t(0.044715)
    return t(0.5) * x * (t(1) + xp.tanh(c * (x + k * x * x * x)))


def _special(name: str) -> Callable[[Any, Any], Any]:
    """The reference of ``scipy.special.<name>`` (``erf``, ``expit``) with SciPy's dtypes:
    float32 stays float32, any other real input (float16 included: SciPy's loops are
    float32 and float64, float64 first) gives float64. SciPy's (CuPy's
    ``cupyx.scipy.special``) where installed, else the function from its definition."""
    def reference(xp: Any, x: Any) -> Any:
        dt = np.dtype(x.dtype)
        if dt.kind not in "biuf" and dt.name != "bfloat16":
            raise TypeError(f"{name} takes real inputs, not {dt.name}")
        x = x.astype(np.float32 if dt == np.float32 else np.float64, copy=False)
        if xp is not np:
            import cupyx.scipy.special as special

            return getattr(special, name)(x)
        try:
            import scipy.special as special
        except ImportError:  # SciPy missing: the definitions, in the same dtype
            if name == "erf":
                return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)
            with np.errstate(over="ignore"):
                return 1 / (1 + np.exp(-x))
        return getattr(special, name)(x)

    return reference


def _sigmoid(xp: Any, x: Any) -> Any:
    return 1 / (1 + xp.exp(-x))


def _in_float(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """An activation computed in float32 for bfloat16 and rounded once (what a generated
    kernel does with its one expression), in float64 for integers and bools."""
    def reference(xp: Any, x: Any) -> Any:
        if x.dtype.name == "bfloat16":
            return fn(xp, x.astype(np.float32)).astype(x.dtype)
        if x.dtype.kind in "biu":
            return fn(xp, x.astype(np.float64))
        return fn(xp, x)

    return reference


#: Activations usable as GEMM epilogues, with their references.
ACTIVATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "relu": lambda xp, x: xp.maximum(x, x.dtype.type(0)),
    "gelu": _in_float(_gelu),
    "sigmoid": _in_float(_sigmoid),
    "silu": _in_float(lambda xp, x: x * _sigmoid(xp, x)),
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
    # NumPy's floor division and remainder (Python's semantics, NumPy's float special
    # cases) and its shifts (defined past the bit width): native/divmod.cuh follows
    # NumPy's loops.
    "floor_divide": (lambda xp, a, b: xp.floor_divide(a, b), "pyc_floor_divide({0}, {1})",
                     "floor_divide"),
    "remainder": (lambda xp, a, b: xp.remainder(a, b), "pyc_remainder({0}, {1})",
                  "remainder"),
    "left_shift": (lambda xp, a, b: xp.left_shift(a, b), "pyc_left_shift({0}, {1})",
                   "left_shift"),
    "right_shift": (lambda xp, a, b: xp.right_shift(a, b), "pyc_right_shift({0}, {1})",
                    "right_shift"),
    "bitwise_and": (lambda xp, a, b: xp.bitwise_and(a, b), "({0} & {1})", "bitwise_and"),
    "bitwise_or": (lambda xp, a, b: xp.bitwise_or(a, b), "({0} | {1})", "bitwise_or"),
    "bitwise_xor": (lambda xp, a, b: xp.bitwise_xor(a, b), "({0} ^ {1})", "bitwise_xor"),
    "logical_and": (lambda xp, a, b: xp.logical_and(a, b), "({0} && {1})", "logical_and"),
    "logical_or": (lambda xp, a, b: xp.logical_or(a, b), "({0} || {1})", "logical_or"),
    "logical_xor": (lambda xp, a, b: xp.logical_xor(a, b), "({0} != {1})", "logical_xor"),
    # the C99 functions NumPy's loops call, with their special cases
    "arctan2": (lambda xp, a, b: xp.arctan2(a, b), "atan2({0}, {1})", "arctan2"),
    "hypot": (lambda xp, a, b: xp.hypot(a, b), "hypot({0}, {1})", "hypot"),
    "copysign": (lambda xp, a, b: xp.copysign(a, b), "copysign({0}, {1})", "copysign"),
    "fmod": (lambda xp, a, b: xp.fmod(a, b), "fmod({0}, {1})", "fmod"),
    # float64 (NumPy's only real loop for it): the operands are converted first
    "float_power": (lambda xp, a, b: xp.float_power(a, b), "pow({0}, {1})", "float_power"),
    # NumPy's: 0 below zero, h at zero, 1 above, NaN for NaN
    "heaviside": (lambda xp, a, b: xp.heaviside(a, b),
                  "(({0}) < 0 ? 0 : (({0}) == 0 ? ({1}) : (({0}) > 0 ? 1 : ({0}))))",
                  "heaviside"),
    # NaN-ignoring max/min: a NaN operand gives the other one; NumPy's own signed-zero
    # ties differ between its SIMD and scalar loops, so neither is a contract here
    "fmax": (lambda xp, a, b: xp.fmax(a, b),
             "((({0}) > ({1}) || ({1}) != ({1})) ? ({0}) : ({1}))", "fmax"),
    "fmin": (lambda xp, a, b: xp.fmin(a, b),
             "((({0}) < ({1}) || ({1}) != ({1})) ? ({0}) : ({1}))", "fmin"),
    # NumPy's npy_logaddexp: equal operands (infinities included) give x + log 2, a NaN
    # difference gives NaN
    "logaddexp": (lambda xp, a, b: xp.logaddexp(a, b),
                  "(({0}) == ({1}) ? ({0}) + 0.6931471805599453 : "
                  "((({0}) - ({1})) > 0 ? ({0}) + log1p(exp(({1}) - ({0}))) : "
                  "((({0}) - ({1})) <= 0 ? ({1}) + log1p(exp(({0}) - ({1}))) : "
                  "(({0}) - ({1})))))", "logaddexp"),
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
    "gelu": (lambda xp, x: ACTIVATIONS["gelu"](xp, x),
             "(0.5 * ({0}) * (1 + tanh(0.7978845608028654 * (({0}) + 0.044715 * ({0}) * "
             "({0}) * ({0})))))", None),
    "sigmoid": (lambda xp, x: ACTIVATIONS["sigmoid"](xp, x), "(1 / (1 + exp(-({0}))))",
                None),
    "silu": (lambda xp, x: ACTIVATIONS["silu"](xp, x), "(({0}) / (1 + exp(-({0}))))", None),
    # the C math library's functions, as NumPy's float loops call them (float16 and
    # bfloat16 computed in float and rounded once, as NumPy computes float16)
    **{name: ((lambda f: lambda xp, x: getattr(xp, f)(x))(name), f"{c}({{0}})", name)
       for name, c in (("sin", "sin"), ("cos", "cos"), ("tan", "tan"), ("arcsin", "asin"),
                       ("arccos", "acos"), ("arctan", "atan"), ("sinh", "sinh"),
                       ("cosh", "cosh"), ("arcsinh", "asinh"), ("arccosh", "acosh"),
                       ("arctanh", "atanh"), ("log1p", "log1p"), ("expm1", "expm1"),
                       ("log2", "log2"), ("log10", "log10"), ("exp2", "exp2"),
                       ("cbrt", "cbrt"), ("fabs", "fabs"), ("floor", "floor"),
                       ("ceil", "ceil"), ("trunc", "trunc"), ("rint", "rint"))},
    # NumPy's x * (pi / 180) and x * (180 / pi), the constant in the compute type
    "deg2rad": (lambda xp, x: xp.deg2rad(x), "(({0}) * 0.017453292519943295)", "deg2rad"),
    "rad2deg": (lambda xp, x: xp.rad2deg(x), "(({0}) * 57.29577951308232)", "rad2deg"),
    # scipy.special.erf's and expit's ufuncs (named "erf", "expit") and pl.compiler.erf
    "erf": (_special("erf"), "erf({0})", "erf"),
    "expit": (_special("expit"), "(1 / (1 + exp(-({0}))))", "expit"),
    # NaN stays NaN, both zeros give +0
    "sign": (lambda xp, x: xp.sign(x),
             "(({0}) > 0 ? 1 : (({0}) < 0 ? -1 : (({0}) == ({0}) ? 0 : ({0}))))", "sign"),
    # predicates read their operand as it is (no conversion to the bool result); the
    # integer-safe forms: x - x is 0 for every finite x, NaN for an infinity or a NaN
    "isnan": (lambda xp, x: xp.isnan(x), "(({0}) != ({0}))", "isnan"),
    "isinf": (lambda xp, x: xp.isinf(x), "(({0}) - ({0}) != 0 && ({0}) == ({0}))", "isinf"),
    "isfinite": (lambda xp, x: xp.isfinite(x), "(({0}) - ({0}) == 0)", "isfinite"),
    "signbit": (lambda xp, x: xp.signbit(x), "signbit({0})", "signbit"),
}

for _name, (_ref, _cuda, _ufunc) in _BINARY.items():
    register(OpDef(_name, "elementwise", 2, broadcast_shape,
                    (lambda f: lambda xp, args, attrs: f(xp, *args))(_ref), _cuda,
                    ufunc=_ufunc))
for _name, (_ref, _cuda, _ufunc) in _UNARY.items():
    register(OpDef(_name, "elementwise", 1, same_shape,
                    (lambda f: lambda xp, args, attrs: f(xp, *args))(_ref), _cuda,
                    ufunc=_ufunc))

register(OpDef(
    # np.clip: NaN in any operand gives NaN; otherwise max(x, lo) then min(., hi), the
    # first operand kept on ties (so clip(-0.0, 0.0, 1.0) is -0.0, as in NumPy)
    "clip", "elementwise", 3, broadcast_shape,
    lambda xp, args, attrs: xp.clip(*args),
    "(({1}) != ({1}) ? ({1}) : (({2}) != ({2}) ? ({2}) : "
    "(((({0}) < ({1})) ? ({1}) : ({0})) > ({2}) ? ({2}) : "
    "((({0}) < ({1})) ? ({1}) : ({0})))))",
    ufunc="clip",
))
register(OpDef(
    "where", "elementwise", 3, broadcast_shape,
    lambda xp, args, attrs: xp.where(*args), "({0} ? {1} : {2})",
))
register(OpDef(
    "astype", "elementwise", 1, same_shape,
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

    register(OpDef(name, "reduction", None, _reduce_shape, reference))


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
            dt = ACTIVATIONS[attrs["activation"]](np, tiny(dt)).dtype
    return dt


register(OpDef("matmul", "matmul", None, _matmul_shape, _matmul_reference,
                dtype=_matmul_dtype))


# -- normalisations ------------------------------------------------------------------------
def _float_of(dtype: np.dtype) -> np.dtype:
    """A normalisation's result dtype: a float input's own (bfloat16 included), else
    float64."""
    return dtype if dtype.kind == "f" or dtype.name == "bfloat16" else np.dtype(np.float64)


def _working(x: Any) -> Any:
    """``x`` in the dtype a normalisation computes in: bfloat16 in float32 (rounded once
    at the end, the rule of bfloat16 reductions), an integer in float64."""
    if x.dtype.name == "bfloat16":
        return x.astype(np.float32)
    return x if x.dtype.kind == "f" else x.astype(np.float64)


def _softmax_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    x = _working(args[0])
    axis = attrs["axis"]
    e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    out = e / xp.sum(e, axis=axis, keepdims=True)
    return out.astype(_float_of(args[0].dtype), copy=False)


def _softmax_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    normalize_axis(attrs["axis"], len(inputs[0].shape))
    return tuple(inputs[0].shape)


register(OpDef("softmax", "norm", 1, _softmax_shape, _softmax_reference,
                dtype=lambda inputs, attrs: _float_of(inputs[0].dtype)))


def _layer_norm_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    result = _layer_norm_dtype(args, attrs)
    x = _working(args[0])
    if result.name == "bfloat16":  # scale and shift in float32 too: one rounding
        args = [x, *(a.astype(np.float32) for a in args[1:])]
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
    return y.astype(result, copy=False)


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


register(OpDef("layer_norm", "norm", None, _layer_norm_shape, _layer_norm_reference,
                dtype=_layer_norm_dtype))


# -- sources, fused groups and graph breaks ------------------------------------------------
def _no_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    raise ShapeError("this op's shape is given when it is built")


def _constant_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    return xp.asarray(attrs["value"])


register(OpDef("input", "source", 0, _no_shape,
                lambda xp, args, attrs: (_ for _ in ()).throw(
                    PycLabError("an input node has no reference"))))
register(OpDef("constant", "source", 0,
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


register(OpDef("fused", "fused", None, _fused_shape, _fused_reference,
                dtype=lambda inputs, attrs: attrs["body"].nodes[attrs["body"].outputs[0]].dtype))


# ``fused_rows``: a row program (row fusion) — elementwise prologue, reductions over the
# axes ``attrs["axes"]`` (any sorted axes; the last axis when absent) of its row
# space ``attrs["space"]`` and an elementwise epilogue, one body graph whose output 0 is
# the node's value (outputs 1, 2, ...: row values read through ``fused_extra`` nodes),
# computed as written (its reference runs the body op by op).
register(OpDef("fused_rows", "norm", None, _fused_shape, _fused_reference,
                dtype=lambda inputs, attrs: attrs["body"].nodes[attrs["body"].outputs[0]].dtype))

# ``fused_extra``: output ``attrs["output"]`` (>= 1) of a fused node whose body has several
# outputs (its input 0, which the generated kernel writes in the same pass); its other
# inputs are the fused node's, so that its reference can compute it alone.
register(OpDef("fused_extra", "extra", None, _fused_extra_shape, _fused_extra_reference,
                dtype=lambda inputs, attrs: attrs["body"].nodes[
                    attrs["body"].outputs[attrs["output"]]].dtype))

#: Ops whose ``attrs["body"]`` is a graph computed as one kernel.
FUSED_OPS = ("fused", "fused_rows")

def _eager_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    fn = attrs["_fn"]
    call_args, call_kwargs = attrs["_rebuild"](list(args))
    return fn(*call_args, **call_kwargs)


register(OpDef("eager", "eager", None, _no_shape, _eager_reference))


#: NumPy ufunc name -> the op with its semantics (``np.true_divide`` is ``"divide"``).
UFUNC_OPS: dict[str, str] = {d.ufunc: name for name, d in REGISTRY.items() if d.ufunc}
UFUNC_OPS.update(radians="deg2rad", degrees="rad2deg")  # NumPy's aliases, ufuncs of their own
