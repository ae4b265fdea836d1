"""Gather sinking: read fewer elements by gathering before elementwise work, not after.

``gather(E(a, b), idx)`` for an elementwise op ``E`` becomes ``E(gather(a, idx),
gather(b, idx))`` when the gather's result has fewer elements than ``E``'s: an element
of an elementwise result depends only on the operands' elements at its own position, so
picking positions first computes the same values on fewer of them. Repeated down the
chain, the pick of a loss written as ``logp = z - log(sum(exp(z))); -logp[arange, y]``
reads ``z`` and the row's log-sum at ``n`` positions instead of materialising the whole
``logp``; ``(w * s)[tokens]`` scales only the rows it reads. ``E`` stays where something
else still reads it. A gather of rows (or, with a 1-D index, columns) of a 2-D matmul
gathers that operand instead, so the GEMM computes only what is read.

An operand broadcast along the gathered axis (a row's ``max`` of shape ``(n, 1)``) is
not gathered: it is reshaped to the gathered shape (the axis replaced by the index's
dims, or dropped for one index per row) and broadcasts as before; an operand of lower
rank (a bias) is read at its full-rank shape first. A rewrite whose result type would differ
and ops with more than elementwise meaning are left as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph, Node
from .rewrite import insert_like, kind_of, prune, try_infer

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "gather_sinking"


def _size(node: Node) -> int:
    return int(np.prod(node.shape, dtype=np.int64))


def _gathered(graph: Graph, g: Node, operand: int, rank: int) -> int | None:
    """A node with ``operand``'s values at ``g``'s positions (inserted before ``g``), or
    None where the operand's layout is not one this pass handles."""
    o = graph.nodes[operand]
    if o.shape == ():
        return operand
    if len(o.shape) > rank:
        return None
    if len(o.shape) < rank:  # broadcast from the left (a bias): its full-rank shape
        padded = (1,) * (rank - len(o.shape)) + tuple(o.shape)
        o = graph.insert_before(g.id, "reshape", (operand,), {"shape": padded})
        operand = o.id
    axis, along = int(g.attrs["axis"]), bool(g.attrs.get("along"))
    idx = graph.nodes[g.inputs[1]]
    if o.shape[axis] != 1:
        attrs = dict(g.attrs)
        if try_infer("gather", [o, idx], attrs) is None:
            return None
        return graph.insert_before(g.id, "gather", (operand, idx.id), attrs).id
    if along and len(idx.shape) == rank:  # broadcast along the axis: read as it is
        return operand
    if along:  # one index per row: the axis is dropped
        shape = o.shape[:axis] + o.shape[axis + 1:]
    else:  # the index's dims replace the axis (all of extent 1 here)
        shape = o.shape[:axis] + (1,) * len(idx.shape) + o.shape[axis + 1:]
    return graph.insert_before(g.id, "reshape", (operand,), {"shape": shape}).id


def _sink_matmul(graph: Graph, g: Node, src: Node) -> Node | None:
    """``(a @ b)[idx]`` as ``a[idx] @ b`` and ``(a @ b)[:, idx]`` (a 1-D ``idx``) as
    ``a @ b[:, idx]``, for 2-D operands: the GEMM computes only the rows or columns that
    are read."""
    a, b = (graph.nodes[i] for i in src.inputs[:2])
    idx = graph.nodes[g.inputs[1]]
    axis = int(g.attrs["axis"])
    if len(src.inputs) != 2 or any(src.attrs.values()) or len(a.shape) != 2 \
            or len(b.shape) != 2 or g.attrs.get("along") \
            or (axis == 1 and len(idx.shape) != 1):
        return None
    pos = 0 if axis == 0 else 1
    operand = graph.nodes[src.inputs[pos]]
    attrs = {"axis": axis, "along": False}
    if try_infer("gather", [operand, idx], attrs) is None:
        return None
    inputs = list(src.inputs)
    inputs[pos] = graph.insert_before(g.id, "gather", (operand.id, idx.id), attrs).id
    return insert_like(graph, g.id, "matmul", inputs, {}, g)


def _sink_elementwise(graph: Graph, g: Node, src: Node) -> Node | None:
    """``E(a, b)[idx]`` as ``E(a[idx], b[idx])`` (see the module's note)."""
    if src.shape[int(g.attrs["axis"])] == 1:  # an operand must keep the range check
        return None
    operands = [_gathered(graph, g, i, len(src.shape)) for i in src.inputs]
    if any(o is None for o in operands):
        return None
    return insert_like(graph, g.id, src.op, operands, dict(src.attrs), g)


def _sink(graph: Graph, g: Node) -> Node | None:
    """``g`` moved below the elementwise op or matmul it reads; the new op, or None
    (and the graph as it was)."""
    src = graph.nodes[g.inputs[0]]
    if _size(g) >= _size(src) or not src.inputs:
        return None
    if src.op == "matmul":
        how = _sink_matmul
    elif kind_of(src.op) == "elementwise":
        how = _sink_elementwise
    else:
        return None
    before = set(graph.nodes)
    new = how(graph, g, src)
    if new is None:  # undo: drop what was inserted
        prune(graph, [n for n in graph.nodes if n not in before])
        return None
    graph.replace_uses(g.id, new.id)
    prune(graph, [g.id])
    return new


def run(graph: Graph, ctx: PassContext) -> bool:
    """Move every gather below the elementwise ops it reads, where that reads less.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per move.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    work = [n.id for n in graph if n.op == "gather"]
    while work:
        g = graph.nodes.get(work.pop())
        if g is None or g.op != "gather":
            continue
        src_op, src_id = graph.nodes[g.inputs[0]].op, g.inputs[0]
        new = _sink(graph, g)
        if new is None:
            continue
        ctx.note(f"{NAME}: gather %{g.id} of {src_op} %{src_id} became {src_op} %{new.id} "
                 "of gathered operands (fewer elements computed)")
        work += [i for i in new.inputs if graph.nodes[i].op == "gather"]
        changed = True
    return changed
