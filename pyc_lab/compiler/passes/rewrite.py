"""What every pass works with: its context and the rewrite helpers the passes share.

:class:`PassContext` carries the optimisation mode and a list for each decision's note;
the helpers look up constants, check and insert nodes, and prune what a rewrite left
dead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import PycLabError
from ..ir import Graph, Node
from ..ops import FUSED_OPS, REGISTRY, infer, normalize_axis
from ..views import broadcasts_to

__all__ = ["NotRebuilt", "PassContext", "broadcasts_to", "const_is", "const_value",
           "exclusive_prologue", "insert_checked", "insert_like", "is_const", "is_float",
           "kind_of", "prune", "rebuild_prologue", "same_type", "sole_user", "try_infer"]

logger = logging.getLogger(__name__)


@dataclass
class PassContext:
    """What a pass gets besides the graph: the mode and a list for its decision notes.

    Attributes
    ----------
    mode : str
        ``"balanced"``, ``"memory_first"`` or ``"utilization_first"``.
    notes : list of str
        One human-readable line per decision, e.g.
        ``"epilogue_fusion: folded bias add %5 and gelu %6 into matmul %4"``.
    """

    mode: str = "balanced"
    notes: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        """Record one decision (also logged at DEBUG level)."""
        self.notes.append(line)
        logger.debug("%s", line)


def is_const(graph: Graph, nid: int) -> bool:
    """Whether node ``nid`` is a ``constant``."""
    return graph.nodes[nid].op == "constant"


def const_value(graph: Graph, nid: int) -> np.ndarray | None:
    """The value of constant node ``nid`` as an array, or None if it is not a constant."""
    node = graph.nodes[nid]
    if node.op != "constant":
        return None
    return np.asarray(node.attrs["value"])


def as_float(arr: np.ndarray) -> np.ndarray:
    """A bfloat16 constant as float32 (ml_dtypes' bfloat16 has dtype kind ``V``, which
    checks for ``"f"`` miss; every bfloat16 value is a float32 one); others as given."""
    return arr.astype(np.float32) if arr.dtype.name == "bfloat16" else arr


def const_is(graph: Graph, nid: int, value: float, *, scalar_only: bool = False,
             bfloat16: bool = False) -> bool:
    """Whether ``nid`` is a constant whose every element equals ``value``.

    A zero ``value`` matches only +0 (a float ``-0.0`` constant does not), so rewrites
    keyed on zero keep the sign of zero. ``scalar_only`` demands a 0-d constant;
    ``bfloat16`` lets a bfloat16 constant match too (read through :func:`as_float`).
    """
    arr = const_value(graph, nid)
    if arr is not None and bfloat16:
        arr = as_float(arr)
    if arr is None or arr.size == 0 or (scalar_only and arr.ndim != 0):
        return False
    if arr.dtype.kind not in "biuf":
        return False
    with np.errstate(all="ignore"):
        if not bool(np.all(arr == value)):
            return False
        if value == 0 and arr.dtype.kind == "f" and bool(np.any(np.signbit(arr))):
            return False
    return True


def same_type(a: Node, b: Node) -> bool:
    """Whether two nodes have exactly the same shape and dtype."""
    return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype


def try_infer(op: str, inputs: list[Node], attrs: dict[str, Any]) \
        -> tuple[tuple[int, ...], np.dtype] | None:
    """``infer`` that returns None instead of raising when the operands do not fit."""
    try:
        shape, dtype = infer(op, inputs, attrs)
    except PycLabError:
        return None
    return tuple(shape), np.dtype(dtype)


def insert_like(graph: Graph, anchor: int, op: str, inputs: Iterable[int],
                attrs: dict[str, Any] | None, like: Node) -> Node | None:
    """Insert ``op(inputs; attrs)`` before ``anchor`` if its type equals ``like``'s.

    Returns the new node, or None (and inserts nothing) when the new node's inferred
    shape or dtype would differ from ``like``'s — a rewrite must never change a type.
    """
    inputs = tuple(inputs)
    attrs = dict(attrs or {})
    got = try_infer(op, [graph.nodes[i] for i in inputs], attrs)
    if got is None or got[0] != tuple(like.shape) or got[1] != like.dtype:
        return None
    return graph.insert_before(anchor, op, inputs, attrs)


def insert_checked(graph: Graph, anchor: int, op: str, inputs: tuple[int, ...],
                   attrs: dict[str, Any], inserted: list[int]) -> Node | None:
    """Insert ``op(inputs; attrs)`` before ``anchor`` when its operands fit (recording its
    id in ``inserted``, so that a rewrite given up can :func:`prune` it), else None."""
    if try_infer(op, [graph.nodes[i] for i in inputs], attrs) is None:
        return None
    node = graph.insert_before(anchor, op, inputs, attrs)
    inserted.append(node.id)
    return node


def exclusive_prologue(graph: Graph, start: int, consumer: int,
                       users: dict[int, list[int]]) -> set[int]:
    """The elementwise work from ``start`` up that only ``consumer`` needs: the
    elementwise ancestors (``start`` included) whose operands have their shape or are
    0-d and whose every reader is among them or ``consumer``. A value read several times
    inside (``d = abs(p - t)`` in a Huber loss) is in; one also read elsewhere or returned
    is out (computed once, at its own shape). A rewrite of ``consumer`` may rebuild this
    work on transformed operands (:func:`rebuild_prologue`) with nothing computed twice."""
    inside: set[int] = set()
    stack = [start]
    while stack:
        nid = stack.pop()
        node = graph.nodes[nid]
        if nid in inside or node.op not in REGISTRY or kind_of(node.op) != "elementwise" \
                or not node.inputs or nid in graph.outputs \
                or any(tuple(graph.nodes[i].shape) not in (tuple(node.shape), ())
                       for i in node.inputs):
            continue
        inside.add(nid)
        stack.extend(node.inputs)
    changed = True
    while changed:  # keep only what nothing outside reads
        changed = False
        for nid in list(inside):
            if any(u not in inside and u != consumer for u in users.get(nid, ())):
                inside.discard(nid)
                changed = True
    return inside


class NotRebuilt(Exception):
    """A node rebuilt by :func:`rebuild_prologue` did not keep its dtype."""


def rebuild_prologue(graph: Graph, nid: int, leaf: Callable[[int], int | None],
                     anchor: int, inserted: list[int], prologue: set[int],
                     memo: dict[int, int]) -> int:
    """Node ``nid`` rebuilt before ``anchor`` on transformed operands: a member of
    ``prologue`` (:func:`exclusive_prologue`) is its elementwise op applied to its rebuilt
    operands (0-d ones as they are), anything else is ``leaf(nid)`` (the transform
    itself: a reshape, a slice...). ``memo`` keeps each node rebuilt once.

    Raises
    ------
    NotRebuilt
        When a rebuilt node's dtype differs from the original's or ``leaf`` gave None;
        the caller prunes ``inserted``.
    """
    if nid in memo:
        return memo[nid]
    node = graph.nodes[nid]
    if nid in prologue:
        args = tuple(i if graph.nodes[i].shape == () else
                     rebuild_prologue(graph, i, leaf, anchor, inserted, prologue, memo)
                     for i in node.inputs)
        new = insert_checked(graph, anchor, node.op, args, dict(node.attrs), inserted)
        new_id = None if new is None or new.dtype != node.dtype else new.id
    else:
        new_id = leaf(nid)
        if new_id is not None and graph.nodes[new_id].dtype != node.dtype:
            new_id = None
    if new_id is None:
        raise NotRebuilt
    memo[nid] = new_id
    return new_id


def may_raise(node: Node, graph: Graph) -> bool:
    """Whether a node can raise on the values of a call, so must run even when its
    result is unused: an integer ``power`` whose exponent may be negative (NumPy raises
    ``ValueError`` for a negative integer exponent; a constant exponent of no negative
    element, or an unsigned one, cannot), a maximum, minimum or arg-reduction without
    ``initial`` over an axis of no values (NumPy's "zero-size array to reduction
    operation" ``ValueError``; the shapes are static, so this is known), or a fused
    kernel whose body holds one."""
    if node.op in ("max", "min", "argmax", "argmin") and node.inputs \
            and node.attrs.get("initial") is None:
        x = graph.nodes.get(node.inputs[0])
        return x is not None and 0 in x.shape and any(
            x.shape[a] == 0 for a in normalize_axis(node.attrs.get("axis"), len(x.shape)))
    if node.op == "power":
        if node.dtype.kind not in "iu" or len(node.inputs) < 2:
            return False
        exp = graph.nodes.get(node.inputs[1])
        if exp is None or exp.dtype.kind in "ub":
            return False
        if exp.op == "constant":
            return bool(np.any(np.asarray(exp.attrs["value"]) < 0))
        return True
    body = node.attrs.get("body") if node.op in FUSED_OPS else None
    return isinstance(body, Graph) and any(may_raise(n, body) for n in body.nodes.values())


def prune(graph: Graph, candidates: Iterable[int]) -> list[int]:
    """Remove the candidates nobody reads (and, recursively, inputs that become unread).

    Graph inputs, graph outputs, graph breaks (see :mod:`.dce`) and nodes that may raise
    (:func:`may_raise`) are never removed. Returns the removed ids.
    """
    counts: dict[int, int] = {k: 0 for k in graph.nodes}
    for n in graph.nodes.values():
        for i in n.inputs:
            counts[i] += 1
    keep = set(graph.outputs)
    removed: list[int] = []
    work = list(candidates)
    while work:
        nid = work.pop()
        node = graph.nodes.get(nid)
        if node is None or node.op in ("input", "eager") or nid in keep \
                or counts.get(nid, 0) or may_raise(node, graph):
            continue
        graph.remove(nid)
        removed.append(nid)
        for i in node.inputs:
            counts[i] -= 1
            work.append(i)
    return removed


def restore_order(graph: Graph) -> None:
    """Reorder ``graph``'s nodes so that every node follows its inputs, keeping the
    present order wherever it already does (a rewrite that placed a node before some
    of its inputs, or after some of its readers, is put right)."""
    done: set[int] = set()
    order: dict[int, Node] = {}
    waiting: list[Node] = []
    for n in graph.nodes.values():
        waiting.append(n)
        progress = True
        while progress:
            progress = False
            still = []
            for w in waiting:
                if all(i in done for i in w.inputs):
                    order[w.id] = w
                    done.add(w.id)
                    progress = True
                else:
                    still.append(w)
            waiting = still
    if waiting:  # pragma: no cover - a cycle: the rewrite was wrong
        raise ValueError(f"graph {graph.name}: a cycle through %{waiting[0].id}")
    graph.nodes = order


def sole_user(graph: Graph, nid: int, users: dict[int, list[int]]) -> Node | None:
    """The one node reading ``nid`` (once), or None if there are more, none, or it is an
    output of the graph."""
    if nid in graph.outputs:
        return None
    readers = users.get(nid, [])
    if len(readers) != 1:
        return None
    return graph.nodes[readers[0]]


def is_float(node: Node) -> bool:
    """Whether the node's dtype is a floating-point type, bfloat16 included (ml_dtypes'
    bfloat16 has dtype kind ``V``, so ``kind == "f"`` alone leaves it out)."""
    return node.dtype.kind == "f" or node.dtype.name == "bfloat16"


def kind_of(op: str) -> str:
    """The registry kind of ``op`` (``elementwise``, ``reduction``...)."""
    return REGISTRY[op].kind


# -- records ------------------------------------------------------------------------------
