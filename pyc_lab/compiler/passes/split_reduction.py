"""Two-stage full reductions: a sum (maximum, minimum) over a whole large array becomes a
sum of row sums.

A reduction over every element leaves one output, so a row kernel (one block per row)
would give the whole array to one block of one SM; the row kernels refuse one row longer
than :data:`~..codegen.reduction.LONG_ROW`. ``sum(x)`` over ``n >=``
:data:`MIN_ELEMENTS` elements (just past that limit; from :data:`PLAIN_MIN_ELEMENTS`
when no elementwise prologue comes with it, unless CuPy would copy the array first, as
for a bfloat16 sum) becomes
``sum(sum(reshape(x, (R, C)), axis=1))`` with ``C`` a divisor of ``n`` near ``sqrt(n)``
(between :data:`MIN_COLUMNS` and :data:`MAX_COLUMNS`): ``R`` blocks reduce a row each,
then one block the ``R`` partial results — the two-stage tree of a full reduction (a
``keepdims`` result is reshaped back). ``max``, ``min`` and ``mean`` (the mean of equal
rows' means) split the same way.

Maxima and minima are exact in any order (a NaN anywhere is the answer either way), and
so are integer and boolean sums (two's-complement wrap-around is associative), so these
stay bit for bit NumPy's; float32 and float64 sums change order only, as every parallel
sum does (NumPy's own is pairwise), within the dtype's rounding; so do means. A float16
or bfloat16 sum or mean keeps float32 partial results (``astype(float32)`` joins the
first stage's prologue, the total is rounded once at the end), as one row kernel
accumulates such a reduction in float32 and rounds once: partial results rounded to 16
bits would lose what the accumulation keeps. bfloat16 maxima and minima split as they
are (exact). Sizes with no divisor in range (a prime ``n``, say) are left alone too.

The reshape moves above the elementwise prologue only the reduction reads (``sum(x *
x)`` becomes ``sum(sum(reshape(x) * reshape(x), axis=1))``, ``np.isnan(x).any()`` the
maximum of row maxima of ``isnan`` of the reshaped ``x``, a Huber loss's ``abs(p - t)``
read three times is reshaped once), so that row fusion puts the prologue into the first
stage's kernel instead of a pass of its own.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..codegen.reduction import LONG_ROW
from ..ir import Graph, Node
from .rewrite import NotRebuilt, exclusive_prologue, insert_checked, prune, rebuild_prologue

if TYPE_CHECKING:
    from .rewrite import PassContext

__all__ = ["MAX_COLUMNS", "MIN_COLUMNS", "MIN_ELEMENTS", "NAME", "PLAIN_MIN_ELEMENTS",
           "columns_for", "run"]

NAME = "split_reduction"

#: Full reductions of fewer elements stay one row (one block handles them well; the row
#: kernels take a single row up to this length).
MIN_ELEMENTS = LONG_ROW + 1
#: Below this many elements a full reduction of a plain array splits only when its
#: elementwise prologue joins the first stage: CuPy's own (CUB's) full sum of 135201
#: float32 values took 5.8 us against the two stages' 6.9 us on the H100, where
#: ``np.isnan(x).any()`` over the same array took 6.9 us against CuPy's 8.8 us
#: (``benchmarks/exp_library_twins.py``).
PLAIN_MIN_ELEMENTS = 1 << 18
#: The reductions split, and the dtypes each leaves alone.
_SPLIT = {"sum": ("complex64", "complex128"), "mean": ("complex64", "complex128"),
          "max": ("complex64", "complex128"), "min": ("complex64", "complex128")}
#: Sums and means of these dtypes keep float32 partial results (see the module's note).
_WIDENED = frozenset({"float16", "bfloat16"})
#: The row length of the first stage lies in this range (a row per block, vectorised).
MIN_COLUMNS, MAX_COLUMNS = 1024, 1 << 16


def columns_for(n: int) -> int | None:
    """The divisor of ``n`` in ``[MIN_COLUMNS, MAX_COLUMNS]`` nearest ``sqrt(n)`` (at
    least two rows), or ``None``."""
    target = max(MIN_COLUMNS, min(MAX_COLUMNS, math.isqrt(n)))
    for step in range(MAX_COLUMNS):
        for c in (target - step, target + step):
            if MIN_COLUMNS <= c <= MAX_COLUMNS and n % c == 0 and n // c >= 2:
                return c
        if target - step < MIN_COLUMNS and target + step > MAX_COLUMNS:
            return None
    return None


def _library_copies(n: Node, x: Node) -> bool:
    """Whether the library path of full reduction ``n`` of ``x`` copies ``x`` first: a
    bfloat16 sum or mean runs through CuPy on a float32 copy (see the ops' reference),
    so CuPy's full reduction is no faster below :data:`PLAIN_MIN_ELEMENTS` there."""
    return n.op in ("sum", "mean") and x.dtype.name == "bfloat16"


def _split(graph: Graph, n: Node) -> tuple[int, int] | None:
    """The two-stage form of full reduction ``n``, inserted before it: its id and the
    first stage's row length."""
    x = graph.nodes[n.inputs[0]]
    size = math.prod(x.shape)
    cols = columns_for(size)
    if cols is None:
        return None
    inserted: list[int] = []
    shape = (size // cols, cols)

    def reshaped(nid: int) -> int | None:
        new = insert_checked(graph, n.id, "reshape", (nid,), {"shape": shape}, inserted)
        return None if new is None else new.id

    try:
        first = rebuild_prologue(graph, x.id, reshaped, n.id, inserted,
                                 exclusive_prologue(graph, x.id, n.id, graph.users()), {})
    except NotRebuilt:
        prune(graph, inserted)
        return None
    steps = [(n.op, {"axis": (1,), "keepdims": False}),
             (n.op, {"axis": None, "keepdims": False})]
    if n.op in ("sum", "mean") and x.dtype.name in _WIDENED and n.dtype == x.dtype:
        steps = [("astype", {"dtype": np.dtype(np.float32)}), *steps,
                 ("astype", {"dtype": n.dtype})]
    if n.attrs.get("keepdims"):
        steps.append(("reshape", {"shape": tuple(n.shape)}))
    last: Node | None = graph.nodes[first]
    for op, attrs in steps:
        last = insert_checked(graph, n.id, op, (last.id,), attrs, inserted)
        if last is None:
            break
    if last is None or tuple(last.shape) != tuple(n.shape) or last.dtype != n.dtype:
        prune(graph, inserted)
        return None
    return last.id, cols


def run(graph: Graph, ctx: PassContext) -> bool:
    """Split large full sums, maxima and minima into two stages, in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per split.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    for n in list(graph):
        if n.id not in graph.nodes or n.op not in _SPLIT or len(n.inputs) != 1:
            continue
        if n.attrs.get("axis") is not None or set(n.attrs) - {"axis", "keepdims"}:
            continue
        x = graph.nodes[n.inputs[0]]
        if (n.dtype.kind not in "fiub" and n.dtype.name != "bfloat16") \
                or n.dtype.name in _SPLIT[n.op] \
                or x.dtype.name in _SPLIT[n.op] or math.prod(x.shape) < MIN_ELEMENTS:
            continue
        if math.prod(x.shape) < PLAIN_MIN_ELEMENTS and not _library_copies(n, x) \
                and x.id not in exclusive_prologue(graph, x.id, n.id, graph.users()):
            continue
        split = _split(graph, n)
        if split is None:
            continue
        total, cols = split
        graph.replace_uses(n.id, total)
        prune(graph, [n.id])
        size = math.prod(x.shape)
        ctx.note(f"{NAME}: {n.op} over {size} elements in two stages ({size // cols} rows "
                 f"of {cols}, then their partial results): {n.op} %{n.id} -> %{total}")
        changed = True
    return changed
