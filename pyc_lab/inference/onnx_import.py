"""ONNX in: a model (path, bytes or ``ModelProto``) as a Python function ``pl.compile`` traces.

The import reads the graph once and turns it into a program of steps, each an ONNX node
mapped to a NumPy-style function (the op table of :mod:`.onnx_handlers`, over
:mod:`.onnx_ops`). On the way it

- folds every ``BatchNormalization`` that follows a ``Conv`` or ``Gemm`` with constant
  weights into that layer (the new weights computed in float64 and rounded once to the
  weights' dtype, so the folded layer equals the pair up to float32 rounding);
- evaluates nodes whose inputs are all constants (shape arithmetic, ``Constant``);
- binds the float initializers as the function's weight arguments and keeps shape-like
  inputs (``Reshape``'s target, ``ReduceMean``'s axes) as Python constants.

An op with no mapping raises :class:`~pyc_lab.inference.errors.UnsupportedOpError`
naming the op and the node, unless onnxruntime is installed and the caller allows it:
then that node alone runs through onnxruntime as a graph break of the compiled
function (:mod:`.onnx_fallback`), and ``explain()`` says so.
"""

from __future__ import annotations

import functools
import keyword
import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ModelImportError, UnsupportedOpError
from .onnx_fallback import graph_break, onnxruntime_module, ort_runner
from .onnx_handlers import (
    HANDLERS,
    POOLS_CHANNELS_LAST,
    STATIC_INPUTS,
    SUPPORTED_OPS,
    bn_scale_shift,
    conv_channels_last,
    np_dtype,
)
from .onnx_layout import LAYOUTS, ChannelsLast
from .onnx_ops import CONV_LIBRARY_FLOPS, CONV_ROUTES

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
    #: The step's forms for channels-last inputs (:mod:`.onnx_layout`): ``"conv"``,
    #: ``"pool"``; empty for a graph break (which always runs as the graph says).
    special: dict[str, Callable[..., Any]] = field(default_factory=dict)
    native: bool = True


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
        The arrays bound to the weight parameters, in order (a channels-last import holds
        the filters its 2-D convolutions alone read as ``(O, KH, KW, C)``).
    notes
        One line per import decision (folded batch norms, graph breaks, constants).
    op_counts
        ONNX op -> nodes of it in the imported program.
    breaks
        ``(op, node)`` of every node that runs through onnxruntime.
    opset
        The model's default-domain opset.
    layout
        Where the imported program holds its 2-D convolutions' channels
        (:data:`~.onnx_layout.LAYOUTS`).
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
    layout: str = "channels_first"


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


def _spec(value_info: Any) -> TensorSpec:
    t = value_info.type.tensor_type
    dims: list[int | None] = []
    for d in t.shape.dim:
        dims.append(int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None)
    return TensorSpec(value_info.name, np_dtype(t.elem_type), tuple(dims))


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


# -- the import ------------------------------------------------------------------------------
def _evaluate_constants(nodes: list[Any], consts: dict[str, np.ndarray],
                        opset: int) -> tuple[list[Any], int]:
    """Compute, in graph order, every mapped node whose inputs are all constants (weights
    made by ``Constant``/``ConstantOfShape``, shape arithmetic), adding the results to
    ``consts``; returns the nodes left and how many were computed."""
    left, done = [], 0
    for index, node in enumerate(nodes):
        fn = HANDLERS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
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


def _filters_read_only_by_convs(steps: Sequence[_Step], weight_names: Sequence[str],
                                consts: dict[str, np.ndarray],
                                output_names: set[str]) -> set[str]:
    """The weights that are 4-D filters of native 2-D ``Conv`` steps and read by nothing
    else (no other step or input position, not a graph output)."""
    readers: dict[str, set[tuple[str, int]]] = {}
    for step in steps:
        for pos, i in enumerate(step.inputs):
            if i:
                readers.setdefault(i, set()).add(
                    ("Conv" if step.op == "Conv" and step.native else "", pos))
    return {n for n in weight_names if n not in output_names and consts[n].ndim == 4
            and readers.get(n) == {("Conv", 1)}}


