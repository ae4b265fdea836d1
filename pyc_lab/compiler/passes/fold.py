"""Constant folding: a node whose inputs are all constants becomes a constant.

The value is computed with the op's NumPy reference and cast to the node's dtype, so the
folded graph computes exactly what the original did. Results of more than ``2**20``
elements are left alone (a constant that size costs more than it saves); inputs, eager
nodes (graph breaks, possibly impure) and constants themselves are never folded.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph
from ..ops import evaluate
from .rewrite import const_value, kind_of, prune

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "constant_folding"

#: Largest folded result, in elements.
MAX_ELEMENTS = 2**20

logger = logging.getLogger(__name__)


def run(graph: Graph, ctx: PassContext) -> bool:
    """Fold constant sub-expressions of ``graph`` in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per folded node.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    for n in graph:
        if n.id not in graph.nodes or not n.inputs:
            continue
        if kind_of(n.op) in ("source", "eager"):
            continue
        values = [const_value(graph, i) for i in n.inputs]
        if any(v is None for v in values):
            continue
        size = int(np.prod(n.shape, dtype=np.int64))
        if size > MAX_ELEMENTS:
            ctx.note(f"{NAME}: kept {n.op} %{n.id}: its result has {size} elements "
                     f"(> {MAX_ELEMENTS})")
            continue
        try:
            with np.errstate(all="ignore"):
                value = np.asarray(evaluate(n.op, np, values, n.attrs)).astype(n.dtype)
        except Exception as exc:  # the op refuses these values: keep it, it fails at run
            logger.debug("constant folding of %s %%%d failed: %s", n.op, n.id, exc)
            ctx.note(f"{NAME}: kept {n.op} %{n.id}: evaluating it failed ({exc})")
            continue
        value = np.array(value, order="C")  # own, C-ordered; keeps 0-d (not ascontiguous)
        if tuple(value.shape) != tuple(n.shape):
            continue
        const = graph.insert_before(n.id, "constant", (), {"value": value})
        graph.replace_uses(n.id, const.id)
        prune(graph, [n.id])
        ctx.note(f"{NAME}: folded {n.op} %{n.id} into constant %{const.id}")
        changed = True
    return changed
