"""Hand-written attention: ``softmax(q @ k^T * scale [+ mask]) @ v`` becomes one node.

After :mod:`.reduction_fusion` has turned the hand-written softmax into one node, a
matmul whose left operand is a last-axis softmax of ``q @ k^T`` (``k`` transposed by the
matmul: :mod:`.transpose_fold` folded the ``swapaxes``), scaled by a scalar constant
(``*`` or ``/``) and optionally plus a floating-point mask or filled with ``-inf`` where
a boolean mask is false (``np.where(mask, s, -np.inf)``, before or after the scale), is
attention. A constant boolean mask that is ``np.tril`` of ones over the scores' last two
axes is causal masking as torch's ``is_causal`` (query ``i`` sees keys ``j <= i``): the
node gets ``causal=True`` and no mask; any other boolean mask is passed on as one
(``pl.attention`` takes it as ``where``: true takes part, a row with none is NaN, as
NumPy's softmax of ``-inf`` everywhere). Only ``-inf`` fills: ``-1e9`` or ``finfo.min``
would give a fully masked row uniform weights, not NumPy's NaN, and is left as written.
:func:`find` returns what it found. The pass rewrites each one whose intermediate values
nobody else reads into one ``attention`` node (:mod:`..attention_op`: pyc_lab's Hopper
kernel or the library's SDPA, whichever ``pl.attention``'s first call measured faster,
on a GPU where torch is installed, else the blocked online softmax; either way the score
matrix is never materialised) and notes it for ``explain()``; one it cannot rewrite is
noted with the reason and runs as written (two batched GEMMs and a row softmax).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import attention_op  # noqa: F401  (registers the attention op)
from ..ir import Graph, Node
from .rewrite import as_float, const_value, is_const, prune, sole_user, try_infer

if TYPE_CHECKING:
    from .rewrite import PassContext

__all__ = ["NAME", "Attention", "find", "run"]

NAME = "find_attention"


@dataclass(frozen=True)
class Attention:
    """One hand-written attention.

    Attributes
    ----------
    output, softmax, scores
        Node ids: ``p @ v``, the softmax ``p``, and ``q @ k^T``.
    q, k, v
        The operands' node ids.
    scale
        Whether a scalar scale was applied; ``mask``: the mask's node id (additive, or
        boolean with ``filled``).
    factor
        The scale as one number (a division by ``c`` is ``1 / c``; 1.0 without one).
    chain
        The nodes between the scores and the softmax, in order (scaling, mask).
    filled
        Whether the mask is boolean, the scores filled with ``-inf`` where it is false.
    causal
        Whether that boolean mask is a constant lower triangle of ones (causal masking;
        ``mask`` is then None).
    """

    output: int
    softmax: int
    scores: int
    q: int
    k: int
    v: int
    scale: bool
    mask: int | None
    factor: float = 1.0
    chain: tuple[int, ...] = ()
    filled: bool = False
    causal: bool = False


def _filled_by(graph: Graph, node: Node) -> tuple[int, int] | None:
    """``where(mask, inner, -inf)`` with a boolean ``mask``: (mask, inner), else None."""
    if node.op != "where" or len(node.inputs) != 3:
        return None
    cond, inner, fill = node.inputs
    value = const_value(graph, fill)
    if graph.nodes[cond].dtype != np.bool_ or value is None or value.size != 1:
        return None
    v = float(np.asarray(as_float(value), dtype=np.float64).reshape(()))
    return (cond, inner) if v == -math.inf else None


def _is_causal(graph: Graph, mask: int, scores: Node) -> bool:
    """Whether boolean ``mask`` is a constant ``np.tril`` of ones over the scores' last
    two axes (leading axes of one), i.e. torch's top-left ``is_causal``."""
    value = const_value(graph, mask)
    if value is None or value.ndim < 2 or any(d != 1 for d in value.shape[:-2]):
        return False
    sq, sk = scores.shape[-2:]
    return tuple(value.shape[-2:]) == (sq, sk) and bool(
        np.array_equal(value.reshape(sq, sk), np.tri(sq, sk, dtype=bool)))


