"""Output fusion: a fused kernel whose value escapes is computed inside its reader.

Elementwise fusion stops at a value that is a result or has several readers: an Adam
step's ``m2 = 0.9 * m + 0.1 * g`` is returned *and* read by the parameter update, so it
becomes a kernel of its own that writes ``m2``, and the update's kernel reads it back.
This pass moves such a producer ``A`` into a reader ``B`` of the same shape that reads
it element for element: ``B``'s body computes ``A``'s value as well, as its output
``k``, and a ``fused_extra(B, ...; output=k)`` node stands for it wherever else it was
read. One kernel then reads ``m`` and ``g`` once and writes ``m2`` and the update in
the same pass; the Adam step's three kernels become one.

A producer moves only when nothing reads it before ``B`` (its value now appears at
``B``), its body is a plain elementwise one (no concatenation) and ``B``'s is too; the
``fused_extra`` nodes follow ``B`` directly, so the memory plan gives them buffers that
no value live during ``B``'s kernel holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph, Node
from ..views import same_position_inputs

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "output_fusion"

#: The most outputs one kernel writes (each is one more pointer and store stream).
MAX_OUTPUTS = 8


def is_plain(node: Node) -> bool:
    """Whether ``node`` is a fused kernel of elementwise work (no concatenation)."""
    body = node.attrs.get("body")
    return node.op == "fused" and isinstance(body, Graph) and not any(
        body.node(o).op == "concatenate" for o in body.outputs)


def _candidate(graph: Graph, b: Node, order: dict[int, int],
               users: dict[int, list[int]]) -> int | None:
    """The position in ``b``'s inputs of a producer that can move into ``b``, or None."""
    same = same_position_inputs(b.attrs["body"])
    for pos, a_id in enumerate(b.inputs):
        a = graph.nodes[a_id]
        if not is_plain(a) or pos not in same or a.shape != b.shape:
            continue
        if len(a.attrs["body"].outputs) != 1:
            continue
        if len(b.attrs["body"].outputs) + 1 > MAX_OUTPUTS:
            return None
        if any(order[u] < order[b.id] for u in users[a_id] if u != b.id):
            continue
        return pos
    return None


def copy_into(dst: Graph, src: Graph, env: dict[int, int]) -> None:
    """Add ``src``'s non-input nodes to ``dst`` (``env`` maps ``src`` ids to ``dst`` ids
    and receives the new ones)."""
    for n in src:
        if n.op == "input":
            continue
        if n.op == "constant":
            env[n.id] = dst.add("constant", (), dict(n.attrs)).id
        else:
            env[n.id] = dst.add(n.op, [env[i] for i in n.inputs], dict(n.attrs)).id


def _merge(graph: Graph, a: Node, b: Node, pos: int) -> tuple[Node, list[Node]]:
    """``b`` computing ``a``'s value too: the new fused node and its fused_extra nodes
    (the old ones of ``b`` first, then ``a``'s)."""
    a_body, b_body = a.attrs["body"], b.attrs["body"]
    inputs = [i for k, i in enumerate(b.inputs) if k != pos]
    inputs += [i for i in a.inputs if i not in inputs]
    body = Graph(name=b_body.name)
    slot: dict[int, int] = {}
    for k, i in enumerate(inputs):
        src = graph.nodes[i]
        slot[i] = body.add("input", (), {"index": k}, name=f"in{k}", shape=src.shape,
                           dtype=src.dtype).id
    a_env = {bid: slot[a.inputs[k]] for k, bid in enumerate(a_body.inputs)}
    copy_into(body, a_body, a_env)
    b_env = {bid: (a_env[a_body.outputs[0]] if k == pos else slot[b.inputs[k]])
             for k, bid in enumerate(b_body.inputs)}
    copy_into(body, b_body, b_env)
    body.outputs = [b_env[o] for o in b_body.outputs] + [a_env[a_body.outputs[0]]]
    return add_multi_output(graph, body, inputs, b.attrs.get("name", "fused"))


def extras_of(graph: Graph, node: Node, users: dict[int, list[int]]) -> list[Node]:
    """``node``'s ``fused_extra`` nodes, by output."""
    return sorted((graph.nodes[u] for u in users[node.id]
                   if graph.nodes[u].op == "fused_extra" and graph.nodes[u].inputs[0] == node.id),
                  key=lambda e: e.attrs["output"])


def add_multi_output(graph: Graph, body: Graph, inputs: list[int],
                     name: str) -> tuple[Node, list[Node]]:
    """A ``fused`` node computing ``body`` from ``inputs`` and a ``fused_extra`` node for
    each of its outputs past the first (not yet placed in the graph's order)."""
    ops = tuple(n.op for n in body if n.op not in ("input", "constant"))
    fused = graph.add("fused", inputs, {"body": body, "ops": ops, "name": name})
    extras = [graph.add("fused_extra", [fused.id, *inputs], {"body": body, "output": k})
              for k in range(1, len(body.outputs))]
    return fused, extras


def place_at(graph: Graph, fused: Node, extras: list[Node], b: Node, gone: set[int]) -> None:
    """Put ``fused`` and then its extras where ``b`` was; drop the nodes in ``gone``."""
    new = {fused.id, *(e.id for e in extras)}
    order: dict[int, Node] = {}
    for nid, n in graph.nodes.items():
        if nid == b.id:
            order[fused.id] = fused
            for e in extras:
                order[e.id] = e
        elif nid not in gone and nid not in new:
            order[nid] = n
    graph.nodes = order


def run(graph: Graph, ctx: PassContext) -> bool:
    """Move escaping producers into their readers' kernels, in place.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    while True:
        order = {nid: k for k, nid in enumerate(graph.nodes)}
        users = graph.users()
        found = None
        for b in graph.nodes.values():
            if is_plain(b):
                pos = _candidate(graph, b, order, users)
                if pos is not None:
                    found = (b, pos)
                    break
        if found is None:
            return changed
        b, pos = found
        a = graph.nodes[b.inputs[pos]]
        # b's own extra outputs (another node's extras may read b as an input)
        old_extras = extras_of(graph, b, users)
        fused, extras = _merge(graph, a, b, pos)
        place_at(graph, fused, extras, b, {a.id, b.id, *(e.id for e in old_extras)})
        graph.replace_uses(b.id, fused.id)
        for old in old_extras:
            graph.replace_uses(old.id, extras[old.attrs["output"] - 1].id)
        graph.replace_uses(a.id, extras[-1].id)
        role = "a result" if extras[-1].id in graph.outputs else "read elsewhere"
        ctx.note(f"{NAME}: {a.attrs.get('name', 'fused')} %{a.id} is also {role}: computed "
                 f"inside {fused.attrs['name']} %{fused.id} as its output {len(extras)} "
                 f"(%{extras[-1].id}), one pass writing both")
        changed = True
