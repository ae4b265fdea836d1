"""The pass manager: runs optimisation passes in order, verifies the IR after each, logs.

Every pass is a module with ``NAME`` and ``run(graph, ctx) -> bool``; it rewrites the
graph in place (keeping topological order) and says whether it changed anything. The
manager works on a copy of the caller's graph, times each pass, calls
:meth:`~pyc_lab.compiler.ir.Graph.verify` after it and records a :class:`PassRecord`
(node counts, the pass's decision notes and the IR text afterwards). After the last
pass it restores NumPy's output aliasing (:mod:`.aliasing`): whatever the pipeline, a
result never shares memory with an argument, a constant or another result unless the
traced function's did.

This module also holds the :class:`PassContext` and the few rewrite helpers the passes
share (constant look-ups, checked node insertion, pruning of nodes a rewrite left dead).
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import PycLabError
from ..ir import Graph, IRError, Node
from ..ops import REGISTRY, infer

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DEFAULT_PIPELINE",
    "MODES",
    "PASSES",
    "PassContext",
    "PassManager",
    "PassRecord",
    "PassResult",
]

logger = logging.getLogger(__name__)

#: The passes :class:`PassManager` runs when given no list.
DEFAULT_PIPELINE = ["canonicalize", "constant_folding", "simplify", "cse", "dce",
                    "transpose_folding", "epilogue_fusion", "reduction_fusion",
                    "elementwise_fusion", "dce"]

#: The optimisation modes a pass may look at.
MODES = ("balanced", "memory_first", "utilization_first")


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


# -- helpers shared by the passes ---------------------------------------------------------
def is_const(graph: Graph, nid: int) -> bool:
    """Whether node ``nid`` is a ``constant``."""
    return graph.nodes[nid].op == "constant"


def const_value(graph: Graph, nid: int) -> np.ndarray | None:
    """The value of constant node ``nid`` as an array, or None if it is not a constant."""
    node = graph.nodes[nid]
    if node.op != "constant":
        return None
    return np.asarray(node.attrs["value"])


def const_is(graph: Graph, nid: int, value: float, *, scalar_only: bool = False) -> bool:
    """Whether ``nid`` is a constant whose every element equals ``value``.

    A zero ``value`` matches only +0 (a float ``-0.0`` constant does not), so rewrites
    keyed on zero keep the sign of zero. ``scalar_only`` demands a 0-d constant.
    """
    arr = const_value(graph, nid)
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


def broadcasts_to(shape: Iterable[int], target: Iterable[int]) -> bool:
    """Whether an array of ``shape`` broadcasts to exactly ``target``."""
    target = tuple(target)
    try:
        return tuple(np.broadcast_shapes(tuple(shape), target)) == target
    except ValueError:
        return False


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


def prune(graph: Graph, candidates: Iterable[int]) -> list[int]:
    """Remove the candidates nobody reads (and, recursively, inputs that become unread).

    Graph inputs, graph outputs and graph breaks (see :mod:`.dce`) are never removed.
    Returns the removed ids.
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
        if node is None or node.op in ("input", "eager") or nid in keep or counts.get(nid, 0):
            continue
        graph.remove(nid)
        removed.append(nid)
        for i in node.inputs:
            counts[i] -= 1
            work.append(i)
    return removed


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
    """Whether the node's dtype is a floating-point type."""
    return node.dtype.kind == "f"


def kind_of(op: str) -> str:
    """The registry kind of ``op`` (``elementwise``, ``reduction``...)."""
    return REGISTRY[op].kind


# -- records ------------------------------------------------------------------------------
@dataclass
class PassRecord:
    """What one pass did: timing, node counts, decisions and the IR afterwards."""

    name: str
    ms: float
    nodes_before: int
    nodes_after: int
    changed: bool
    notes: list[str]
    ir_after: str


