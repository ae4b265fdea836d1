"""Loads and pieces of a fused elementwise body: what each kernel element reads and writes.

A ``fused`` node's body is elementwise work over inputs, and may also hold

- **views of its inputs** — basic slices (``x[..., :64]``, ``x[::2]``, ``x[:, 3]``) and
  transposes, alone or chained: a kernel reads such a view straight from the input's
  memory at static strides and an offset, so the view is never copied; and
- **a concatenation as its output** (``np.concatenate([a * c - b * s, b * c + a * s],
  -1)``): each operand is a *piece* computed over its own shape and written straight
  into its region of the output, so no piece is materialised and copied again; and
- **gathers of its inputs** (``w[tokens]``, ``np.take_along_axis(x, idx, 1)``): a
  ``gather`` node whose source and indices are inputs (or views of them) is a load of
  its own, reading its index first and its source at the position that index names
  (:class:`Gather`).

:func:`analyse` turns a body into :class:`Piece` s, each with the :class:`Load` s it reads;
the code generator emits one loop per piece. A body with several outputs (one shape)
has one piece per output, written to its own array in the same loop.
:func:`same_position_inputs` says which inputs every output element reads only at its
own position (the only ones a kernel may overwrite in place). Nothing here needs a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Graph, Node
from .ops import REGISTRY, basic_index

__all__ = ["VIEW_OPS", "Gather", "Load", "Piece", "analyse", "broadcasts_to",
           "contiguous_strides", "same_position_inputs", "view_geometry"]

#: Shape ops a fused body may apply to its inputs (read in place, never copied).
VIEW_OPS = ("slice", "transpose")


@dataclass(frozen=True)
class Gather:
    """The index read of a gathering :class:`Load`.

    Element ``i`` of the load (over the load's shape) reads its index at
    ``offset + strides . coords(i)`` of body input ``param``, wraps it into
    ``[0, length)`` (negative indices count from the end; out-of-range ones wrap, as
    CuPy's take does) and reads the source at the load's own offset plus
    ``index * stride``.

    Attributes
    ----------
    node
        The body node the indices are (an input, or a view of one).
    param
        The body input (kernel pointer) holding the indices.
    strides, offset
        Element strides over the load's shape (0 along dims the index does not vary
        with) and element offset, in the indices' memory.
    stride
        The source's element stride along the gathered axis.
    length
        The source's extent along it.
    """

    node: int
    param: int
    strides: tuple[int, ...]
    offset: int
    stride: int
    length: int


@dataclass(frozen=True)
class Load:
    """One array an element of a piece reads: a body input, or a view of one.

    Attributes
    ----------
    node
        The body node whose value this is (an ``input`` or the last view of a chain).
    param
        The body input (kernel pointer) it reads.
    shape
        Its shape.
    strides
        Element strides of ``shape`` over the input's C-contiguous memory.
    offset
        Element offset of its first element in that memory.
    gather
        For a gather: where its index is read (the gathered axis then adds
        ``index * gather.stride`` to ``offset + strides . coords``); ``None`` otherwise.
    """

    node: int
    param: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    gather: Gather | None = None

    @property
    def direct(self) -> bool:
        """Whether this is the input itself (C-contiguous, no offset, no gather)."""
        return self.gather is None and self.offset == 0 \
            and self.strides == tuple(contiguous_strides(self.shape))


@dataclass(frozen=True)
class Piece:
    """A region of the output computed by one expression.

    Attributes
    ----------
    root
        The body node computing it.
    shape
        Its shape (the output's, or one operand's of the output concatenation).
    out_strides, out_offset
        Where it lies in the output's C-contiguous memory (element strides, offset).
    loads
        What it reads, in the order of its device function's parameters.
    out_param
        The output it is written to: 0, or ``k`` for output ``k`` of a body with
        several outputs (a fused node and its ``fused_extra`` nodes).
    """

    root: int
    shape: tuple[int, ...]
    out_strides: tuple[int, ...]
    out_offset: int
    loads: tuple[Load, ...]
    out_param: int = 0


def broadcasts_to(shape: tuple[int, ...] | list[int], target: tuple[int, ...] | list[int]) \
        -> bool:
    """Whether an array of ``shape`` broadcasts to exactly ``target``."""
    target = tuple(target)
    try:
        return tuple(np.broadcast_shapes(tuple(shape), target)) == target
    except ValueError:
        return False


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> list[int]:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, acc = [], 1
    for d in reversed(tuple(shape)):
        strides.append(acc)
        acc *= int(d)
    return list(reversed(strides))


def view_geometry(base_shape: tuple[int, ...], chain: list[Node]) \
        -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Shape, element strides and element offset of ``chain`` (view nodes, first applied
    first) over a C-contiguous array of ``base_shape``: NumPy computes them on a probe
    array of one-byte elements whose memory is never touched."""
    strides = tuple(contiguous_strides(base_shape))
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), tuple(base_shape), strides)
    start = probe.__array_interface__["data"][0]
    view = probe
    for n in chain:
        if n.op == "slice":
            view = view[basic_index(n.attrs)]
        elif n.op == "transpose":
            view = view.transpose(tuple(n.attrs["axes"]))
        else:
            raise ValueError(f"{n.op} is not a view op")
    offset = view.__array_interface__["data"][0] - start
    return tuple(view.shape), tuple(int(s) for s in view.strides), int(offset)


