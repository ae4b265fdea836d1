"""Common-subexpression elimination: identical nodes are computed once.

Two nodes are identical when they have the same op, the same inputs (in any order for
``add``, ``multiply``, ``equal`` and ``not_equal``, whose results do not depend on it) and
equal attributes. Constants are identical when dtype, shape and bytes agree (so ``0.0``
and ``-0.0`` stay apart); fused bodies compare structurally. Inputs and eager nodes
(graph breaks, possibly impure) are never merged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir import Graph
from .rewrite import prune

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "cse"

#: Ops whose result is exactly the same with the operands swapped.
SYMMETRIC = frozenset({"add", "multiply", "equal", "not_equal"})


class _Unhashable(Exception):
    pass


def _freeze(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("nd", value.dtype.str, value.shape, value.tobytes(order="C"))
    if isinstance(value, Graph):
        return ("graph", graph_key(value))
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    if isinstance(value, np.generic):
        return ("np", value.dtype.str, value.tobytes())
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, (bool, int, str, type(None))):
        return (type(value).__name__, value)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), _freeze(v)) for k, v in value.items())))
    if isinstance(value, slice):
        return ("slice", _freeze(value.start), _freeze(value.stop), _freeze(value.step))
    raise _Unhashable(type(value).__name__)


def graph_key(graph: Graph) -> tuple:
    """A hashable structural key of a whole graph (ids renumbered in order)."""
    num = {nid: k for k, nid in enumerate(graph.nodes)}
    nodes = tuple(
        (n.op, tuple(num[i] for i in n.inputs), _freeze(n.attrs), n.shape, n.dtype.str)
        for n in graph.nodes.values()
    )
    return (nodes, tuple(num[i] for i in graph.inputs), tuple(num[o] for o in graph.outputs))


def node_key(graph: Graph, nid: int) -> tuple | None:
    """The key under which node ``nid`` is merged, or None if it must never be merged."""
    n = graph.nodes[nid]
    if n.op in ("input", "eager"):
        return None
    inputs = tuple(sorted(n.inputs)) if n.op in SYMMETRIC else tuple(n.inputs)
    try:
        attrs = _freeze(n.attrs)
    except _Unhashable:
        return None
    if n.op == "constant":
        return ("constant", attrs, n.shape, n.dtype.str)
    return (n.op, inputs, attrs)


def run(graph: Graph, ctx: PassContext) -> bool:
    """Merge identical nodes of ``graph`` in place (the first one stays).

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per merged node.

    Returns
    -------
    bool
        Whether anything changed.
    """
    seen: dict[tuple, int] = {}
    changed = False
    for n in graph:
        if n.id not in graph.nodes:
            continue
        key = node_key(graph, n.id)
        if key is None:
            continue
        try:
            first = seen.get(key)
        except TypeError:  # an attribute value that is not hashable after all
            continue
        if first is None:
            seen[key] = n.id
            continue
        graph.replace_uses(n.id, first)
        prune(graph, [n.id])
        ctx.note(f"{NAME}: merged {n.op} %{n.id} into identical %{first}")
        changed = True
    return changed
