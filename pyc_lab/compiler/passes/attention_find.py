"""Finding hand-written attention: ``softmax(q @ k^T * scale [+ mask]) @ v``.

After :mod:`.reduction_fusion` has turned the hand-written softmax into one node, a
matmul whose left operand is a last-axis softmax of ``q @ k^T`` (``k`` transposed by the
matmul: :mod:`.transpose_fold` folded the ``swapaxes``), scaled by a scalar constant
(``*`` or ``/``) and optionally plus a mask, is attention. :func:`find` returns what it
found; the pass notes each one for ``explain()``, with the size of the score matrix the
program materialises. It rewrites nothing: until a fused attention kernel exists the
program runs as written (two batched GEMMs and a row softmax), and the note says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ir import Graph, Node
from .rewrite import is_const

if TYPE_CHECKING:
    from .rewrite import PassContext

__all__ = ["NAME", "Attention", "find", "run"]

NAME = "find_attention"


@dataclass(frozen=True)
class Attention:
    """One hand-written attention.

    Attributes
    ----------
    output, softmax, scores
        Node ids: ``p @ v``, the softmax ``p``, and ``q @ k^T``.
    q, k, v
        The operands' node ids.
    scale
        Whether a scalar scale was applied; ``mask``: the additive mask's node id.
    """

    output: int
    softmax: int
    scores: int
    q: int
    k: int
    v: int
    scale: bool
    mask: int | None


def _scores(graph: Graph, nid: int) -> tuple[Node, bool, int | None] | None:
    """``q @ k^T`` under an optional scalar scale and an optional additive mask."""
    node = graph.nodes[nid]
    mask = None
    scale = False
    if node.op == "add":
        a, b = node.inputs
        for inner, other in ((a, b), (b, a)):
            if graph.nodes[inner].op in ("matmul", "multiply", "divide") \
                    and not is_const(graph, other):
                node, mask = graph.nodes[inner], other
                break
        else:
            return None
    if node.op in ("multiply", "divide"):
        a, b = node.inputs
        const = b if is_const(graph, b) else (a if node.op == "multiply"
                                              and is_const(graph, a) else None)
        if const is None or graph.nodes[const].attrs["value"].size != 1:
            return None
        node = graph.nodes[a if const == b else b]
        scale = True
    if node.op != "matmul" or len(node.inputs) != 2 or not node.attrs.get("transpose_b") \
            or node.attrs.get("transpose_a") or len(node.shape) < 2:
        return None
    return node, scale, mask


def find(graph: Graph) -> list[Attention]:
    """Every hand-written attention in ``graph`` (see the module docstring)."""
    found = []
    for n in graph:
        if n.op != "matmul" or len(n.inputs) != 2 or n.attrs.get("transpose_a") \
                or n.attrs.get("transpose_b"):
            continue
        p = graph.nodes[n.inputs[0]]
        if p.op != "softmax" or p.attrs.get("axis") not in (-1, len(p.shape) - 1):
            continue
        got = _scores(graph, p.inputs[0])
        if got is None:
            continue
        scores, scale, mask = got
        found.append(Attention(n.id, p.id, scores.id, scores.inputs[0], scores.inputs[1],
                               n.inputs[1], scale, mask))
    return found


def run(graph: Graph, ctx: PassContext) -> bool:
    """Note every hand-written attention; the graph is left as it is.

    Parameters
    ----------
    graph : Graph
        The graph (not changed).
    ctx : PassContext
        Receives one note per attention found.

    Returns
    -------
    bool
        Always False.
    """
    for att in find(graph):
        s = graph.nodes[att.scores]
        q, v = graph.nodes[att.q], graph.nodes[att.v]
        size = math.prod(s.shape) * s.dtype.itemsize
        size_text = f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"
        extras = ", ".join(filter(None, ("scaled" if att.scale else "",
                                         f"mask %{att.mask}" if att.mask is not None else "")))
        ctx.note(f"{NAME}: attention at %{att.output}: softmax(q @ k^T"
                 f"{' ' + extras if extras else ''}) @ v, q {list(q.shape)}, v "
                 f"{list(v.shape)}; runs as two batched GEMMs and a row softmax with the "
                 f"{list(s.shape)} scores materialised ({size_text}): no fused attention "
                 "kernel yet")
    return False
