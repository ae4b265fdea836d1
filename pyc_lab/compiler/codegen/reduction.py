"""Row kernels: softmax, layer norm and reductions over the last axis (the plain
reductions: over the last axes, ``x.mean(axis=(2, 3))``).

The input is viewed as ``rows x cols`` (C-contiguous; ``cols`` = the reduced axes). Each row
is handled by one warp (``cols <= 1024``: eight rows per 256-thread block) or by one
block (256 to 1024 threads, more for longer rows); rows are walked by a grid-stride
loop. Partial results combine with ``__shfl_xor_sync`` butterflies inside a warp and
through shared memory across warps, in a fixed order, so results are deterministic
from run to run.

When a row fits in registers (at most 32 values a thread for a warp, 16 for a block;
half that in double) every thread keeps its share of the row in a fully unrolled local
array and the row is read from memory once; otherwise each pass re-reads the row
(it is usually still in L1/L2).

Arithmetic runs in the compute type of the result (float for float16 and float32,
double for float64 and for integer inputs of a float result, 64-bit integers for
integer sums); softmax subtracts the row maximum before ``exp``; layer norm and ``var``
use two passes (mean, then the mean of squared deviations). ``max``/``min`` propagate
NaN like NumPy.

Float16 rows accumulate in float32 and round to float16 exactly where NumPy does: a
sum is rounded once at the end (NumPy's float16 add reduction sums a row in float32),
``np.mean`` divides the float32 sum before rounding, and every elementwise step of a
variance or layer norm (the centred value, its square, ``var + eps``, the square
root, the quotient) is rounded as NumPy rounds each float16 op. ``var`` follows how it
was written (its ``form``; a layer norm's ``variance``): ``np.var`` rounds the sums to
float16 before dividing by the row length (so a float16 ``np.var`` can overflow where
the float32 sum does not, as in NumPy), a mean of squares divides first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node, dtype_short
from ..ops import normalize_axis
from . import cuda_types as ct
from .cuda_types import KernelSource
from .elementwise import kernel_name

__all__ = ["ROW_OPS", "check_rows", "generate_rows", "row_config", "vector_width"]

#: Ops this module generates.
ROW_OPS = ("softmax", "layer_norm", "sum", "mean", "max", "min", "var")

_REDUCTIONS = ("sum", "mean", "max", "min", "var")


def row_config(cols: int, acc_itemsize: int = 4) -> dict[str, Any]:
    """Threads per row, block size and register caching for rows of ``cols`` values."""
    if cols <= 1024:
        threads, block, mode = 32, 256, "warp"
    elif cols <= 4096:
        threads, block, mode = 256, 256, "block"
    elif cols <= 8192:
        threads, block, mode = 512, 512, "block"
    else:
        threads, block, mode = 1024, 1024, "block"
    per = -(-cols // threads)
    limit = (32 if mode == "warp" else 16) * 4 // max(acc_itemsize, 4)
    return {"threads": threads, "block": block, "mode": mode, "per_thread": per,
            "cached": per <= limit, "rows_per_block": block // threads}


#: A full reduction of more values than this is not generated as one row: one block
#: would leave most of the GPU idle (large full reductions are split in two stages by
#: :mod:`..passes.split_reduction`; what it leaves — float16, sizes without a divisor —
#: CuPy reduces across the GPU).
LONG_ROW = 1 << 16


def _first_reduced(node: Node, shape: tuple[int, ...]) -> int:
    """The first axis of the row: the last one, or the first of the trailing block of
    axes a plain reduction reduces (``x.mean(axis=(2, 3))`` of NCHW: rows of H * W)."""
    if node.op in _REDUCTIONS and shape:
        axes = normalize_axis(node.attrs.get("axis"), len(shape))
        if axes and axes == tuple(range(axes[0], len(shape))):
            return axes[0]
    return len(shape) - 1


def _rows_cols(shape: tuple[int, ...], first: int | None = None) -> tuple[int, int]:
    """Rows and values per row of a C-contiguous ``shape`` whose rows are its axes from
    ``first`` on (the last axis by default)."""
    first = len(shape) - 1 if first is None else first
    cols = int(np.prod(shape[first:], dtype=np.int64))
    rows = int(np.prod(shape[:first], dtype=np.int64))
    return rows, cols


def _float_of(dtype: np.dtype) -> np.dtype:
    return dtype if dtype.kind == "f" else np.dtype(np.float64)


def check_rows(node: Node, graph: Graph) -> str:
    """Why ``node`` (a softmax, layer norm or reduction) cannot be generated, or ``""``."""
    if node.op not in ROW_OPS:
        return f"{node.op} is not a row op"
    x = graph.node(node.inputs[0])
    shape = tuple(x.shape)
    for n in [x, node, *(graph.node(i) for i in node.inputs[1:])]:
        # bfloat16 rows: the plain reductions (accumulated in float32, rounded once, as
        # the reductions' reference does); softmax and layer norm do not take it
        if not ct.is_supported(n.dtype, elementwise=node.op in _REDUCTIONS):
            return f"dtype {n.dtype.name} is not generated; runs through CuPy"
    if not shape:
        return f"{node.op} of a 0-d array is not generated; runs through CuPy"
    last = (len(shape) - 1,)
    if node.op == "softmax":
        if normalize_axis(node.attrs.get("axis", -1), len(shape)) != last:
            return "softmax over a non-last axis is not generated; runs through CuPy"
    elif node.op in _REDUCTIONS:
        axes = normalize_axis(node.attrs.get("axis"), len(shape))
        if axes != tuple(range(_first_reduced(node, shape), len(shape))):
            return (f"{node.op} over axes {axes} of a rank-{len(shape)} array is not "
                    "generated (only the last axes, or one block of consecutive axes "
                    "before the last); runs through CuPy")
        if node.attrs.get("ddof") or node.attrs.get("dtype") is not None \
                or node.attrs.get("initial") is not None or len(node.inputs) != 1:
            return f"{node.op} with ddof/dtype/initial/where is not generated"
    else:  # layer_norm
        for extra in node.inputs[1:]:
            es = tuple(graph.node(extra).shape)
            if es not in ((shape[-1],), ()):
                return f"layer_norm scale/shift of shape {es} is not generated"
        if len(node.inputs) > 3:
            return "layer_norm takes at most 3 inputs"
    rows, cols = _rows_cols(shape, _first_reduced(node, shape))
    if cols == 0:
        return f"{node.op} over an empty last axis runs through CuPy"
    if cols >= 2**31:
        return f"rows of {cols} elements are too long for the row kernels"
    if rows == 1 and cols > LONG_ROW:
        return (f"one row of {cols} would leave most of the GPU idle (one block); runs "
                "through CuPy, whose full reduction spreads over the GPU")
    return ""


# -- dtype plans ---------------------------------------------------------------------------
_HALVES = ("float16", "bfloat16")


def _acc_dtype(node: Node, x: np.dtype) -> np.dtype:
    """The dtype partial results are kept in."""
    out = node.dtype
    if node.op in ("max", "min"):
        if x.name in _HALVES:
            return np.dtype(np.float32)
        if x.name == "bool":
            return np.dtype(np.int32)  # shuffles have no bool overload
        return x
    if node.op in ("softmax", "layer_norm"):
        f = _float_of(x)
        return np.dtype(np.float32) if f.name == "float16" else f
    # sum, mean, var: the result dtype, float16 and bfloat16 accumulated in float
    return np.dtype(np.float32) if out.name in _HALVES else out


def _store(expr: str, acc_dt: np.dtype, odt: np.dtype) -> str:
    """An accumulator-typed value as the stored element of the result (rounded once)."""
    if odt.name == "float16":
        wide = "float" if acc_dt.name != "float64" else "double"
        fn = "pyc_float_to_f16" if wide == "float" else "pyc_double_to_f16"
        return f"{fn}({expr})"
    return ct.to_storage(odt, ct.convert(expr, acc_dt, odt))


class _Emitter:
    """Builds a row kernel's body for one thread-per-row configuration.

    With ``vec`` > 1 (the vectorised entry, cached rows only) each thread owns whole
    vectors of ``vec`` consecutive columns: vector ``cv = t + j * threads`` of the row,
    its elements ``k = j * vec + e`` of the cached values, moved by one aligned load or
    store per vector.
    """

    def __init__(self, cols: int, cfg: dict[str, Any], acc: str, vec: int = 1) -> None:
        self.cols = cols
        self.cfg = cfg
        self.acc = acc
        self.vec = vec
        self.n_vectors = cols // vec if vec > 1 else 0
        self.per_thread = (-(-self.n_vectors // cfg["threads"]) * vec if vec > 1
                           else cfg["per_thread"])

    def reduce(self, var: str, op: str, identity: str) -> str:
        if self.cfg["mode"] == "warp":
            return f"{var} = pyc_warp_reduce({var}, pyc_{op}_op());"
        return f"{var} = pyc_block_reduce({var}, pyc_{op}_op(), {identity}, smem);"

    def loop(self, body: list[str], indent: str = "        ",
             loads: tuple[tuple[str, str, str], ...] = (),
             store: tuple[str, str, str] | None = None) -> list[str]:
        """Lines running ``body`` for every column ``col`` this thread owns
        (``k`` indexes the cached values when cached).

        In the vectorised form, ``loads`` are ``(var, pointer, storage type)`` vectors
        read before the elements (``var.v[e]``) and ``store`` a vector written after them.
        """
        t = self.cfg["threads"]
        if self.vec > 1:
            return self._vector_loop(body, indent, loads, store)
        if self.cfg["cached"]:
            per = self.cfg["per_thread"]
            guard = per * t != self.cols
            lines = [f"{indent}#pragma unroll",
                     f"{indent}for (int k = 0; k < {per}; ++k) {{"]
            if guard or any("col" in b for b in body):
                lines.append(f"{indent}    const int col = t + k * {t};")
            if guard:
                lines.append(f"{indent}    if (col < {self.cols}) {{")
                lines += [f"{indent}        {b}" for b in body]
                lines.append(f"{indent}    }}")
            else:
                lines += [f"{indent}    {b}" for b in body]
            lines.append(f"{indent}}}")
            return lines
        # a row program's thread stepping through a long row across memory (a column
        # program's, or one over axes apart) has one load per step: unrolled (the
        # config's "unroll"), several are in flight at once
        unroll = [f"{indent}#pragma unroll {self.cfg['unroll']}"] if self.cfg.get("unroll") \
            else []
        return (unroll + [f"{indent}for (int col = t; col < {self.cols}; col += {t}) {{"]
                + [f"{indent}    {b}" for b in body] + [f"{indent}}}"])

    def _vector_loop(self, body: list[str], indent: str,
                     loads: tuple[tuple[str, str, str], ...],
                     store: tuple[str, str, str] | None) -> list[str]:
        t, v = self.cfg["threads"], self.vec
        nv = self.per_thread // v
        guard = nv * t != self.n_vectors
        lines = [f"{indent}#pragma unroll",
                 f"{indent}for (int j = 0; j < {nv}; ++j) {{",
                 f"{indent}    const int cv = t + j * {t};  // this vector's index in the row"]
        inner = indent + "    "
        if guard:
            lines.append(f"{inner}if (cv < {self.n_vectors}) {{")
            inner += "    "
        for var, ptr, st in loads:
            lines.append(f"{inner}const pyc_vec<{st}, {v}> {var} = "
                         f"reinterpret_cast<const pyc_vec<{st}, {v}>*>({ptr})[cv];")
        if store is not None:
            lines.append(f"{inner}pyc_vec<{store[2]}, {v}> {store[0]};")
        lines += [f"{inner}#pragma unroll",
                  f"{inner}for (int e = 0; e < {v}; ++e) {{",
                  f"{inner}    const int k = j * {v} + e;"]
        lines += [f"{inner}    {b}" for b in body]
        lines.append(f"{inner}}}")
        if store is not None:
            var, ptr, st = store
            lines.append(f"{inner}reinterpret_cast<pyc_vec<{st}, {v}>*>({ptr})[cv] = {var};")
        if guard:
            lines.append(f"{indent}    }}")
        lines.append(f"{indent}}}")
        return lines


def vector_width(node: Node, graph: Graph) -> int:
    """Elements per aligned vector access of the vectorised row kernel, or 0 if none.

    Vectors move 16 bytes of the widest array; the row length must be a multiple of the
    width, the row must be cached in registers, and layer norm's scale/shift must be
    per-column vectors or scalars.
    """
    x = graph.node(node.inputs[0])
    _rows, cols = _rows_cols(tuple(x.shape), _first_reduced(node, tuple(x.shape)))
    acc_dt = _acc_dtype(node, x.dtype)
    cfg = row_config(cols, acc_dt.itemsize)
    arrays = [x, node] if node.op in ("softmax", "layer_norm") else [x]
    arrays += [graph.node(i) for i in node.inputs[1:] if tuple(graph.node(i).shape)]
    vec = 16 // max(a.dtype.itemsize for a in arrays)
    if vec < 2 or cols % vec or not cfg["cached"]:
        return 0
    per = -(-(cols // vec) // cfg["threads"]) * vec
    limit = (32 if cfg["mode"] == "warp" else 16) * 4 // max(acc_dt.itemsize, 4)
    return vec if per <= limit else 0


def generate_rows(node: Node, graph: Graph) -> KernelSource:
    """The CUDA source of a softmax, layer norm or last-axis reduction node.

    Entries: ``name`` (any alignment) and, when :func:`vector_width` allows it,
    ``name_vec`` (aligned vector loads and stores; the launcher checks the pointers).
    """
    why = check_rows(node, graph)
    if why:
        raise ValueError(f"node %{node.id} ({node.op}): {why}")
    name = kernel_name(node)
    x = graph.node(node.inputs[0])
    xdt, odt = x.dtype, node.dtype
    rows, cols = _rows_cols(tuple(x.shape), _first_reduced(node, tuple(x.shape)))
    acc_dt = _acc_dtype(node, xdt)
    acc = ct.compute_type(acc_dt)
    cfg = row_config(cols, acc_dt.itemsize)
    xs, os_ = ct.storage_type(xdt), ct.storage_type(odt)
    extras: list[tuple[str, Node]] = []
    if node.op == "layer_norm":
        extras = [(label, graph.node(i))
                  for label, i in zip(("gamma", "beta"), node.inputs[1:], strict=False)]
    params = [f"const {xs}* __restrict__ x"]
    params += [f"const {ct.storage_type(en.dtype)}* __restrict__ {label}"
               for label, en in extras]
    params.append(f"{os_}* __restrict__ y")
    vec = vector_width(node, graph)
    entries = [(name, 1)] + ([(f"{name}_vec", vec)] if vec else [])
    kernels = [_row_kernel(entry, v, node, x, extras, cfg, acc_dt, params)
               for entry, v in entries]
    ops_text = node.op
    if node.op in _REDUCTIONS:
        ops_text = f"{node.op} over the last axis"
    elif node.op == "layer_norm":
        ops_text = "layer_norm over the last axis" + (
            " with " + " and ".join(label for label, _ in extras) if extras else "")

    t, block, mode = cfg["threads"], cfg["block"], cfg["mode"]
    per, cached = cfg["per_thread"], cfg["cached"]
    extras_text = "".join(f", {label} {en.type_text}" for label, en in extras)
    header = [
        f"// pyc_lab generated kernel {name} (rows)",
        f"// ops: {ops_text}",
        f"// x {x.type_text}{extras_text} -> y {node.type_text}: {rows} rows of {cols}",
        f"// one {'warp' if mode == 'warp' else f'block of {block} threads'} per row"
        + (f" ({cfg['rows_per_block']} rows per block of {block})" if mode == "warp" else "")
        + f", {per} value(s) per thread"
        + (", kept in registers" if cached else ", re-read on each pass")
        + f"; arithmetic in {acc}",
        f"// {name}: any alignment" + (
            f"; {name}_vec: {vec} columns per aligned load/store" if vec
            else "; no vectorised variant"),
    ]
    sections = ["\n".join(header) + "\n"]
    names = {xdt.name, odt.name, *(en.dtype.name for _, en in extras)}
    sections += [ct.helper(h) for h, dt in (("f16", "float16"), ("bf16", "bfloat16"))
                 if dt in names]
    if vec:
        sections.append(ct.helper("vec"))
    sections.append(ct.helper("reduce"))  # combining operators, warp and block reductions
    sections += kernels
    source = "\n".join(sections)
    vec_arrays = [("in0", xdt)] + [(f"in{k + 1}", en.dtype) for k, (_, en) in enumerate(extras)
                                   if tuple(en.shape)]
    if node.op in ("softmax", "layer_norm"):
        vec_arrays.append(("out", odt))
    launch = {"rows": rows, "cols": cols, "block": block, "threads_per_row": t,
              "rows_per_block": cfg["rows_per_block"], "mode": mode, "cached": cached,
              "vec": vec, "vec_kernel": f"{name}_vec" if vec else None,
              "align_bytes": {k: vec * dt.itemsize for k, dt in vec_arrays} if vec else {}}
    notes = (f"{rows} rows x {cols}: one {'warp' if mode == 'warp' else 'block'} per row, "
             f"{block} threads per block, "
             + ("row cached in registers" if cached else "row re-read per pass")
             + (f"; vectorised by {vec} when aligned" if vec else ""))
    ops = (node.op,) if node.op != "layer_norm" else tuple(
        ["layer_norm"] + [label for label, _ in extras])
    return KernelSource(name=name, kind="rows", source=source, ops=ops, notes=notes,
                        entries=tuple(e for e, _ in entries), launch=launch)


def _row_kernel(entry: str, vec: int, node: Node, x: Node, extras: list[tuple[str, Node]],
                cfg: dict[str, Any], acc_dt: np.dtype, params: list[str]) -> str:
    """One entry point of a row kernel: scalar (``vec`` 1) or vectorised."""
    xdt, odt = x.dtype, node.dtype
    rows, cols = _rows_cols(tuple(x.shape), _first_reduced(node, tuple(x.shape)))
    acc = ct.compute_type(acc_dt)
    em = _Emitter(cols, cfg, acc, vec)
    xs, os_ = ct.storage_type(xdt), ct.storage_type(odt)
    vector = vec > 1
    x_elem = "xin.v[e]" if vector else "xr[col]"
    load = ct.convert(ct.from_storage(xdt, x_elem), xdt if xdt.name != "float16"
                      else np.dtype(np.float32), acc_dt)
    x_load = (("xin", "xr", xs),)
    y_store = ("yout", "yr", os_) if vector else None
    y_elem = "yout.v[e]" if vector else "yr[col]"

    cached = cfg["cached"] or vector
    per = em.per_thread
    body: list[str] = []
    f16 = xdt.name == "float16" and node.op in ("var", "layer_norm")

    def rnd(expr: str) -> str:
        """``expr`` rounded to float16 where NumPy rounds (float16 rows only); always one
        parenthesised term, so that composing rounded pieces keeps their precedence."""
        return f"pyc_round_f16({expr})" if f16 else f"({expr})"

    value = "v[k]" if cached else "xv"
    read = [] if cached else [f"const {acc} xv = {load};"]
    if cached:
        body.append(f"        {acc} v[{per}];")
        body += em.loop([f"v[k] = {load};"], loads=x_load if vector else ())

    def total(var: str, op: str, identity: str, contribution: str) -> list[str]:
        lines = [f"        {acc} {var} = {identity};"]
        lines += em.loop([*read, f"{var} = pyc_{op}_op()({var}, {contribution});"]
                         if op != "sum" else [*read, f"{var} += {contribution};"])
        lines.append(f"        {em.reduce(var, op, identity)}")
        return lines

    zero = ct.literal(0, acc_dt)
    if node.op in _REDUCTIONS:
        if node.op in ("max", "min"):
            ident = ct.lowest(acc_dt) if node.op == "max" else ct.highest(acc_dt)
            body += total("m", node.op, ident, value)
            result = "m"
        elif node.op == "sum":
            body += total("s", "sum", zero, value)
            result = "s"
        elif node.op == "mean":
            body += total("s", "sum", zero, value)
            result = f"s / static_cast<{acc}>({cols})"
        else:  # var: two passes, rounded as NumPy rounds float16 (see the module doc)
            np_var = node.attrs.get("form", "np.var") == "np.var"
            body += total("s", "sum", zero, value)
            body.append(f"        const {acc} mean = {_row_mean('s', acc, cols, rnd, np_var)};")
            body += total("q", "sum", zero, _centred_square(value, rnd))
            result = _row_mean("q", acc, cols, rnd, np_var)
        out = _store(result, acc_dt, odt)
        body += ["        if (t == 0) {",
                 f"            y[row] = {out};",
                 "        }"]
    elif node.op == "softmax":
        ninf = ct.lowest(acc_dt)
        body += total("m", "max", ninf, value)
        body.append(f"        {acc} s = {zero};")
        exp = ct.exp_function(odt)
        if cached:
            body += em.loop([f"v[k] = {exp}(v[k] - m);", "s += v[k];"])
        else:
            body += em.loop([*read, f"s += {exp}(xv - m);"])
        body.append(f"        {em.reduce('s', 'sum', zero)}")
        res = "v[k] / s" if cached else f"{exp}(xv - m) / s"
        store = _store(res, acc_dt, odt)
        body += em.loop([*read, f"{y_elem} = {store};"], store=y_store)
    else:  # layer_norm
        xf = _float_of(xdt)
        eps = ct.literal(np.asarray(node.attrs.get("eps", 1e-5), dtype=xf), acc_dt)
        np_var = node.attrs.get("variance", "mean_square") == "np.var"
        body += total("s", "sum", zero, value)
        body.append(f"        const {acc} mean = {_row_mean('s', acc, cols, rnd, False)};")
        centre = "mean"
        if np_var and xf.name == "float16":  # np.var centres on its own float16 mean
            body.append(f"        const {acc} vmean = {_row_mean('s', acc, cols, rnd, True)};")
            centre = "vmean"
        body += total("q", "sum", zero, _centred_square(value, rnd, centre))
        var = _row_mean("q", acc, cols, rnd, np_var)
        shifted = rnd(f"{var} + {eps}")
        body.append(f"        const {acc} denom = {rnd(f'sqrt({shifted})')};")
        # y = (x - mean) / denom in x's float dtype, then * gamma, + beta, each in
        # NumPy's promoted dtype
        cur_dt = xf
        centred = rnd(f"{value} - mean")
        quotient = ct.divide(centred, "denom", xf)  # one parenthesised term
        steps = [f"{acc} r = {rnd(quotient) if f16 else quotient};"]
        cur = "r"
        extra_loads = []
        for label, en in extras:
            nxt = np.result_type(cur_dt, en.dtype)
            if not tuple(en.shape):
                g_elem = f"{label}[0]"
            elif vector:
                g_elem = f"{label}_in.v[e]"
                extra_loads.append((f"{label}_in", label, ct.storage_type(en.dtype)))
            else:
                g_elem = f"{label}[col]"
            gval = ct.convert(ct.from_storage(en.dtype, g_elem),
                              en.dtype if en.dtype.name != "float16"
                              else np.dtype(np.float32), nxt if nxt.name != "float16"
                              else np.dtype(np.float32))
            lhs = ct.convert(cur, cur_dt if cur_dt.name != "float16" else np.float32,
                             nxt if nxt.name != "float16" else np.float32)
            opsym = "*" if label == "gamma" else "+"
            expr = f"{lhs} {opsym} {gval}"
            if nxt.name == "float16":
                expr = f"pyc_round_f16({expr})"
            var = f"r_{label}"
            steps.append(f"const {ct.compute_type(nxt)} {var} = {expr};")
            cur, cur_dt = var, nxt
        assert cur_dt == odt, (cur_dt, odt)
        steps.append(f"{y_elem} = {ct.to_storage(odt, cur)};")
        body += em.loop(read + steps, loads=tuple(extra_loads), store=y_store)

    block, mode = cfg["block"], cfg["mode"]
    lines = [f'extern "C" __global__ void __launch_bounds__({block})',
             f"{entry}({', '.join(params)})",
             "{",
             f"    const long long rows = {rows}LL;"]
    if mode == "warp":
        rpb = cfg["rows_per_block"]
        lines += [
            "    const int t = threadIdx.x & 31;  // lane: this thread's first column",
            f"    const long long first = static_cast<long long>(blockIdx.x) * {rpb} "
            "+ (threadIdx.x >> 5);",
            f"    for (long long row = first; row < rows; row += "
            f"static_cast<long long>(gridDim.x) * {rpb}) {{",
        ]
    else:
        lines += [
            f"    __shared__ {acc} smem[32];",
            "    const int t = threadIdx.x;",
            "    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {",
        ]
    lines.append(f"        const {xs}* xr = x + row * {cols}LL;")
    if node.op in ("softmax", "layer_norm"):
        lines.append(f"        {os_}* yr = y + row * {cols}LL;")
    lines += body
    lines += ["    }", "}"]
    return "\n".join(lines) + "\n"


def _row_mean(total: str, acc: str, cols: int, rnd: Any, np_var: bool) -> str:
    """The mean of a row from its float32/float64 sum: ``np.var`` rounds the sum to the
    array's float16 first and the quotient after; ``np.mean`` only the quotient."""
    n = f"static_cast<{acc}>({cols})"
    return rnd(f"{rnd(total)} / {n}") if np_var else rnd(f"{total} / {n}")


def _centred_square(value: str, rnd: Any, mean: str = "mean") -> str:
    """``(x - mean) ** 2`` with NumPy's float16 roundings (after each op)."""
    d = rnd(f"{value} - {mean}")
    return rnd(f"{d} * {d}")


def describe(node: Node, graph: Graph) -> str:
    """One line: the op, its input and the row split."""
    x = graph.node(node.inputs[0])
    shape = tuple(x.shape)
    rows, cols = _rows_cols(shape, _first_reduced(node, shape)) if shape else (1, 1)
    return f"{node.op} {dtype_short(x.dtype)}{list(x.shape)}: {rows} rows of {cols}"
