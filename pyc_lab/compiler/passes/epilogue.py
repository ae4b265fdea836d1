"""Epilogue fusion: ``matmul -> + bias -> activation`` becomes one matmul node, and
``conv -> + residual -> activation`` one conv node.

``add(matmul(a, b), bias)`` (bias on either side) becomes ``matmul(a, b, bias)``, and an
activation (relu, gelu, sigmoid, silu, tanh — or ``maximum(h, 0)`` as relu) applied to
the product or to product + bias becomes ``attrs["activation"]``. The GEMM library
applies both in its epilogue instead of re-reading the product from memory.

Conditions: the product is floating point; the bias broadcasts along rows only (shape
``(N,)`` or ``(1, ..., 1, N)`` with ``N`` the product's last dimension) and the sum has the
product's shape; every folded intermediate has exactly one reader and is not a graph
output; the fused node's inferred type equals the replaced node's.

A convolution (``pl.conv``'s node) takes relu, gelu and silu the same way (its bias is
already an input); its library call applies the activation to its output before the
program reads it, instead of a kernel of its own after the call. Before that,
``add(conv(...), r)`` (either side) with ``r`` of the convolution's own shape and dtype
— a residual block's sum — becomes ``conv(..., residual=r)``: a CUTLASS kernel tuned
with a residual reads ``r`` in its epilogue (one pass over the result instead of the
sum's three), any other form adds it in one kernel with the activation. Like the
activation, the sum is then computed in float32 before the result is rounded to a
16-bit dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...kernels.conv import ACTIVATIONS as CONV_ACTIVATION_NAMES
from ..ir import Graph, Node
from ..ops import ACTIVATIONS, REGISTRY
from .rewrite import const_is, is_float, prune, sole_user, try_infer

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "epilogue_fusion"

#: Activation ops that can become an epilogue.
ACTIVATION_OPS = frozenset(a for a in ACTIVATIONS if a in REGISTRY)
#: Those a convolution takes (``pl.conv``'s ``activation``).
CONV_ACTIVATIONS = frozenset(CONV_ACTIVATION_NAMES)


def _row_bias(product: Node, bias: Node) -> bool:
    if not product.shape:
        return False
    n = product.shape[-1]
    shape = tuple(bias.shape)
    return (len(shape) >= 1 and len(shape) <= len(product.shape) and shape[-1] == n
            and all(d == 1 for d in shape[:-1]))


def _activation(graph: Graph, node: Node, user: Node) -> str | None:
    if user.op in ACTIVATION_OPS and user.inputs == (node.id,):
        return user.op
    if user.op == "maximum" and len(user.inputs) == 2 and user.inputs[0] == node.id:
        zero = user.inputs[1]
        if zero != node.id and const_is(graph, zero, 0, bfloat16=True) \
                and graph.nodes[zero].dtype == node.dtype \
                and graph.nodes[zero].attrs["value"].ndim == 0 \
                and user.shape == node.shape and user.dtype == node.dtype:
            return "relu"
    return None


def run(graph: Graph, ctx: PassContext) -> bool:
    """Fold bias adds and activations into the matmuls producing them, in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per fused matmul.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = _fold_conv_residuals(graph, ctx)
    changed = _fold_conv_activations(graph, ctx) or changed
    users = graph.users()
    for mm in graph:
        if mm.id not in graph.nodes or mm.op != "matmul" or mm.attrs.get("activation"):
            continue
        if not is_float(mm) or len(mm.inputs) not in (2, 3):
            continue
        inputs = list(mm.inputs)
        attrs = dict(mm.attrs)
        chain: list[Node] = [mm]
        last = mm
        what: list[str] = []
        if len(inputs) == 2:
            add = sole_user(graph, mm.id, users)
            if add is not None and add.op == "add":
                bias_id = add.inputs[1] if add.inputs[0] == mm.id else add.inputs[0]
                bias = graph.nodes[bias_id]
                if bias_id != mm.id and _row_bias(mm, bias) and add.shape == mm.shape:
                    inputs.append(bias_id)
                    chain.append(add)
                    last = add
                    what.append(f"bias add %{add.id}")
        user = sole_user(graph, last.id, users)
        if user is not None and is_float(last):
            act = _activation(graph, last, user)
            if act is not None:
                attrs["activation"] = act
                chain.append(user)
                what.append(f"{act} %{user.id}")
                last = user
        while len(chain) > 1:
            got = try_infer("matmul", [graph.nodes[i] for i in inputs], attrs)
            if got == (last.shape, last.dtype):
                break
            # the full chain does not type-check: drop its tail and try again
            dropped = chain.pop()
            what.pop()
            if "activation" in attrs and dropped.op != "add":
                attrs.pop("activation")
            else:
                inputs.pop()
            last = chain[-1]
        if len(chain) == 1:
            continue
        new = graph.insert_before(last.id, "matmul", inputs, attrs)
        graph.replace_uses(last.id, new.id)
        prune(graph, [c.id for c in reversed(chain)])
        users = graph.users()
        ctx.note(f"{NAME}: folded {' and '.join(what)} into matmul %{mm.id} "
                 f"(now %{new.id})")
        changed = True
    return changed


