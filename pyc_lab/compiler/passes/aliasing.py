"""Output aliasing: a compiled function's results share memory exactly where NumPy's do.

NumPy returns a view of an argument for ``x[1:]``, ``x.T`` or ``x.reshape(...)`` and the
argument itself for ``return x``; everything computed (``x * 1``, ``x.astype(x.dtype)``,
``-(-x)``, ``x + 0``) is a new array. Rewrites can change that: the simplifier turns
``x * 1`` into ``x``, CSE makes two equal results one array, constant folding makes a
result a constant the graph keeps between calls. Writing into such a result would then
change the caller's argument, the other result, or every later call's result.

:func:`preserve` compares the graph as traced (whose aliasing is NumPy's: shape ops
are views as in NumPy, everything else fresh) with the optimised one, and gives every
returned value that now shares storage it did not share before a ``copy`` node: with
an input, with another returned value, or with a constant. The pass manager runs it
after the pipeline, whatever the passes were.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "output_aliasing"

#: Ops whose result may share its operand's storage (NumPy views).
VIEWS = frozenset({"reshape", "transpose", "slice", "expand_dims", "squeeze",
                   "broadcast_to"})

Tag = tuple[str, int]


def storage(graph: Graph) -> dict[int, frozenset[Tag]]:
    """For every node, the storage its value may live in: ``("input", k)``,
    ``("constant", id)`` or ``("node", id)`` (its own new array).

    Views share their operand's storage; a graph break may return a view of any of its
    arguments (``np.flip``), so it may share theirs as well as having its own.
    """
    position = {nid: k for k, nid in enumerate(graph.inputs)}
    out: dict[int, frozenset[Tag]] = {}
    for n in graph:
        if n.op == "input":
            out[n.id] = frozenset({("input", position[n.id])})
        elif n.op == "constant":
            out[n.id] = frozenset({("constant", n.id)})
        elif n.op in VIEWS:
            out[n.id] = out[n.inputs[0]]
        elif n.op == "eager":
            out[n.id] = frozenset({("node", n.id)}).union(*(out[i] for i in n.inputs))
        else:
            out[n.id] = frozenset({("node", n.id)})
    return out


def preserve(before: Graph, after: Graph, ctx: PassContext) -> bool:
    """Copy the returned values of ``after`` whose aliasing differs from ``before``'s.

    Parameters
    ----------
    before : Graph
        The graph as traced (same outputs, in the same positions).
    after : Graph
        The optimised graph, rewritten in place.
    ctx : PassContext
        Receives one note per copy.

    Returns
    -------
    bool
        Whether a copy was added.
    """
    sb, sa = storage(before), storage(after)
    written = {pos for _, pos in after.writeback}
    returned = [k for k in range(len(after.outputs)) if k not in written]
    changed = False
    for i, k in enumerate(returned):
        b, a = sb[before.outputs[k]], sa[after.outputs[k]]
        why = ""
        if any(t[0] == "input" and t not in b for t in a):
            why = "it would share memory with an argument"
        elif any(t[0] == "constant" for t in a):
            why = "it would be a constant kept between calls"
        else:
            for j in returned[:i]:
                if a & sa[after.outputs[j]] and not b & sb[before.outputs[j]]:
                    why = f"it would share memory with result {j}"
                    break
        if not why:
            continue
        src = after.outputs[k]
        node = after.add("copy", [src])
        after.outputs[k] = node.id
        sa[node.id] = frozenset({("node", node.id)})
        ctx.note(f"{NAME}: result {k} (%{src}) copied into %{node.id}: {why}, where "
                 "NumPy's result is a new array")
        changed = True
    return changed
