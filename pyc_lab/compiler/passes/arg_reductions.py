"""argmax/argmin over one axis of a float array as reductions row fusion takes.

``x.argmax(axis)`` is the first index along ``axis`` where ``x`` equals its maximum —
or, where the maximum is NaN (NumPy's ``max`` propagates NaN and its ``argmax`` points
at the first NaN), the first NaN. So it is

    min(where(isnan(x) | (x == max(x, axis, keepdims=True)), i, inf), axis)

with ``i`` the index along the axis as float32 (exact below 2**24), cast to int64
(``argmin``: the same with ``min`` for ``max``). Ties keep the first index, ``-0.0`` and
``0.0`` compare equal as in NumPy, and where no NaN is present ``isnan`` selects
nothing (the maximum is NaN exactly when one is). Written so, it is a maximum and a
minimum over the same rows, which row fusion makes one kernel reading each row once,
with its prologue (``argmax(x / T)``) and what reads the index (an accuracy's ``== y``)
fused into it; left as it is, argmax runs through CuPy as a kernel of its own.

Rewritten only where row fusion takes the row space (:func:`.row_fusion.usable_space`:
enough rows for the GPU), for float16, float32 and float64 inputs and one reduced axis
(``axis=None`` of a 1-D array included), rows shorter than 2**24.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph, Node
from ..ops import normalize_axis
from .row_fusion import usable_space

if TYPE_CHECKING:
    from .rewrite import PassContext

__all__ = ["MAX_INDEX", "NAME", "run"]

NAME = "arg_reductions"

#: Rows up to this long are rewritten: float32 holds every index below it exactly.
MAX_INDEX = 1 << 24

_FLOATS = ("float16", "float32", "float64")


def _axis(node: Node, x: Node) -> int | None:
    """The one axis ``node`` reduces, or None."""
    axis = node.attrs.get("axis")
    if axis is None:
        return 0 if len(x.shape) == 1 else None
    axes = normalize_axis(axis, len(x.shape))
    return axes[0] if len(axes) == 1 else None


def _rewrite(graph: Graph, node: Node, axis: int) -> int:
    """Insert the max-and-min form of ``node`` before it; the id of its result."""
    x = graph.nodes[node.inputs[0]]
    ndim, cols = len(x.shape), x.shape[axis]
    first = "max" if node.op == "argmax" else "min"
    index = np.arange(cols, dtype=np.float32).reshape((cols,) + (1,) * (ndim - 1 - axis))

    def add(op: str, inputs: tuple[int, ...], attrs: dict | None = None) -> int:
        return graph.insert_before(node.id, op, inputs, attrs or {}).id

    extreme = add(first, (x.id,), {"axis": (axis,), "keepdims": True})
    hit = add("logical_or", (add("isnan", (x.id,)), add("equal", (x.id, extreme))))
    at = add("where", (hit, add("constant", (), {"value": index}),
                       add("constant", (), {"value": np.float32(np.inf)})))
    first_at = add("min", (at,), {"axis": (axis,), "keepdims": bool(node.attrs.get("keepdims"))})
    return add("astype", (first_at,), {"dtype": node.dtype})


def run(graph: Graph, ctx: PassContext) -> bool:
    """Rewrite argmax/argmin of floats over one axis as a max and a min, in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per rewrite.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    for n in list(graph):
        if n.op not in ("argmax", "argmin") or len(n.inputs) != 1:
            continue
        x = graph.nodes[n.inputs[0]]
        axis = _axis(n, x)
        if x.dtype.name not in _FLOATS or axis is None or n.attrs.get("out") is not None:
            continue
        cols = x.shape[axis]
        if not 2 <= cols < MAX_INDEX or usable_space((tuple(x.shape), (axis,))):
            continue
        result = _rewrite(graph, n, axis)
        node = graph.nodes[result]
        if node.shape != n.shape or node.dtype != n.dtype:  # pragma: no cover - by design
            raise AssertionError(f"{n.op} %{n.id}: the rewrite changed its type")
        graph.replace_uses(n.id, result)
        graph.remove(n.id)
        extreme = "max" if n.op == "argmax" else "min"
        ctx.note(f"{NAME}: {n.op} %{n.id} over axis {axis} as a {extreme} and a min of "
                 "indices (one row program with what reads it)")
        changed = True
    return changed
