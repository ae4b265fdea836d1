"""Reductions of a few values per result as elementwise work: 2x2 max pooling written
with a reshape, ``x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))``, becomes the
maximum of the four strided views ``x6[:, :, :, i, :, j]``; the length of 3-D vectors,
``np.sqrt((d * d).sum(-1))``, the sum of the squares of ``d[:, 0]``, ``d[:, 1]`` and
``d[:, 2]``.

The row kernels reduce the last axes, a warp per row; the column kernels a block of
consecutive axes before the last. A reduction over axes apart (``(3, 5)`` above, ``(1,
3)`` of a 4-D array) has no kernel of its own and ran through CuPy, in a pass of its
own; a row of a few values leaves most of its warp idle (the lengths of 2^24 3-D
vectors took 1.65 ms as a row kernel, 0.42 ms through CuPy and 0.093 ms unrolled, on
the H100: ``benchmarks/exp_library_twins.py``). When each result reduces at most
:data:`MAX_VALUES` values over such axes, the reduction is unrolled: one strided view
per position of the reduced axes (in C order; with ``keepdims`` a view keeps the axis,
``x[:, 1:2]``), combined by the reduction's elementwise twin (``maximum``, ``minimum``,
``add``, ``multiply``; a mean divides the sum by the count). Elementwise fusion then
makes it one kernel whose threads each compute one result from its few values, reading
every view in place, and the elementwise work before the reduction that only it reads
(a ReLU before the pooling) is rebuilt on the views (:func:`~.rewrite.rebuild_prologue`),
so it joins that kernel instead of writing the full array first; each element of it is
still computed once. A reduction in a chain of them — its result broadcast back
against larger values (``x - x.mean(axis=(0, 2), keepdims=True)``), or its operand made
from another reduction's result — is left to row fusion, which makes the chain one
program reading the rows once.

Arithmetic is NumPy's: maxima and minima are exact and propagate NaN; a sum, product
or mean accumulates in the result's dtype (an integer sum in int64, an integer mean in
float64), float16 and bfloat16 ones in float32 with one rounding at the end, as a row
kernel accumulates them (NumPy rounds a float16 sum over axes apart to float16 after
each addition, so the result here is the closer one). A float sum or mean over the
last axes adds in the order of NumPy's pairwise summation of a contiguous row (so its
answer is NumPy's bit for bit, float16 included); over axes apart in C order of the
reduced positions, the order NumPy adds a strided row in.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..codegen.column_reduction import own_kernel_takes
from ..codegen.row_space import trailing
from ..ir import Graph, Node
from ..ops import REDUCTIONS, REGISTRY, is_plain_reduction, normalize_axis
from .rewrite import (
    NotRebuilt,
    exclusive_prologue,
    insert_checked,
    is_float,
    kind_of,
    prune,
    rebuild_prologue,
)

if TYPE_CHECKING:
    from .rewrite import PassContext

__all__ = ["MAX_VALUES", "NAME", "run"]

NAME = "small_reduction"

#: Results of at most this many values each are unrolled (a 4x4 pooling window).
MAX_VALUES = 16

#: A reduction and the elementwise op that combines two of its values.
_COMBINE = {"sum": "add", "mean": "add", "prod": "multiply", "max": "maximum",
            "min": "minimum"}
#: Ops that make row values of their own (reduction fusion's and row fusion's nodes).
_ROW_VALUES = ("softmax", "layer_norm", "fused_rows", "attention")
#: Accumulations of these dtypes run in float32 and round once.
_WIDENED = frozenset({"float16", "bfloat16"})


def _broadcast_back(graph: Graph, n: Node, users: dict[int, list[int]]) -> bool:
    """Whether the result of ``n`` is broadcast against larger values (``x -
    x.mean(axis=(0, 2), keepdims=True)``, after work of its own size such as ``x / (s +
    1)``): row fusion makes that one program with the reduction, reading ``x`` once,
    which an unrolled reduction would undo."""
    size = math.prod(n.shape)
    stack, seen = list(users.get(n.id, ())), set()
    while stack:
        u = graph.nodes[stack.pop()]
        if u.id in seen:
            continue
        seen.add(u.id)
        if math.prod(u.shape) > size:
            return True
        if math.prod(u.shape) == size:
            stack.extend(users.get(u.id, ()))
    return False


def _after_reduction(graph: Graph, n: Node) -> bool:
    """Whether the operand of ``n`` is computed from another reduction's result (through
    elementwise and shape ops): a chain of reductions is a row program's, reading its
    rows once, which unrolling one link would split."""
    stack, seen = [n.inputs[0]], set()
    while stack:
        node = graph.nodes[stack.pop()]
        if node.id in seen:
            continue
        seen.add(node.id)
        if node.op in REDUCTIONS or node.op in _ROW_VALUES:
            return True
        if node.op in REGISTRY and kind_of(node.op) in ("elementwise", "shape"):
            stack.extend(node.inputs)
    return False


def _candidate(graph: Graph, n: Node,
               users: dict[int, list[int]]) -> tuple[int, ...] | None:
    """The reduced axes of ``n`` when it is a reduction this pass unrolls, else None:
    a plain one of at most :data:`MAX_VALUES` values a result, over the last axes (a
    warp per row) or over axes no kernel takes, not part of a chain of reductions (its
    result not broadcast back, its operand not made from another reduction's)."""
    if n.op not in _COMBINE or not is_plain_reduction(n) or set(n.attrs) - {"axis",
                                                                             "keepdims"}:
        return None
    x = graph.nodes[n.inputs[0]]
    if n.attrs.get("axis") is None or len(x.shape) < 2 or 0 in x.shape:
        return None
    if not (x.dtype.kind in "iuf" or is_float(x)) or not (n.dtype.kind in "iuf"
                                                           or is_float(n)):
        return None
    axes = normalize_axis(n.attrs["axis"], len(x.shape))
    values = math.prod(x.shape[a] for a in axes)
    shape = tuple(x.shape)
    if not axes or not 2 <= values <= MAX_VALUES \
            or (own_kernel_takes(shape, axes) and not trailing(shape, axes)) \
            or _broadcast_back(graph, n, users) or _after_reduction(graph, n):
        return None
    return axes


def _numpy_pairwise(terms: list[int], add: Callable[[int, int], int],
                    zero: Callable[[], int]) -> int:
    """The sum of ``terms`` in the order NumPy's pairwise summation adds a contiguous row
    of a few values: from zero one after another below 8 values; else eight running sums
    (value ``j`` into sum ``j % 8``), combined as ``((s0 + s1) + (s2 + s3)) + ((s4 + s5)
    + (s6 + s7))``, then the values past the last multiple of 8 one by one. The same
    additions in the same order give NumPy's float sum bit for bit."""
    if len(terms) < 8:
        total = zero()
        for term in terms:
            total = add(total, term)
        return total
    sums = list(terms[:8])
    whole = len(terms) - len(terms) % 8
    for i in range(8, whole):
        sums[i % 8] = add(sums[i % 8], terms[i])
    total = add(add(add(sums[0], sums[1]), add(sums[2], sums[3])),
                add(add(sums[4], sums[5]), add(sums[6], sums[7])))
    for term in terms[whole:]:
        total = add(total, term)
    return total


def _accumulator(n: Node, x: Node) -> np.dtype:
    """The dtype the values are combined in."""
    if n.op in ("max", "min"):
        return x.dtype
    if x.dtype.name in _WIDENED or n.dtype.name in _WIDENED:
        return np.dtype(np.float32)
    return n.dtype


def _unroll(graph: Graph, n: Node, axes: tuple[int, ...]) -> int | None:
    """The unrolled form of reduction ``n``, inserted before it: its id, or None (with
    nothing left inserted) when a step does not keep its type."""
    x = graph.nodes[n.inputs[0]]
    users = graph.users()
    base, reshape_to = x, None
    if x.op == "reshape" and x.id not in graph.outputs and users.get(x.id) == [n.id]:
        base, reshape_to = graph.nodes[x.inputs[0]], tuple(x.shape)
    prologue = exclusive_prologue(graph, base.id, x.id if reshape_to else n.id, users)
    acc = _accumulator(n, x)
    inserted: list[int] = []
    reshaped = {base.id: x.id} if reshape_to is not None else {}

    def add(op: str, inputs: tuple[int, ...], attrs: dict) -> int:
        new = insert_checked(graph, n.id, op, inputs, attrs, inserted)
        if new is None:
            raise NotRebuilt
        return new.id

    try:
        terms = []
        for pos in itertools.product(*(range(x.shape[a]) for a in axes)):
            at = dict(zip(axes, pos, strict=True))
            keep = bool(n.attrs.get("keepdims"))
            index = tuple(("s", None, None, None) if j not in at
                          else ("s", at[j], at[j] + 1, None) if keep else ("i", at[j])
                          for j in range(len(x.shape)))

            def view(nid: int, index: tuple = index) -> int:
                if reshape_to is not None:
                    if nid not in reshaped:
                        reshaped[nid] = add("reshape", (nid,), {"shape": reshape_to})
                    nid = reshaped[nid]
                return add("slice", (nid,), {"index": index})

            term = rebuild_prologue(graph, base.id, view, n.id, inserted, prologue, {})
            if graph.nodes[term].dtype != acc:
                term = add("astype", (term,), {"dtype": acc})
            terms.append(term)
        combine = _COMBINE[n.op]
        if n.op in ("sum", "mean") and np.dtype(acc).kind == "f" \
                and trailing(tuple(x.shape), axes):
            total = _numpy_pairwise(terms, lambda a, b: add("add", (a, b), {}),
                                    lambda: add("constant", (), {
                                        "value": np.asarray(0, dtype=acc)}))
        else:
            total = terms[0]
            for term in terms[1:]:
                total = add(combine, (total, term), {})
        if n.op == "mean":
            count = add("constant", (), {"value": np.asarray(len(terms), dtype=acc)})
            total = add("divide", (total, count), {})
        if graph.nodes[total].dtype != n.dtype:
            total = add("astype", (total, ), {"dtype": n.dtype})
    except NotRebuilt:
        prune(graph, inserted)
        return None
    last = graph.nodes[total]
    if tuple(last.shape) != tuple(n.shape) or last.dtype != n.dtype:
        prune(graph, inserted)
        return None
    return total


def run(graph: Graph, ctx: PassContext) -> bool:
    """Unroll small reductions over axes no reduction kernel covers, in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per unrolled reduction.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    for n in list(graph):
        if n.id not in graph.nodes or n.op not in _COMBINE:
            continue
        axes = _candidate(graph, n, graph.users())
        if axes is None:
            continue
        total = _unroll(graph, n, axes)
        if total is None:
            continue
        x = graph.nodes[n.inputs[0]]
        graph.replace_uses(n.id, total)
        prune(graph, [n.id])
        ctx.note(f"{NAME}: {n.op} %{n.id} over axes {axes} of {tuple(x.shape)} "
                 f"({math.prod(x.shape[a] for a in axes)} values per result) unrolled "
                 f"into elementwise work on strided views -> %{total}")
        changed = True
    return changed
