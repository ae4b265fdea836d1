"""ONNX in: a model (path, bytes or ``ModelProto``) as a Python function ``pl.compile`` traces.

The import reads the graph once and turns it into a program of steps, each an ONNX node
mapped to a NumPy-style function (:mod:`.onnx_ops`). On the way it

- folds every ``BatchNormalization`` that follows a ``Conv`` or ``Gemm`` with constant
  weights into that layer (the new weights computed in float64 and rounded once to the
  weights' dtype, so the folded layer equals the pair up to float32 rounding);
- evaluates nodes whose inputs are all constants (shape arithmetic, ``Constant``);
- binds the float initializers as the function's weight arguments and keeps shape-like
  inputs (``Reshape``'s target, ``ReduceMean``'s axes) as Python constants.

An op with no mapping raises :class:`~pyc_lab.inference.errors.UnsupportedOpError`
naming the op and the node, unless onnxruntime is installed and the caller allows it:
then that node alone runs through onnxruntime as a graph break of the compiled
function, and ``explain()`` says so.
"""

from __future__ import annotations

import keyword
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import onnx_ops as ops
from .errors import ModelImportError, UnsupportedOpError

__all__ = ["SUPPORTED_OPS", "ImportedGraph", "TensorSpec", "bn_scale_shift", "import_onnx",
           "read_model"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, dtype and shape (``None`` for a free dimension).

    Attributes
    ----------
    name
        The tensor's name in the model.
    dtype
        Its NumPy dtype.
    shape
        Its shape; ``None`` where the model leaves the size free (the batch axis).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]

    def describe(self) -> str:
        """``name: float32[N, 18]`` (free dimensions written ``N``)."""
        dims = ", ".join("N" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {np.dtype(self.dtype).name}[{dims}]"

    def to_v2(self) -> dict[str, Any]:
        """The KServe v2 metadata entry (free dimensions are ``-1``)."""
        from .protocol import datatype_of

        return {"name": self.name, "datatype": datatype_of(self.dtype),
                "shape": [-1 if d is None else int(d) for d in self.shape]}


@dataclass
class _Step:
    op: str
    node: str
    fn: Callable[..., Any]
    inputs: list[str]
    outputs: list[str]


@dataclass
class ImportedGraph:
    """What :func:`import_onnx` returns: the function, its weights, and what was done.

    Attributes
    ----------
    name
        The graph's name.
    function
        ``function(*inputs, *weights)``: positional parameters named after the model's
        inputs, then ``w0, w1, ...``; NumPy-style, ready for ``pl.compile``.
    inputs, outputs
        The model's tensors.
    weights
        The arrays bound to the weight parameters, in order.
    notes
        One line per import decision (folded batch norms, graph breaks, constants).
    op_counts
        ONNX op -> nodes of it in the imported program.
    breaks
        ``(op, node)`` of every node that runs through onnxruntime.
    opset
        The model's default-domain opset.
    """

    name: str
    function: Callable[..., Any]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    weights: list[np.ndarray]
    notes: list[str] = field(default_factory=list)
    op_counts: dict[str, int] = field(default_factory=dict)
    breaks: list[tuple[str, str]] = field(default_factory=list)
    opset: int = 0


# -- reading --------------------------------------------------------------------------------
def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise ModelImportError("importing ONNX models needs the onnx package: "
                               "pip install onnx (or pip install 'pyc-lab[serve]')") from None
    return onnx


def read_model(model: Any) -> Any:
    """An ONNX ``ModelProto`` from a path, bytes, or a ``ModelProto``, checked.

    Raises
    ------
    ModelImportError
        If the file is missing, is not an ONNX model, or fails ``onnx.checker``.
    """
    onnx = _onnx()
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as exc:
            raise ModelImportError(f"these bytes are not an ONNX model ({exc})") from None
    elif isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            raise ModelImportError(f"no ONNX model at {str(path)!r}: pass a path to a .onnx "
                                   "file, its bytes, or an onnx.ModelProto")
        try:
            proto = onnx.load(str(path))
        except Exception as exc:
            raise ModelImportError(f"{str(path)!r} is not an ONNX model ({exc})") from None
    else:
        raise ModelImportError(f"cannot import a {type(model).__name__} as an ONNX model: "
                               "pass a path, bytes or an onnx.ModelProto")
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ModelImportError(f"the ONNX model fails onnx.checker: {exc}") from None
    return proto


def _np_dtype(elem_type: int) -> np.dtype:
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _spec(value_info: Any) -> TensorSpec:
    t = value_info.type.tensor_type
    dims: list[int | None] = []
    for d in t.shape.dim:
        dims.append(int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None)
    return TensorSpec(value_info.name, _np_dtype(t.elem_type), tuple(dims))


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper, numpy_helper

    out: dict[str, Any] = {}
    out["_outputs"] = len(node.output)
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif hasattr(v, "data_type") and hasattr(v, "dims"):  # a TensorProto
            v = numpy_helper.to_array(v)
        elif isinstance(v, list):
            v = [x.decode() if isinstance(x, bytes) else x for x in v]
        out[a.name] = v
    return out


# -- batch norm folding -------------------------------------------------------------------------
def bn_scale_shift(gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray, var: np.ndarray,
                   eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Inference batch norm as ``y = x * scale + shift``, in float64.

    ``scale = gamma / sqrt(var + eps)``, ``shift = beta - mean * scale``.
    """
    g, b, m, v = (np.asarray(a, dtype=np.float64) for a in (gamma, beta, mean, var))
    scale = g / np.sqrt(v + float(eps))
    return scale, b - m * scale


def _fold_batch_norms(nodes: list[Any], consts: dict[str, np.ndarray], outputs: set[str],
                      notes: list[str]) -> list[Any]:
    """Fold BatchNormalization into a preceding Conv/Gemm with constant weights, in place
    of both (new initializers are added to ``consts``)."""
    from onnx import helper

    consumers: Counter[str] = Counter(i for n in nodes for i in n.input if i)
    producer = {o: n for n in nodes for o in n.output}
    drop: set[int] = set()
    replace: dict[int, Any] = {}
    for bn in nodes:
        if bn.op_type != "BatchNormalization" or (len(bn.output) != 1 and any(bn.output[1:])):
            continue
        x = bn.input[0]
        prev = producer.get(x)
        if prev is None or prev.op_type not in ("Conv", "Gemm") or consumers[x] != 1 \
                or x in outputs or not all(n in consts for n in bn.input[1:5]):
            continue
        w_name = prev.input[1]
        if w_name not in consts:
            continue
        attrs = _attrs(prev)
        eps = float(_attrs(bn).get("epsilon", 1e-5))
        scale, shift = bn_scale_shift(*(consts[n] for n in bn.input[1:5]), eps)
        w = consts[w_name]
        w64 = w.astype(np.float64)
        bias_name = prev.input[2] if len(prev.input) > 2 and prev.input[2] else None
        if prev.op_type == "Conv":
            w_new = w64 * scale.reshape((-1,) + (1,) * (w.ndim - 1))
            b64 = (consts[bias_name].astype(np.float64) if bias_name
                   else np.zeros(w.shape[0]))
            b_new = b64 * scale + shift
            new_attrs = {k: v for k, v in attrs.items() if not k.startswith("_")}
        else:  # Gemm: y = alpha * A @ B' + beta * C
            if bias_name and bias_name not in consts:
                continue
            trans_b = int(attrs.get("transB", 0))
            alpha = float(attrs.get("alpha", 1.0))
            beta = float(attrs.get("beta", 1.0))
            n_out = w.shape[0] if trans_b else w.shape[1]
            if scale.shape != (n_out,):
                continue
            w_new = w64 * (scale[:, None] if trans_b else scale[None, :])
            if bias_name:
                c = consts[bias_name].astype(np.float64)
                if c.shape not in ((n_out,), (1, n_out)):
                    continue
                b_new = (beta * c.reshape(-1)) * scale + shift
            else:
                b_new = shift
            new_attrs = {"alpha": alpha, "beta": 1.0, "transA": int(attrs.get("transA", 0)),
                         "transB": trans_b}
        w_fold, b_fold = f"{w_name}__bn_folded", f"{bn.output[0]}__bn_bias"
        consts[w_fold] = w_new.astype(w.dtype)
        consts[b_fold] = b_new.astype(w.dtype)
        node = helper.make_node(prev.op_type, [prev.input[0], w_fold, b_fold], [bn.output[0]],
                                name=prev.name or prev.output[0], **new_attrs)
        replace[id(prev)] = node
        drop.add(id(bn))
        notes.append(f"BatchNormalization {bn.name or bn.output[0]!r} folded into "
                     f"{prev.op_type} {prev.name or prev.output[0]!r}")
    return [replace.get(id(n), n) for n in nodes if id(n) not in drop]


# -- the op table -----------------------------------------------------------------------------
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


def _conv(args, attrs, op, node, opset):
    _no_auto_pad(attrs, op, node)
    return ops.conv(args[0], args[1], args[2] if len(args) > 2 else None,
                    strides=attrs.get("strides"), pads=attrs.get("pads"),
                    dilations=attrs.get("dilations"), group=int(attrs.get("group", 1)))


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


def _max_pool(args, attrs, op, node, opset):
    return ops.max_pool(args[0], attrs["kernel_shape"], **_pool_attrs(attrs, op, node))


def _avg_pool(args, attrs, op, node, opset):
    return ops.average_pool(args[0], attrs["kernel_shape"],
                            count_include_pad=bool(attrs.get("count_include_pad", 0)),
                            **_pool_attrs(attrs, op, node))


def _softmax(args, attrs, op, node, opset):
    return ops.softmax(args[0], int(attrs.get("axis", -1 if opset >= 13 else 1)), opset)


def _layer_norm(args, attrs, op, node, opset):
    return ops.layer_norm(args[0], args[1] if len(args) > 1 else None,
                          args[2] if len(args) > 2 else None, axis=int(attrs.get("axis", -1)),
                          eps=float(attrs.get("epsilon", 1e-5)))


def _reduce_mean(args, attrs, op, node, opset):
    return ops.reduce_mean(args[0], _axes(args, attrs, op), bool(attrs.get("keepdims", 1)),
                           bool(attrs.get("noop_with_empty_axes", 0)))


def _reduce_sum(args, attrs, op, node, opset):
    axes = _axes(args, attrs, op)
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return args[0]
        axes = list(range(args[0].ndim))
    return np.sum(args[0], axis=tuple(int(a) % args[0].ndim for a in axes),
                  keepdims=bool(attrs.get("keepdims", 1)))


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
    return args[0].astype(_np_dtype(int(attrs["to"])))


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
    if mode != "constant":
        raise UnsupportedOpError(f"Pad node {node!r}: mode {mode!r} is not supported (only "
                                 "'constant')")
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
    return ops.pad(x, pads, value)


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
    # constant indices into shapes fold at import; indices computed from the inputs (an
    # embedding lookup) make np.take a graph break that runs as NumPy/CuPy at every call
    return np.take(args[0], args[1], axis=int(attrs.get("axis", 0)))


def _concat(args, attrs, op, node, opset):
    return np.concatenate([a for a in args if a is not None], axis=int(attrs["axis"]))


def _flatten(args, attrs, op, node, opset):
    return ops.flatten(args[0], int(attrs.get("axis", 1)))


_HANDLERS: dict[str, Callable[..., Any]] = {
    "Gemm": _gemm,
    "MatMul": _binary(np.matmul),
    "Conv": _conv,
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
    "ReduceSum": _reduce_sum,
    "Identity": _unary(lambda x: x),
    "Dropout": _unary(lambda x: x),
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Cast": _cast,
    "Shape": _shape,
    "Gather": _gather,
}

#: The ONNX ops (default domain) the importer maps onto pyc_lab's compiler.
SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(_HANDLERS))

#: Inputs that must be constants (Python values in the program, never traced).
_STATIC_INPUTS: dict[str, set[int]] = {
    "Reshape": {1}, "ReduceMean": {1}, "ReduceSum": {1}, "Squeeze": {1}, "Unsqueeze": {1},
    "Clip": {1, 2},
    "BatchNormalization": {1, 2, 3, 4}, "Gather": {1}, "ConstantOfShape": {0},
    "Pad": {1, 2, 3}, "Slice": {1, 2, 3, 4}, "Split": {1},
}


# -- graph breaks through onnxruntime -------------------------------------------------------------
def _onnxruntime() -> Any | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def _ort_runner(node: Any, opset: int, ir_version: int) -> Callable[..., Any]:
    """A function running one ONNX node through onnxruntime (a session per input
    signature, built on first use)."""
    from onnx import helper

    sessions: dict[tuple, Any] = {}
    names = [i for i in node.input if i]  # the inputs given (optional ones may be empty)

    def run(*arrays: Any) -> Any:
        host = [a.get() if hasattr(a, "get") and type(a).__module__.startswith("cupy")
                else np.asarray(a) for a in arrays]
        key = tuple((a.shape, a.dtype.str) for a in host)
        sess = sessions.get(key)
        if sess is None:
            ort = _onnxruntime()
            inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                    a.shape)
                      for n, a in zip(names, host, strict=True)]
            outputs = [helper.make_empty_tensor_value_info(o)
                       for o in node.output if o]
            g = helper.make_graph([node], "break", inputs, outputs)
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
            m.ir_version = ir_version
            sess = ort.InferenceSession(m.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
            sessions[key] = sess
        feed = dict(zip(names, host, strict=True))
        outs = sess.run(None, feed)
        if arrays and type(arrays[0]).__module__.startswith("cupy"):
            import cupy

            outs = [cupy.asarray(o) for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run


def _graph_break(fn: Callable[..., Any], op: str, node: str) -> Callable[..., Any]:
    from ..compiler.proxy import Traced

    reason = f"ONNX op {op} (node {node!r}) has no pyc_lab mapping: it runs in onnxruntime"

    def handler(args, attrs, op_, node_, opset):
        present = [a for a in args if a is not None]
        traced = next((a for a in present if isinstance(a, Traced)), None)
        if traced is not None:
            return traced.tracer.eager(fn, tuple(present), {}, reason)
        return fn(*present)

    return handler


# -- the import ------------------------------------------------------------------------------
def _evaluate_constants(nodes: list[Any], consts: dict[str, np.ndarray],
                        opset: int) -> tuple[list[Any], int]:
    """Compute, in graph order, every mapped node whose inputs are all constants (weights
    made by ``Constant``/``ConstantOfShape``, shape arithmetic), adding the results to
    ``consts``; returns the nodes left and how many were computed."""
    left, done = [], 0
    for index, node in enumerate(nodes):
        fn = _HANDLERS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if fn is None or not all(not i or i in consts for i in node.input):
            left.append(node)
            continue
        name = node.name or f"{node.op_type}_{index}"
        try:
            values = fn([consts[i] if i else None for i in node.input], _attrs(node),
                        node.op_type, name, opset)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ModelImportError(f"{node.op_type} node {name!r}: {type(exc).__name__}: "
                                   f"{exc}") from exc
        values = values if isinstance(values, tuple) else (values,)
        for o, v in zip(node.output, values, strict=False):
            if o:
                consts[o] = np.asarray(v)
        done += 1
    return left, done


def _param_name(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name) or "x"
    if base[0].isdigit() or keyword.iskeyword(base) or (base.startswith("w") and \
            base[1:].isdigit()):
        base = f"in_{base}"
    out, k = base, 1
    while out in taken:
        out, k = f"{base}_{k}", k + 1
    taken.add(out)
    return out


def import_onnx(model: Any, *, onnxruntime_fallback: bool = True) -> ImportedGraph:
    """Import an ONNX model as a NumPy-style function with its weights bound.

    Parameters
    ----------
    model
        A path to a ``.onnx`` file, its bytes, or an ``onnx.ModelProto``.
    onnxruntime_fallback
        Run nodes whose op has no mapping through onnxruntime (a graph break), when
        onnxruntime is installed. ``False``: such a node is an error.

    Returns
    -------
    ImportedGraph

    Raises
    ------
    ModelImportError
        If the model cannot be read or checked.
    UnsupportedOpError
        If a node's op has no mapping (and onnxruntime cannot take it), naming the op and
        the node.
    """
    from onnx import numpy_helper

    proto = read_model(model)
    graph = proto.graph
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t)
                                     for t in graph.initializer}
    produced = {o for n in graph.node for o in n.output}
    inputs = [_spec(v) for v in graph.input if v.name not in consts and v.name not in produced]
    outputs = [_spec(v) for v in graph.output]
    output_names = {o.name for o in outputs}
    notes: list[str] = []
    nodes, folded = _evaluate_constants(list(graph.node), consts, opset)
    nodes = _fold_batch_norms(nodes, consts, output_names, notes)

    steps: list[_Step] = []
    counts: Counter[str] = Counter()
    breaks: list[tuple[str, str]] = []
    for index, node in enumerate(nodes):
        name = node.name or f"{node.op_type}_{index}"
        op = node.op_type
        fn = None if node.domain not in ("", "ai.onnx") else _HANDLERS.get(op)
        attrs = _attrs(node)
        if fn is None:
            ort = _onnxruntime() if onnxruntime_fallback else None
            if ort is None:
                why = ("onnxruntime_fallback=False" if onnxruntime_fallback is False
                       else "onnxruntime is not installed")
                raise UnsupportedOpError(
                    f"ONNX op {op!r} (node {name!r}, domain {node.domain or 'ai.onnx'!r}) is "
                    f"not supported by pyc_lab's importer and {why}. Supported ops: "
                    f"{', '.join(SUPPORTED_OPS)}. Install onnxruntime to run such nodes "
                    "as graph breaks, or replace the op in the model")
            fn = _graph_break(_ort_runner(node, opset, proto.ir_version), op, name)
            breaks.append((op, name))
            notes.append(f"{op} node {name!r} has no pyc_lab mapping: it runs through "
                         "onnxruntime (a graph break)")

        def bound(args, fn=fn, attrs=attrs, op=op, name=name):
            try:
                return fn(args, attrs, op, name, opset)
            except (KeyError, IndexError, ValueError, TypeError) as exc:
                raise ModelImportError(f"{op} node {name!r}: {type(exc).__name__}: "
                                       f"{exc}") from exc

        ins = list(node.input)
        if all(not i or i in consts for i in ins) and not any(b[1] == name for b in breaks):
            values = bound([consts[i] if i else None for i in ins])
            values = values if isinstance(values, tuple) else (values,)
            for o, v in zip(node.output, values, strict=False):
                if o:
                    consts[o] = np.asarray(v)
            folded += 1
            continue
        counts[op] += 1
        steps.append(_Step(op, name, bound, ins, [o for o in node.output]))
    if folded:
        notes.append(f"{folded} node(s) computed at import (their inputs are constants)")

    # weights: float constants read by steps at positions that are not static-only
    weight_names: list[str] = []
    static_names: set[str] = set()
    for step in steps:
        static = _STATIC_INPUTS.get(step.op, set())
        for pos, i in enumerate(step.inputs):
            if i and i in consts:
                if pos in static or consts[i].dtype.kind not in "fc":
                    static_names.add(i)
                elif i not in weight_names:
                    weight_names.append(i)
    for o in outputs:
        if o.name in consts and o.name not in weight_names:
            weight_names.append(o.name)
    weights = [consts[n] for n in weight_names]
    statics = {n: consts[n] for n in static_names}
    in_names = [i.name for i in inputs]
    out_names = [o.name for o in outputs]

    def program(xs: Sequence[Any], ws: Sequence[Any]) -> Any:
        env: dict[str, Any] = dict(statics)
        env.update(zip(weight_names, ws, strict=True))
        env.update(zip(in_names, xs, strict=True))
        for step in steps:
            result = step.fn([env[i] if i else None for i in step.inputs])
            result = result if isinstance(result, tuple) else (result,)
            for o, v in zip(step.outputs, result, strict=False):
                if o:
                    env[o] = v
        outs = tuple(env[n] for n in out_names)
        return outs[0] if len(outs) == 1 else outs

    taken: set[str] = set()
    params = [_param_name(n, taken) for n in in_names]
    wparams = [f"w{k}" for k in range(len(weights))]
    taken.update(wparams)
    src = (f"def {_param_name(graph.name or 'model', set(taken))}({', '.join(params + wparams)}):\n"
           f"    return _program(({', '.join(params)}{',' if params else ''}), "
           f"({', '.join(wparams)}{',' if wparams else ''}))\n")
    namespace: dict[str, Any] = {"_program": program}
    exec(compile(src, f"<onnx model {graph.name or 'model'}>", "exec"), namespace)
    fn = next(v for k, v in namespace.items() if k != "_program" and callable(v)
              and k != "__builtins__")
    log.debug("imported ONNX graph %r: %d steps, %d weights", graph.name, len(steps),
              len(weights))
    return ImportedGraph(name=graph.name or "model", function=fn, inputs=inputs,
                         outputs=outputs, weights=weights, notes=notes,
                         op_counts=dict(sorted(counts.items())), breaks=breaks, opset=opset)
