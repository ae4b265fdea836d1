"""Canonical forms, so that later passes (CSE, pattern matchers) see one spelling.

- a constant on the left of a commutative op moves to the right
  (``add(c, x) -> add(x, c)``; also multiply, maximum, minimum, equal, not_equal);
- reduction attributes: ``axis`` a sorted tuple of non-negative axes, or None when
  every axis is reduced; ``keepdims`` a bool;
- a ``sum``/``prod``/``mean`` with ``dtype=``: dropped where it is the dtype the
  reduction would use anyway; into another dtype whose arrays reduce in that dtype, the
  operand is cast first (``x.sum(dtype=d)`` is ``x.astype(d).sum()`` in NumPy, and that
  form has generated kernels: ``np.einsum("ij,ij->i", a, b)`` sums with ``dtype=``). A
  float16 mean keeps ``dtype=float16``: without it NumPy accumulates in float32;
- shape ops that do nothing (identity transpose, reshape/broadcast_to to the same shape,
  squeeze of no axis) are bypassed: their readers read the input (a returned
  ``broadcast_to`` stays: NumPy's result is a read-only view).

Note that NumPy's ``maximum``/``minimum`` return the second operand when both compare
equal, so swapping their operands may change the *sign* of a zero result (``-0.0`` vs
``0.0``); the values still compare equal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph
from ..ops import normalize_axis
from .rewrite import is_const, kind_of, prune

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "canonicalize"

#: Binary ops whose operands may be swapped.
# maximum/minimum are left out on purpose: NumPy returns the second operand when the two
# compare equal, so swapping them could turn maximum(0.0, -0.0) into -0.0 (sign of zero).
COMMUTATIVE = frozenset({"add", "multiply", "equal", "not_equal"})


def _is_noop_shape(graph: Graph, nid: int) -> bool:
    n = graph.nodes[nid]
    if n.op not in ("transpose", "reshape", "broadcast_to", "squeeze") or len(n.inputs) != 1:
        return False
    src = graph.nodes[n.inputs[0]]
    if src.shape != n.shape or src.dtype != n.dtype:
        return False
    if n.op == "broadcast_to" and nid in graph.outputs:
        return False
    if n.op == "transpose":
        return tuple(int(a) for a in n.attrs["axes"]) == tuple(range(len(n.shape)))
    return True


def _default_dtype(op: str, dtype: np.dtype) -> np.dtype | None:
    """The dtype NumPy's ``op`` reduction gives an array of ``dtype`` without ``dtype=``."""
    try:
        return np.dtype(getattr(np, op)(np.ones(1, dtype)).dtype)
    except TypeError:
        return None


def _reduction_dtype(graph: Graph, nid: int, ctx: PassContext) -> bool:
    """Drop or move a reduction's ``dtype=`` (see the module docstring)."""
    n = graph.nodes[nid]
    want = n.attrs.get("dtype")
    if n.op not in ("sum", "prod", "mean") or want is None or len(n.inputs) != 1 \
            or n.attrs.get("initial") is not None:
        return False
    want = np.dtype(want)
    x = graph.nodes[n.inputs[0]]
    if want.kind not in "iuf" or x.dtype.kind not in "biuf":
        return False
    if _default_dtype(n.op, x.dtype) == want and not (n.op == "mean" and x.dtype == np.float16):
        # (a float16 mean accumulates in float32 unless dtype= says float16)
        n.attrs = {k: v for k, v in n.attrs.items() if k != "dtype"}
        ctx.note(f"{NAME}: dropped {n.op} %{nid}'s dtype={want.name} (its own anyway)")
        return True
    if _default_dtype(n.op, want) == want and not (n.op == "mean" and want == np.float16):
        cast = graph.insert_before(nid, "astype", (x.id,), {"dtype": want})
        n.inputs = (cast.id,)
        n.attrs = {k: v for k, v in n.attrs.items() if k != "dtype"}
        ctx.note(f"{NAME}: {n.op} %{nid} with dtype={want.name} reads %{x.id} cast first")
        return True
    return False


def run(graph: Graph, ctx: PassContext) -> bool:
    """Rewrite ``graph`` into canonical form in place.

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
    for n in graph:
        if n.id not in graph.nodes:
            continue
        if n.op in COMMUTATIVE and len(n.inputs) == 2:
            a, b = n.inputs
            if is_const(graph, a) and not is_const(graph, b):
                n.inputs = (b, a)
                ctx.note(f"{NAME}: moved constant %{a} to the right of {n.op} %{n.id}")
                changed = True
        elif kind_of(n.op) == "reduction":
            changed |= _reduction_dtype(graph, n.id, ctx)
            ndim = len(graph.nodes[n.inputs[0]].shape)
            axes = normalize_axis(n.attrs.get("axis"), ndim)
            axis = None if len(axes) == ndim else axes
            keep = bool(n.attrs.get("keepdims", False))
            old_axis = n.attrs.get("axis")
            same_axis = (old_axis is None and axis is None) or (
                old_axis is not None and axis is not None and isinstance(old_axis, tuple)
                and old_axis == axis)
            if not same_axis or n.attrs.get("keepdims") is not keep:
                n.attrs = {**n.attrs, "axis": axis, "keepdims": keep}
                ctx.note(f"{NAME}: normalised {n.op} %{n.id} to axis={axis}, "
                         f"keepdims={keep}")
                changed = True
        elif _is_noop_shape(graph, n.id):
            src = n.inputs[0]
            graph.replace_uses(n.id, src)
            prune(graph, [n.id])
            ctx.note(f"{NAME}: removed no-op {n.op} %{n.id} (reads %{src} directly)")
            changed = True
    return changed
