"""Row fusion: elementwise prologue -> reductions over the last axis -> epilogue, one node.

A *row program* works on a row space ``X = (..., C)``: ``prod(X[:-1])`` rows of ``C``
values. Its values are of four kinds, by shape: **full** (``X``: one per element),
**row** (``X[:-1] + (1,)`` or ``X[:-1]``: one per row, a reduction's result with or
without ``keepdims``), and **scalar** (0-d). Its ops are elementwise ops (with a CUDA
template) and the plain reductions ``sum``/``mean``/``max``/``min`` over the last axis
of a full float value; ``softmax``, layer norm and ``var`` nodes that reduction fusion
made join too, written back as the reductions and elementwise ops they stand for
(bit for bit what the user wrote; a float16 ``np.var`` with NumPy's roundings: each sum
rounded to float16 before its division). Reading a row value where a full one is
computed broadcasts it along the row, as NumPy does with ``keepdims``; any other mix (a
per-column value made inside, a row value without ``keepdims`` against a full one) ends
the program there.

Programs are grown from their output backwards, like elementwise fusion: a producer
joins its reader's program when every reader of it is in that program, it is not a
graph output and its kind fits the row space. Then neighbouring programs over the same
row space are joined where the result stays convex (no path out of it and back in) and
at most one full value leaves it: a program whose row values are also returned or read
elsewhere (a layer norm returning its mean, a cross-entropy picking against the row
maximum) and programs reading one array along the same rows (a sum and a sum of
squares) become one, the row values that leave written as extra outputs. A program is
kept when it has a reduction and something else (a lone softmax or sum keeps its own
kernel); it becomes one ``fused_rows`` node whose ``attrs`` hold ``body`` (a graph with
inputs ``in0, in1, ...``; output 0 the program's result, outputs 1, 2, ... the row
values that leave it, each read through a ``fused_extra`` node), ``ops``, ``space`` and
``name`` (``rows_<k>``). The GPU backend generates one row kernel for it
(:mod:`pyc_lab.compiler.codegen.row_program`): each row is read from memory once when it
fits in registers, and every reduction of a row is combined in registers and shared
memory, never written out.

Rows of more than :data:`MAX_FULL_COLUMNS` values in fewer than :data:`MIN_ROWS` rows are
left alone: one block per row would leave most of the GPU idle (a full reduction of a
large array is :mod:`.split_reduction`'s).

The reduced axes may be any axes (``attrs["axes"]``; the last when absent). With the last
axis among them rows lie along memory — over axes apart (a batch norm's statistics over
N, H and W of NCHW) each element's offset takes a division, and fewer than
:data:`MIN_SEGMENTED_ROWS` long such rows are left alone. Without it — a normalisation
over a middle axis
(channels of NCHW), statistics over the batch (``x - x.mean(axis=0)``), an instance norm
over ``(H, W)`` of NHWC — the program is a *column program*: its rows run across memory,
so the kernel's lanes take neighbouring rows and the threads sharing a row step down it
together. A reduction over leading axes without ``keepdims`` broadcasts back as NumPy
aligns trailing axes, so it counts as a row value with ``keepdims``. A column program is
made only when it does elementwise work on the full array (a prologue, or reduced values
broadcast back) — otherwise the column kernels, which split a long reduction across the
GPU, read the array once already — and not when it would give fewer than
:data:`MIN_COLUMN_BLOCKS` blocks over rows longer than :data:`MAX_SPARSE_COLUMNS`. A lone
softmax, layer norm or variance over such axes becomes one too (it has no kernel of its
own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..codegen import cuda_types as ct
from ..codegen.column_reduction import own_kernel_takes
from ..codegen.row_program import _READS, ROW_REDUCTIONS, SHORT_ROW, check_row_program
from ..codegen.row_space import (
    across_memory,
    check_axes,
    column_config,
    inner_extent,
    kind_in,
    trailing,
)
from ..ir import Graph, Node
from ..ops import REGISTRY, is_plain_reduction, normalize_axis
from .rewrite import broadcasts_to, kind_of, prune, restore_order

if TYPE_CHECKING:
    from .rewrite import PassContext

__all__ = ["MAX_FULL_COLUMNS", "MIN_ROWS", "NAME", "ROW_REDUCTIONS", "kind_in", "run",
           "usable_space"]

NAME = "row_fusion"

#: Reduction fusion's ops a row program takes in, as what they stand for.
_COMPOUND = ("softmax", "layer_norm", "var")

#: Row spaces with fewer rows than this ...
MIN_ROWS = 64
#: ... and longer rows than this are not fused (too little parallelism).
MAX_FULL_COLUMNS = 1 << 16
#: Rows over reduced axes that are not the last ones together (a batch norm's statistics
#: over N, H and W of NCHW), when fewer than this ...
MIN_SEGMENTED_ROWS = 256
#: A lone sum, mean, maximum or minimum over axes apart is a program of its own in at
#: least this many rows; in fewer, longer rows CuPy's reduction was faster: over ``(1,
#: 3)`` of a 32 x 256 x 56 x 56 float32 array (1792 rows) the program took 56 us
#: against CuPy's 91 us, over ``(0, 2)`` of 64 x 512 x 256 (512 rows) 15.9 us against
#: 13.3 us, on the H100 (``benchmarks/exp_library_twins.py``).
MIN_LONE_ROWS = 1024
#: Column programs giving fewer blocks than this ...
MIN_COLUMN_BLOCKS = 128
#: ... over rows longer than this are not fused: a block's lanes would each walk a long
#: row while most of the GPU idles (the column kernels split such reductions instead).
MAX_SPARSE_COLUMNS = 1024

#: The most outputs one row kernel writes: its result and row values read elsewhere.
MAX_ROW_OUTPUTS = 8

#: A program's row space: the full shape and the reduced axes (sorted).
Space = tuple[tuple[int, ...], tuple[int, ...]]

def _float(dtype: np.dtype, bfloat16: bool = False) -> bool:
    """A float dtype the row kernels take (``bfloat16`` too where asked: the plain
    reductions, which accumulate it in float32 and round once, as their reference)."""
    return (dtype.kind == "f" and ct.is_supported(dtype)) or (
        bfloat16 and dtype.name == "bfloat16")


def _axes(node: Node, x: Node) -> tuple[int, ...] | None:
    """The axes ``node`` reduces (sorted), or None for a 0-d input."""
    ndim = len(x.shape)
    if ndim < 1:
        return None
    axes = normalize_axis(node.attrs.get("axis", -1), ndim)
    return None if check_axes(tuple(x.shape), axes) else axes


def reduction_space(node: Node, graph: Graph) -> Space | None:
    """The row space (shape, reduced axes) of a reduction-like node a row program can
    take, or None."""
    if not node.inputs or node.op not in ROW_REDUCTIONS + _COMPOUND:
        return None
    x = graph.nodes[node.inputs[0]]
    # a bfloat16 variance computes in float32 and rounds once, as it is expanded
    plain = node.op in ROW_REDUCTIONS or node.op == "var"
    axes = _axes(node, x)
    if not _float(x.dtype, plain) or not _float(node.dtype, plain) or axes is None:
        return None
    if node.op in ROW_REDUCTIONS:
        ok = is_plain_reduction(node)
    elif node.op == "softmax":
        ok = len(node.inputs) == 1
    elif node.op == "var":  # ddof= too: the sum of squares over (count - ddof)
        ok = len(node.inputs) == 1 and node.attrs.get("dtype") is None \
            and node.attrs.get("initial") is None \
            and isinstance(node.attrs.get("ddof") or 0, (int, np.integer))
    elif node.op == "layer_norm":
        ok = len(node.inputs) <= 3 and (node.attrs.get("variance") == "mean_square"
                                        or x.dtype.name != "float16") and all(
            broadcasts_to(graph.nodes[i].shape, x.shape) for i in node.inputs[1:])
    else:
        ok = False
    return (tuple(x.shape), axes) if ok else None


def _lone_column(node: Node, space: Space) -> bool:
    """Whether ``node`` alone is worth a program: a softmax, layer norm or variance over
    axes before the last one or over rows of at most :data:`SHORT_ROW` values (a thread
    per row there; the row kernels give each a warp), a variance with ``ddof=`` over any
    axes, or a sum, mean, maximum or minimum over axes apart (``(1, 3)`` of a 4-D array)
    in at least :data:`MIN_LONE_ROWS` rows, which have no kernel of their own (CuPy runs
    them)."""
    if node.op in ROW_REDUCTIONS:
        return not own_kernel_takes(*space) and _sizes(space)[0] >= MIN_LONE_ROWS
    return node.op in _COMPOUND and (across_memory(*space) or _sizes(space)[1] <= SHORT_ROW
                                     or (node.op == "var" and bool(node.attrs.get("ddof"))))


def _full_work(graph: Graph, prog: _Program) -> bool:
    """Whether a program does elementwise work on the full array (a prologue, or reduced
    values broadcast back): what a column program saves passes over memory on. A
    program over the last axis always qualifies (the row kernels read rows along
    memory either way)."""
    shape, axes = prog.space
    if not across_memory(shape, axes) or _lone_column(graph.nodes[prog.root], prog.space):
        return True
    for nid in prog.members:
        n = graph.nodes[nid]
        if n.op in _COMPOUND or (kind_of(n.op) == "elementwise"
                                 and kind_in(n.shape, shape, axes) == "full"):
            return True
    return False


def _elementwise(node: Node) -> bool:
    opdef = REGISTRY.get(node.op)
    return bool(opdef is not None and opdef.kind == "elementwise" and opdef.cuda is not None
                and ct.is_supported(node.dtype, elementwise=True))


@dataclass
class _Program:
    root: int
    members: list[int] = field(default_factory=list)
    space: Space | None = None
    reductions: int = 0
    #: Row values of the program read outside it or returned: the kernel writes them too
    extras: list[int] = field(default_factory=list)


def _sizes(space: Space) -> tuple[int, int, int]:
    """Rows, values per row, and the extent after the reduced axes."""
    shape, axes = space
    cols = int(np.prod([shape[j] for j in axes], dtype=np.int64))
    rows = int(np.prod(shape, dtype=np.int64)) // max(cols, 1)
    return rows, cols, inner_extent(shape, axes)


def usable_space(space: Space) -> str:
    """Why a program over ``space`` would leave the GPU idle or is empty, or ``""``."""
    shape, axes = space
    if len(shape) < 1 or 0 in shape:
        return "an empty array"
    rows, cols, inner = _sizes(space)
    if cols < 2:
        return "one value per row"
    if inner == 1:  # rows along memory
        if rows < MIN_ROWS and cols > MAX_FULL_COLUMNS:
            return f"{rows} row(s) of {cols} are too few rows for a block per row"
        if not trailing(shape, axes) and rows < MIN_SEGMENTED_ROWS and cols > MAX_FULL_COLUMNS:
            return (f"{rows} row(s) of {cols} over axes {axes} are too few rows for the GPU "
                    "(one block each; such a reduction is not split across blocks)")
        return ""
    blocks = -(-rows // column_config(rows, inner, cols)["tx"])
    if blocks < MIN_COLUMN_BLOCKS and cols > MAX_SPARSE_COLUMNS:
        return (f"{rows} positions reduced over {cols} values each give {blocks} block(s): "
                "too few for the GPU (the column kernels split the reduction instead)")
    return ""


def _edges_fit(graph: Graph, prog: _Program, space: Space,
               extra: Node | None = None) -> bool:
    """Whether every member (and ``extra``) reads the other members as the row space
    allows."""
    members = set(prog.members) | ({extra.id} if extra is not None else set())
    for nid in members:
        n = graph.nodes[nid]
        rspace = None if kind_of(n.op) == "elementwise" else reduction_space(n, graph)
        if rspace is not None:
            if rspace != space:
                return False
            continue
        kind = kind_in(n.shape, *space)
        if kind is None or kind == "scalar":
            return False
        for i in n.inputs:
            if i in members:
                ik = kind_in(graph.nodes[i].shape, *space)
                if ik != "scalar" and ik not in _READS[kind]:
                    return False
    return True


def _groups(graph: Graph) -> list[_Program]:
    users = graph.users()
    outputs = set(graph.outputs)
    group_of: dict[int, int] = {}
    progs: list[_Program] = []
    for n in reversed(list(graph.nodes.values())):
        space = reduction_space(n, graph)
        if space is not None and usable_space(space):
            continue
        if space is None and not _elementwise(n):
            continue
        target = None
        readers = users[n.id]
        if readers and n.id not in outputs:
            gids = {group_of.get(u) for u in readers}
            if len(gids) == 1 and None not in gids:
                gid = gids.pop()
                prog = progs[gid]
                if _joins(graph, prog, n, space) and not _epilogue_elsewhere(
                        graph, prog, n, space, users):
                    target = gid
        if target is None:
            target = len(progs)
            progs.append(_Program(root=n.id, space=space))
        prog = progs[target]
        if space is not None:
            prog.space = space
            prog.reductions += 1
        group_of[n.id] = target
        prog.members.append(n.id)
    return _merge_neighbours(graph, progs)


def _epilogue_elsewhere(graph: Graph, prog: _Program, n: Node, space: Space | None,
                        users: dict[int, list[int]]) -> bool:
    """Whether elementwise ``n`` belongs after the reduction it alone reads rather than in
    the elementwise-only ``prog``: a reduction whose row space cannot hold ``prog``'s
    result would never join ``prog``, and ``n`` there would keep another reduction out
    (a masked mean's ``astype(count)`` beside its masked sum over another space)."""
    if space is not None or prog.space is not None:
        return False
    root = graph.nodes[prog.root]
    for i in n.inputs:
        r = graph.nodes[i]
        rspace = reduction_space(r, graph)
        if rspace is not None and users[i] == [n.id] and not usable_space(rspace) \
                and kind_in(root.shape, *rspace) is None:
            return True
    return False


def _escapes(members: list[int], users: dict[int, list[int]], outputs: set[int]) -> list[int]:
    """The ``members`` (in graph order) read outside them or returned, in that order."""
    inside = set(members)
    return [nid for nid in members
            if nid in outputs or any(u not in inside for u in users[nid])]


def _convex(members: set[int], users: dict[int, list[int]]) -> bool:
    """Whether no path leaves ``members`` and comes back (one kernel could not run
    between the two ends of such a path)."""
    frontier = [u for m in members for u in users[m] if u not in members]
    seen: set[int] = set()
    while frontier:
        v = frontier.pop()
        if v in seen:
            continue
        seen.add(v)
        for u in users[v]:
            if u in members:
                return False
            frontier.append(u)
    return True


def _merged(graph: Graph, a: _Program, b: _Program, users: dict[int, list[int]],
            outputs: set[int], order: dict[int, int]) -> _Program | None:
    """``a`` and ``b`` as one program over the same row space, or None: what they compute
    must stay one convex program with at most one full value leaving it (its result)
    and row values leaving it besides (the kernel writes them too)."""
    if a.space is not None and b.space is not None and a.space != b.space:
        return None
    space = b.space if b.space is not None else a.space
    if space is None:  # elementwise both: elementwise fusion's work
        return None
    members = sorted({*a.members, *b.members}, key=order.__getitem__)
    leaving = _escapes(members, users, outputs)
    if not leaving or len(leaving) > MAX_ROW_OUTPUTS:
        return None
    kinds = {o: kind_in(graph.nodes[o].shape, *space) for o in leaving}
    full = [o for o in leaving if kinds[o] == "full"]
    if len(full) > 1 or any(kinds[o] not in ("full", "row", "row1") for o in leaving):
        return None
    if not _convex(set(members), users):
        return None
    root = full[0] if full else leaving[-1]
    prog = _Program(root=root, members=members, space=space,
                    reductions=a.reductions + b.reductions,
                    extras=[o for o in leaving if o != root])
    return prog if _edges_fit(graph, prog, space) else None


def _siblings(graph: Graph, progs: list[_Program], a: int, group_of: dict[int, int],
              users: dict[int, list[int]]) -> set[int]:
    """Programs reducing over ``a``'s row space that read an array ``a`` reads along its
    rows (two statistics of one input), and elementwise-only programs whose result is a
    full value of that space reading it (an activation returned beside the row sums of
    its input): one kernel reads it once for both."""
    space = progs[a].space
    if space is None:
        return set()
    members = set(progs[a].members)
    out: set[int] = set()
    for nid in progs[a].members:
        for i in graph.nodes[nid].inputs:
            if i in members or kind_in(graph.nodes[i].shape, *space) != "full":
                continue
            out.update(group_of[u] for u in users[i] if u in group_of and group_of[u] != a
                       and (progs[group_of[u]].space == space
                            or _full_elementwise(graph, progs[group_of[u]], space)))
    return out


def _full_elementwise(graph: Graph, prog: _Program, space: Space) -> bool:
    """Whether ``prog`` is elementwise work whose result is a full value of ``space``."""
    return prog.space is None and kind_in(graph.nodes[prog.root].shape, *space) == "full"


def _merge_neighbours(graph: Graph, progs: list[_Program]) -> list[_Program]:
    """Join programs that read one another's values where those values are also read
    elsewhere or returned (a layer norm that returns its mean and inverse deviation, a
    cross-entropy that picks from ``x - max``), and programs over one row space reading
    the same array along its rows (a sum and a sum of squares): one kernel computes them
    all, writing the row values that leave as extra outputs, instead of a kernel per
    reader reading the rows again."""
    users = graph.users()
    outputs = set(graph.outputs)
    order = {nid: k for k, nid in enumerate(graph.nodes)}
    group_of = {nid: k for k, prog in enumerate(progs) for nid in prog.members}
    alive = set(range(len(progs)))
    changed = True
    while changed:
        changed = False
        for a in sorted(alive):
            readers = {group_of[u] for nid in progs[a].members for u in users[nid]
                       if u in group_of and group_of[u] != a}
            for b in sorted(readers | _siblings(graph, progs, a, group_of, users)):
                merged = _merged(graph, progs[a], progs[b], users, outputs, order)
                if merged is None:
                    continue
                progs[b] = merged
                for nid in progs[a].members:
                    group_of[nid] = b
                alive.discard(a)
                changed = True
                break
    return [progs[k] for k in sorted(alive)]


def _joins(graph: Graph, prog: _Program, n: Node, space: Space | None) -> bool:
    if space is not None:  # a reduction-like node fixes (or must match) the row space
        if prog.space is not None and prog.space != space:
            return False
        return _edges_fit(graph, prog, space, n)
    if prog.space is None:  # elementwise so far: as elementwise fusion groups
        return broadcasts_to(n.shape, graph.nodes[prog.root].shape)
    return _edges_fit(graph, prog, prog.space, n)


# -- building the body ------------------------------------------------------------------------
def _expand(body: Graph, n: Node, args: list[int]) -> int:
    """Add what compound node ``n`` stands for to ``body``; the id of its result."""
    x = body.nodes[args[0]]
    last = normalize_axis(n.attrs.get("axis", -1), len(x.shape))
    if n.op == "softmax":
        m = body.add("max", [args[0]], {"axis": last, "keepdims": True})
        d = body.add("subtract", [args[0], m.id])
        e = body.add("exp", [d.id])
        s = body.add("sum", [e.id], {"axis": last, "keepdims": True})
        return body.add("divide", [e.id, s.id]).id
    if n.op == "var" and x.dtype.name == "bfloat16":  # float32 inside, one rounding
        wide = body.add("astype", [args[0]], {"dtype": np.dtype(np.float32)}).id
        v = _expand(body, n, [wide])
        return body.add("astype", [v], {"dtype": x.dtype}).id
    if n.op == "var" and x.dtype.name == "float16" \
            and n.attrs.get("form", "np.var") != "mean_square":
        return _float16_var(body, n, args[0], last)
    mean = body.add("mean", [args[0]], {"axis": last, "keepdims": True})
    c = body.add("subtract", [args[0], mean.id])
    sq = body.add("multiply", [c.id, c.id])
    if n.op == "var":
        keep = bool(n.attrs.get("keepdims"))
        ddof = int(n.attrs.get("ddof") or 0)
        if not ddof:
            return body.add("mean", [sq.id], {"axis": last, "keepdims": keep}).id
        # NumPy's: the sum of squares over max(count - ddof, 0)
        count = int(np.prod([x.shape[a] for a in last], dtype=np.int64))
        total = body.add("sum", [sq.id], {"axis": last, "keepdims": keep})
        rest = body.add("constant", (), {"value": np.asarray(max(count - ddof, 0),
                                                              total.dtype)})
        return body.add("divide", [total.id, rest.id]).id
    # layer norm: (x - mean) / sqrt(var + eps) [* gamma [+ beta]]
    v = body.add("mean", [sq.id], {"axis": last, "keepdims": True})
    eps = body.add("constant", (), {"value": np.asarray(n.attrs.get("eps", 1e-5), x.dtype)})
    sd = body.add("sqrt", [body.add("add", [v.id, eps.id]).id])
    y = body.add("divide", [c.id, sd.id])
    if len(args) > 1:
        y = body.add("multiply", [y.id, args[1]])
    if len(args) > 2:
        y = body.add("add", [y.id, args[2]])
    return y.id


def _float16_var(body: Graph, n: Node, x: int, axes: tuple[int, ...]) -> int:
    """NumPy's float16 ``np.var`` in ``body``: each sum (float32 inside) rounded to
    float16 and then divided by the count in float32 and rounded again — the mean and the
    result, as NumPy's ``true_divide(sum, count, out=...)`` — the deviations and their
    squares in float16. (``np.mean`` divides before rounding; the row kernel of a lone
    float16 ``var`` rounds the same way.)"""
    f32 = np.dtype(np.float32)
    shape = body.nodes[x].shape
    count = int(np.prod([shape[a] for a in axes], dtype=np.int64))

    def divided(total: int, by: int) -> int:
        c = body.add("constant", (), {"value": np.asarray(by, f32)})
        q = body.add("divide", [body.add("astype", [total], {"dtype": f32}).id, c.id])
        return body.add("astype", [q.id], {"dtype": body.nodes[x].dtype}).id

    s = body.add("sum", [x], {"axis": axes, "keepdims": True})
    mean = divided(s.id, count)
    c = body.add("subtract", [x, mean])
    sq = body.add("multiply", [c.id, c.id])
    keep = bool(n.attrs.get("keepdims"))
    total = body.add("sum", [sq.id], {"axis": axes, "keepdims": keep})
    return divided(total.id, max(count - int(n.attrs.get("ddof") or 0), 0))


def _build(graph: Graph, prog: _Program, name: str) -> tuple[list[int], list[int], Graph]:
    """The external inputs, the inlined constants and the body of one program."""
    nodes = graph.nodes
    order = {nid: k for k, nid in enumerate(nodes)}
    members = sorted(prog.members, key=order.__getitem__)
    inside = set(members)
    external: list[int] = []
    inline: dict[int, None] = {}
    for nid in members:
        for i in nodes[nid].inputs:
            if i in inside:
                continue
            src = nodes[i]
            if src.op == "constant" and src.shape == ():
                inline.setdefault(i)
            elif i not in external:
                external.append(i)
    body = Graph(name=name)
    env: dict[int, int] = {}
    for k, i in enumerate(external):
        src = nodes[i]
        env[i] = body.add("input", (), {"index": k}, name=f"in{k}", shape=src.shape,
                          dtype=src.dtype).id
    for i in inline:
        env[i] = body.add("constant", (), {"value": nodes[i].attrs["value"]}).id
    for nid in members:
        n = nodes[nid]
        args = [env[i] for i in n.inputs]
        if n.op in _COMPOUND:
            env[nid] = _expand(body, n, args)
        else:
            env[nid] = body.add(n.op, args, dict(n.attrs)).id
    body.outputs = [env[prog.root], *(env[e] for e in prog.extras)]
    return external, list(inline), body


def run(graph: Graph, ctx: PassContext) -> bool:
    """Replace every row program of ``graph`` by one ``fused_rows`` node, in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per program, and one per program that could not be generated.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    declined: set[int] = set()  # members of column programs not made (noted once)
    k = sum(1 for n in graph.nodes.values() if n.op == "fused_rows")
    for prog in _groups(graph):
        if not prog.reductions or prog.space is None:
            continue
        if len(prog.members) < 2 and not _lone_column(graph.nodes[prog.root], prog.space):
            continue
        if not _full_work(graph, prog):
            declined.update(prog.members)
            ctx.note(f"{NAME}: the reductions ending at %{prog.root} over axes "
                     f"{prog.space[1]} stay column kernels: nothing of the full array is "
                     "computed or written, so one kernel would save no pass over memory, "
                     "and the column kernel splits a long reduction across the GPU")
            continue
        if not _edges_fit(graph, prog, prog.space):  # pragma: no cover - grown to fit
            continue
        root = graph.nodes[prog.root]
        name = f"rows_{k}"
        external, inlined, body = _build(graph, prog, name)
        if any(body.nodes[b].shape != graph.nodes[g].shape
               or body.nodes[b].dtype != graph.nodes[g].dtype
               for b, g in zip(body.outputs, [root.id, *prog.extras], strict=True)):
            ctx.note(f"{NAME}: the program ending at %{root.id} changes its result's type "
                     "when written out; left unfused")
            continue
        shape, axes = prog.space
        why = check_row_program(body, shape, [tuple(graph.nodes[i].shape) for i in external],
                                [graph.nodes[i].dtype for i in external], axes)
        if why:
            ctx.note(f"{NAME}: the program ending at %{root.id} is not fused: {why}")
            continue
        ops = tuple(n.op for n in body.nodes.values() if n.op not in ("input", "constant"))
        attrs = {"body": body, "ops": ops, "space": shape, "name": name}
        if axes != (len(shape) - 1,):  # the last axis is the default
            attrs["axes"] = axes
        fused = graph.add("fused_rows", external, attrs)
        extras = [graph.add("fused_extra", [fused.id, *external], {"body": body, "output": k})
                  for k in range(1, len(body.outputs))]
        _place(graph, fused, extras, root, set(prog.members))
        for old, extra in zip(prog.extras, extras, strict=True):
            graph.replace_uses(old, extra.id)
        if extras:
            restore_order(graph)
        prune(graph, inlined)
        reds = [o for o in ops if o in ROW_REDUCTIONS]
        rows, cols, inner = _sizes(prog.space)
        where = (f"over rows of {cols} ({rows} rows)" if inner == 1 else
                 f"over axes {axes} ({rows} rows of {cols} across memory: lanes take "
                 "neighbouring rows)")
        also = (f", also writing the row value(s) {', '.join(f'%{e}' for e in prog.extras)} "
                "read elsewhere" if prog.extras else "")
        ctx.note(f"{NAME}: {len(prog.members)} nodes ending at %{root.id} "
                 f"({', '.join(sorted(set(ops)))}) fused into {name} %{fused.id}: "
                 f"{len(reds)} reduction(s) {where} with their elementwise work, one kernel"
                 + also)
        k += 1
        changed = True
    _explain_unfused(graph, ctx, declined)
    return changed


def _why_not_row(node: Node, graph: Graph) -> str:
    """Why reduction-like ``node`` cannot be part of a row program ("" if it can)."""
    x = graph.nodes[node.inputs[0]] if node.inputs else None
    if node.op not in ROW_REDUCTIONS + _COMPOUND:
        return f"{node.op} is not one of a row program's reductions ({', '.join(ROW_REDUCTIONS)})"
    plain = node.op in ROW_REDUCTIONS
    if x is None or not _float(x.dtype, plain) or not _float(node.dtype, plain):
        return "row programs reduce floating-point values; integer reductions keep their kernel"
    if _axes(node, x) is None:
        return "it reduces a 0-d array"
    if node.op == "layer_norm" and x.dtype.name == "float16":
        return "a float16 layer norm written with np.var keeps its own kernel"
    space = reduction_space(node, graph)
    if space is None:
        return "where=, dtype=, initial= or ddof= is given"
    return usable_space(space)


def _explain_unfused(graph: Graph, ctx: PassContext, declined: set[int]) -> None:
    """Say, for each reduction left standing next to elementwise work, why it stays a
    kernel of its own (those in ``declined`` have their note already)."""
    users = graph.users()
    outputs = set(graph.outputs)

    def elementwise(nid: int) -> bool:
        return kind_of(graph.nodes[nid].op) == "elementwise"

    for n in graph:
        if n.id in declined or n.op not in ROW_REDUCTIONS + _COMPOUND + (
                "std", "prod", "argmax", "argmin", "any", "all"):
            continue
        before = [i for i in n.inputs[:1] if elementwise(i)]
        after = [u for u in users.get(n.id, []) if elementwise(u)]
        if not before and not after:
            continue
        why = _why_not_row(n, graph)
        if not why:
            shared = [i for i in before if i in outputs or len(users[i]) > 1]
            if shared:
                why = (f"its input %{shared[0]} ({graph.nodes[shared[0]].op}) is also read "
                       "elsewhere or is a result, so it is computed once by its own kernel")
            else:
                why = ("its readers are not one row program (a value read outside it, a "
                       "result, or a per-column use)")
        ctx.note(f"{NAME}: {n.op} %{n.id} stays its own kernel: {why}")


def _place(graph: Graph, fused: Node, extras: list[Node], root: Node,
           members: set[int]) -> None:
    """Put ``fused`` (then its extra outputs) where the program's root was and drop its
    nodes. With extra outputs, readers of theirs placed before the root are moved after
    them afterwards (:func:`~.rewrite.restore_order`; the program is convex, so nothing
    they feed comes before it)."""
    new = {fused.id, *(e.id for e in extras)}
    order: dict[int, Node] = {}
    for nid, n in graph.nodes.items():
        if nid == root.id:
            order[fused.id] = fused
            for e in extras:
                order[e.id] = e
        elif nid not in members and nid not in new:
            order[nid] = n
    graph.nodes = order
    graph.replace_uses(root.id, fused.id)
