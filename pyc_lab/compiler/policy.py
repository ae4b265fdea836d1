"""The policy: one implementation per node, chosen among candidates, with a reason code.

Candidates, by node kind:

- inputs and constants: ``source`` (nothing runs);
- shape ops (reshape, transpose, slice, ...): ``view`` on the CPU, ``cupy`` on the GPU;
- fused elementwise groups: ``fused_kernel`` — a generated CUDA kernel — on the GPU;
- softmax, layer norm, reductions over the last axis (warp shuffles) or over leading or
  middle axes (column kernels): ``reduction_kernel`` when the code generator supports
  the node, else ``cupy``;
- matmul: a tuned CUTLASS kernel when the tuning database has one for this GPU, dtype,
  layout, epilogue and shape or its bucket (``cutlass``, bias/activation inside the
  kernel when it was tuned with them; the hook is :data:`TUNED_LOOKUP`, by default
  :func:`tuned_lookup`, which asks the same database as :func:`pyc_lab.matmul`); else, when
  the matmul carries a bias and/or relu/gelu epilogue that cuBLASLt can apply inside
  the GEMM (2-D, float16/float32, nvmath-python installed), ``cublaslt``; else
  ``cublas`` through ``cupy.matmul``, with any epilogue as a generated kernel applied
  in place;
- graph breaks: ``eager`` — the original NumPy function, run as-is;
- on the numpy backend everything runs its NumPy reference (``numpy``).

Modes: ``memory_first`` plans buffers with in-place reuse (an elementwise kernel may
overwrite an input that dies with it); ``balanced`` and ``utilization_first`` reuse
freed buffers but never write in place. Every mode takes a generated kernel wherever
the code generator covers a node. ``utilization_first`` spends time at the first call
to be fastest afterwards: its cuBLASLt GEMMs *measure* cuBLASLt's candidate algorithms
and keep the fastest (``balanced`` takes the heuristic's first choice). A tuned CUTLASS
kernel from :data:`TUNED_LOOKUP` wins in every mode. ``cuda_graph=True`` replays the
launch list as CUDA graphs, split around each cuBLAS/cuBLASLt call, which CuPy cannot
capture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .ir import Graph, Node
from .ops import FUSED_OPS, REGISTRY

__all__ = ["MODES", "REASONS", "TUNED_LOOKUP", "Decision", "choose", "lt_problem",
           "tuned_lookup", "tuned_problem"]

MODES = ("balanced", "memory_first", "utilization_first")

#: Reason codes and what they mean (shown in ``explain().decisions``).
REASONS = {
    "SOURCE": "graph input or constant: nothing to run",
    "NUMPY_REFERENCE": "numpy backend: the op's NumPy reference runs it",
    "VIEW": "shape op: a view or a CuPy call, no kernel of its own",
    "FUSED_KERNEL": "elementwise group: one generated CUDA kernel, one pass over memory",
    "REDUCTION_KERNEL": "reduction: a generated row kernel (warp-shuffle reductions) or "
                        "column kernel (lanes across the contiguous columns)",
    "NO_CODEGEN": "the code generator does not cover this case; CuPy runs it",
    "FUSED_OUTPUT": "another output of a fused kernel: that kernel writes it in the same "
                    "pass",
    "CUTLASS_TUNED": "the tuning database has a tuned CUTLASS kernel for this shape",
    "CUBLAS_DEFAULT": "the library GEMM by pl.matmul's rule (cuBLAS, or cuBLASLt where "
                      "faster): no tuned kernel for this shape",
    "CUBLASLT_EPILOGUE": "cuBLASLt applies the bias/activation inside the GEMM "
                         "(nvmath-python): the product is written once",
    "EPILOGUE_KERNEL": "bias/activation epilogue applied in place by a generated kernel",
    "GRAPH_BREAK": "op not in pyc_lab's registry: runs eagerly as the original call",
    "ATTENTION": "attention: pl.attention's path (pyc_lab's Hopper kernel or torch's "
                 "scaled_dot_product_attention, whichever its first call measured faster, "
                 "where torch is installed, else the blocked online softmax); a library "
                 "call between CUDA graphs",
    "SCAN": "a scan, sort or quantile along an axis (cumsum, cumprod, sort, argsort, "
            "quantile): the array "
            "library's own (CuPy: CUB's device scans and radix sorts), a library call "
            "between the generated kernels",
    "CONV": "convolution: pl.conv's path (cuDNN, the GEMM form or pyc_lab's direct "
            "kernel, whichever its first call measured fastest, through torch where torch "
            "is installed, else im2col); the direct kernel recorded into the CUDA graphs "
            "where its GPU time beats the library's cost, else a library call between them",
}

def tuned_problem(node: Node, graph: Graph) -> tuple[tuple[Any, ...] | None, str]:
    """The tuning-database problem of a matmul node, or ``None`` and why it has none.

    Returns ``((m, n, k, dtype, layout, epilogue), "")``: 2-D operands of one dtype
    (float16, or float32 in exact float32), the layout from the node's transposes
    (graph arrays are C-contiguous: ``t``, a transposed view ``n``), and the bias
    (a length-N row of the same dtype) and activation as a CUTLASS epilogue.
    """
    from ..kernels.cutlass import ACTIVATIONS, Epilogue
    from ..kernels.matmul import TUNED_DTYPES

    if node.op != "matmul":
        return None, f"{node.op} is not a matmul"
    a, b = graph.node(node.inputs[0]), graph.node(node.inputs[1])
    if len(a.shape) != 2 or len(b.shape) != 2:
        return None, "batched or 1-D operands (tuned kernels are 2-D)"
    dt = np.dtype(node.dtype).name
    if dt not in TUNED_DTYPES or {np.dtype(a.dtype).name, np.dtype(b.dtype).name} != {dt}:
        return None, f"dtypes {a.dtype} @ {b.dtype} -> {node.dtype} (tuned: float16/float32)"
    ta, tb = bool(node.attrs.get("transpose_a")), bool(node.attrs.get("transpose_b"))
    m, k = (a.shape[1], a.shape[0]) if ta else tuple(a.shape)
    n = b.shape[0] if tb else b.shape[1]
    act = node.attrs.get("activation")
    if act is not None and act not in ACTIVATIONS:
        return None, f"activation {act!r} has no CUTLASS epilogue"
    has_bias = len(node.inputs) == 3
    if has_bias:
        bias = graph.node(node.inputs[2])
        if int(np.prod(bias.shape)) != n or bias.shape[-1] != n or \
                np.dtype(bias.dtype).name != dt:
            return None, f"bias {bias.shape} {bias.dtype} is not one {dt} value per column"
    layout = ("n" if ta else "t") + ("n" if tb else "t")
    return (int(m), int(n), int(k), TUNED_DTYPES[dt], layout, Epilogue(has_bias, act)), ""


def tuned_lookup(node: Node, graph: Graph) -> str | None:
    """The default :data:`TUNED_LOOKUP`: the tuned CUTLASS config for a matmul node on
    this GPU (``"<config id> (exact match (MxNxK): tuned kernel ... beat cuBLAS ...)"``),
    or None (no GPU, no entry, or an entry that did not beat the library in its tuning
    run: the never-slower rule of :func:`pyc_lab.kernels.matmul.winning_entry`)."""
    from ..hardware.device import cupy_status

    problem, _ = tuned_problem(node, graph)
    if problem is None or cupy_status()[0] is None:
        return None
    from ..kernels.matmul import winning_entry
    from ..kernels.tuning.result import kernel_config_id

    found, why, _ = winning_entry(*problem)
    if found is None:
        return None
    try:
        return f"{kernel_config_id(found.measurement.config)} ({why})"
    except Exception:  # an entry of another kind: not ours to run
        return None


#: Hook for the autotuner: ``lookup(node, graph) -> tuned kernel id or None``.
TUNED_LOOKUP: Callable[[Node, Graph], str | None] | None = tuned_lookup


@dataclass(frozen=True)
class Decision:
    """The implementation chosen for one node and why."""

    node: int
    op: str
    choice: str
    reason: str
    detail: str = ""


def _describe(node: Node) -> str:
    if node.op == "fused_extra":
        return f"output {node.attrs['output']} of {node.attrs['body'].name}"
    if node.op in FUSED_OPS:
        return f"{node.attrs.get('name', node.op)}: " + ", ".join(node.attrs.get("ops", ()))
    return node.op


def choose(graph: Graph, backend: str, mode: str = "balanced",
           supports: Callable[[Node, Graph], tuple[bool, str]] | None = None) \
        -> list[Decision]:
    """Pick an implementation for every node of an optimised graph.

    Parameters
    ----------
    graph
        The graph after the passes.
    backend
        ``"numpy"`` or ``"cupy"``.
    mode
        One of :data:`MODES`.
    supports
        The code generator's ``supports(node, graph) -> (ok, reason)``; required for the
        cupy backend.
    """
    decisions = []
    chosen: dict[int, str] = {}
    for node in graph:
        kind = REGISTRY[node.op].kind
        label = _describe(node)
        if node.op == "fused_extra" and backend != "numpy":
            if chosen.get(node.inputs[0]) in ("fused_kernel", "reduction_kernel"):
                decisions.append(Decision(node.id, label, "fused_kernel", "FUSED_OUTPUT"))
            else:
                decisions.append(Decision(node.id, label, "cupy", "NO_CODEGEN",
                                          "its fused node runs through CuPy, so it is "
                                          "computed on its own"))
        elif kind == "source":
            decisions.append(Decision(node.id, label, "source", "SOURCE"))
        elif kind == "eager":
            decisions.append(Decision(node.id, label, "eager", "GRAPH_BREAK",
                                      node.attrs.get("reason", "")))
        elif backend == "numpy":
            decisions.append(Decision(node.id, label, "numpy", "NUMPY_REFERENCE"))
        elif kind == "shape":
            decisions.append(Decision(node.id, label, "cupy", "VIEW"))
        elif kind == "matmul":
            decisions.append(_matmul(node, graph, mode))
        elif kind == "attention":
            decisions.append(Decision(node.id, label, "attention", "ATTENTION"))
        elif kind == "conv":
            decisions.append(Decision(node.id, label, "conv", "CONV"))
        elif kind == "scan":
            decisions.append(Decision(node.id, label, "cupy", "SCAN"))
        else:
            ok, why = supports(node, graph) if supports else (False, "no code generator")
            if ok:
                choice = "fused_kernel" if kind in ("fused", "elementwise") \
                    else "reduction_kernel"
                reason = "FUSED_KERNEL" if choice == "fused_kernel" else "REDUCTION_KERNEL"
                decisions.append(Decision(node.id, label, choice, reason))
            else:
                decisions.append(Decision(node.id, label, "cupy", "NO_CODEGEN", why))
        chosen[node.id] = decisions[-1].choice
    return decisions


def lt_problem(node: Node, graph: Graph) -> str:
    """Why ``node`` (a matmul) cannot run as one cuBLASLt GEMM with its epilogue, or ``""``."""
    from ..kernels.cublaslt import why_not

    a, b = graph.node(node.inputs[0]), graph.node(node.inputs[1])
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)
    if node.attrs.get("transpose_a") and len(a_shape) >= 2:
        a_shape = a_shape[:-2] + a_shape[-2:][::-1]
    if node.attrs.get("transpose_b") and len(b_shape) >= 2:
        b_shape = b_shape[:-2] + b_shape[-2:][::-1]
    bias = graph.node(node.inputs[2]) if len(node.inputs) == 3 else None
    return why_not(a_shape, b_shape, a.dtype, b.dtype, node.dtype,
                   tuple(bias.shape) if bias is not None else None,
                   bias.dtype if bias is not None else None, node.attrs.get("activation"))


def _matmul(node: Node, graph: Graph, mode: str) -> Decision:
    epilogue = []
    if len(node.inputs) == 3:
        epilogue.append("bias")
    if node.attrs.get("activation"):
        epilogue.append(node.attrs["activation"])
    shape = "x".join(str(d) for d in node.shape)
    tuned = TUNED_LOOKUP(node, graph) if TUNED_LOOKUP is not None else None
    why_lt = lt_problem(node, graph) if epilogue and not tuned else ""
    if epilogue and not tuned and not why_lt:
        how = ("algorithm measured at the first call (utilization_first)"
               if mode == "utilization_first" else "the heuristic's first algorithm")
        return Decision(node.id, node.op, "cublaslt", "CUBLASLT_EPILOGUE",
                        f"{shape} {node.dtype.name}; {'+'.join(epilogue)} inside the GEMM; "
                        f"{how}")
    suffix = f"; epilogue {'+'.join(epilogue)} by a generated kernel in place" \
        if epilogue else ""
    if why_lt and why_lt != "no epilogue to fuse":
        suffix += f" (not cuBLASLt: {why_lt})"
    if tuned:
        inside = f"; {'+'.join(epilogue)} inside its epilogue" if epilogue else ""
        return Decision(node.id, node.op, "cutlass", "CUTLASS_TUNED",
                        f"{shape} {node.dtype.name}; kernel {tuned}{inside}")
    return Decision(node.id, node.op, "cublas", "CUBLAS_DEFAULT",
                    f"{shape} {node.dtype.name}; no tuning database yet{suffix}")
