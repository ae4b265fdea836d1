"""Run a graph node by node with an array module: the NumPy backend and eager segments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .ir import Graph
from .ops import evaluate

__all__ = ["run_graph"]


def run_graph(graph: Graph, args: Sequence[Any], xp: Any) -> list[Any]:
    """Evaluate ``graph`` on ``args`` (one per graph input) with module ``xp``.

    Values are dropped as soon as their last reader has run, so peak memory follows the
    graph's liveness rather than its size.
    """
    values: dict[int, Any] = dict(zip(graph.inputs, args, strict=True))
    last_use: dict[int, int] = {}
    for pos, n in enumerate(graph.nodes.values()):
        for i in n.inputs:
            last_use[i] = pos
    keep = set(graph.outputs)
    for pos, n in enumerate(graph.nodes.values()):
        if n.op == "input":
            continue
        out = xp.asarray(evaluate(n.op, xp, [values[i] for i in n.inputs], n.attrs))
        if out.dtype != n.dtype:
            out = out.astype(n.dtype)
        values[n.id] = out
        for i in set(n.inputs):
            if last_use.get(i) == pos and i not in keep:
                values.pop(i, None)
    return [values[o] for o in graph.outputs]