def import_onnx(model: Any, *, onnxruntime_fallback: bool = True,
                conv: str = "auto", layout: str = "channels_first") -> ImportedGraph:
    """Import an ONNX model as a NumPy-style function with its weights bound.

    Parameters
    ----------
    model
        A path to a ``.onnx`` file, its bytes, or an ``onnx.ModelProto``.
    onnxruntime_fallback
        Run nodes whose op has no mapping through onnxruntime (a graph break), when
        onnxruntime is installed. ``False``: such a node is an error.
    conv
        How ``Conv`` nodes run (:data:`~pyc_lab.inference.onnx_ops.CONV_ROUTES`):
        ``"im2col"`` inside the compiled program, ``"library"`` through ``pl.conv``
        (cuDNN, the GEMM form or pyc_lab's direct kernel on a GPU, whichever the first
        call measures fastest: the direct kernel recorded into the CUDA graphs, the
        libraries between them), ``"auto"`` (default) ``pl.conv`` for a convolution of at
        least :data:`~pyc_lab.inference.onnx_ops.CONV_LIBRARY_FLOPS` at the traced batch
        and for one the direct kernel takes
        (:func:`~pyc_lab.inference.onnx_ops.direct_candidate`).
    layout
        ``"channels_first"`` (default): activations as the graph has them;
        ``"channels_last"``: 2-D convolutions read and write channels-last activations
        through ``pl.conv`` (whatever ``conv`` says for them), kept so across the
        elementwise ops between them and transposed back where another op needs the
        graph's layout (:mod:`.onnx_layout`) — what pyc_lab's tuned CUTLASS kernels and
        cuDNN's tensor-core kernels read; their filters are held ``(O, KH, KW, C)``, the
        order those kernels read, so that no call copies them.

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

    if conv not in CONV_ROUTES:
        raise ModelImportError(f"conv must be one of {CONV_ROUTES}, got {conv!r}")
    if layout not in LAYOUTS:
        raise ModelImportError(f"layout must be one of {LAYOUTS}, got {layout!r}")
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
        fn = None if node.domain not in ("", "ai.onnx") else HANDLERS.get(op)
        if op in ("Conv", "ConvTranspose") and fn is not None:
            fn = functools.partial(fn, route=conv)
        attrs = _attrs(node)
        native = fn is not None  # else a graph break through onnxruntime
        if fn is None:
            ort = onnxruntime_module() if onnxruntime_fallback else None
            if ort is None:
                why = ("onnxruntime_fallback=False" if onnxruntime_fallback is False
                       else "onnxruntime is not installed")
                raise UnsupportedOpError(
                    f"ONNX op {op!r} (node {name!r}, domain {node.domain or 'ai.onnx'!r}) is "
                    f"not supported by pyc_lab's importer and {why}. Supported ops: "
                    f"{', '.join(SUPPORTED_OPS)}. Install onnxruntime to run such nodes "
                    "as graph breaks, or replace the op in the model")
            fn = graph_break(ort_runner(node, opset, proto.ir_version), op, name)
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
        if all(not i or i in consts for i in ins) and native:
            values = bound([consts[i] if i else None for i in ins])
            values = values if isinstance(values, tuple) else (values,)
            for o, v in zip(node.output, values, strict=False):
                if o:
                    consts[o] = np.asarray(v)
            folded += 1
            continue
        counts[op] += 1
        special: dict[str, Callable[..., Any]] = {}
        if native and op == "Conv":
            special["conv"] = functools.partial(bound, fn=conv_channels_last)
        if native and op in POOLS_CHANNELS_LAST:
            special["pool"] = functools.partial(bound, fn=POOLS_CHANNELS_LAST[op])
        steps.append(_Step(op, name, bound, ins, [o for o in node.output], special, native))
    if folded:
        notes.append(f"{folded} node(s) computed at import (their inputs are constants)")
    if counts.get("Conv"):
        notes.append({"auto": f"Conv: pl.conv (cuDNN, the GEMM form or pyc_lab's direct "
                              f"kernel on a GPU, raced at the first call) for a convolution "
                              f"of at least {CONV_LIBRARY_FLOPS:,} flops at the traced batch "
                              "or one the direct kernel takes (where torch is installed), "
                              "im2col inside the program for the rest",
                      "library": "Conv: pl.conv (cuDNN, the GEMM form or pyc_lab's direct "
                                 "kernel on a GPU, raced at the first call; the direct kernel "
                                 "inside the CUDA graphs, the libraries between them)",
                      "im2col": "Conv: im2col inside the compiled program"}[conv])
    if layout == "channels_last" and counts.get("Conv"):
        notes.append("layout channels_last: 2-D convolutions run through pl.conv on "
                     "channels-last activations, kept so across elementwise ops and "
                     "transposed back where another op needs the graph's layout")

    # weights: float constants read by steps at positions that are not static-only
    weight_names: list[str] = []
    static_names: set[str] = set()
    for step in steps:
        static = STATIC_INPUTS.get(step.op, set())
        for pos, i in enumerate(step.inputs):
            if i and i in consts:
                if pos in static or consts[i].dtype.kind not in "fc":
                    static_names.add(i)
                elif i not in weight_names:
                    weight_names.append(i)
    for o in outputs:
        if o.name in consts and o.name not in weight_names:
            weight_names.append(o.name)
    # channels last: a filter read only by 2-D convolutions is held (O, KH, KW, C), the
    # order the tuned kernels, cuDNN's channels-last kernels and the GEMM form read, and
    # viewed (O, C, KH, KW) in the program (no copy of it on each call)
    filters_last = _filters_read_only_by_convs(steps, weight_names, consts, output_names) \
        if layout == "channels_last" else set()
    weights = [np.ascontiguousarray(consts[n].transpose(0, 2, 3, 1)) if n in filters_last
               else consts[n] for n in weight_names]
    statics = {n: consts[n] for n in static_names}
    in_names = [i.name for i in inputs]
    out_names = [o.name for o in outputs]

    def program(xs: Sequence[Any], ws: Sequence[Any]) -> Any:
        env: dict[str, Any] = dict(statics)
        env.update(zip(weight_names, ws, strict=True))
        for n in filters_last:  # (O, KH, KW, C) held, (O, C, KH, KW) seen
            env[n] = np.transpose(env[n], (0, 3, 1, 2))
        env.update(zip(in_names, xs, strict=True))
        plan = ChannelsLast() if layout == "channels_last" else None
        for step in steps:
            if plan is None:
                args, how = [env[i] if i else None for i in step.inputs], "first"
            else:  # a graph break takes its inputs as the graph has them
                args, how = plan.arguments(step.op if step.native else "", step.inputs, env)
            result = step.special[how](args) if how in step.special else step.fn(args)
            result = result if isinstance(result, tuple) else (result,)
            if plan is not None:
                plan.produced(step.outputs, how)
            for o, v in zip(step.outputs, result, strict=False):
                if o:
                    env[o] = v
        outs = tuple(env[n] if plan is None else plan.output(n, env[n]) for n in out_names)
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
                         op_counts=dict(sorted(counts.items())), breaks=breaks, opset=opset,
                         layout=layout)
