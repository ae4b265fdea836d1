"""The ONNX op table: each supported node type as a NumPy-style function of its inputs.

A handler takes ``(args, attrs, op, node, opset)`` — the node's input values (traced
arrays, NumPy constants, or ``None`` for an omitted optional input), its attributes read
once by the importer, the op and node names for messages, and the model's opset — and
returns the output (a tuple for several) built from :mod:`.onnx_ops` and NumPy calls, which
``pl.compile`` traces. :data:`STATIC_INPUTS` names the inputs that must be import-time
constants (a ``Reshape`` target, ``ReduceMean`` axes). Attributes a handler cannot honour
raise :class:`~pyc_lab.inference.errors.UnsupportedOpError` with the fix.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import onnx_ops as ops
from .errors import ModelImportError, UnsupportedOpError

__all__ = ["HANDLERS", "POOLS_CHANNELS_LAST", "STATIC_INPUTS", "SUPPORTED_OPS", "bn_scale_shift",
           "conv_channels_last", "np_dtype"]


def bn_scale_shift(gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray, var: np.ndarray,
                   eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Inference batch norm as ``y = x * scale + shift``, in float64.

    ``scale = gamma / sqrt(var + eps)``, ``shift = beta - mean * scale``.
    """
    g, b, m, v = (np.asarray(a, dtype=np.float64) for a in (gamma, beta, mean, var))
    scale = g / np.sqrt(v + float(eps))
    return scale, b - m * scale


def np_dtype(elem_type: int) -> np.dtype:
    """The NumPy dtype of an ONNX tensor element type."""
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _ints(v: Any) -> list[int]:
    return [int(i) for i in np.asarray(v).reshape(-1)]


def _const(v: Any, what: str) -> np.ndarray:
    if not isinstance(v, np.ndarray) and not np.isscalar(v):
        raise ModelImportError(f"{what} must be known when the model is imported (a "
                               "constant or an initializer); here it is computed from the "
                               "inputs, which pyc_lab's static-shape import does not take")
    return np.asarray(v)


def _axes(args: list[Any], attrs: dict[str, Any], what: str) -> list[int] | None:
    if len(args) > 1 and args[1] is not None:
        return _ints(_const(args[1], f"{what}'s axes"))
    return _ints(attrs["axes"]) if "axes" in attrs else None


def _pool_attrs(attrs: dict[str, Any], op: str, node: str) -> dict[str, Any]:
    if int(attrs.get("ceil_mode", 0)):
        raise UnsupportedOpError(f"{op} node {node!r}: ceil_mode=1 is not supported; "
                                 "export the model with ceil_mode=0 (floor)")
    _no_auto_pad(attrs, op, node)
    return {"strides": attrs.get("strides"), "pads": attrs.get("pads"),
            "dilations": attrs.get("dilations")}


def _no_auto_pad(attrs: dict[str, Any], op: str, node: str) -> None:
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise UnsupportedOpError(f"{op} node {node!r}: auto_pad={attrs['auto_pad']!r} is "
                                 "not supported; export the model with explicit pads")


def _conv(args, attrs, op, node, opset, route="im2col"):
    _no_auto_pad(attrs, op, node)
    return ops.conv(args[0], args[1], args[2] if len(args) > 2 else None,
                    strides=attrs.get("strides"), pads=attrs.get("pads"),
                    dilations=attrs.get("dilations"), group=int(attrs.get("group", 1)),
                    route=route)


def conv_channels_last(args, attrs, op, node, opset):
    """A 2-D ``Conv`` node on a channels-last input (:mod:`.onnx_layout`)."""
    _no_auto_pad(attrs, op, node)
    return ops.conv_channels_last(args[0], args[1], args[2] if len(args) > 2 else None,
                                  strides=attrs.get("strides"), pads=attrs.get("pads"),
                                  dilations=attrs.get("dilations"),
                                  group=int(attrs.get("group", 1)))


def _conv_transpose(args, attrs, op, node, opset, route="im2col"):
    _no_auto_pad(attrs, op, node)
    if "output_shape" in attrs:
        raise UnsupportedOpError(f"{op} node {node!r}: output_shape is not supported; export "
                                 "the model with explicit pads and output_padding")
    return ops.conv_transpose(args[0], args[1], args[2] if len(args) > 2 else None,
                              strides=attrs.get("strides"), pads=attrs.get("pads"),
                              dilations=attrs.get("dilations"),
                              output_padding=attrs.get("output_padding"),
                              group=int(attrs.get("group", 1)), route=route)


