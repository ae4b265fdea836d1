"""Reshape sinking: elementwise work on a reshaped value runs in the value's own shape.

``E(reshape(v, s), w)`` for an elementwise ``E`` becomes ``reshape(E(v, w'), s)`` when
the reshape splits or merges neighbouring axes (one that only adds or drops axes of
length one is left: both shapes fuse alike) and every other operand ``w``
broadcasts along each such group as a whole (all ones there, or the group's full
extent, which ``w'`` splits the same way). A group norm written as NumPy users write it —
``((xg - mu) / sd).reshape(n, c, h, w) * g[:, None, None] + b[:, None, None]`` — then
applies its scale and shift in the grouped shape, where row fusion takes them into the
kernel that normalises, instead of a pass of their own after it. Elementwise results
are positionwise, so computing them before the reshape gives the same values; a rewrite
whose types would differ is left alone. Reshapes of graph inputs are left alone (there
is nothing to fuse with above them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..ir import Graph, Node
from ..ops import REGISTRY
from .rewrite import insert_like, kind_of, prune, try_infer

if TYPE_CHECKING:
    from .rewrite import PassContext

__all__ = ["NAME", "run"]

NAME = "reshape_sinking"


def _groups(r: tuple[int, ...], v: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """The axes of ``r`` and of ``v`` that a reshape between them maps onto each other:
    neighbouring runs of equal product, in order (None for an empty array)."""
    if 0 in r or 0 in v:
        return None
    out: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(r) and j < len(v):
        ri, vj, pr, pv = [i], [j], r[i], v[j]
        i, j = i + 1, j + 1
        while pr != pv:
            if pr < pv and i < len(r):
                pr, i = pr * r[i], i + 1
                ri.append(i - 1)
            elif pv < pr and j < len(v):
                pv, j = pv * v[j], j + 1
                vj.append(j - 1)
            else:
                return None
        out.append((ri, vj))
    rest_r, rest_v = list(range(i, len(r))), list(range(j, len(v)))
    if any(r[k] != 1 for k in rest_r) or any(v[k] != 1 for k in rest_v):
        return None
    if rest_r or rest_v:  # trailing axes of length one join the last run
        last_r, last_v = out[-1] if out else ([], [])
        out[-1:] = [(last_r + rest_r, last_v + rest_v)]
    return out


def _operand_shape(shape: tuple[int, ...], rank: int, groups: list, r: tuple[int, ...],
                   v: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape an operand broadcasting to ``r`` takes in ``v``'s axes, or None where it
    varies along part of a group only."""
    padded = (1,) * (rank - len(shape)) + tuple(shape)
    out: list[int] = []
    for ri, vj in groups:
        mine = [padded[k] for k in ri]
        if all(d == 1 for d in mine):
            out.extend(1 for _ in vj)
        elif mine == [r[k] for k in ri]:
            out.extend(v[k] for k in vj)
        else:
            return None
    return tuple(out)


def _unviewed(graph: Graph, node: Node) -> Node:
    """``node`` or, where it is only a view that keeps every element in order (a reshape,
    axes of length one added or dropped: ``g[None, :, None, None]``), what it views — one
    reshape of that instead of a chain of view steps."""
    while node.inputs and math.prod(graph.nodes[node.inputs[0]].shape) == math.prod(node.shape):
        axes_only = node.op == "slice" and all(
            p in (("n",), ("e",), ("s", None, None, None)) for p in node.attrs.get("index", ()))
        if node.op not in ("reshape", "expand_dims", "squeeze") and not axes_only:
            break
        node = graph.nodes[node.inputs[0]]
    return node


def _sink(graph: Graph, e: Node) -> bool:
    reshapes = [i for i in e.inputs if graph.nodes[i].op == "reshape"
                and tuple(graph.nodes[i].shape) == tuple(e.shape)]
    if not reshapes:
        return False
    r = graph.nodes[reshapes[0]]
    v = graph.nodes[r.inputs[0]]
    if v.op in ("input", "constant") or math.prod(v.shape) != math.prod(e.shape):
        return False
    rshape, vshape = tuple(r.shape), tuple(v.shape)
    groups = _groups(rshape, vshape)
    if groups is None or not any(
            sum(rshape[k] > 1 for k in ri) > 1 or sum(vshape[k] > 1 for k in vj) > 1
            for ri, vj in groups):
        return False  # (only axes of length one come or go: the spaces fuse alike)
    inserted: list[int] = []
    args: list[int] = []
    for i in e.inputs:
        node = graph.nodes[i]
        if node.op == "reshape" and node.inputs[0] == v.id \
                and tuple(node.shape) == rshape:
            args.append(v.id)
            continue
        if node.shape == ():
            args.append(i)
            continue
        shape = _operand_shape(tuple(node.shape), len(rshape), groups, rshape, vshape)
        if shape is None or try_infer("reshape", [node], {"shape": shape}) is None:
            prune(graph, inserted)
            return False
        moved = graph.insert_before(e.id, "reshape", (_unviewed(graph, node).id,),
                                    {"shape": shape})
        inserted.append(moved.id)
        args.append(moved.id)
    got = try_infer(e.op, [graph.nodes[a] for a in args], dict(e.attrs))
    if got is None or got[0] != vshape or got[1] != e.dtype:
        prune(graph, inserted)
        return False
    inner = graph.insert_before(e.id, e.op, tuple(args), dict(e.attrs))
    back = insert_like(graph, e.id, "reshape", (inner.id,), {"shape": tuple(e.shape)}, e)
    if back is None:  # pragma: no cover - the types were checked above
        prune(graph, [*inserted, inner.id])
        return False
    graph.replace_uses(e.id, back.id)
    prune(graph, [e.id])
    return True


def run(graph: Graph, ctx: PassContext) -> bool:
    """Sink reshapes below the elementwise ops that read them, in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per op moved.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    for n in list(graph):
        if n.id not in graph.nodes or not n.inputs or n.op not in REGISTRY \
                or kind_of(n.op) != "elementwise":
            continue
        if _sink(graph, n):
            ctx.note(f"{NAME}: {n.op} %{n.id} runs before the reshape it read")
            changed = True
    return changed