def _scores(graph: Graph, nid: int
            ) -> tuple[Node, float | None, int | None, list[int], bool] | None:
    """``q @ k^T`` under an optional scalar scale and an optional mask (added, or a
    boolean one filling ``-inf`` before or after the scale): the scores node, the scale
    factor (None: no scale), the mask, the chain above it and whether the mask fills."""
    node = graph.nodes[nid]
    mask = None
    factor = None
    filled = False
    chain: list[int] = []
    got = _filled_by(graph, node)
    if got is not None:
        chain.append(node.id)
        mask, filled = got[0], True
        node = graph.nodes[got[1]]
    elif node.op == "add":
        a, b = node.inputs
        for inner, other in ((a, b), (b, a)):
            if graph.nodes[inner].op in ("matmul", "multiply", "divide") \
                    and not is_const(graph, other):
                chain.append(node.id)
                node, mask = graph.nodes[inner], other
                break
        else:
            return None
    if node.op in ("multiply", "divide"):
        a, b = node.inputs
        const = b if is_const(graph, b) else (a if node.op == "multiply"
                                              and is_const(graph, a) else None)
        if const is None or graph.nodes[const].attrs["value"].size != 1:
            return None
        value = float(np.asarray(const_value(graph, const), dtype=np.float64).reshape(()))
        factor = value if node.op == "multiply" else 1.0 / value
        chain.append(node.id)
        node = graph.nodes[a if const == b else b]
    got = _filled_by(graph, node) if mask is None else None
    if got is not None:  # the scale applied to scores filled before it: -inf * c stays
        if factor is not None and not factor > 0:  # -inf only for c > 0
            return None
        chain.append(node.id)
        mask, filled = got[0], True
        node = graph.nodes[got[1]]
    if node.op != "matmul" or len(node.inputs) != 2 or not node.attrs.get("transpose_b") \
            or node.attrs.get("transpose_a") or len(node.shape) < 2:
        return None
    return node, factor, mask, chain[::-1], filled


def find(graph: Graph) -> list[Attention]:
    """Every hand-written attention in ``graph`` (see the module docstring)."""
    found = []
    for n in graph:
        if n.op != "matmul" or len(n.inputs) != 2 or n.attrs.get("transpose_a") \
                or n.attrs.get("transpose_b"):
            continue
        p = graph.nodes[n.inputs[0]]
        if p.op != "softmax" or p.attrs.get("axis") not in (-1, len(p.shape) - 1):
            continue
        got = _scores(graph, p.inputs[0])
        if got is None:
            continue
        scores, factor, mask, chain, filled = got
        causal = filled and _is_causal(graph, mask, scores)
        found.append(Attention(n.id, p.id, scores.id, scores.inputs[0], scores.inputs[1],
                               n.inputs[1], factor is not None, None if causal else mask,
                               1.0 if factor is None else factor, tuple(chain), filled,
                               causal))
    return found


_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _why_not(graph: Graph, att: Attention, users: dict[int, list[int]]) -> str:
    """Why ``att`` cannot become one attention node, or ``""``."""
    steps = [att.scores, *att.chain, att.softmax, att.output]
    for here, there in itertools.pairwise(steps):
        reader = sole_user(graph, here, users)
        if reader is None or reader.id != there:
            return (f"%{here} ({graph.nodes[here].op}) is read elsewhere too, so the "
                    "scores must exist")
    for name, nid in (("q", att.q), ("k", att.k), ("v", att.v)):
        if graph.nodes[nid].dtype.name not in _FLOATS:
            return f"{name} is {graph.nodes[nid].dtype.name}, not a float"
    if att.mask is not None and not att.filled and graph.nodes[att.mask].dtype.kind != "f":
        return f"the mask is {graph.nodes[att.mask].dtype.name}: added as numbers, not a mask"
    return ""


def run(graph: Graph, ctx: PassContext) -> bool:
    """Rewrite every hand-written attention it can into one ``attention`` node.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per attention found: what became of it.

    Returns
    -------
    bool
        Whether the graph changed.
    """
    changed = False
    for att in find(graph):
        if att.output not in graph.nodes:
            continue
        s, out = graph.nodes[att.scores], graph.nodes[att.output]
        q, v = graph.nodes[att.q], graph.nodes[att.v]
        size = math.prod(s.shape) * s.dtype.itemsize
        size_text = f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"
        mask_text = ("causal" if att.causal else
                     f"{'boolean ' if att.filled else ''}mask %{att.mask}"
                     if att.mask is not None else "")
        extras = ", ".join(filter(None, ("scaled" if att.scale else "", mask_text)))
        what = (f"{NAME}: attention at %{att.output}: softmax(q @ k^T"
                f"{' ' + extras if extras else ''}) @ v, q {list(q.shape)}, v {list(v.shape)}")
        why = _why_not(graph, att, graph.users())
        inputs = [att.q, att.k, att.v] + ([att.mask] if att.mask is not None else [])
        attrs = {"scale": att.factor, "causal": att.causal, "dtype": out.dtype.name}
        if not why:
            got = try_infer("attention", [graph.nodes[i] for i in inputs], attrs)
            if got != (tuple(out.shape), out.dtype):
                why = "the fused form would change the result's shape or dtype"
        if why:
            ctx.note(f"{what}; runs as two batched GEMMs and a row softmax with the "
                     f"{list(s.shape)} scores materialised ({size_text}): {why}")
            continue
        new = graph.insert_before(att.output, "attention", inputs, attrs)
        graph.replace_uses(att.output, new.id)
        prune(graph, [att.output])
        changed = True
        ctx.note(f"{what}; one attention node %{new.id} (pl.attention's semantics and path: "
                 "pyc_lab's Hopper kernel or torch's scaled_dot_product_attention on a GPU "
                 "where torch is installed, else the blocked online softmax): the "
                 f"{list(s.shape)} scores ({size_text}) are never materialised")
    return changed
