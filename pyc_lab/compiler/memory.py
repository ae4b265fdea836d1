"""Static memory planning: which buffer every node writes, and how much memory that takes.

The plan follows the graph's node order. A value is live from the node that writes it
to its last reader; when it dies its buffer goes back to a free pool, and a later node
takes the *best fit* from the pool (the smallest free buffer at least as large as it
needs, never growing one) or else a new buffer.

- Inputs and constants get no buffer (they live outside the plan), and neither does a
  shape op (a transpose, slice, broadcast or concatenation) of nothing but them: the GPU
  backend runs it through CuPy, a view of them (or a fresh array), and never copies it
  into a buffer — e.g. a filter held transposed and read through a view.
- ``reshape``, ``expand_dims`` and ``squeeze`` are views: they share their input's
  buffer (``aliases``) and keep it alive as long as they are read. Other shape ops
  (``transpose``, ``slice``, ``broadcast_to``, ``concatenate``) of a planned value, and
  ``eager`` nodes, write their own buffer.
- Graph outputs (and whatever an output is a view of) get their own new buffers, never
  reused by anything else.
- In ``memory_first`` mode an elementwise or fused node may also write *in place* into
  the buffer of an input of the same shape and element size that dies at that node.

``naive_bytes`` is what one buffer per node would take; ``peak_bytes`` the most bytes of
buffers holding live values at one time under the plan; ``sum(buffer_bytes)`` the total
the plan allocates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import PycLabError
from .ir import Graph
from .ops import REGISTRY
from .views import same_position_inputs

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["VIEW_OPS", "MemoryPlan", "plan_memory"]

logger = logging.getLogger(__name__)

#: Shape ops whose result shares its input's buffer.
VIEW_OPS = frozenset({"reshape", "expand_dims", "squeeze"})

_MODES = ("balanced", "memory_first", "utilization_first")


@dataclass
class MemoryPlan:
    """A buffer assignment for every node of a graph.

    Attributes
    ----------
    buffer_of : dict[int, int]
        Node id -> buffer index (views map to their source's buffer; inputs, constants
        and views of them are absent).
    buffer_bytes : list[int]
        Size of every buffer, in bytes.
    peak_bytes : int
        Most bytes of buffers holding live values at one time.
    naive_bytes : int
        Bytes with one buffer per node that needs one (no reuse, no in-place).
    aliases : dict[int, int]
        View node -> the node whose storage it shares.
    inplace : list of (int, int)
        ``(node, input)`` pairs where the node writes over its input's buffer.
    rows : list of dict
        One record per node (node, op, bytes, buffer, reuse), for :meth:`to_frame`.
    """

    buffer_of: dict[int, int]
    buffer_bytes: list[int]
    peak_bytes: int
    naive_bytes: int
    aliases: dict[int, int]
    inplace: list[tuple[int, int]]
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def planned_bytes(self) -> int:
        """Total bytes the plan allocates (``sum(buffer_bytes)``)."""
        return int(sum(self.buffer_bytes))

    def to_frame(self) -> pd.DataFrame:
        """One row per node: node, op, bytes, buffer, reuse.

        ``reuse`` is ``"new"``, ``"reuse"``, ``"in-place"``, ``"view"`` or ``"output"``
        (``"input"``/``"constant"`` for nodes outside the plan, ``"unplanned"`` for a
        shape op of nothing but them); ``buffer`` is missing (``<NA>``) where there is
        none.

        Returns
        -------
        pandas.DataFrame
        """
        import pandas as pd

        frame = pd.DataFrame(self.rows, columns=["node", "op", "bytes", "buffer", "reuse"])
        frame["buffer"] = frame["buffer"].astype("Int64")
        return frame


def plan_memory(graph: Graph, mode: str = "balanced") -> MemoryPlan:
    """Assign buffers to the nodes of ``graph`` with liveness-based reuse.

    Parameters
    ----------
    graph : Graph
        The graph, in execution order.
    mode : str
        ``"balanced"`` or ``"utilization_first"`` (reuse only) or ``"memory_first"``
        (reuse and in-place writes).

    Returns
    -------
    MemoryPlan

    Raises
    ------
    PycLabError
        An unknown mode.
    """
    if mode not in _MODES:
        raise PycLabError(f"unknown memory planning mode {mode!r}; known: {', '.join(_MODES)}")
    order = list(graph.nodes.values())
    pos = {n.id: k for k, n in enumerate(order)}

    # storage owner of every value (views resolve to the node whose buffer they read)
    owner: dict[int, int] = {}
    for n in order:
        owner[n.id] = owner[n.inputs[0]] if n.op in VIEW_OPS else n.id
    # the step after which an owner's storage is no longer needed
    end: dict[int, int] = {}
    for n in order:
        o = owner[n.id]
        end[o] = max(end.get(o, pos[n.id]), pos[n.id])
        for i in n.inputs:
            oi = owner[i]
            end[oi] = max(end.get(oi, pos[n.id]), pos[n.id])
    pinned = {owner[o] for o in graph.outputs}
    dying: dict[int, list[int]] = {}
    for o, step in end.items():
        dying.setdefault(step, []).append(o)

    buffer_of: dict[int, int] = {}
    buffer_bytes: list[int] = []
    holder: dict[int, int] = {}  # buffer -> owner node whose value it holds now
    free: list[int] = []
    aliases: dict[int, int] = {}
    inplace: list[tuple[int, int]] = []
    rows: list[dict[str, Any]] = []
    live = peak = naive = 0

    def row(n: Any, buf: int | None, kind: str) -> None:
        rows.append({"node": n.id, "op": n.op, "bytes": n.nbytes, "buffer": buf,
                     "reuse": kind})

    for n in order:
        step = pos[n.id]
        if n.op in ("input", "constant"):
            row(n, None, n.op)
            continue
        if n.op in VIEW_OPS:
            aliases[n.id] = owner[n.id]
            buf = buffer_of.get(owner[n.id])
            if buf is not None:
                buffer_of[n.id] = buf
            row(n, buf, "view")
            continue
        if REGISTRY[n.op].kind == "shape" and n.id not in pinned and \
                all(buffer_of.get(owner[i]) is None for i in n.inputs):
            row(n, None, "unplanned")  # of inputs and constants: see the docstring
            continue
        need = n.nbytes
        naive += need
        if n.id in pinned:
            buf, kind = len(buffer_bytes), "output"
            buffer_bytes.append(need)
            live += need
        else:
            buf = _inplace_source(graph, n, owner, end, pinned, buffer_of, step) \
                if mode == "memory_first" else None
            if buf is not None:
                kind = "in-place"
                inplace.append((n.id, buf[1]))
                buf = buf[0]
            else:
                fits = [b for b in free if buffer_bytes[b] >= need]
                if fits:
                    buf = min(fits, key=lambda b: (buffer_bytes[b], b))
                    free.remove(buf)
                    kind = "reuse"
                else:
                    buf = len(buffer_bytes)
                    buffer_bytes.append(need)
                    kind = "new"
                live += buffer_bytes[buf]
        buffer_of[n.id] = buf
        holder[buf] = n.id
        row(n, buf, kind)
        peak = max(peak, live)
        for o in dying.get(step, ()):
            b = buffer_of.get(o)
            if b is None or o in pinned or holder.get(b) != o:
                continue
            del holder[b]
            free.append(b)
            live -= buffer_bytes[b]
    plan = MemoryPlan(buffer_of, buffer_bytes, peak, naive, aliases, inplace, rows)
    logger.debug("memory plan for %s (%s): %d buffers, %d planned bytes, peak %d, naive %d",
                 graph.name, mode, len(buffer_bytes), plan.planned_bytes, peak, naive)
    return plan


def _inplace_source(graph: Graph, n: Any, owner: dict[int, int], end: dict[int, int],
                    pinned: set[int], buffer_of: dict[int, int], step: int) \
        -> tuple[int, int] | None:
    """(buffer, input) that ``n`` may overwrite, or None."""
    if REGISTRY[n.op].kind not in ("elementwise", "fused"):
        return None
    # a fused body reading an input through a view (or writing a concatenation) reads
    # elements at other positions than the one it writes: never over that input
    same = same_position_inputs(n.attrs["body"]) if n.op == "fused" else None
    for pos, i in enumerate(n.inputs):
        if same is not None and pos not in same:
            continue
        if i in n.inputs[:pos]:
            continue
        src = graph.nodes[i]
        o = owner[i]
        if o in pinned or o not in buffer_of or end.get(o) != step:
            continue
        if src.shape != n.shape or src.dtype.itemsize != n.dtype.itemsize:
            continue
        return buffer_of[o], i
    return None
