"""The pass manager: runs optimisation passes in order, verifies the IR after each, logs.

Every pass is a module with ``NAME`` and ``run(graph, ctx) -> bool``; it rewrites the
graph in place (keeping topological order) and says whether it changed anything. The
manager works on a copy of the caller's graph, times each pass, calls
:meth:`~pyc_lab.compiler.ir.Graph.verify` after it and records a :class:`PassRecord`
(node counts, the pass's decision notes and the IR text afterwards). After the last
pass it restores NumPy's output aliasing (:mod:`.aliasing`): whatever the pipeline, a
result never shares memory with an argument, a constant or another result unless the
traced function's did.

The passes' context and shared rewrite helpers are :mod:`.rewrite`.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import PycLabError
from ..ir import Graph, IRError
from .rewrite import PassContext

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
DEFAULT_PIPELINE = ["canonicalize", "constant_folding", "simplify", "cheap_math",
                    "gather_sinking", "reshape_sinking", "cse", "dce", "transpose_folding",
                    "epilogue_fusion", "reduction_fusion", "find_attention", "split_reduction",
                    "small_reduction", "arg_reductions", "row_fusion", "elementwise_fusion",
                    "output_fusion", "sibling_fusion", "dce"]

#: The optimisation modes a pass may look at.
MODES = ("balanced", "memory_first", "utilization_first")


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


_MODULES = ("canonicalize", "fold", "simplify", "cheap_math", "gather_sinking", "reshape_sinking",
            "cse", "dce",
            "transpose_fold", "epilogue", "reduction_fusion", "attention_find", "split_reduction",
            "small_reduction", "arg_reductions", "row_fusion", "elementwise_fusion",
            "output_fusion", "sibling_fusion")

#: Every pass by name (``module.NAME`` -> module). Imported last: the pass modules use the
#: helpers above.
PASSES: dict[str, Any] = {
    mod.NAME: mod
    for mod in (importlib.import_module(f"{__package__}.{m}") for m in _MODULES)
}
