"""Concrete values of traced nodes while tracing, for graph breaks.

A graph break (a NumPy function pyc_lab has no op for) must be called once while
tracing to learn its result's shape and dtype. It is called on the *real* values of its
arguments — computed from the function's actual inputs by the ops' references — not on
stand-ins: stand-in zeros would make ``np.linalg.inv`` fail ("singular matrix") and
would give data-dependent results (``np.unique``) the wrong shape.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .ir import Graph
from .ops import evaluate

__all__ = ["Probe"]


class Probe:
    """Values of a graph's nodes on the inputs of one call, computed on demand.

    Parameters
    ----------
    graph
        The graph being traced (nodes are added while the probe lives).
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.values: dict[int, Any] = {}
        #: CuPy once a node's value is a CuPy array: the call runs on the GPU, so a
        #: value made of constants alone (``np.zeros_like(x)``'s fill) is computed there
        #: too, as the compiled function computes it, and a graph break gets the arrays
        #: it will get when it runs
        self._device: Any = None

    def set(self, node_id: int, value: Any) -> None:
        """Record the value of a node (an input, or a graph break just called)."""
        self.values[node_id] = value
        if self._device is None and type(value).__module__.startswith("cupy"):
            import cupy

            self._device = cupy

    def value(self, node_id: int) -> Any:
        """The value of ``node_id``, evaluating whatever it depends on first."""
        if node_id in self.values:
            return self.values[node_id]
        needed: set[int] = set()
        stack = [node_id]
        while stack:
            nid = stack.pop()
            if nid in needed or nid in self.values:
                continue
            needed.add(nid)
            stack.extend(self.graph.nodes[nid].inputs)
        for nid in sorted(needed):  # node ids grow in topological order while tracing
            node = self.graph.nodes[nid]
            args = [self.values[i] for i in node.inputs]
            xp = _module(args)
            if xp is np and self._device is not None:
                xp = self._device
                args = [xp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = xp.asarray(evaluate(node.op, xp, args, node.attrs))
            if out.dtype != node.dtype:
                out = out.astype(node.dtype)
            self.values[nid] = out
        return self.values[node_id]


def _module(args: list[Any]) -> Any:
    for a in args:
        if type(a).__module__.startswith("cupy"):
            import cupy

            return cupy
    return np