def _gemm(args, attrs, op, node, opset):
    return ops.gemm(args[0], args[1], args[2] if len(args) > 2 else None,
                    alpha=float(attrs.get("alpha", 1.0)), beta=float(attrs.get("beta", 1.0)),
                    trans_a=bool(attrs.get("transA", 0)), trans_b=bool(attrs.get("transB", 0)))


def _batch_norm(args, attrs, op, node, opset):
    x, *params = args
    consts = [_const(p, f"{op} {node!r}'s statistics") for p in params[:4]]
    scale, shift = bn_scale_shift(*consts, float(attrs.get("epsilon", 1e-5)))
    dt = np.dtype(x.dtype)
    return ops.batch_norm(x, scale.astype(dt), shift.astype(dt))


def _max_pool(args, attrs, op, node, opset, channels_last=False):
    return ops.max_pool(args[0], attrs["kernel_shape"], channels_last=channels_last,
                        **_pool_attrs(attrs, op, node))


def _avg_pool(args, attrs, op, node, opset, channels_last=False):
    return ops.average_pool(args[0], attrs["kernel_shape"],
                            count_include_pad=bool(attrs.get("count_include_pad", 0)),
                            channels_last=channels_last, **_pool_attrs(attrs, op, node))


#: The pooling ops of a 2-D channels-last input (:mod:`.onnx_layout`), whose result is
#: channels last too.
POOLS_CHANNELS_LAST: dict[str, Callable[..., Any]] = {
    "MaxPool": functools.partial(_max_pool, channels_last=True),
    "AveragePool": functools.partial(_avg_pool, channels_last=True),
    "GlobalAveragePool": lambda args, attrs, op, node, opset: ops.global_average_pool_last(
        args[0]),
}


def _softmax(args, attrs, op, node, opset):
    return ops.softmax(args[0], int(attrs.get("axis", -1 if opset >= 13 else 1)), opset)


def _layer_norm(args, attrs, op, node, opset):
    return ops.layer_norm(args[0], args[1] if len(args) > 1 else None,
                          args[2] if len(args) > 2 else None, axis=int(attrs.get("axis", -1)),
                          eps=float(attrs.get("epsilon", 1e-5)))


def _reduce_mean(args, attrs, op, node, opset):
    return ops.reduce_mean(args[0], _axes(args, attrs, op), bool(attrs.get("keepdims", 1)),
                           bool(attrs.get("noop_with_empty_axes", 0)))


def _reduce(fn: Callable[[Any, tuple[int, ...], bool], Any]) -> Callable[..., Any]:
    """An ONNX ``Reduce*`` op: its axes (an input from opset 18, an attribute before; none:
    every axis, or the input itself with ``noop_with_empty_axes``), ``keepdims`` (default
    1), the result in the input's dtype as ONNX keeps it (NumPy sums int32 into int64)."""
    def run(args, attrs, op, node, opset):
        x = args[0]
        axes = _axes(args, attrs, op)
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.ndim))
        out = fn(x, tuple(int(a) % x.ndim for a in axes), bool(attrs.get("keepdims", 1)))
        return out if out.dtype == x.dtype else out.astype(x.dtype)

    return run


def _log_sum_exp(x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    """``log(sum(exp(x)))`` with the maximum taken out first (no overflow)."""
    top = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True)) + top
    return out if keepdims else np.squeeze(out, axis=axis)


