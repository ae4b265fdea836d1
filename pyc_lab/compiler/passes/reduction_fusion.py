"""Reduction fusion: hand-written softmax, layer norm and variance become one op each.

Patterns (``x`` floating point; every intermediate read only inside the pattern and not
a graph output):

- softmax: ``e = exp(x - max(x, a, keepdims=True)); e / sum(e, a, keepdims=True)`` with
  one axis ``a`` -> ``softmax(x; axis=a)``;
- layer norm over the last axis:
  ``(x - mean(x, -1, keepdims=True)) / sqrt(v + eps)`` where ``v`` is
  ``var(x, -1, keepdims=True)``, ``mean((x-m)*(x-m), ...)`` or ``mean((x-m)**2, ...)``
  (``* rsqrt(v + eps)`` also matches), optionally followed by ``* gamma`` and ``+ beta``
  -> ``layer_norm(x[, gamma[, beta]]; eps=eps, axis=-1)``;
- variance: ``mean((x - mean(x, a, keepdims=True))**2, a, keepdims=k)`` (or the square
  written ``d * d``) -> ``var(x; axis=a, keepdims=k, form="mean_square")``.

Only plain reductions match (no ``where``/``dtype``/``initial``/``ddof``). The fused
ops compute what was written, NumPy's accumulation rules included: a variance written
as a mean of squares stays one (``form="mean_square"``; for float16 ``np.mean`` sums
through float32 where ``np.var`` sums the squares in float16, so ``np.var`` would
overflow where the written code does not), and a layer norm records which variance it
was written with (``variance="np.var"`` or ``"mean_square"``). Softmax and layer norm
are bit for bit; ``rsqrt`` matches ``1/sqrt`` to within rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..ir import Graph, Node
from ..ops import is_plain_reduction, normalize_axis
from .rewrite import const_is, const_value, prune, try_infer

if TYPE_CHECKING:
    from .rewrite import PassContext

NAME = "reduction_fusion"


@dataclass
class _Match:
    root: Node
    nodes: set[int]
    op: str
    inputs: list[int]
    attrs: dict[str, Any]
    what: str
    fallbacks: list[tuple[set[int], Node, list[int]]] = field(default_factory=list)


def _axes(graph: Graph, node: Node) -> tuple[int, ...]:
    return normalize_axis(node.attrs.get("axis"), len(graph.nodes[node.inputs[0]].shape))


def _reduces(graph: Graph, nid: int, op: str, x: int | None = None,
             keepdims: bool | None = True) -> Node | None:
    node = graph.nodes[nid]
    if node.op != op or (x is not None and node.inputs[0] != x) \
            or not is_plain_reduction(node):
        return None
    if keepdims is not None and bool(node.attrs.get("keepdims")) != keepdims:
        return None
    return node


def _centered(graph: Graph, nid: int, axes: tuple[int, ...] | None = None) \
        -> tuple[Node, Node, Node] | None:
    """``c = x - mean(x, axes, keepdims=True)``: returns (c, x, m)."""
    c = graph.nodes[nid]
    if c.op != "subtract":
        return None
    x_id, m_id = c.inputs
    m = _reduces(graph, m_id, "mean", x_id)
    x = graph.nodes[x_id]
    if m is None or x.dtype.kind != "f" or c.shape != x.shape:
        return None
    if axes is not None and _axes(graph, m) != axes:
        return None
    return c, x, m


def _centered_square(graph: Graph, nid: int, axes: tuple[int, ...]) \
        -> tuple[Node, set[int]] | None:
    """``d * d`` or ``d ** 2`` (0-d exponent) with ``d = x - mean(x, axes, keepdims=True)``.

    The two factors may be separate but identical nodes (no CSE yet). Returns ``x`` and
    the pattern's nodes (the square, the differences and the means).
    """
    sq = graph.nodes[nid]
    if sq.op == "multiply":
        factors = list(sq.inputs)
    elif sq.op == "square" or (
            sq.op == "power" and const_is(graph, sq.inputs[1], 2, scalar_only=True)):
        factors = [sq.inputs[0]]
    else:
        return None
    nodes = {nid}
    x = None
    for f in factors:
        cm = _centered(graph, f, axes)
        if cm is None or (x is not None and cm[1].id != x.id):
            return None
        x = cm[1]
        nodes |= {cm[0].id, cm[2].id}
    if x is None:
        return None
    return x, nodes


def _match_softmax(graph: Graph, r: Node, users: dict[int, list[int]]) -> _Match | None:
    if r.op != "divide":
        return None
    e_id, s_id = r.inputs
    s = _reduces(graph, s_id, "sum", e_id)
    e = graph.nodes[e_id]
    if s is None or e.op != "exp":
        return None
    d = graph.nodes[e.inputs[0]]
    if d.op != "subtract":
        return None
    x_id, m_id = d.inputs
    m = _reduces(graph, m_id, "max", x_id)
    x = graph.nodes[x_id]
    if m is None or x.dtype.kind != "f":
        return None
    axes = _axes(graph, m)
    if len(axes) != 1 or _axes(graph, s) != axes or r.shape != x.shape:
        return None
    return _Match(r, {r.id, s.id, e.id, d.id, m.id}, "softmax", [x_id],
                  {"axis": axes[0]}, f"softmax over axis {axes[0]}")


def _variance_of(graph: Graph, v_id: int, x_id: int, axes: tuple[int, ...]) \
        -> tuple[set[int], str] | None:
    """The pattern nodes and how the variance was written (``"np.var"`` or
    ``"mean_square"``) if ``v_id`` is the variance of x over ``axes`` with keepdims."""
    v = graph.nodes[v_id]
    if v.op == "var" and v.inputs[0] == x_id and bool(v.attrs.get("keepdims")) \
            and _axes(graph, v) == axes and is_plain_reduction(v):
        return {v_id}, str(v.attrs.get("form", "np.var"))
    if v.op != "mean" or not v.attrs.get("keepdims") or _axes(graph, v) != axes \
            or not is_plain_reduction(v):
        return None
    got = _centered_square(graph, v.inputs[0], axes)
    if got is None or got[0].id != x_id:
        return None
    return {v_id} | got[1], "mean_square"


def _is_scalar_float(graph: Graph, nid: int) -> bool:
    value = const_value(graph, nid)
    return value is not None and value.size == 1 and value.dtype.kind == "f"


def _match_layer_norm(graph: Graph, y: Node, users: dict[int, list[int]]) -> _Match | None:
    if y.op == "divide":
        c_id, sd_id = y.inputs
        sd = graph.nodes[sd_id]
        if sd.op != "sqrt":
            return None
    elif y.op == "multiply":
        pair = next(((a, b) for a, b in (y.inputs, y.inputs[::-1])
                     if graph.nodes[b].op == "rsqrt"), None)
        if pair is None:
            return None
        c_id, sd_id = pair
        sd = graph.nodes[sd_id]
    else:
        return None
    x_ndim = len(graph.nodes[c_id].shape)
    if x_ndim == 0:
        return None
    last = (x_ndim - 1,)
    cm = _centered(graph, c_id, last)
    if cm is None:
        return None
    c, x, m = cm
    ve = graph.nodes[sd.inputs[0]]
    if ve.op != "add":
        return None
    pair = next(((a, b) for a, b in (ve.inputs, ve.inputs[::-1])
                 if _is_scalar_float(graph, b)), None)
    if pair is None:
        return None
    v_id, eps_id = pair
    eps = const_value(graph, eps_id)
    if ve.dtype != x.dtype or ve.shape != graph.nodes[v_id].shape:
        return None
    got = _variance_of(graph, v_id, x.id, last)
    if got is None:
        return None
    var_nodes, form = got
    core = {y.id, sd.id, ve.id, c.id, m.id} | var_nodes
    attrs = {"eps": float(eps.reshape(-1)[0]), "axis": -1, "variance": form}
    match = _Match(y, core, "layer_norm", [x.id], attrs, "layer norm over the last axis")
    # optional affine: * gamma [+ beta]; try the longest first, fall back on failure
    g_user = users.get(y.id, [])
    if len(g_user) == 1 and y.id not in graph.outputs:
        g = graph.nodes[g_user[0]]
        if g.op == "multiply" and g.inputs.count(y.id) == 1:
            gamma = g.inputs[1] if g.inputs[0] == y.id else g.inputs[0]
            with_gamma = (core | {g.id}, g, [x.id, gamma])
            b_user = users.get(g.id, [])
            cands = [with_gamma]
            if len(b_user) == 1 and g.id not in graph.outputs:
                b = graph.nodes[b_user[0]]
                if b.op == "add" and b.inputs.count(g.id) == 1:
                    beta = b.inputs[1] if b.inputs[0] == g.id else b.inputs[0]
                    cands.insert(0, (core | {g.id, b.id}, b, [x.id, gamma, beta]))
            match.fallbacks = cands
    return match


def _match_var(graph: Graph, v: Node, users: dict[int, list[int]]) -> _Match | None:
    if v.op != "mean" or not is_plain_reduction(v):
        return None
    axes = _axes(graph, v)
    got = _centered_square(graph, v.inputs[0], axes)
    if got is None:
        return None
    x, nodes = got
    attrs = {"axis": v.attrs.get("axis"), "keepdims": bool(v.attrs.get("keepdims")),
             "form": "mean_square"}
    return _Match(v, {v.id} | nodes, "var", [x.id], attrs,
                  f"variance over axes {axes}, written as a mean of squares")


def _closed(graph: Graph, nodes: set[int], root: int, users: dict[int, list[int]]) -> bool:
    """Whether every pattern node but the root is read only inside the pattern."""
    outs = set(graph.outputs)
    for nid in nodes:
        if nid == root:
            continue
        if nid in outs or any(u not in nodes for u in users.get(nid, [])):
            return False
    return True


def _apply(graph: Graph, match: _Match, users: dict[int, list[int]], ctx: PassContext) \
        -> bool:
    options = [(*f, True) for f in match.fallbacks]
    options.append((match.nodes, match.root, match.inputs, False))
    for nodes, root, inputs, affine in options:
        if not _closed(graph, nodes, root.id, users):
            continue
        got = try_infer(match.op, [graph.nodes[i] for i in inputs], match.attrs)
        if got != (root.shape, root.dtype):
            continue
        new = graph.insert_before(root.id, match.op, inputs, match.attrs)
        graph.replace_uses(root.id, new.id)
        prune(graph, [root.id])
        extra = {1: "", 2: " with scale", 3: " with scale and shift"}[len(inputs)] \
            if affine else ""
        ctx.note(f"{NAME}: rewrote {len(nodes)} nodes ending at %{root.id} as "
                 f"{match.op} %{new.id} ({match.what}{extra})")
        return True
    return False


def run(graph: Graph, ctx: PassContext) -> bool:
    """Recognise softmax, layer norm and variance patterns in ``graph``, in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per rewritten pattern.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    for matcher in (_match_layer_norm, _match_softmax, _match_var):
        users = graph.users()
        for n in graph:
            if n.id not in graph.nodes:
                continue
            match = matcher(graph, n, users)
            if match is not None and _apply(graph, match, users, ctx):
                changed = True
                users = graph.users()
    return changed
