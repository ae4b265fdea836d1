"""Dead-code elimination: drop every node the graph's outputs do not depend on.

Graph inputs are never removed (they are the function's signature), even when unused.
Nor are graph breaks (``eager`` nodes): the NumPy code they run may have effects, and
the shape of their result may have been read while tracing (``np.unique(a).size``
becomes a constant) — running them is what checks, at every call, that the shape is
still the traced one. Nor are the ops NumPy raises in (:func:`may_raise`): an integer
power, for a negative exponent on the values of a call, and a maximum, minimum or
arg-reduction over an axis of no values — the function it compiles must raise too,
even where the result is never used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph
from .rewrite import may_raise

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "dce"


def run(graph: Graph, ctx: PassContext) -> bool:
    """Remove the nodes not reachable from ``graph.outputs``, in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note listing the removed nodes.

    Returns
    -------
    bool
        Whether anything was removed.
    """
    live = set(graph.outputs) | {n.id for n in graph.nodes.values()
                                 if n.op == "eager" or may_raise(n, graph)}
    for n in reversed(list(graph.nodes.values())):
        if n.id in live:
            live.update(n.inputs)
    dead = [n for n in graph.nodes.values() if n.id not in live and n.op != "input"]
    for n in dead:
        graph.remove(n.id)
    if dead:
        ctx.note(f"{NAME}: removed {len(dead)} dead node(s): "
                 + ", ".join(f"{n.op} %{n.id}" for n in dead))
    return bool(dead)
