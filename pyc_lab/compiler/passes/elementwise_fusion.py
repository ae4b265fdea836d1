"""Elementwise fusion: every maximal group of elementwise ops becomes one ``fused`` node.

Groups are grown from their output backwards (reverse topological order): a producer
joins its consumer's group when it is elementwise, is not a graph output, every one of
its readers is in that group (so the group has a single output and no value escapes
it) and its shape broadcasts to the group's output shape. Such a group is convex, so it
can be computed in one pass over the output's elements.

Two shape ops join as well, so that they cost no copy (:mod:`pyc_lab.compiler.views`):
basic slices and transposes of a group's inputs (``x[..., :half]``), which the kernel
reads in place at their strides, and a concatenation as a group's root
(``np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)``), whose operands are
computed as *pieces* straight into their regions of the output. A value several pieces
read (``arg`` in ``np.concatenate([np.sin(arg), np.cos(arg)], -1)``) is computed in each
of them rather than written to memory and read back: elementwise arithmetic costs far
less than the round trip (up to :data:`MAX_RECOMPUTED_OPS` extra ops per group). A ``gather``
(``w[tokens]``, ``np.take_along_axis``) joins or starts a group like an elementwise op,
but, like a view, only reads inputs of the group (or views of them): its source and
indices are never computed inside it.

The fused node's inputs are the group's external inputs (first-use order, no
duplicates); ``attrs["body"]`` is a :class:`~pyc_lab.compiler.ir.Graph` with matching
inputs ``in0, in1, ...``, the group's ops (0-d constants inlined) and one output;
``attrs["ops"]`` the body's op names in order (constants excluded) and ``attrs["name"]``
``fused_<k>``. A lone elementwise op becomes a one-op fused node as well: the GPU backend
generates a kernel for every fused node. An op without a CUDA template would stay
outside every group, so that it does not keep the rest of a group from being generated.

In ``memory_first`` mode the grouping is the same; recomputing cheap producers to shorten
live ranges is a future refinement (the pass notes it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph, Node
from ..ops import REGISTRY
from ..views import VIEW_OPS
from .rewrite import broadcasts_to, kind_of, prune

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "elementwise_fusion"

#: The most op evaluations a concatenation's group may add by computing a value in
#: every piece that reads it (a value read by k pieces adds k - 1); past it the value
#: is computed once, by a kernel of its own.
MAX_RECOMPUTED_OPS = 16


#: Ops that read a group's inputs (or views of them) at positions of their own, never
#: values computed inside the group.
_READS = (*VIEW_OPS, "gather")


def _fusable(n: Node) -> bool:
    return n.op == "gather" or (kind_of(n.op) == "elementwise"
                                and REGISTRY[n.op].cuda is not None)


def _groups(graph: Graph) -> list[list[int]]:
    """Maximal single-output groups, each listed in topological order.

    A group's root is an elementwise op or a concatenation; with a concatenation each
    operand's part of the group is a *piece*, computed over the operand's shape, and a
    computed node serving several pieces is computed in each (within the group's
    :data:`MAX_RECOMPUTED_OPS`). Views (:data:`VIEW_OPS`) join as the reads
    of a group's inputs: a view joins when all its readers are in one group, and a node
    read by a view joins only if it is a view itself (so every view reads an input of
    the group, or another view). A view never starts a group of its own.
    """
    users = graph.users()
    outputs = set(graph.outputs)
    group_of: dict[int, int] = {}
    piece_of: dict[int, frozenset[int]] = {}  # {-1}: a concatenation root
    recomputed: dict[int, int] = {}  # group -> op evaluations added by shared values
    spaces: dict[tuple[int, int], tuple[int, ...]] = {}
    roots: list[int] = []
    members: dict[int, list[int]] = {}
    for n in reversed(list(graph.nodes.values())):
        is_view = n.op in VIEW_OPS
        is_concat = n.op == "concatenate" and len(n.shape) >= 1
        if not (_fusable(n) or is_view or is_concat):
            continue
        target = _join(graph, n, users[n.id], outputs, group_of, piece_of, spaces, roots,
                       recomputed)
        if target is None:
            if is_view:
                continue
            gid = len(roots)
            roots.append(n.id)
            members[gid] = []
            if is_concat:
                for p, i in enumerate(n.inputs):
                    spaces[(gid, p)] = tuple(graph.nodes[i].shape)
                target = (gid, frozenset({-1}))
            else:
                spaces[(gid, 0)] = tuple(n.shape)
                target = (gid, frozenset({0}))
        group_of[n.id], piece_of[n.id] = target
        members[target[0]].append(n.id)
    order = {nid: k for k, nid in enumerate(graph.nodes)}
    return [sorted(members[g], key=order.__getitem__) for g in sorted(
        members, key=lambda g: order[roots[g]])]


def _join(graph: Graph, n: Node, readers: list[int], outputs: set[int],
          group_of: dict[int, int], piece_of: dict[int, frozenset[int]],
          spaces: dict[tuple[int, int], tuple[int, ...]], roots: list[int],
          recomputed: dict[int, int]) -> tuple[int, frozenset[int]] | None:
    """The group producer ``n`` joins and the pieces it serves, or None."""
    if not readers or n.id in outputs or n.op == "concatenate":
        return None
    gids = {group_of.get(u) for u in readers}
    if len(gids) != 1 or None in gids:
        return None
    gid = gids.pop()
    is_view = n.op in VIEW_OPS
    if not is_view and any(graph.nodes[u].op in _READS for u in readers):
        return None  # views and gathers read inputs (or views), never computed values
    pieces: set[int] = set()
    for u in set(readers):
        if piece_of[u] == frozenset({-1}):  # an operand of the root concatenation
            pieces.update(p for p, i in enumerate(graph.nodes[roots[gid]].inputs)
                          if i == n.id)
        else:
            pieces.update(piece_of[u])
    chain_link = is_view and all(graph.nodes[u].op in _READS for u in readers)
    if not chain_link and not all(broadcasts_to(n.shape, spaces[(gid, p)]) for p in pieces):
        return None  # (a view read only by views or gathers is one link of a chain)
    if not is_view and len(pieces) > 1:  # computed in each piece that reads it
        extra = recomputed.get(gid, 0) + len(pieces) - 1
        if extra > MAX_RECOMPUTED_OPS:
            return None
        recomputed[gid] = extra
    return gid, frozenset(pieces)


def _build(graph: Graph, group: list[int], name: str) \
        -> tuple[list[int], list[int], Graph]:
    """The external inputs, the inlined constants and the body graph of one group."""
    nodes = graph.nodes
    inside = set(group)
    external: list[int] = []
    inline: dict[int, None] = {}
    for nid in group:
        for i in nodes[nid].inputs:
            if i in inside:
                continue
            src = nodes[i]
            if src.op == "constant" and src.shape == ():
                inline.setdefault(i)
            elif i not in external:
                external.append(i)
    body = Graph(name=name)
    env: dict[int, int] = {}
    for k, i in enumerate(external):
        src = nodes[i]
        env[i] = body.add("input", (), {"index": k}, name=f"in{k}", shape=src.shape,
                          dtype=src.dtype).id
    for i in inline:
        env[i] = body.add("constant", (), {"value": nodes[i].attrs["value"]}).id
    for nid in group:
        n = nodes[nid]
        env[nid] = body.add(n.op, [env[i] for i in n.inputs], dict(n.attrs)).id
    body.outputs = [env[group[-1]]]
    return external, list(inline), body


def run(graph: Graph, ctx: PassContext) -> bool:
    """Replace every maximal elementwise group of ``graph`` by a fused node, in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per fused node (and one about ``memory_first``).

    Returns
    -------
    bool
        Whether anything changed.
    """
    groups = _groups(graph)
    if not groups:
        return False
    if ctx.mode == "memory_first":
        ctx.note(f"{NAME}: memory_first groups like balanced (recomputing producers to "
                 "shorten live ranges is not implemented yet)")
    k = sum(1 for n in graph.nodes.values() if n.op == "fused")
    for group in groups:
        root = graph.nodes[group[-1]]
        name = f"fused_{k}"
        external, inlined, body = _build(graph, group, name)
        out = body.nodes[body.outputs[0]]
        if out.shape != root.shape or out.dtype != root.dtype:  # pragma: no cover
            continue  # cannot happen: the body repeats the group's own type inference
        ops = tuple(n.op for n in body.nodes.values() if n.op not in ("input", "constant"))
        fused = graph.add("fused", external, {"body": body, "ops": ops, "name": name})
        _place(graph, fused, root, set(group))
        prune(graph, inlined)
        ctx.note(f"{NAME}: fused {len(ops)} op(s) {', '.join(ops)} "
                 f"(%{', %'.join(map(str, group))}) into {name} %{fused.id}")
        _note_gather_sources(graph, external, body, name, ctx)
        k += 1
    return True


def _note_gather_sources(graph: Graph, external: list[int], body: Graph, name: str,
                         ctx: PassContext) -> None:
    """Say why a computed value a gather reads was not fused: a gather reads its source
    at positions of its own, so the source is materialised first."""
    for n in body.nodes.values():
        if n.op != "gather":
            continue
        src = body.nodes[n.inputs[0]]
        while src.op in VIEW_OPS:
            src = body.nodes[src.inputs[0]]
        if src.op != "input":
            continue
        outer = graph.nodes.get(external[int(src.attrs["index"])])
        if outer is not None and outer.op not in ("input", "constant"):
            ctx.note(f"{NAME}: {name} gathers from {outer.op} %{outer.id}, computed by its "
                     "own kernel first (a gather reads its source at other positions than "
                     "its own, so the source is never computed inside the gathering kernel)")


def _place(graph: Graph, fused: Node, root: Node, group: set[int]) -> None:
    """Put ``fused`` where the group's root was and drop the group's nodes."""
    order: dict[int, Node] = {}
    for nid, n in graph.nodes.items():
        if nid == root.id:
            order[fused.id] = fused
        elif nid not in group and nid != fused.id:
            order[nid] = n
    graph.nodes = order
    graph.replace_uses(root.id, fused.id)