def _load(body: Graph, nid: int, positions: dict[int, int]) -> Load | str:
    """The load giving body node ``nid`` (an input or a view), or why there is none."""
    chain: list[Node] = []
    cur = body.node(nid)
    while cur.op in VIEW_OPS:
        chain.append(cur)
        cur = body.node(cur.inputs[0])
    if cur.op != "input":
        return (f"a {chain[-1].op} of a computed value ({cur.op}) inside a fused body is "
                "not generated")
    chain.reverse()
    shape, strides, offset = view_geometry(tuple(cur.shape), chain) if chain else (
        tuple(cur.shape), tuple(contiguous_strides(cur.shape)), 0)
    return Load(nid, positions[cur.id], shape, strides, offset)


def _gather_load(body: Graph, n: Node, positions: dict[int, int]) -> Load | str:
    """The load of gather node ``n``: its source read over ``n``'s shape with the
    gathered axis given by the index (see :class:`Gather`), or why there is none."""
    src = _load(body, n.inputs[0], positions)
    idx = _load(body, n.inputs[1], positions)
    if isinstance(src, str) or isinstance(idx, str):
        return "a gather of a computed value inside a fused body is not generated"
    axis, out = int(n.attrs["axis"]), tuple(n.shape)
    rank = len(src.shape)
    if n.attrs.get("along"):
        # over the output: the source at its own coordinates (broadcast where its extent
        # is 1), the index likewise; the axis comes from the index (and is no dim of the
        # output when there is one index per row)
        picked = len(idx.shape) == rank - 1
        full = (*out[:axis], 1, *out[axis:]) if picked else out
        ishape = (*idx.shape[:axis], 1, *idx.shape[axis:]) if picked else idx.shape
        istrides = (*idx.strides[:axis], 0, *idx.strides[axis:]) if picked else idx.strides
        src_str = [0 if d == axis or (src.shape[d] == 1 and full[d] != 1) else src.strides[d]
                   for d in range(rank)]
        idx_str = [0 if ishape[d] == 1 and full[d] != 1 else istrides[d]
                   for d in range(rank)]
        if picked:
            del src_str[axis], idx_str[axis]
    else:
        # the index's dims replace the axis: src[:axis] + idx + src[axis + 1:]
        k = len(idx.shape)
        src_str = [*src.strides[:axis], *([0] * k), *src.strides[axis + 1:]]
        idx_str = [*([0] * axis), *idx.strides, *([0] * (rank - axis - 1))]
    gather = Gather(idx.node, idx.param, tuple(idx_str), idx.offset, src.strides[axis],
                    src.shape[axis])
    return Load(n.id, src.param, out, tuple(src_str), src.offset, gather)


def analyse(body: Graph) -> list[Piece] | str:
    """The pieces of ``body``'s output with their loads, or why it cannot be generated.

    Without a concatenation there is one piece: the whole output. Each piece is
    evaluated at its own coordinates, so a computed node several pieces read is
    computed in each of them (its value at a piece's coordinates is the same whichever
    piece reads it: it broadcasts to every piece's shape); loads may be shared.
    """
    positions = {bid: k for k, bid in enumerate(body.inputs)}
    out = body.node(body.outputs[0])
    if len(body.outputs) > 1:
        shapes = {tuple(body.node(o).shape) for o in body.outputs}
        if len(shapes) != 1 or any(body.node(o).op == "concatenate" for o in body.outputs):
            return ("a fused body's outputs must share one shape and none may be a "
                    "concatenation")
        strides = tuple(contiguous_strides(out.shape))
        roots = [(o, tuple(out.shape), strides, 0) for o in body.outputs]
    elif out.op == "concatenate":
        (axis,) = np.atleast_1d(out.attrs["axis"]) % len(out.shape)
        out_strides = contiguous_strides(out.shape)
        roots, start = [], 0
        for i in out.inputs:
            shape = tuple(body.node(i).shape)
            roots.append((i, shape, tuple(out_strides), start * out_strides[int(axis)]))
            start += shape[int(axis)]
    else:
        roots = [(out.id, tuple(out.shape), tuple(contiguous_strides(out.shape)), 0)]
    order = {nid: k for k, nid in enumerate(body.nodes)}
    pieces = []
    for p, (root, shape, strides, offset) in enumerate(roots):
        loads: dict[int, Load] = {}
        stack = [root]
        seen: set[int] = set()
        while stack:
            nid = stack.pop()
            if nid in seen:
                continue
            seen.add(nid)
            n = body.node(nid)
            if n.op == "input" or n.op in VIEW_OPS or n.op == "gather":
                load = _gather_load(body, n, positions) if n.op == "gather" \
                    else _load(body, nid, positions)
                if isinstance(load, str):
                    return load
                loads[nid] = load
                continue
            if n.op == "concatenate":
                return "a concatenation inside a fused body (not as its output) is not generated"
            if n.op != "constant" and REGISTRY[n.op].kind != "elementwise":
                return f"op {n.op!r} inside a fused body is not generated"
            stack.extend(n.inputs)
        ordered = tuple(sorted(loads.values(), key=lambda ld: order[ld.node]))
        pieces.append(Piece(root, shape, strides, offset, ordered,
                            p if len(body.outputs) > 1 else 0))
    return pieces


def same_position_inputs(body: Graph) -> set[int]:
    """Positions of the body inputs that every output element reads only at its own
    position: read directly (no view, no gather) and the output is not a
    concatenation."""
    out = body.node(body.outputs[0])
    if out.op == "concatenate":
        return set()
    viewed = {i for n in body if n.op in VIEW_OPS or n.op == "gather" for i in n.inputs}
    return {k for k, bid in enumerate(body.inputs) if bid not in viewed}