def _arg_extreme(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(args, attrs, op, node, opset):
        if attrs.get("select_last_index", 0):
            raise UnsupportedOpError(f"{op} node {node!r}: select_last_index=1 is not "
                                     "supported")
        x = args[0]
        return fn(x, axis=int(attrs.get("axis", 0)) % x.ndim,
                  keepdims=bool(attrs.get("keepdims", 1))).astype(np.int64)

    return run


def _expand(args, attrs, op, node, opset):
    shape = tuple(_ints(_const(args[1], f"Expand {node!r}'s shape")))
    x = args[0]
    return np.broadcast_to(x, np.broadcast_shapes(tuple(x.shape), shape)).copy()


def _trilu(args, attrs, op, node, opset):
    k = int(_const(args[1], f"Trilu {node!r}'s k")) if len(args) > 1 and \
        args[1] is not None else 0
    return (np.triu if attrs.get("upper", 1) else np.tril)(args[0], k)


def _reshape(args, attrs, op, node, opset):
    return ops.reshape(args[0], _ints(_const(args[1], f"Reshape {node!r}'s shape")),
                       bool(attrs.get("allowzero", 0)))


def _transpose(args, attrs, op, node, opset):
    perm = attrs.get("perm")
    return np.transpose(args[0], None if perm is None else tuple(int(p) for p in perm))


def _squeeze(args, attrs, op, node, opset):
    axes = _axes(args, attrs, op)
    return np.squeeze(args[0], axis=None if axes is None else tuple(axes))


def _unsqueeze(args, attrs, op, node, opset):
    x = args[0]
    axes = _axes(args, attrs, op) or []
    ndim = x.ndim + len(axes)
    for a in sorted(int(a) % ndim for a in axes):
        x = np.expand_dims(x, a)
    return x


def _constant(args, attrs, op, node, opset):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attrs:
            v = attrs[key]
            if key.startswith("value_float"):
                return np.asarray(v, dtype=np.float32)
            if key.startswith("value_int"):
                return np.asarray(v, dtype=np.int64)
            return np.asarray(v)
    raise UnsupportedOpError(f"Constant node {node!r}: only value/value_float(s)/value_int(s) "
                             "attributes are supported")


def _constant_of_shape(args, attrs, op, node, opset):
    shape = _ints(_const(args[0], f"ConstantOfShape {node!r}'s shape"))
    value = attrs.get("value")
    fill = np.asarray(0.0, np.float32) if value is None else np.asarray(value).reshape(-1)[0]
    return np.full(tuple(shape), fill, dtype=np.asarray(fill).dtype)


def _cast(args, attrs, op, node, opset):
    return args[0].astype(np_dtype(int(attrs["to"])))


def _clip(args, attrs, op, node, opset):
    x = args[0]
    lo = args[1] if len(args) > 1 and args[1] is not None else attrs.get("min")
    hi = args[2] if len(args) > 2 and args[2] is not None else attrs.get("max")
    if lo is not None:
        x = np.maximum(x, np.asarray(_const(lo, "Clip's min"), dtype=np.dtype(x.dtype)))
    if hi is not None:
        x = np.minimum(x, np.asarray(_const(hi, "Clip's max"), dtype=np.dtype(x.dtype)))
    return x


def _leaky_relu(args, attrs, op, node, opset):
    x = args[0]
    alpha = np.dtype(x.dtype).type(attrs.get("alpha", 0.01))
    return np.where(x < 0, x * alpha, x)


def _prelu(args, attrs, op, node, opset):
    x, slope = args
    if x.ndim > 2 and slope.ndim == 1 and slope.shape[0] == x.shape[1] != x.shape[-1]:
        # a per-channel slope (what older exporters write) broadcasts over axis 1
        slope = np.reshape(slope, (-1,) + (1,) * (x.ndim - 2))
    return np.where(x < 0, x * slope, x)


def _elu(args, attrs, op, node, opset):
    x = args[0]
    alpha = np.dtype(x.dtype).type(attrs.get("alpha", 1.0))
    return np.where(x < 0, alpha * (np.exp(np.minimum(x, 0)) - 1), x)


def _selu(args, attrs, op, node, opset):
    x = args[0]
    dt = np.dtype(x.dtype).type
    alpha = dt(attrs.get("alpha", 1.67326319217681884765625))
    gamma = dt(attrs.get("gamma", 1.05070102214813232421875))
    return gamma * np.where(x < 0, alpha * (np.exp(np.minimum(x, 0)) - 1), x)


def _log_softmax(args, attrs, op, node, opset):
    x = args[0]
    axis = int(attrs.get("axis", -1 if opset >= 13 else 1))
    if opset >= 13:
        return ops.log_softmax(x, axis)
    axis %= x.ndim
    shape = tuple(x.shape)
    flat = np.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))
    return np.reshape(ops.log_softmax(flat, -1), shape)


