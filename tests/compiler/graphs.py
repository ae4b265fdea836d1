"""Graph builders shared by the compiler tests (one node over typed inputs)."""

from __future__ import annotations

import numpy as np

from pyc_lab.compiler import Graph
from pyc_lab.compiler.tracer import trace


def fused_graph(fn, specs, name="fused_0"):
    """A graph: inputs of ``specs`` [(shape, dtype)], one fused node (body traced from
    ``fn``), returning it."""
    arrays = [np.zeros(s, d) for s, d in specs]
    body, breaks = trace(fn, arrays)
    assert not breaks
    g = Graph(name="g")
    ins = [g.add("input", (), {"index": k}, shape=tuple(s), dtype=d).id
           for k, (s, d) in enumerate(specs)]
    ops = tuple(n.op for n in body if n.op not in ("input", "constant"))
    node = g.add("fused", ins, {"body": body, "ops": ops, "name": name})
    g.outputs = [node.id]
    g.verify()
    return g, node


def op_graph(op, specs, attrs=None):
    """A graph with one ``op`` node over inputs ``specs`` [(shape, dtype)]."""
    g = Graph(name="g")
    ins = [g.add("input", (), {"index": k}, shape=tuple(s), dtype=d).id
           for k, (s, d) in enumerate(specs)]
    node = g.add(op, ins, attrs or {})
    g.outputs = [node.id]
    g.verify()
    return g, node
