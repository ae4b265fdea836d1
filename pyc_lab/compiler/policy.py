"""The policy: one implementation per node, chosen among candidates, with a reason code.

Candidates, by node kind:

- inputs and constants: ``source`` (nothing runs);
- shape ops (reshape, transpose, slice, ...): ``view`` on the CPU, ``cupy`` on the GPU;
- fused elementwise groups: ``fused_kernel`` — a generated CUDA kernel — on the GPU;
- softmax, layer norm and last-axis reductions: ``reduction_kernel`` (generated, warp
  shuffles) when the code generator supports the node, else ``cupy``;
- matmul: a tuned CUTLASS kernel when the tuning database has one for the shape
  (``cutlass``; the hook is :data:`TUNED_LOOKUP`, filled by the autotuner), else
  ``cublas`` through ``cupy.matmul``, with any bias/activation epilogue as a generated
  kernel applied in place;
- graph breaks: ``eager`` — the original NumPy function, run as-is;
- on the numpy backend everything runs its NumPy reference (``numpy``).

Modes: ``memory_first`` plans buffers with in-place reuse (an elementwise kernel may
overwrite an input that dies with it); ``balanced`` and ``utilization_first`` reuse
freed buffers but never write in place. Every mode already takes a generated kernel
wherever the code generator covers a node; ``utilization_first`` does not yet choose
differently from ``balanced`` (it is where tuned CUTLASS kernels will be preferred once
the autotuner fills :data:`TUNED_LOOKUP`). ``cuda_graph=True`` replays the launch list
as CUDA graphs, split around each cuBLAS call, which CuPy cannot capture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .ir import Graph, Node
from .ops import REGISTRY

__all__ = ["MODES", "REASONS", "TUNED_LOOKUP", "Decision", "choose"]

MODES = ("balanced", "memory_first", "utilization_first")

#: Reason codes and what they mean (shown in ``explain().decisions``).
REASONS = {
    "SOURCE": "graph input or constant: nothing to run",
    "NUMPY_REFERENCE": "numpy backend: the op's NumPy reference runs it",
    "VIEW": "shape op: a view or a CuPy call, no kernel of its own",
    "FUSED_KERNEL": "elementwise group: one generated CUDA kernel, one pass over memory",
    "REDUCTION_KERNEL": "row reduction: a generated kernel with warp-shuffle reductions",
    "NO_CODEGEN": "the code generator does not cover this case; CuPy runs it",
    "CUTLASS_TUNED": "the tuning database has a tuned CUTLASS kernel for this shape",
    "CUBLAS_DEFAULT": "cuBLAS through cupy.matmul: no tuned kernel for this shape",
    "EPILOGUE_KERNEL": "bias/activation epilogue applied in place by a generated kernel",
    "GRAPH_BREAK": "op not in pyc_lab's registry: runs eagerly as the original call",
}

#: Hook for the autotuner: ``lookup(node) -> kernel id or None``.
TUNED_LOOKUP: Callable[[Node], str | None] | None = None


@dataclass(frozen=True)
class Decision:
    """The implementation chosen for one node and why."""

    node: int
    op: str
    choice: str
    reason: str
    detail: str = ""


def _describe(node: Node) -> str:
    if node.op == "fused":
        return f"{node.attrs.get('name', 'fused')}: " + ", ".join(node.attrs.get("ops", ()))
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
    for node in graph:
        kind = REGISTRY[node.op].kind
        label = _describe(node)
        if kind == "source":
            decisions.append(Decision(node.id, label, "source", "SOURCE"))
        elif kind == "eager":
            decisions.append(Decision(node.id, label, "eager", "GRAPH_BREAK",
                                      node.attrs.get("reason", "")))
        elif backend == "numpy":
            decisions.append(Decision(node.id, label, "numpy", "NUMPY_REFERENCE"))
        elif kind == "shape":
            decisions.append(Decision(node.id, label, "cupy", "VIEW"))
        elif kind == "matmul":
            decisions.append(_matmul(node, graph, supports))
        else:
            ok, why = supports(node, graph) if supports else (False, "no code generator")
            if ok:
                choice = "fused_kernel" if kind in ("fused", "elementwise") \
                    else "reduction_kernel"
                reason = "FUSED_KERNEL" if choice == "fused_kernel" else "REDUCTION_KERNEL"
                decisions.append(Decision(node.id, label, choice, reason))
            else:
                decisions.append(Decision(node.id, label, "cupy", "NO_CODEGEN", why))
    return decisions


def _matmul(node: Node, graph: Graph, supports: Any) -> Decision:
    epilogue = []
    if len(node.inputs) == 3:
        epilogue.append("bias")
    if node.attrs.get("activation"):
        epilogue.append(node.attrs["activation"])
    suffix = f"; epilogue {'+'.join(epilogue)} by a generated kernel in place" \
        if epilogue else ""
    tuned = TUNED_LOOKUP(node) if TUNED_LOOKUP is not None else None
    if tuned:
        return Decision(node.id, node.op, "cutlass", "CUTLASS_TUNED", f"kernel {tuned}{suffix}")
    shape = "x".join(str(d) for d in node.shape)
    return Decision(node.id, node.op, "cublas", "CUBLAS_DEFAULT",
                    f"{shape} {node.dtype.name}; no tuning database yet{suffix}")
