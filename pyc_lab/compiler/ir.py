"""The IR: typed nodes in a graph, a deterministic text form, a fingerprint and verify().

A :class:`Graph` holds :class:`Node` objects in topological order (a node's inputs are
always earlier nodes). Every node has an op name from the registry
(:mod:`pyc_lab.compiler.ops`), input node ids, attributes, a shape and a dtype. Inputs
are nodes of op ``input``; constants are nodes of op ``constant`` whose value is an
``numpy.ndarray`` attribute.

Text form (``graph.text()``), one line per node, ids renumbered in order::

    graph f(%0: f32[4,8] x, %1: f32[8,16] w) {
      %2 = matmul(%0, %1) : f32[4,16]
      %3 = tanh(%2) : f32[4,16]
      return %3
    }
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PycLabError

__all__ = ["Graph", "IRError", "Node", "dtype_short", "format_attr"]


class IRError(PycLabError):
    """The IR is malformed: a pass or a hand-built graph broke an invariant."""


_SHORT = {
    "float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8", "bool": "bool",
}


def dtype_short(dtype: Any) -> str:
    """``float32`` -> ``f32`` (the text form's spelling)."""
    name = np.dtype(dtype).name
    return _SHORT.get(name, name)


def format_attr(value: Any) -> str:
    """Deterministic text for an attribute value (arrays by shape, dtype and content hash)."""
    if isinstance(value, np.ndarray):
        if value.size == 1 and value.ndim == 0:
            return repr(value.item())
        digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()[:8]
        return f"array<{dtype_short(value.dtype)}{list(value.shape)} #{digest}>"
    if isinstance(value, Graph):
        return f"<body {value.fingerprint()[:8]}>"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(format_attr(v) for v in value) + ("," if len(value) == 1 else "") \
            + ")"
    if isinstance(value, np.dtype):
        return value.name
    if callable(value):
        return getattr(value, "__qualname__", getattr(value, "__name__", type(value).__name__))
    return repr(value)


@dataclass(eq=False)
class Node:
    """One operation: ``op(inputs; attrs) -> shape, dtype``."""

    id: int
    op: str
    inputs: tuple[int, ...]
    attrs: dict[str, Any]
    shape: tuple[int, ...]
    dtype: np.dtype
    name: str | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of this node's result."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def type_text(self) -> str:
        """``f32[4,16]``."""
        return f"{dtype_short(self.dtype)}[{','.join(str(d) for d in self.shape)}]"


@dataclass(eq=False)
class Graph:
    """A function as a DAG of nodes in topological order.

    ``outputs`` lists the node ids returned; ``output_tree`` records how they are packed
    (an output position, or a nested tuple of them). ``writeback`` lists
    ``(input position, output position)`` pairs: outputs that are not returned but
    copied into the caller's input array after each call (the function wrote into
    that argument, as NumPy code may). ``scalar_outputs`` lists the output positions
    NumPy returns as scalars (``np.float64``) rather than 0-d arrays.
    """

    name: str = "f"
    nodes: dict[int, Node] = field(default_factory=dict)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    output_tree: Any = None
    _next: int = 0
    writeback: list[tuple[int, int]] = field(default_factory=list)
    scalar_outputs: tuple[int, ...] = ()

    # -- building -----------------------------------------------------------------------
    def add(self, op: str, inputs: Iterable[int] = (), attrs: dict[str, Any] | None = None,
            *, name: str | None = None, shape: tuple[int, ...] | None = None,
            dtype: Any = None) -> Node:
        """Append a node; shape and dtype are inferred by the op registry unless given."""
        from .ops import infer

        inputs = tuple(int(i) for i in inputs)
        for i in inputs:
            if i not in self.nodes:
                raise IRError(f"{op}: input %{i} is not in the graph")
        attrs = dict(attrs or {})
        if shape is None or dtype is None:
            shape, dtype = infer(op, [self.nodes[i] for i in inputs], attrs)
        node = Node(self._next, op, inputs, attrs, tuple(int(d) for d in shape),
                    np.dtype(dtype), name)
        self.nodes[node.id] = node
        self._next += 1
        if op == "input":
            self.inputs.append(node.id)
        return node

    def insert_before(self, anchor: int, op: str, inputs: Iterable[int],
                      attrs: dict[str, Any] | None = None) -> Node:
        """Add a node and move it just before node ``anchor`` in the order."""
        node = self.add(op, inputs, attrs)
        order = [k for k in self.nodes if k != node.id]
        pos = order.index(anchor)
        order.insert(pos, node.id)
        self.nodes = {k: self.nodes[k] for k in order}
        return node

    # -- queries ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Node]:
        return iter(list(self.nodes.values()))

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, nid: int) -> Node:
        """The node with id ``nid``."""
        try:
            return self.nodes[nid]
        except KeyError:
            raise IRError(f"no node %{nid} in graph {self.name}") from None

    def users(self) -> dict[int, list[int]]:
        """For every node id, the ids of the nodes that read it (in order)."""
        out: dict[int, list[int]] = {k: [] for k in self.nodes}
        for n in self.nodes.values():
            for i in n.inputs:
                out[i].append(n.id)
        return out

    def ops(self) -> list[str]:
        """The op of every node, in order (inputs included)."""
        return [n.op for n in self.nodes.values()]

    # -- rewriting ----------------------------------------------------------------------
    def replace_uses(self, old: int, new: int) -> None:
        """Make every reader of ``old`` (and the outputs) read ``new`` instead."""
        for n in self.nodes.values():
            if old in n.inputs:
                n.inputs = tuple(new if i == old else i for i in n.inputs)
        self.outputs = [new if o == old else o for o in self.outputs]

    def remove(self, nid: int) -> None:
        """Remove a node nobody reads."""
        self.nodes.pop(nid)
        if nid in self.inputs:
            self.inputs.remove(nid)

    def copy(self) -> Graph:
        """A deep-enough copy: new Node objects, shared attribute values."""
        g = Graph(self.name, {}, list(self.inputs), list(self.outputs), self.output_tree,
                  self._next, list(self.writeback), self.scalar_outputs)
        for n in self.nodes.values():
            g.nodes[n.id] = Node(n.id, n.op, n.inputs, dict(n.attrs), n.shape, n.dtype, n.name)
        return g

    # -- text, fingerprint, verify --------------------------------------------------------
    def text(self) -> str:
        """The deterministic text form (ids renumbered in order)."""
        num = {nid: k for k, nid in enumerate(self.nodes)}
        args = ", ".join(
            f"%{num[i]}: {self.nodes[i].type_text}"
            + (f" {self.nodes[i].name}" if self.nodes[i].name else "")
            for i in self.inputs
        )
        lines = [f"graph {self.name}({args}) {{"]
        for n in self.nodes.values():
            if n.op == "input":
                continue
            ins = ", ".join(f"%{num[i]}" for i in n.inputs)
            attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in sorted(n.attrs.items())
                              if not k.startswith("_"))
            sep = "; " if ins and attrs else ""
            lines.append(f"  %{num[n.id]} = {n.op}({ins}{sep}{attrs}) : {n.type_text}")
            body = n.attrs.get("body")
            if isinstance(body, Graph) and n.op != "fused_extra":  # (its fused node's body)
                lines.extend("    | " + line for line in body.text().splitlines())
        written = {pos for _, pos in self.writeback}
        outs = ", ".join(f"%{num[o]}" for k, o in enumerate(self.outputs) if k not in written)
        lines.append(f"  return {outs}")
        for inp, pos in self.writeback:
            lines.append(f"  write %{num[self.outputs[pos]]} into %{num[self.inputs[inp]]}")
        lines.append("}")
        return "\n".join(lines)

    def fingerprint(self) -> str:
        """SHA-256 of the text form: equal graphs, equal fingerprints."""
        return hashlib.sha256(self.text().encode()).hexdigest()

    def verify(self) -> None:
        """Check every invariant; raise :class:`IRError` naming the node and the problem."""
        from .ops import REGISTRY, infer

        seen: set[int] = set()
        for n in self.nodes.values():
            where = f"node %{n.id} ({n.op})"
            if n.op not in REGISTRY:
                raise IRError(f"{where}: unknown op {n.op!r}")
            for i in n.inputs:
                if i not in self.nodes:
                    raise IRError(f"{where}: reads %{i}, which is not in the graph")
                if i not in seen:
                    raise IRError(f"{where}: reads %{i} before it is defined (order broken)")
            opdef = REGISTRY[n.op]
            if opdef.arity is not None and len(n.inputs) != opdef.arity:
                raise IRError(f"{where}: takes {opdef.arity} input(s), has {len(n.inputs)}")
            if n.op not in ("input", "eager"):
                shape, dtype = infer(n.op, [self.nodes[i] for i in n.inputs], n.attrs)
                if tuple(shape) != n.shape or np.dtype(dtype) != n.dtype:
                    raise IRError(
                        f"{where}: recorded type {n.type_text} but its inputs give "
                        f"{dtype_short(dtype)}[{','.join(map(str, shape))}]"
                    )
            seen.add(n.id)
        for o in self.outputs:
            if o not in self.nodes:
                raise IRError(f"output %{o} is not in the graph")
        for i in self.inputs:
            if self.nodes.get(i) is None or self.nodes[i].op != "input":
                raise IRError(f"graph input %{i} is not an input node")
