"""CUDA code generation for the CuPy backend.

Four kinds of kernels are generated from IR nodes, as readable CUDA C++ that NVRTC
compiles without headers:

- **elementwise** (:mod:`.elementwise`, its loops and layouts in
  :mod:`.elementwise_loops`): a ``fused`` node's body (or one elementwise op) as one
  grid-stride kernel, with a 16-byte vectorised variant — reading views of its inputs
  in place, writing an output concatenation piecewise, or writing several outputs;
- **columns** (:mod:`.column_reduction`): sum/mean/max/min over leading or middle
  axes, lanes across the contiguous columns, the reduced axes split across blocks
  (and combined by the last block of each tile, or a second kernel for long splits)
  when the columns alone cannot fill the GPU;
- **rows** (:mod:`.reduction`): softmax, layer norm and sum/mean/max/min/var over the
  last axis, one warp or one block per row with warp-shuffle reductions; and
  (:mod:`.row_program`) a fused row program — elementwise prologue, reductions over the
  last axis, elementwise epilogue — as one such kernel;
- **epilogue** (:func:`generate_epilogue`): a matmul's bias and activation applied in
  place to the GEMM result.

:func:`supports` says whether a node is covered, and if not why (the reason is shown
to users in ``explain()``); :func:`generate` returns a :class:`KernelSource`; kernels
are compiled and cached by :mod:`.cache`. Nothing here needs a GPU.

Only what varies (expressions, indexing, launch shapes) is written here; the fixed C++
the kernels share (float16 conversions, aligned vectors, reductions) is read from
``native/`` (:func:`.cuda_types.helper`) and spliced into each source as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node
from ..ops import REGISTRY, normalize_axis
from . import cuda_types
from .column_reduction import COLUMN_OPS, check_columns, column_split, generate_columns
from .cuda_types import KernelSource
from .elementwise import (
    activation_ok,
    body_of,
    check_elementwise,
    epilogue_body,
    generate_elementwise,
    kernel_name,
)
from .reduction import ROW_OPS, check_rows, generate_rows
from .row_program import check_row_program, generate_row_program

__all__ = ["ROW_OPS", "KernelSource", "cuda_types", "generate", "generate_epilogue",
           "supports"]


def _elementwise_inputs(node: Node, graph: Graph) -> tuple[list[tuple[int, ...]], list[Any]]:
    ins = [graph.node(i) for i in node.inputs]
    return [tuple(n.shape) for n in ins], [n.dtype for n in ins]


def _is_elementwise(node: Node) -> bool:
    opdef = REGISTRY.get(node.op)
    return node.op == "fused" or (opdef is not None and opdef.kind == "elementwise")


def _is_column(node: Node, graph: Graph) -> bool:
    """A reduction over leading or middle axes (the column kernels' case)."""
    if node.op not in COLUMN_OPS or not node.inputs:
        return False
    shape = tuple(graph.node(node.inputs[0]).shape)
    return column_split(shape, normalize_axis(node.attrs.get("axis"), len(shape))) is not None


def supports(node: Node, graph: Graph) -> tuple[bool, str]:
    """Whether :func:`generate` covers ``node``: ``(True, "")`` or ``(False, reason)``.

    For a matmul the question is whether its bias/activation epilogue can be generated
    (a matmul without one needs no kernel of its own: ``(True, "")``).
    """
    try:
        if _is_elementwise(node):
            if node.op == "fused" and not isinstance(node.attrs.get("body"), Graph):
                return False, "a fused node without a body graph"
            body, _ = body_of(node, graph)
            shapes, dtypes = _elementwise_inputs(node, graph)
            why = check_elementwise(body, shapes, dtypes, tuple(node.shape), node.dtype)
        elif _is_column(node, graph):
            why = check_columns(node, graph)
        elif node.op in ROW_OPS:
            why = check_rows(node, graph)
        elif node.op == "fused_rows":
            shapes, dtypes = _elementwise_inputs(node, graph)
            why = check_row_program(node.attrs["body"], tuple(node.attrs["space"]), shapes,
                                    dtypes, node.attrs.get("axes"))
        elif node.op == "matmul":
            why = _epilogue_problem(node, graph)
        else:
            kind = REGISTRY[node.op].kind if node.op in REGISTRY else "unknown"
            why = f"{node.op} ({kind}) has no generated kernel; runs through CuPy"
    except Exception as exc:  # a malformed node: say so instead of failing the policy
        why = f"cannot generate {node.op}: {type(exc).__name__}: {exc}"
    return (not why), why


def generate(node: Node, graph: Graph, *, inplace: bool = False) -> KernelSource:
    """The CUDA source for ``node`` (a fused/elementwise node or a row op).

    Parameters
    ----------
    node, graph
        The node and the graph holding its inputs.
    inplace
        Elementwise only: the output may share memory with an input of the output's
        shape (the memory plan's in-place reuse); the kernel then drops ``__restrict__``.

    Raises
    ------
    ValueError
        When :func:`supports` says no; the message is its reason.
    """
    ok, why = supports(node, graph)
    if not ok:
        raise ValueError(f"node %{node.id} ({node.op}): {why}")
    if _is_elementwise(node):
        body, ops = body_of(node, graph)
        shapes, dtypes = _elementwise_inputs(node, graph)
        return generate_elementwise(kernel_name(node), body, shapes, dtypes,
                                    tuple(node.shape), node.dtype, ops, inplace=inplace)
    if _is_column(node, graph):
        return generate_columns(node, graph)
    if node.op in ROW_OPS:
        return generate_rows(node, graph)
    if node.op == "fused_rows":
        return generate_row_program(node, graph)
    raise ValueError(f"node %{node.id} ({node.op}): use generate_epilogue for a matmul")


# -- GEMM epilogues --------------------------------------------------------------------------
def _epilogue_facts(node: Node, graph: Graph | None, product_dtype: Any, bias_shape: Any,
                    bias_dtype: Any) -> tuple[np.dtype, tuple[tuple[int, ...], Any] | None]:
    if graph is not None:
        a, b = graph.node(node.inputs[0]), graph.node(node.inputs[1])
        product = np.result_type(a.dtype, b.dtype)
        bias = None
        if len(node.inputs) == 3:
            bn = graph.node(node.inputs[2])
            bias = (tuple(bn.shape), bn.dtype)
        return np.dtype(product), bias
    product = np.dtype(product_dtype) if product_dtype is not None else node.dtype
    if len(node.inputs) == 3:
        if bias_shape is None or bias_dtype is None:
            raise ValueError(f"matmul %{node.id} has a bias: pass the graph (or bias_shape "
                             "and bias_dtype) to generate its epilogue")
        return product, (tuple(bias_shape), np.dtype(bias_dtype))
    return product, None


def _epilogue_problem(node: Node, graph: Graph | None, product_dtype: Any = None,
                      bias_shape: Any = None, bias_dtype: Any = None) -> str:
    act = node.attrs.get("activation")
    why = activation_ok(act)
    if why:
        return why
    if len(node.inputs) not in (2, 3):
        return f"matmul with {len(node.inputs)} inputs"
    if len(node.inputs) == 2 and not act:
        return ""
    product, bias = _epilogue_facts(node, graph, product_dtype, bias_shape, bias_dtype)
    body = epilogue_body(tuple(node.shape), product, bias, act)
    shapes = [tuple(node.shape)] + ([bias[0]] if bias else [])
    dtypes = [product] + ([bias[1]] if bias else [])
    return check_elementwise(body, shapes, dtypes, tuple(node.shape), node.dtype)


def generate_epilogue(node: Node, graph: Graph | None = None, *, product_dtype: Any = None,
                      bias_shape: Any = None, bias_dtype: Any = None) -> KernelSource:
    """The elementwise kernel ``y = activation(product + bias)`` of a matmul node.

    Its inputs are ``in0`` = the GEMM product (shape ``node.shape``) and, with a bias,
    ``in1`` = the bias (broadcast along rows); its output is ``node``'s result. When the
    product already has ``node.dtype`` the kernel is generated for in-place use
    (``out`` = ``in0``: ``launch["inplace"]`` is True); otherwise (e.g. an int product
    with a float activation) it writes a separate array.

    Parameters
    ----------
    node
        A ``matmul`` node with a bias (3rd input) and/or ``attrs["activation"]``.
    graph
        The graph holding its inputs (for the product's and the bias's types); without
        it, give ``product_dtype`` (default ``node.dtype``) and, with a bias,
        ``bias_shape`` and ``bias_dtype``.
    """
    if node.op != "matmul":
        raise ValueError(f"node %{node.id} is a {node.op}, not a matmul")
    act = node.attrs.get("activation") or None
    if len(node.inputs) == 2 and not act:
        raise ValueError(f"matmul %{node.id} has no bias and no activation: no epilogue")
    why = _epilogue_problem(node, graph, product_dtype, bias_shape, bias_dtype)
    if why:
        raise ValueError(f"matmul %{node.id} epilogue: {why}")
    product, bias = _epilogue_facts(node, graph, product_dtype, bias_shape, bias_dtype)
    body = epilogue_body(tuple(node.shape), product, bias, act)
    shapes = [tuple(node.shape)] + ([bias[0]] if bias else [])
    dtypes = [product] + ([bias[1]] if bias else [])
    ops = tuple(["bias_add"] if bias else []) + ((act,) if act else ())
    name = kernel_name(node, f"matmul_{node.id}") + "_epilogue"
    inplace = product == node.dtype
    return generate_elementwise(name, body, shapes, dtypes, tuple(node.shape), node.dtype,
                                ops, kind="epilogue", inplace=inplace,
                                title="GEMM epilogue: out = "
                                + (f"{act}(" if act else "") + "product"
                                + (" + bias" if bias else "") + (")" if act else "")
                                + (", in place on the product" if inplace else ""))