@dataclass
class PassResult:
    """The optimised graph and the log of every pass run on it."""

    graph: Graph
    log: list[PassRecord]

    def to_frame(self) -> pd.DataFrame:
        """One row per pass: name, ms, nodes_before, nodes_after, changed, notes.

        Returns
        -------
        pandas.DataFrame
            ``notes`` joined by ``"; "``.
        """
        import pandas as pd

        rows = [{"name": r.name, "ms": r.ms, "nodes_before": r.nodes_before,
                 "nodes_after": r.nodes_after, "changed": r.changed,
                 "notes": "; ".join(r.notes)} for r in self.log]
        return pd.DataFrame(rows, columns=["name", "ms", "nodes_before", "nodes_after",
                                           "changed", "notes"])


class PassManager:
    """Run a list of passes over a copy of a graph, verifying the IR after each.

    Parameters
    ----------
    passes : list of str, optional
        Pass names from :data:`PASSES`, in order; default :data:`DEFAULT_PIPELINE`.
    mode : str
        ``"balanced"`` (default), ``"memory_first"`` or ``"utilization_first"``.

    Raises
    ------
    PycLabError
        An unknown pass name or mode (the message lists the known ones).
    """

    def __init__(self, passes: list[str] | None = None, mode: str = "balanced") -> None:
        names = list(DEFAULT_PIPELINE if passes is None else passes)
        unknown = [p for p in names if p not in PASSES]
        if unknown:
            raise PycLabError(f"unknown pass(es) {', '.join(map(repr, unknown))}; known "
                              f"passes: {', '.join(sorted(PASSES))}")
        if mode not in MODES:
            raise PycLabError(f"unknown mode {mode!r}; known modes: {', '.join(MODES)}")
        self.passes = names
        self.mode = mode

    def run(self, graph: Graph) -> PassResult:
        """Optimise a copy of ``graph`` (the caller's graph is never changed).

        Parameters
        ----------
        graph : Graph
            The graph to optimise.

        Returns
        -------
        PassResult
            The optimised graph and one :class:`PassRecord` per pass.

        Raises
        ------
        IRError
            A pass left a graph that fails ``verify()``; the message names the pass.
        """
        g = graph.copy()
        log: list[PassRecord] = []
        for name in self.passes:
            module = PASSES[name]
            ctx = PassContext(mode=self.mode)
            before = len(g)
            t0 = time.perf_counter()
            changed = bool(module.run(g, ctx))
            ms = (time.perf_counter() - t0) * 1e3
            try:
                g.verify()
            except PycLabError as exc:
                raise IRError(f"pass {name!r} left an invalid graph: {exc}") from exc
            log.append(PassRecord(name, ms, before, len(g), changed, list(ctx.notes),
                                  g.text()))
            logger.debug("pass %s: %.3f ms, %d -> %d nodes, changed=%s", name, ms, before,
                         len(g), changed)
        self._keep_aliasing(graph, g, log)
        return PassResult(g, log)

    @staticmethod
    def _keep_aliasing(traced: Graph, g: Graph, log: list[PassRecord]) -> None:
        """Results share memory with arguments, constants and each other only where the
        traced graph's (NumPy's) do: see :mod:`.aliasing`. Logged only when it copies."""
        from . import aliasing

        ctx = PassContext()
        before = len(g)
        t0 = time.perf_counter()
        if aliasing.preserve(traced, g, ctx):
            g.verify()
            log.append(PassRecord(aliasing.NAME, (time.perf_counter() - t0) * 1e3, before,
                                  len(g), True, list(ctx.notes), g.text()))


_MODULES = ("canonicalize", "fold", "simplify", "cse", "dce", "transpose_fold", "epilogue",
            "reduction_fusion", "elementwise_fusion")

#: Every pass by name (``module.NAME`` -> module). Imported last: the pass modules use the
#: helpers above.
PASSES: dict[str, Any] = {
    mod.NAME: mod
    for mod in (importlib.import_module(f"{__package__}.{m}") for m in _MODULES)
}
