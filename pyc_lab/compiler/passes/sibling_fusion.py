"""Sibling fusion: independent elementwise kernels of one shape that read the same array
become one kernel.

``np.sin(x), np.cos(x)``, ``x // y, x % y`` or a polar-to-Cartesian ``r * np.cos(t),
r * np.sin(t)`` are two groups to elementwise fusion (neither reads the other), so each
is a kernel that reads the shared inputs again: four transfers of the array where one
kernel reading it once and writing both results moves three. This pass joins two plain
fused nodes (no concatenation; see :mod:`.output_fusion`) when they have the same
shape, share an input, and neither depends on the other: the joined body computes both,
its outputs the later node's followed by the earlier's, and ``fused_extra`` nodes stand
for the outputs past the first, as output fusion's do.

The joined kernel takes the later node's place when nothing reads the earlier one
before it, else the earlier one's place when every input of the later one is computed
before that; otherwise the pair stays two kernels (it would need the graph reordered).
Joining repeats until no pair is left, up to :data:`~.output_fusion.MAX_OUTPUTS`
outputs a kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph, Node
from .output_fusion import MAX_OUTPUTS, add_multi_output, copy_into, extras_of, is_plain, place_at

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "sibling_fusion"


def _ancestors(graph: Graph, nid: int) -> set[int]:
    seen: set[int] = set()
    stack = list(graph.nodes[nid].inputs)
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(graph.nodes[i].inputs)
    return seen


def _anchor(graph: Graph, a: Node, b: Node, order: dict[int, int],
            users: dict[int, list[int]]) -> Node | None:
    """Where the joined kernel of ``a`` (earlier) and ``b`` may stand, or None."""
    outs = {a.id, *(e.id for e in extras_of(graph, a, users))}
    readers = [u for o in outs for u in users[o] if u not in outs]
    if all(order[u] > order[b.id] for u in readers):
        return b
    if all(order[i] < order[a.id] for i in b.inputs):
        return a
    return None


def _pair(graph: Graph) -> tuple[Node, Node, Node] | None:
    """An earlier node, a later node and the place of their joined kernel, or None."""
    order = {nid: k for k, nid in enumerate(graph.nodes)}
    users = graph.users()
    plain = [n for n in graph.nodes.values() if is_plain(n)]
    for k, b in enumerate(plain):
        b_outs = len(b.attrs["body"].outputs)
        ancestors: set[int] | None = None
        for a in plain[:k]:
            if a.shape != b.shape or not set(a.inputs) & set(b.inputs):
                continue
            if b_outs + len(a.attrs["body"].outputs) > MAX_OUTPUTS:
                continue
            if ancestors is None:
                ancestors = _ancestors(graph, b.id)
            if a.id in ancestors or any(e.id in ancestors for e in extras_of(graph, a, users)):
                continue  # b reads a's value: output fusion's case, not a sibling
            anchor = _anchor(graph, a, b, order, users)
            if anchor is not None:
                return a, b, anchor
    return None


def _join(graph: Graph, a: Node, b: Node) -> tuple[Node, list[Node]]:
    """One fused node computing ``b``'s outputs, then ``a``'s; and its extras."""
    inputs = list(dict.fromkeys([*b.inputs, *a.inputs]))
    body = Graph(name=b.attrs["body"].name)
    slot: dict[int, int] = {}
    for k, i in enumerate(inputs):
        src = graph.nodes[i]
        slot[i] = body.add("input", (), {"index": k}, name=f"in{k}", shape=src.shape,
                           dtype=src.dtype).id
    envs = []
    for node in (b, a):
        sub = node.attrs["body"]
        env = {bid: slot[node.inputs[k]] for k, bid in enumerate(sub.inputs)}
        copy_into(body, sub, env)
        envs.append([env[o] for o in sub.outputs])
    body.outputs = envs[0] + envs[1]
    return add_multi_output(graph, body, inputs, b.attrs.get("name", "fused"))


def run(graph: Graph, ctx: PassContext) -> bool:
    """Join independent same-shape kernels that share an input, in place.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    while (found := _pair(graph)) is not None:
        a, b, anchor = found
        users = graph.users()
        a_extras, b_extras = extras_of(graph, a, users), extras_of(graph, b, users)
        fused, extras = _join(graph, a, b)
        place_at(graph, fused, extras, anchor,
               {a.id, b.id, *(e.id for e in a_extras), *(e.id for e in b_extras)})
        n_b = len(b.attrs["body"].outputs)
        graph.replace_uses(b.id, fused.id)
        for old in b_extras:
            graph.replace_uses(old.id, extras[old.attrs["output"] - 1].id)
        graph.replace_uses(a.id, extras[n_b - 1].id)
        for old in a_extras:
            graph.replace_uses(old.id, extras[n_b + old.attrs["output"] - 1].id)
        ctx.note(f"{NAME}: {a.attrs.get('name', 'fused')} %{a.id} and "
                 f"{b.attrs.get('name', 'fused')} %{b.id} read the same array and neither "
                 f"reads the other: one kernel %{fused.id} reads it once and writes "
                 f"{len(extras) + 1} outputs")
        changed = True
    return changed
