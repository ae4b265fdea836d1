"""Transpose folding: a matmul reads ``x`` instead of ``swapaxes(x, -1, -2)``.

``matmul(transpose(x; axes=(0, ..., n-1, n-2)), w)`` becomes
``matmul(x, w; transpose_a=True)`` (and likewise for the right operand with
``transpose_b``), so the GEMM reads the operand in its stored layout instead of
materialising the transpose. Only transposes that swap exactly the last two axes fold.
The transpose node stays while something else reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph, Node
from .rewrite import prune, try_infer

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "transpose_folding"


def swaps_last_two(node: Node) -> bool:
    """Whether ``node`` is a transpose exchanging exactly its last two axes."""
    if node.op != "transpose":
        return False
    axes = tuple(int(a) for a in node.attrs["axes"])
    n = len(axes)
    return n >= 2 and axes == (*range(n - 2), n - 1, n - 2)


def run(graph: Graph, ctx: PassContext) -> bool:
    """Fold last-two-axes transposes into the matmuls reading them, in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per folded transpose.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    for n in graph:
        if n.id not in graph.nodes or n.op != "matmul":
            continue
        for pos, flag in ((0, "transpose_a"), (1, "transpose_b")):
            while True:
                src = graph.nodes[n.inputs[pos]]
                if not swaps_last_two(src):
                    break
                inputs = list(n.inputs)
                inputs[pos] = src.inputs[0]
                attrs = dict(n.attrs)
                if attrs.get(flag):
                    attrs.pop(flag)
                else:
                    attrs[flag] = True
                got = try_infer("matmul", [graph.nodes[i] for i in inputs], attrs)
                if got != (n.shape, n.dtype):
                    break
                n.inputs = tuple(inputs)
                n.attrs = attrs
                prune(graph, [src.id])
                ctx.note(f"{NAME}: matmul %{n.id} reads %{src.inputs[0]} with "
                         f"{flag}={bool(attrs.get(flag))} instead of transpose %{src.id}")
                changed = True
    return changed
