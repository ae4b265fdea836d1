"""Column kernels: sum/mean/max/min over leading or middle axes.

A reduction over a block of consecutive axes that does not include the last one (a
column sum ``x.sum(axis=0)``, a middle-axis sum ``x.sum(axis=1)`` of a 3-D array, a
sum over batch and time ``x.sum(axis=(0, 1))``) views its C-contiguous input as
``outer x R x inner``: ``out[o, i]`` reduces ``x[o, r, i]`` over ``r``. Consecutive
columns ``i`` are consecutive in memory, so a warp's lanes take consecutive columns
(one aligned vector of up to 16 bytes each in the ``_vec`` entry) and step down ``r``
together: every load is a coalesced run of a row, never a strided gather.

A block of 256 threads is ``TX`` lanes across columns by ``TY`` rows of ``r``; each
thread accumulates its columns over ``r = r0 + ty, r0 + ty + TY, ...`` and the ``TY``
partial results combine through shared memory in a fixed tree order. When the columns
give too few blocks to fill the GPU (a column sum of a tall matrix), the launcher also
splits ``R`` into ``S`` chunks (grid ``y``): each chunk writes its partial result to a
workspace, and the ``S`` partials of each column are reduced in chunk order — by the
last chunk of the tile to finish (an arrival counter per tile, given by the launcher;
one launch), or by a second small kernel (``_combine``) for long splits. Either way the
same additions in the same order: results are deterministic from run to run.

Arithmetic runs in the compute type of the result (float for float16, bfloat16 and
float32, double for float64, 64-bit integers for integer sums), and a float16 or
bfloat16 result is rounded once, at the end (for bfloat16 what the reductions'
reference does). NumPy's float16 column sum rounds after every addition instead (its
pairwise float32 summation runs along the last axis only), so a float16 column sum
here is closer to the exact sum than NumPy's; a float16 ``mean`` matches NumPy's
(which accumulates in float32). ``max``/``min`` propagate NaN like NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node
from ..ops import is_plain_reduction, normalize_axis
from . import cuda_types as ct
from .cuda_types import KernelSource
from .elementwise import kernel_name
from .reduction import _acc_dtype, _store
from .row_space import trailing

__all__ = ["COLUMN_OPS", "check_columns", "column_split", "generate_columns",
           "own_kernel_takes", "split_count"]

#: Ops this module generates (over leading or middle axes).
COLUMN_OPS = ("sum", "mean", "max", "min")

#: Threads per block.
BLOCK = 256
#: The fewest rows of ``r`` a thread should accumulate per chunk before ``R`` is split.
MIN_ROWS_PER_THREAD = 16


def column_split(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, int, int] | None:
    """``(outer, R, inner)`` for a reduction of ``shape`` over ``axes`` (sorted), or
    None when the axes are not one block of consecutive axes ending before the last."""
    if not axes or len(shape) < 2:
        return None
    first, last = axes[0], axes[-1]
    if axes != tuple(range(first, last + 1)) or last >= len(shape) - 1:
        return None

    def prod(dims: tuple[int, ...]) -> int:
        return int(np.prod(dims, dtype=np.int64)) if dims else 1

    return prod(shape[:first]), prod(shape[first:last + 1]), prod(shape[last + 1:])


def own_kernel_takes(shape: tuple[int, ...], axes: tuple[int, ...]) -> bool:
    """Whether a plain reduction of ``shape`` over ``axes`` (sorted) has a kernel of its
    own: a row kernel over the last axes, or a column kernel over one block of
    consecutive axes before the last. Axes apart (``(1, 3)`` of a 4-D array) have none."""
    return trailing(shape, axes) or column_split(shape, axes) is not None


def check_columns(node: Node, graph: Graph) -> str:
    """Why ``node`` cannot be generated as a column kernel, or ``""``."""
    if node.op not in COLUMN_OPS:
        return f"{node.op} is not a column reduction"
    x = graph.node(node.inputs[0])
    shape = tuple(x.shape)
    for n in (x, node):  # bfloat16 too: accumulated in float32, rounded once
        if not ct.is_supported(n.dtype, elementwise=True):
            return f"dtype {n.dtype.name} is not generated; runs through CuPy"
    axes = normalize_axis(node.attrs.get("axis"), len(shape))
    split = column_split(shape, axes)
    if split is None:
        return (f"{node.op} over axes {axes} of a rank-{len(shape)} array is not generated "
                "(the last axis, or one block of consecutive axes before it); runs "
                "through CuPy")
    if not is_plain_reduction(node):
        return f"{node.op} with dtype/initial/where is not generated"
    outer, r, inner = split
    if r == 0 or outer * inner == 0:
        return f"{node.op} of an empty array runs through CuPy"
    if outer * -(-inner // 32) >= 2**31:
        return f"{outer} x {inner} columns are too many blocks for the column kernel"
    return ""


def _config(inner: int, vec: int) -> dict[str, int]:
    """Lanes across columns (``tx``), rows per block (``ty``), the tile width in
    columns and the number of tiles, for ``vec`` columns per thread."""
    vectors = -(-inner // vec)
    tx = 1
    while tx < min(vectors, 32):
        tx *= 2
    ty = BLOCK // tx
    width = tx * vec
    return {"tx": tx, "ty": ty, "width": width, "tiles": -(-inner // width),
            "vec": vec}


def vector_width(node: Node, graph: Graph) -> int:
    """Columns per aligned load in the ``_vec`` entry (0: no such entry)."""
    x = graph.node(node.inputs[0])
    split = column_split(tuple(x.shape),
                         normalize_axis(node.attrs.get("axis"), len(x.shape)))
    assert split is not None
    inner = split[2]
    vec = 16 // x.dtype.itemsize
    while vec > 1 and inner % vec:
        vec //= 2
    return vec if vec > 1 else 0


def split_count(launch: dict[str, Any], sm_count: int, vectorised: bool) -> int:
    """How many chunks ``S`` to split ``R`` into for a GPU of ``sm_count`` SMs: enough
    blocks for about four per SM, each thread still accumulating at least
    :data:`MIN_ROWS_PER_THREAD` rows of its chunk."""
    cfg = launch["vec_config"] if vectorised else launch["config"]
    blocks = launch["outer"] * cfg["tiles"]
    want = -(-4 * sm_count // blocks)
    most = max(1, launch["r"] // (cfg["ty"] * MIN_ROWS_PER_THREAD))
    return int(max(1, min(want, most, 65535)))


def generate_columns(node: Node, graph: Graph) -> KernelSource:
    """The CUDA source of a sum/mean/max/min over leading or middle axes.

    Entries: ``name`` (any alignment), ``name_vec`` (aligned vector loads, when the
    column count allows; the launcher checks the pointer) and ``name_combine`` (the
    second stage of a split). The first two take ``(x, y, partial, chunk, arrivals)``:
    with one chunk (``gridDim.y == 1``) they write ``y``; otherwise chunk ``blockIdx.y``
    writes its partial results to ``partial[blockIdx.y * outer * inner + ...]``, and
    with ``arrivals`` (``gridDim.x`` counters, zero) the last chunk of each tile to
    finish combines them into ``y`` (null: ``name_combine`` does, launched next).
    """
    why = check_columns(node, graph)
    if why:
        raise ValueError(f"node %{node.id} ({node.op}): {why}")
    name = kernel_name(node)
    x = graph.node(node.inputs[0])
    xdt, odt = x.dtype, node.dtype
    axes = normalize_axis(node.attrs.get("axis"), len(x.shape))
    split = column_split(tuple(x.shape), axes)
    assert split is not None
    outer, r, inner = split
    acc_dt = _acc_dtype(node, xdt)
    acc = ct.compute_type(acc_dt)
    vec = vector_width(node, graph)
    cfg = _config(inner, 1)
    vcfg = _config(inner, vec) if vec else None
    kernels = [_stage_one(name, node, x, acc_dt, split, cfg)]
    if vcfg:
        kernels.append(_stage_one(f"{name}_vec", node, x, acc_dt, split, vcfg))
    kernels.append(_combine(f"{name}_combine", node, acc_dt, split))
    header = [
        f"// pyc_lab generated kernel {name} (columns)",
        f"// ops: {node.op} over axes {axes}",
        f"// x {x.type_text} -> y {node.type_text}: {outer} x ({r} reduced) x {inner} "
        "columns",
        f"// blocks of {BLOCK} threads: {cfg['tx']} lanes across columns x {cfg['ty']} "
        f"rows; arithmetic in {acc}",
        f"// {name}: any alignment; "
        + (f"{name}_vec: {vec} columns per aligned load; " if vec else "")
        + f"{name}_combine: the partial results of a split over the reduced axes",
    ]
    sections = ["\n".join(header) + "\n"]
    sections += [ct.helper(h) for h, dt in (("f16", "float16"), ("bf16", "bfloat16"))
                 if dt in (xdt.name, odt.name)]
    if vec:
        sections.append(ct.helper("vec"))
    sections.append(ct.helper("reduce"))
    sections += kernels
    entries = (name, *((f"{name}_vec",) if vec else ()), f"{name}_combine")
    launch = {"outer": outer, "r": r, "inner": inner, "block": BLOCK, "config": cfg,
              "vec": vec, "vec_kernel": f"{name}_vec" if vec else None,
              "vec_config": vcfg, "align_bytes": {"in0": vec * xdt.itemsize} if vec else {},
              "combine_kernel": f"{name}_combine", "acc_dtype": acc_dt.name}
    notes = (f"{outer} x {inner} columns, {r} values each: {cfg['tx']} lanes x "
             f"{cfg['ty']} rows per block of {BLOCK}"
             + (f"; vectorised by {vec} when aligned" if vec else "")
             + "; the reduced axes split across blocks when columns are few")
    return KernelSource(name=name, kind="columns", source="\n".join(sections),
                        ops=(node.op,), notes=notes, entries=entries, launch=launch)


def _combine_expr(op: str, a: str, b: str) -> str:
    return f"{a} += {b};" if op in ("sum", "mean") else f"{a} = pyc_{op}_op()({a}, {b});"


def _identity(op: str, acc_dt: np.dtype) -> str:
    if op == "max":
        return ct.lowest(acc_dt)
    if op == "min":
        return ct.highest(acc_dt)
    return ct.literal(0, acc_dt)


def _finish(node: Node, acc_dt: np.dtype, value: str, r: int) -> str:
    acc = ct.compute_type(acc_dt)
    if node.op == "mean":
        value = f"{value} / static_cast<{acc}>({r})"
    return _store(value, acc_dt, node.dtype)


def _stage_one(entry: str, node: Node, x: Node, acc_dt: np.dtype,
               split: tuple[int, int, int], cfg: dict[str, int]) -> str:
    """The first stage (the whole reduction when unsplit): scalar or vectorised."""
    outer, r, inner = split
    xdt = x.dtype
    acc = ct.compute_type(acc_dt)
    xs, os_ = ct.storage_type(xdt), ct.storage_type(node.dtype)
    tx, ty, width, tiles, vec = (cfg[k] for k in ("tx", "ty", "width", "tiles", "vec"))
    ident = _identity(node.op, acc_dt)
    src_dt = xdt if xdt.name != "float16" else np.dtype(np.float32)

    def load(elem: str) -> str:
        return ct.convert(ct.from_storage(xdt, elem), src_dt, acc_dt)

    lines = [f'extern "C" __global__ void __launch_bounds__({BLOCK})',
             f"{entry}(const {xs}* __restrict__ x, {os_}* __restrict__ y, "
             f"{acc}* __restrict__ partial, long long chunk, "
             "unsigned int* __restrict__ arrivals)",
             "{",
             f"    __shared__ {acc} smem[{BLOCK * vec}];",
             f"    const int tx = threadIdx.x % {tx};",
             f"    const int ty = threadIdx.x / {tx};",
             f"    const long long tile = blockIdx.x % {tiles}LL;",
             f"    const long long o = blockIdx.x / {tiles}LL;",
             f"    const long long c0 = tile * {width}LL + tx * {vec}LL;",
             "    const long long r0 = static_cast<long long>(blockIdx.y) * chunk;",
             f"    const long long r1 = r0 + chunk < {r}LL ? r0 + chunk : {r}LL;",
             f"    {acc} a[{vec}];",
             "#pragma unroll",
             f"    for (int e = 0; e < {vec}; ++e) a[e] = {ident};",
             f"    if (c0 < {inner}LL) {{",
             f"        const {xs}* p = x + o * {r * inner}LL + c0;",
             "#pragma unroll 4",
             f"        for (long long row = r0 + ty; row < r1; row += {ty}) {{"]
    if vec > 1:
        lines += [f"            const pyc_vec<{xs}, {vec}> v = "
                  f"*reinterpret_cast<const pyc_vec<{xs}, {vec}>*>(p + row * {inner}LL);",
                  "#pragma unroll",
                  f"            for (int e = 0; e < {vec}; ++e) {{",
                  f"                {_combine_expr(node.op, 'a[e]', load('v.v[e]'))}",
                  "            }"]
    else:
        lines += [f"            {_combine_expr(node.op, 'a[0]', load(f'p[row * {inner}LL]'))}"]
    lines += ["        }",
              "    }",
              "#pragma unroll",
              f"    for (int e = 0; e < {vec}; ++e) smem[ty * {width} + tx * {vec} + e] = a[e];",
              "    __syncthreads();",
              f"    for (int s = {ty // 2}; s > 0; s >>= 1) {{",
              "        if (ty < s) {",
              "#pragma unroll",
              f"            for (int e = 0; e < {vec}; ++e) {{",
              f"                const int k = ty * {width} + tx * {vec} + e;",
              f"                {_combine_expr(node.op, 'smem[k]', f'smem[k + s * {width}]')}",
              "            }",
              "        }",
              "        __syncthreads();",
              "    }",
              f"    if (ty == 0 && c0 < {inner}LL) {{",
              f"        const long long base = o * {inner}LL + c0;",
              "#pragma unroll",
              f"        for (int e = 0; e < {vec}; ++e) {{",
              f"            if (c0 + e < {inner}LL) {{",
              f"                const {acc} v = smem[tx * {vec} + e];",
              "                if (gridDim.y == 1) {",
              f"                    y[base + e] = {_finish(node, acc_dt, 'v', r)};",
              "                } else {",
              f"                    partial[static_cast<long long>(blockIdx.y) * "
              f"{outer * inner}LL + base + e] = v;",
              "                }",
              "            }",
              "        }",
              "    }"]
    lines += _last_chunk_combines(node, acc_dt, split, width, tiles)
    lines += ["}"]
    return "\n".join(lines) + "\n"


def _last_chunk_combines(node: Node, acc_dt: np.dtype, split: tuple[int, int, int],
                         width: int, tiles: int) -> list[str]:
    """The end of a split first stage given ``arrivals`` (one counter per tile, zero
    between launches): the last chunk of a tile to finish reduces the tile's ``S``
    partial results in chunk order, as the ``_combine`` kernel would, and sets its
    counter back to zero — one launch instead of two, the same answer bit for bit."""
    outer, r, inner = split
    n = outer * inner
    acc = ct.compute_type(acc_dt)
    add = _combine_expr(node.op, "v", f"__ldcg(partial + s * {n}LL + i)")
    return [
        "    if (gridDim.y > 1 && arrivals != nullptr) {",
        "        __shared__ int last_chunk;",
        "        __threadfence();  // this chunk's partial results, visible to the last",
        "        __syncthreads();",
        "        if (threadIdx.x == 0) {",
        "            last_chunk = atomicAdd(arrivals + blockIdx.x, 1u) == gridDim.y - 1u;",
        "        }",
        "        __syncthreads();",
        "        if (last_chunk) {",
        "            __threadfence();",
        f"            for (int k = threadIdx.x; k < {width}; k += {BLOCK}) {{",
        f"                const long long c = (blockIdx.x % {tiles}LL) * {width}LL + k;",
        f"                if (c < {inner}LL) {{",
        f"                    const long long i = (blockIdx.x / {tiles}LL) * {inner}LL + c;",
        f"                    {acc} v = __ldcg(partial + i);",
        "#pragma unroll 8",
        "                    for (unsigned int s = 1; s < gridDim.y; ++s) {",
        f"                        {add}",
        "                    }",
        f"                    y[i] = {_finish(node, acc_dt, 'v', r)};",
        "                }",
        "            }",
        "            if (threadIdx.x == 0) arrivals[blockIdx.x] = 0u;  // for the next launch",
        "        }",
        "    }"]


def _combine(entry: str, node: Node, acc_dt: np.dtype, split: tuple[int, int, int]) -> str:
    """The second stage of a split: each column's ``S`` partial results, in order."""
    outer, r, inner = split
    n = outer * inner
    acc = ct.compute_type(acc_dt)
    os_ = ct.storage_type(node.dtype)
    lines = [f'extern "C" __global__ void __launch_bounds__({BLOCK})',
             f"{entry}(const {acc}* __restrict__ partial, {os_}* __restrict__ y, int parts)",
             "{",
             f"    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x "
             f"+ threadIdx.x; i < {n}LL; i += static_cast<long long>(gridDim.x) * "
             "blockDim.x) {",
             f"        {acc} v = partial[i];",
             "        for (int s = 1; s < parts; ++s) {",
             f"            {_combine_expr(node.op, 'v', f'partial[s * {n}LL + i]')}",
             "        }",
             f"        y[i] = {_finish(node, acc_dt, 'v', r)};",
             "    }",
             "}"]
    return "\n".join(lines) + "\n"