def _fold_conv_residuals(graph: Graph, ctx: PassContext) -> bool:
    """``add(conv(...), r)`` -> ``conv(..., residual=r)`` where the conv (no activation
    or residual yet) has that one reader and ``r`` is another value of the conv's shape
    and dtype (no broadcast, no promotion)."""
    changed = False
    users = graph.users()
    for cv in graph:
        if cv.id not in graph.nodes or cv.op != "conv" or cv.attrs.get("activation") \
                or cv.attrs.get("residual") or cv.dtype.kind != "f":
            continue
        add = sole_user(graph, cv.id, users)
        if add is None or add.op != "add" or len(add.inputs) != 2:
            continue
        other = add.inputs[1] if add.inputs[0] == cv.id else add.inputs[0]
        r = graph.nodes[other]
        if other == cv.id or (tuple(r.shape), r.dtype) != (tuple(cv.shape), cv.dtype) \
                or (tuple(add.shape), add.dtype) != (tuple(cv.shape), cv.dtype):
            continue
        attrs = {**cv.attrs, "residual": True}
        inputs = [*cv.inputs, other]
        if try_infer("conv", [graph.nodes[i] for i in inputs], attrs) \
                != (add.shape, add.dtype):
            continue
        new = _replace_conv(graph, cv, add, inputs, attrs)
        users = graph.users()
        ctx.note(f"{NAME}: folded the residual add %{add.id} (of %{other}) into conv "
                 f"%{cv.id} (now %{new.id})")
        changed = True
    return changed


def _replace_conv(graph: Graph, cv: Node, user: Node, inputs: list[int],
                  attrs: dict) -> Node:
    """A new conv node of ``inputs`` and ``attrs`` in place of ``user`` (the conv's one
    reader), the two pruned."""
    new = graph.insert_before(user.id, "conv", inputs, attrs)
    graph.replace_uses(user.id, new.id)
    prune(graph, [user.id, cv.id])
    return new


def _fold_conv_activations(graph: Graph, ctx: PassContext) -> bool:
    """``act(conv(...))`` -> ``conv(..., activation=act)`` where the conv's result has
    that one reader and the activation keeps its shape and dtype."""
    changed = False
    users = graph.users()
    for cv in graph:
        if cv.id not in graph.nodes or cv.op != "conv" or cv.attrs.get("activation") \
                or cv.dtype.kind != "f":
            continue
        user = sole_user(graph, cv.id, users)
        if user is None:
            continue
        act = _activation(graph, cv, user)
        if act not in CONV_ACTIVATIONS or (user.shape, user.dtype) != (cv.shape, cv.dtype):
            continue
        attrs = {**cv.attrs, "activation": act}
        if try_infer("conv", [graph.nodes[i] for i in cv.inputs], attrs) \
                != (user.shape, user.dtype):
            continue
        new = _replace_conv(graph, cv, user, list(cv.inputs), attrs)
        users = graph.users()
        ctx.note(f"{NAME}: folded {act} %{user.id} into conv %{cv.id} (now %{new.id})")
        changed = True
    return changed
