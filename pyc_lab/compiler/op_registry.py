"""The op registry: what the compiler knows of each op, and how a graph is evaluated.

Each :class:`OpDef` declares

- ``kind``: ``elementwise``, ``reduction``, ``matmul``, ``norm``, ``shape``, ``gather``
  (reads at integer indices), ``source`` (inputs and constants), ``fused`` or ``eager``
  (a graph break);
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
comparisons included). The ops themselves are registered by :mod:`.ops` (elementwise,
reductions, matmul, normalisations, sources and fused groups), :mod:`.ops_shape`
(reshapes, transposes, slices, concatenation, writes), :mod:`.conv_op` and
:mod:`.attention_op`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import PycLabError
from .errors import DynamicShapeError

__all__ = ["REGISTRY", "DTypeError", "OpDef", "ShapeError", "broadcast_shape",
           "check_eager_result", "evaluate", "infer", "normalize_axis", "reference_dtype",
           "register", "run_graph", "same_shape", "tiny"]


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
    #: For a library op: ``bound(xp, inputs, attrs)`` gives ``call(out)``, computing the
    #: op into an ``out`` given at each call from ``inputs`` at their fixed addresses,
    #: with the per-call conversions done once (so that a call issues only the work) —
    #: or ``None`` to run the reference.
    bound: Callable[[Any, Sequence[Any], dict[str, Any]], Callable[[Any], None] | None] \
        | None = None
    #: For a library op: ``record(xp, inputs, attrs, out, workspace)`` gives a call
    #: computing the op into ``out`` that a CUDA-graph capture can record (kernels
    #: launched on the current stream, nothing synchronised or allocated; ``workspace``
    #: the ``(pointer, bytes)`` cuBLAS workspace the graph's program owns, or ``None``),
    #: or ``None`` where the op must run between graphs this time.
    record: Callable[[Any, Sequence[Any], dict[str, Any], Any, Any],
                     Callable[[], None] | None] | None = None
    #: For a ``record`` op: ``record_workspace(attrs)`` says whether its recorded form
    #: may issue cuBLAS (the graphs then make a workspace for it); ``None``: never.
    record_workspace: Callable[[dict[str, Any]], bool] | None = None


REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add ``opdef`` to :data:`REGISTRY` (under its name) and return it."""
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


def broadcast_shape(inputs: Sequence[Any], _attrs: dict) -> tuple[int, ...]:
    """The broadcast shape of the inputs (an elementwise op's), or a ShapeError."""
    try:
        return tuple(np.broadcast_shapes(*[tuple(n.shape) for n in inputs]))
    except ValueError:
        shapes = " and ".join(str(tuple(n.shape)) for n in inputs)
        raise ShapeError(f"shapes {shapes} do not broadcast together") from None


def same_shape(inputs: Sequence[Any], _attrs: dict) -> tuple[int, ...]:
    """The first input's shape (an op that keeps it)."""
    return tuple(inputs[0].shape)


def tiny(dtype: np.dtype, ndim: int = 1) -> np.ndarray:
    """A one-element array of ``dtype`` and rank ``ndim`` (to ask NumPy for a dtype)."""
    return np.ones((1,) * ndim, dtype=dtype)


def reference_dtype(op: str, inputs: Sequence[Any], attrs: dict[str, Any]) -> np.dtype:
    """The dtype NumPy gives ``op`` on these inputs' dtypes (its reference run on
    one-element arrays), or a DTypeError with NumPy's reason."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. var(ddof=1) of one element
            out = REGISTRY[op].reference(np, [tiny(n.dtype, len(n.shape)) for n in inputs],
                                         attrs)
    except (TypeError, ValueError) as exc:
        dtypes = ", ".join(np.dtype(n.dtype).name for n in inputs)
        raise DTypeError(f"{op} does not take ({dtypes}): NumPy says: {exc}") from None
    return np.asarray(out).dtype


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
        dtype = reference_dtype(op, inputs, attrs)
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
        if n.op in ("fused", "fused_rows") and len(body.outputs) > 1:
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
