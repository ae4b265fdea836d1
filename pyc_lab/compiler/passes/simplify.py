"""Algebraic simplification that never changes a result, NaN and Inf included.

Rewrites (``c`` a constant; each only when the new node has exactly the old node's shape
and dtype, so a constant that broadcasts or promotes blocks it):

- ``x * 1``, ``x / 1``, ``x ** 1`` -> ``x``;
- ``x - 0`` -> ``x`` (+0 only: ``-0.0 - (-0.0)`` is ``+0.0``); ``x + (-0.0)`` -> ``x`` for
  floats, bfloat16 included; ``x + 0`` -> ``x`` only for integer and bool ``x``
  (``-0.0 + 0.0`` is ``+0.0``);
- ``x ** 2`` -> ``x * x``; ``x ** 0.5`` -> ``sqrt(x)`` for floats (0-d exponents only:
  that is where NumPy's ``power`` is exactly ``x * x`` / ``sqrt``, -0.0 and -inf included);
- ``-(-x)`` -> ``x``; ``astype(x, x.dtype)`` -> ``x``;
- ``transpose(transpose(x))`` -> one transpose (or ``x`` when the composition is the
  identity); ``reshape(reshape(x))`` -> one reshape (or ``x``);
- ``1 / sqrt(x)`` -> ``rsqrt(x)``;
- ``std(x)`` -> ``sqrt(var(x))`` with the same axis, ddof and keepdims (how NumPy
  computes it, so bit for bit; the variance has a generated row kernel);
- ``any(x)`` / ``all(x)`` -> ``max`` / ``min`` of ``x`` as booleans (NaN counts as
  true, as NumPy counts it), where every reduced axis has values (the empty reductions
  differ) and no ``where=`` is given: the maximum and minimum have generated kernels;
- a maximum or minimum of booleans (so ``any``/``all`` too) over axes that have values
  -> the float32 maximum/minimum of the booleans as 0 and 1, then ``!= 0``: exact, and
  it joins a row program beside the float work on the same rows (``np.isnan(x).any(-1)``
  with ``x``'s statistics);
- a count — ``sum`` of a boolean array, or of booleans cast to an integer, and ``mean``
  of a boolean array — over at most :data:`EXACT_COUNT` values per result -> the
  ``float32`` sum of the booleans, cast to the count's dtype (a mean's count to
  ``float64``, then divided by the number of values, as NumPy divides): every partial
  sum is an integer below ``2**24``, which ``float32`` holds exactly, so the result is
  NumPy's bit for bit. A float sum joins row programs (``(x > t).sum(-1)`` reads ``x``
  and writes counts in one kernel; a masked mean's count joins its masked sum); an
  integer sum would keep a kernel of its own;
- a masked float reduction — ``sum``/``mean``/``max``/``min`` with ``where=m`` — as the
  reduction of ``np.where(m, x, fill)``: a sum fills with 0 (NumPy's sum starts from
  +0.0 too), a mean divides that sum by the count of ``m`` in float64 and rounds to the
  input's type as NumPy's ``true_divide(..., out=, casting="unsafe")`` does (float16 sums
  in float32 first), a maximum or minimum fills with its ``initial`` and takes it once
  more, first, so that a row entirely selected still meets it; without ``where=``, a
  maximum or minimum with ``initial`` over axes that have values is
  ``maximum(initial, max(x))``. Plain reductions have generated kernels and join row
  programs (a masked softmax's ``np.max(s, where=mask, initial=-np.inf)``); reductions
  with ``where=``/``initial=`` run through CuPy;
- a bfloat16 reduction no generated kernel takes as written — ``std``, ``argmax``,
  ``argmin``, and ``sum``/``mean``/``max``/``min`` with ``where=``/``initial=`` — as the
  same reduction of the input cast to float32 (cast back for a float result), which the
  rewrites above and the arg-reduction pass then take: the reference of an accumulating
  bfloat16 reduction computes in float32 and rounds once, so this is it bit for bit, and
  a maximum, minimum or index is exact in either type (NaN first, as NumPy's).

Never ``x * 0 -> 0``, ``x - x -> 0`` or ``x / x -> 1``: they are wrong for NaN and Inf.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ir import Graph, Node
from ..ops import normalize_axis
from .rewrite import as_float, const_is, insert_like, is_const, is_float, prune, same_type

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "simplify"

_MAX_SWEEPS = 8

#: bfloat16 reductions always computed on a float32 copy (no generated kernel takes them).
_VIA_FLOAT32 = ("std", "argmax", "argmin")
#: bfloat16 reductions generated as they are, computed on a float32 copy only with
#: ``where=`` or ``initial=``.
_PLAIN_IN_BF16 = ("sum", "mean", "max", "min")

#: The most values a count may add up as float32 (every integer up to 2**24 is exact).
EXACT_COUNT = 1 << 24


def _counted(graph: Graph, n: Node) -> int | None:
    """The boolean array ``n`` counts (a sum of booleans, or of booleans cast to an
    integer, or a mean of booleans, with no ``where=`` or ``initial=``, no ``dtype=``
    but an integer one of a sum, and at most :data:`EXACT_COUNT` values per result),
    or None."""
    if n.op not in ("sum", "mean") or len(n.inputs) != 1 or any(
            n.attrs.get(k) is not None for k in ("where", "initial")):
        return None
    dtype = n.attrs.get("dtype")
    if dtype is not None and (n.op != "sum" or np.dtype(dtype).kind not in "iu"):
        return None  # an integer dtype= only sets the count's type (n.dtype)
    x = graph.nodes[n.inputs[0]]
    if n.op == "sum" and x.op == "astype" and x.dtype.kind in "iu" \
            and graph.nodes[x.inputs[0]].dtype.kind == "b":
        x = graph.nodes[x.inputs[0]]
    if x.dtype.kind != "b" or (n.dtype.kind not in "iu" if n.op == "sum"
                               else n.dtype != np.float64):
        return None
    axes = normalize_axis(n.attrs.get("axis"), len(x.shape)) if x.shape else ()
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    return x.id if 0 < count <= EXACT_COUNT else None


def _in_float32(graph: Graph, n: Node) -> Node | None:
    """A bfloat16 ``std``/``argmax``/``argmin``, or ``sum``/``mean``/``max``/``min`` with
    ``where=``/``initial=``, as the same reduction of its input cast to float32 (and its
    result cast back to bfloat16, but an index's), or None."""
    if n.op not in _VIA_FLOAT32 + _PLAIN_IN_BF16 or not n.inputs \
            or n.attrs.get("dtype") is not None:
        return None
    if n.op in _PLAIN_IN_BF16 and len(n.inputs) == 1 and n.attrs.get("initial") is None:
        return None  # generated for bfloat16 as it is
    x = graph.nodes[n.inputs[0]]
    if x.dtype.name != "bfloat16":
        return None
    cast = graph.insert_before(n.id, "astype", (x.id,), {"dtype": np.dtype(np.float32)})
    inputs = (cast.id, *n.inputs[1:])
    if n.op in ("argmax", "argmin"):
        new = insert_like(graph, n.id, n.op, inputs, dict(n.attrs), n)
        if new is None:
            prune(graph, [cast.id])
        return new
    reduced = graph.insert_before(n.id, n.op, inputs, dict(n.attrs))
    new = insert_like(graph, n.id, "astype", (reduced.id,), {"dtype": n.dtype}, n)
    if new is None:
        prune(graph, [reduced.id, cast.id])
    return new


def _float_extreme(graph: Graph, n: Node) -> Node | None:
    """A plain maximum/minimum of booleans over axes that have values as the float32
    maximum/minimum of 0 and 1 cast back to bool, or None."""
    if n.op not in ("max", "min") or len(n.inputs) != 1 or n.dtype.kind != "b" or any(
            n.attrs.get(k) is not None for k in ("where", "initial", "dtype")):
        return None
    x = graph.nodes[n.inputs[0]]
    axes = normalize_axis(n.attrs.get("axis"), len(x.shape)) if x.shape else ()
    if not x.shape or not all(x.shape[a] > 0 for a in axes):
        return None
    cast = graph.insert_before(n.id, "astype", (x.id,), {"dtype": np.dtype(np.float32)})
    reduced = graph.insert_before(n.id, n.op, (cast.id,),
                                  {"axis": n.attrs.get("axis"),
                                   "keepdims": bool(n.attrs.get("keepdims"))})
    new = insert_like(graph, n.id, "astype", (reduced.id,), {"dtype": np.dtype(bool)}, n)
    if new is None:
        prune(graph, [reduced.id, cast.id])
    return new


def _plain_form(graph: Graph, n: Node) -> Node | None:
    """A masked float reduction, or a maximum/minimum with ``initial``, rewritten as
    plain reductions and elementwise ops (see the module docstring); None if ``n`` is
    neither or the rewrite would change its type."""
    if n.op not in ("sum", "mean", "max", "min") or not n.inputs \
            or n.attrs.get("dtype") is not None or n.attrs.get("ddof"):
        return None
    x = graph.nodes[n.inputs[0]]
    if x.dtype.kind != "f" or not x.shape:
        return None
    axes = normalize_axis(n.attrs.get("axis"), len(x.shape))
    if not all(x.shape[a] > 0 for a in axes):
        return None  # empty reductions: NumPy's identities and errors stay NumPy's
    initial = n.attrs.get("initial")
    masked = len(n.inputs) == 2
    if n.op in ("sum", "mean") and (not masked or initial is not None):
        return None
    if n.op in ("max", "min") and initial is None:
        return None
    kept = {"axis": n.attrs.get("axis"), "keepdims": bool(n.attrs.get("keepdims"))}
    new: list[int] = []

    def add(op: str, inputs: tuple[int, ...], attrs: dict | None = None) -> int:
        new.append(graph.insert_before(n.id, op, inputs, attrs).id)
        return new[-1]

    fill = 0 if n.op in ("sum", "mean") else initial
    body = x.id
    if masked:
        body = add("where", (n.inputs[1], x.id,
                             add("constant", (), {"value": x.dtype.type(fill)})))
    if n.op in ("max", "min"):
        reduced = add(n.op, (body,), kept)
        out = insert_like(graph, n.id, "maximum" if n.op == "max" else "minimum",
                          (add("constant", (), {"value": x.dtype.type(initial)}), reduced),
                          {}, n)
    elif n.op == "sum":
        out = insert_like(graph, n.id, "sum", (body,), kept, n)
    else:
        if x.dtype == np.float16:  # NumPy's mean of float16 sums in float32
            body = add("astype", (body,), {"dtype": np.dtype(np.float32)})
        total = add("sum", (body,), kept)
        full = add("broadcast_to", (n.inputs[1],), {"shape": tuple(x.shape)}) \
            if tuple(graph.nodes[n.inputs[1]].shape) != tuple(x.shape) else n.inputs[1]
        count = add("sum", (full,), kept)  # int64: true_divide computes in float64
        quotient = add("divide", (total, count))
        if x.dtype == np.float16:  # into the float32 sum, then NumPy's float16 rounding
            quotient = add("astype", (quotient,), {"dtype": np.dtype(np.float32)})
        out = insert_like(graph, n.id, "astype", (quotient,), {"dtype": n.dtype}, n)
    if out is None:
        prune(graph, new[::-1])
    return out


def _float_count(graph: Graph, n: Node, b: int) -> Node | None:
    """``n`` (a count of boolean array ``b``) as a float32 sum cast back, or None."""
    x = graph.nodes[b]
    axes = normalize_axis(n.attrs.get("axis"), len(x.shape)) if x.shape else ()
    cast = graph.insert_before(n.id, "astype", (b,), {"dtype": np.dtype(np.float32)})
    total = graph.insert_before(n.id, "sum", (cast.id,),
                                {"axis": n.attrs.get("axis"),
                                 "keepdims": bool(n.attrs.get("keepdims"))})
    if n.op == "sum":
        new = insert_like(graph, n.id, "astype", (total.id,), {"dtype": n.dtype}, n)
    else:
        wide = graph.insert_before(n.id, "astype", (total.id,),
                                   {"dtype": np.dtype(np.float64)})
        count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        size = graph.insert_before(n.id, "constant", (), {"value": np.float64(count)})
        new = insert_like(graph, n.id, "divide", (wide.id, size.id), {}, n)
        if new is None:
            prune(graph, [wide.id, size.id])
    if new is None:
        prune(graph, [total.id, cast.id])
    return new


def _identity_operand(graph: Graph, n: Node) -> int | None:
    """The operand ``x`` if ``n`` is ``x op c`` with ``c`` the op's identity element."""
    if len(n.inputs) != 2:
        return None
    a, b = n.inputs
    kind = n.dtype.kind
    candidates: list[tuple[int, int, float]] = []  # (x, c, identity value)
    if n.op == "multiply":
        candidates = [(a, b, 1), (b, a, 1)]
    elif n.op in ("divide", "power"):
        candidates = [(a, b, 1)]
    elif n.op == "subtract":
        candidates = [(a, b, 0)]
    elif n.op == "add" and kind in "biu":
        candidates = [(a, b, 0), (b, a, 0)]
    for x, c, value in candidates:
        if x == c or not is_const(graph, c) or is_const(graph, x):
            continue
        scalar_only = n.op == "power"
        if const_is(graph, c, value, scalar_only=scalar_only) \
                and same_type(graph.nodes[x], n):
            return x
    if n.op == "add" and is_float(n):
        for x, c in ((a, b), (b, a)):
            if x != c and is_const(graph, c) and _is_neg_zero(graph, c) \
                    and same_type(graph.nodes[x], n):
                return x
    return None


def _is_neg_zero(graph: Graph, nid: int) -> bool:
    arr = as_float(np.asarray(graph.nodes[nid].attrs["value"]))  # a bfloat16 one too
    return arr.size > 0 and arr.dtype.kind == "f" and bool(np.all(arr == 0)) \
        and bool(np.all(np.signbit(arr)))


def _simplify(graph: Graph, n: Node, ctx: PassContext) -> bool:
    nodes = graph.nodes
    # x * 1, x / 1, x - 0, x + 0 (ints), x + -0.0 (floats), x ** 1
    x = _identity_operand(graph, n)
    if x is not None:
        return _replace(graph, n, x, ctx, f"{n.op} by its identity")
    if n.op == "power" and len(n.inputs) == 2 and not is_const(graph, n.inputs[0]):
        base, exp = n.inputs
        if const_is(graph, exp, 2, scalar_only=True):
            new = insert_like(graph, n.id, "multiply", (base, base), {}, n)
            if new is not None:
                return _replace(graph, n, new.id, ctx, "x**2 as x*x")
        if n.dtype.kind == "f" and const_is(graph, exp, 0.5, scalar_only=True):
            new = insert_like(graph, n.id, "sqrt", (base,), {}, n)
            if new is not None:
                return _replace(graph, n, new.id, ctx, "x**0.5 as sqrt(x)")
    if (new := _in_float32(graph, n)) is not None:
        return _replace(graph, n, new.id, ctx, f"a bfloat16 {n.op} computed on a float32 "
                        "copy (its reference's precision)")
    if n.op == "std" and len(n.inputs) == 1 and n.dtype.kind == "f":
        # NumPy's std is sqrt(var) with the same arguments, computed exactly so; var has
        # a generated row kernel, std does not
        var = insert_like(graph, n.id, "var", n.inputs, dict(n.attrs), n)
        if var is not None:
            new = insert_like(graph, n.id, "sqrt", (var.id,), {}, n)
            if new is not None:
                return _replace(graph, n, new.id, ctx, "std as sqrt(var)")
            prune(graph, [var.id])
    if n.op in ("any", "all") and len(n.inputs) == 1:
        x = nodes[n.inputs[0]]
        axes = normalize_axis(n.attrs.get("axis"), len(x.shape)) if x.shape else ()
        if x.dtype.kind in "biuf" and all(x.shape[a] > 0 for a in axes):
            truth = x.id
            if x.dtype.kind != "b":
                cast = graph.insert_before(n.id, "astype", (x.id,), {"dtype": np.dtype(bool)})
                truth = cast.id
            attrs = {"axis": n.attrs.get("axis"), "keepdims": bool(n.attrs.get("keepdims"))}
            new = insert_like(graph, n.id, "max" if n.op == "any" else "min", (truth,),
                              attrs, n)
            if new is not None:
                return _replace(graph, n, new.id, ctx, f"{n.op} as the "
                                f"{'max' if n.op == 'any' else 'min'} of booleans")
            if truth != x.id:
                prune(graph, [truth])
    if n.op in ("sum", "mean", "max", "min") and (
            len(n.inputs) == 2 or n.attrs.get("initial") is not None):
        new = _plain_form(graph, n)
        if new is not None:
            return _replace(graph, n, new.id, ctx, f"{n.op} with where=/initial= as plain "
                            "reductions and elementwise ops")
    if n.op in ("max", "min") and n.dtype.kind == "b":
        new = _float_extreme(graph, n)
        if new is not None:
            return _replace(graph, n, new.id, ctx, f"a {n.op} of booleans as a float32 {n.op}")
    if (b := _counted(graph, n)) is not None:
        new = _float_count(graph, n, b)
        if new is not None:
            return _replace(graph, n, new.id, ctx, f"a count of booleans as a float32 "
                            f"sum (exact up to {EXACT_COUNT} values)")
    if n.op == "negative":
        src = nodes[n.inputs[0]]
        if src.op == "negative" and same_type(nodes[src.inputs[0]], n):
            return _replace(graph, n, src.inputs[0], ctx, "double negation")
    if n.op == "astype" and same_type(nodes[n.inputs[0]], n):
        return _replace(graph, n, n.inputs[0], ctx, "astype to the same dtype")
    if n.op == "transpose":
        src = nodes[n.inputs[0]]
        if src.op == "transpose":
            inner = tuple(int(a) for a in src.attrs["axes"])
            outer = tuple(int(a) for a in n.attrs["axes"])
            axes = tuple(inner[j] for j in outer)
            base = src.inputs[0]
            if axes == tuple(range(len(axes))):
                if same_type(nodes[base], n):
                    return _replace(graph, n, base, ctx, "transpose of a transpose "
                                    "(identity)")
            else:
                new = insert_like(graph, n.id, "transpose", (base,), {"axes": axes}, n)
                if new is not None:
                    return _replace(graph, n, new.id, ctx, "transpose of a transpose as "
                                    f"one transpose{axes}")
    if n.op == "reshape":
        src = nodes[n.inputs[0]]
        if src.op == "reshape":
            base = src.inputs[0]
            if same_type(nodes[base], n):
                return _replace(graph, n, base, ctx, "reshape of a reshape (identity)")
            new = insert_like(graph, n.id, "reshape", (base,), {"shape": tuple(n.shape)}, n)
            if new is not None:
                return _replace(graph, n, new.id, ctx, "reshape of a reshape as one "
                                "reshape")
    if n.op == "divide" and len(n.inputs) == 2:
        num, den = n.inputs
        d = nodes[den]
        if d.op == "sqrt" and const_is(graph, num, 1):
            new = insert_like(graph, n.id, "rsqrt", (d.inputs[0],), {}, n)
            if new is not None:
                return _replace(graph, n, new.id, ctx, "1/sqrt(x) as rsqrt(x)")
    return False


def _replace(graph: Graph, n: Node, new: int, ctx: PassContext, what: str) -> bool:
    graph.replace_uses(n.id, new)
    prune(graph, [n.id])
    ctx.note(f"{NAME}: {what}: {n.op} %{n.id} -> %{new}")
    return True


def run(graph: Graph, ctx: PassContext) -> bool:
    """Apply the algebraic identities to ``graph`` in place, until none applies.

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
    for _ in range(_MAX_SWEEPS):
        sweep = False
        for n in graph:
            if n.id in graph.nodes and n.op not in ("input", "constant", "eager"):
                sweep |= _simplify(graph, n, ctx)
        changed |= sweep
        if not sweep:
            break
    return changed