def _pad(args, attrs, op, node, opset):
    mode = attrs.get("mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in ops.PAD_MODES:
        raise UnsupportedOpError(f"Pad node {node!r}: mode {mode!r} is not supported (one of "
                                 f"{', '.join(ops.PAD_MODES)})")
    x = args[0]
    if len(args) > 1 and args[1] is not None:
        pads = _ints(_const(args[1], f"Pad {node!r}'s pads"))
    else:
        pads = _ints(attrs["pads"])
    value = 0.0
    if len(args) > 2 and args[2] is not None:
        value = float(_const(args[2], f"Pad {node!r}'s value"))
    elif "value" in attrs:
        value = float(attrs["value"])
    if len(args) > 3 and args[3] is not None:  # axes (opset 18)
        axes = [int(a) % x.ndim for a in _ints(_const(args[3], f"Pad {node!r}'s axes"))]
        full = [0] * (2 * x.ndim)
        for k, a in enumerate(axes):
            full[a], full[a + x.ndim] = pads[k], pads[k + len(axes)]
        pads = full
    return ops.pad(x, pads, value, mode)


def _slice(args, attrs, op, node, opset):
    x = args[0]
    if opset >= 10:
        starts = _ints(_const(args[1], f"Slice {node!r}'s starts"))
        ends = _ints(_const(args[2], f"Slice {node!r}'s ends"))
        axes = _ints(_const(args[3], "Slice's axes")) if len(args) > 3 and \
            args[3] is not None else list(range(len(starts)))
        steps = _ints(_const(args[4], "Slice's steps")) if len(args) > 4 and \
            args[4] is not None else [1] * len(starts)
    else:
        starts, ends = _ints(attrs["starts"]), _ints(attrs["ends"])
        axes = _ints(attrs.get("axes", list(range(len(starts)))))
        steps = [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        index[a % x.ndim] = slice(s, e, st)  # NumPy clamps as ONNX does
    return x[tuple(index)]


def _split(args, attrs, op, node, opset):
    x = args[0]
    axis = int(attrs.get("axis", 0)) % x.ndim
    if len(args) > 1 and args[1] is not None:
        sizes = _ints(_const(args[1], f"Split {node!r}'s sizes"))
    elif "split" in attrs:
        sizes = _ints(attrs["split"])
    else:
        n = int(attrs.get("num_outputs", attrs["_outputs"]))
        size = -(-x.shape[axis] // n)
        sizes = [min(size, x.shape[axis] - k * size) for k in range(n)]
    out, start = [], 0
    for size in sizes:
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, start + size)
        out.append(x[tuple(index)])
        start += size
    return tuple(out)


def _variadic(fn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def run(args, attrs, op, node, opset):
        out = args[0]
        for a in args[1:]:
            out = fn(out, a)
        return out

    return run


def _unary(fn: Callable[[Any], Any]) -> Callable[..., Any]:
    return lambda args, attrs, op, node, opset: fn(args[0])


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    return lambda args, attrs, op, node, opset: fn(args[0], args[1])


def _shape(args, attrs, op, node, opset):
    shape = np.asarray(args[0].shape, dtype=np.int64)
    start, end = attrs.get("start", 0), attrs.get("end")
    return shape[start:end]


def _gather(args, attrs, op, node, opset):
    # constant indices into shapes fold at import; indices that are inputs or computed
    # from them (an embedding lookup) are a gather op, fused into the kernel around it
    return np.take(args[0], args[1], axis=int(attrs.get("axis", 0)))


def _gather_elements(args, attrs, op, node, opset):
    return np.take_along_axis(args[0], args[1], axis=int(attrs.get("axis", 0)))


def _concat(args, attrs, op, node, opset):
    return np.concatenate([a for a in args if a is not None], axis=int(attrs["axis"]))


def _flatten(args, attrs, op, node, opset):
    return ops.flatten(args[0], int(attrs.get("axis", 1)))


HANDLERS: dict[str, Callable[..., Any]] = {
    "Gemm": _gemm,
    "MatMul": _binary(np.matmul),
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "BatchNormalization": _batch_norm,
    "Relu": _unary(lambda x: ops.F.relu(x)),
    "Gelu": lambda args, attrs, op, node, opset: ops.gelu(args[0],
                                                         attrs.get("approximate", "none")),
    "Sigmoid": _unary(lambda x: ops.F.sigmoid(x)),
    "Tanh": _unary(np.tanh),
    "Softmax": _softmax,
    "LayerNormalization": _layer_norm,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _binary(np.divide),
    "Pow": _binary(np.power),
    "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum),
    "Sum": _variadic(np.add),
    "Exp": _unary(np.exp),
    "Log": _unary(np.log),
    "Sqrt": _unary(np.sqrt),
    "Neg": _unary(np.negative),
    "Abs": _unary(np.abs),
    "Reciprocal": _unary(np.reciprocal),
    "Erf": _unary(ops.erf),
    "LeakyRelu": _leaky_relu,
    "Clip": _clip,
    "Reshape": _reshape,
    "PRelu": _prelu,
    "Elu": _elu,
    "Selu": _selu,
    "Softplus": _unary(ops.softplus),
    "Softsign": _unary(lambda x: x / (1 + np.abs(x))),
    "HardSigmoid": lambda args, attrs, op, node, opset: ops.hard_sigmoid(
        args[0], attrs.get("alpha", 0.2), attrs.get("beta", 0.5)),
    "HardSwish": _unary(lambda x: x * ops.hard_sigmoid(x, 1 / 6, 0.5)),
    "Mish": _unary(ops.mish),
    "InstanceNormalization": lambda args, attrs, op, node, opset: ops.instance_norm(
        args[0], args[1], args[2], float(attrs.get("epsilon", 1e-5))),
    "Tile": lambda args, attrs, op, node, opset: ops.tile(
        args[0], _ints(_const(args[1], f"Tile {node!r}'s repeats"))),
    "LRN": lambda args, attrs, op, node, opset: ops.lrn(
        args[0], int(attrs["size"]), float(attrs.get("alpha", 1e-4)),
        float(attrs.get("beta", 0.75)), float(attrs.get("bias", 1.0))),
    # the math library's elementwise functions (ONNX Round: half to even, as np.rint)
    **{name: _unary(fn) for name, fn in (
        ("Sin", np.sin), ("Cos", np.cos), ("Tan", np.tan), ("Asin", np.arcsin),
        ("Acos", np.arccos), ("Atan", np.arctan), ("Sinh", np.sinh), ("Cosh", np.cosh),
        ("Asinh", np.arcsinh), ("Acosh", np.arccosh), ("Atanh", np.arctanh),
        ("Floor", np.floor), ("Ceil", np.ceil), ("Round", np.rint), ("Sign", np.sign))},
    "LogSoftmax": _log_softmax,
    "Pad": _pad,
    "Slice": _slice,
    "Split": _split,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Concat": _concat,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "MaxPool": _max_pool,
    "AveragePool": _avg_pool,
    "GlobalAveragePool": _unary(ops.global_average_pool),
    "ReduceMean": _reduce_mean,
    "ReduceSum": _reduce(lambda x, a, k: np.sum(x, axis=a, keepdims=k)),
    "ReduceMax": _reduce(lambda x, a, k: np.max(x, axis=a, keepdims=k)),
    "ReduceMin": _reduce(lambda x, a, k: np.min(x, axis=a, keepdims=k)),
    "ReduceProd": _reduce(lambda x, a, k: np.prod(x, axis=a, keepdims=k)),
    "ReduceSumSquare": _reduce(lambda x, a, k: np.sum(x * x, axis=a, keepdims=k)),
    "ReduceL1": _reduce(lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k)),
    "ReduceL2": _reduce(lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k))),
    "ReduceLogSumExp": _reduce(_log_sum_exp),
    "ArgMax": _arg_extreme(np.argmax),
    "ArgMin": _arg_extreme(np.argmin),
    "Where": lambda args, attrs, op, node, opset: np.where(args[0], args[1], args[2]),
    "Equal": _binary(np.equal),
    "Less": _binary(np.less),
    "LessOrEqual": _binary(np.less_equal),
    "Greater": _binary(np.greater),
    "GreaterOrEqual": _binary(np.greater_equal),
    "Not": _unary(np.logical_not),
    "And": _binary(np.logical_and),
    "Or": _binary(np.logical_or),
    "Xor": _binary(np.logical_xor),
    "Mean": lambda args, attrs, op, node, opset: _variadic(np.add)(
        args, attrs, op, node, opset) / np.asarray(len(args), dtype=np.dtype(args[0].dtype)),
    "Expand": _expand,
    "Trilu": _trilu,
    "Einsum": lambda args, attrs, op, node, opset: np.einsum(
        attrs["equation"].decode() if isinstance(attrs["equation"], bytes)
        else attrs["equation"], *args),
    "Identity": _unary(lambda x: x),
    "Dropout": _unary(lambda x: x),
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Cast": _cast,
    "Shape": _shape,
    "Gather": _gather,
    "GatherElements": _gather_elements,
}

#: The ONNX ops (default domain) the importer maps onto pyc_lab's compiler.
SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(HANDLERS))

#: Inputs that must be constants (Python values in the program, never traced).
STATIC_INPUTS: dict[str, set[int]] = {
    "Reshape": {1}, "ReduceMean": {1}, "ReduceSum": {1}, "Squeeze": {1}, "Unsqueeze": {1},
    "Clip": {1, 2},
    "BatchNormalization": {1, 2, 3, 4}, "Gather": {1}, "ConstantOfShape": {0},
    "Pad": {1, 2, 3}, "Slice": {1, 2, 3, 4}, "Split": {1}, "Tile": {1}, "Expand": {1},
    "Trilu": {1}, **{op: {1} for op in ("ReduceMax", "ReduceMin", "ReduceProd",
                                        "ReduceSumSquare", "ReduceL1", "ReduceL2",
                                        "ReduceLogSumExp")},
}
