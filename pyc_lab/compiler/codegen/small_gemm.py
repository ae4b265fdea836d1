"""The small GEMM: a small matmul and its bias/activation epilogue as one kernel.

A small model's linear layer (a weight of a few hundred squared or less) is a few
microseconds of work split over two launches — the library's GEMM and the generated
epilogue adding the bias and applying the activation — and inside a CUDA graph each
launch costs about a microsecond of its own; at large batch the libraries' kernels for
short reductions and narrow outputs (split-k and its reduction, a handful of tiles) leave
most of the GPU idle. :func:`generate_small_gemm` writes the whole layer as one kernel
with several entries, the product from ``native/small_gemm.cuh`` — for at most
:data:`MAX_ROWS` rows a warp per output column over a transposed weight, or a lane per
column with the reduction split over warps for a row-major one; for any number of rows
32 x 32 output tiles staged through shared memory, or an output a thread for short
reductions over many small products — every sum handed to a generated
store that applies the node's epilogue (the very device function the separate epilogue
kernel uses, after the product is rounded to its dtype as the library's output would
be) and writes the result.

It is a candidate, never a default: the matmul step times its entries against the
library GEMM plus epilogue on the first call's operands and keeps the fastest only where
it measured faster (:mod:`pyc_lab.compiler.backend.small_gemm`).

:func:`check_small_gemm` says which matmuls it takes: operands of one float dtype
(float32, float64, float16, bfloat16) — two matrices, a stack of left operands times one
matrix (a single product of all their rows) or a batch of products of one batch shape
(the grid's z extent, at most :data:`MAX_BATCH`) — a reduction of at least one term, at
most :data:`MAX_FLOPS` of work, and a bias (if any) along the rows. The operands' layouts are
checked at run time (:func:`entries_for`).
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, dtype_short
from ..views import Load
from . import cuda_types as ct
from .cuda_types import KernelSource
from .elementwise import _device_function, activation_ok, epilogue_body, kernel_name

__all__ = ["BLOCK", "MAX_BATCH", "MAX_FLOPS", "MAX_ROWS", "MAX_THREAD_TERMS", "check_small_gemm",
           "entries_for", "generate_small_gemm", "launch_shape"]

#: The most rows of ``a`` the column entries (``_k``, ``_kv``, ``_n``) take (8 blocks of 8
#: rows; past it each weight load must serve more rows: the tiled entry's business).
MAX_ROWS = 64
#: The most ``2 * M * N * K`` a problem may have (a 4096-row layer of 128 x 128): past it
#: the work, not the launches, is the cost, and CUDA cores without tensor cores lose it.
MAX_FLOPS = 1 << 27
#: The longest reduction the output-a-thread entry (``_e``) is built for: each thread
#: sums its terms alone, so past a few hundred the split and tiled entries are the ones
#: that can win (and a race of a 2^26-term sum on one thread would take seconds).
MAX_THREAD_TERMS = 256
#: The most products of a batch (the grid's z extent).
MAX_BATCH = 65535
#: Threads per block of every entry (8 warps).
BLOCK = 256
_FLOATS = ("float32", "float64", "float16", "bfloat16")


def _rows_per_block(m: int) -> int:
    """Rows a block computes: the power of two at least ``m``, at most 8."""
    mt = 1
    while mt < min(m, 8):
        mt *= 2
    return mt


def _problem(node: Node, graph: Graph) -> tuple[int, int, int, int] | str:
    """``(batch, M, N, K)`` of a matmul node, or why the small GEMM does not take it.

    A stack of left operands times one 2-D right operand is a single product of all the
    rows (batch 1); a batch of right operands of the left's batch shape is a batch."""
    if node.op != "matmul":
        return f"{node.op} is not a matmul"
    if node.attrs.get("transpose_a"):
        return "a transposed left operand"
    a, b = graph.node(node.inputs[0]), graph.node(node.inputs[1])
    if len(a.shape) < 2 or len(b.shape) < 2:
        return "a vector operand"
    if len(b.shape) > 2 and tuple(b.shape[:-2]) != tuple(a.shape[:-2]):
        return "broadcast batch dimensions"
    if a.dtype != b.dtype or a.dtype.name not in _FLOATS:
        return f"operands {dtype_short(a.dtype)} and {dtype_short(b.dtype)}"
    stack = int(np.prod(a.shape[:-2], dtype=np.int64))
    batch = stack if len(b.shape) > 2 else 1
    m, k = int(a.shape[-2]) * (stack // batch), int(a.shape[-1])
    n = int(b.shape[-2] if node.attrs.get("transpose_b") else b.shape[-1])
    if batch < 1 or m < 1 or k < 1 or n < 1:
        return "an empty product"
    if batch > MAX_BATCH:
        return f"a batch of {batch} products, more than {MAX_BATCH}"
    if 2 * batch * m * n * k > MAX_FLOPS:
        return f"{2 * batch * m * n * k} flops, more than the small GEMM's {MAX_FLOPS}"
    if max(batch * m * k, batch * n * k, batch * m * n) >= 1 << 31:
        return "offsets past 32 bits"
    return batch, m, n, k


def check_small_gemm(node: Node, graph: Graph) -> str:
    """Why :func:`generate_small_gemm` does not take ``node``, or ``""`` when it does."""
    problem = _problem(node, graph)
    return problem if isinstance(problem, str) else _refusal(node, graph, problem)


def _refusal(node: Node, graph: Graph, problem: tuple[int, int, int, int]) -> str:
    """Why the epilogue of a matmul whose ``problem`` the kernel takes is refused, or
    ``""``."""
    act = node.attrs.get("activation")
    why = activation_ok(act)
    if why:
        return why
    if len(node.inputs) == 3:
        bias = graph.node(node.inputs[2])
        n = problem[2]
        shape = tuple(bias.shape)
        if not shape or shape[-1] != n or any(d != 1 for d in shape[:-1]):
            return f"a bias of shape {shape} (one of {n} values along rows needed)"
        if not ct.is_supported(bias.dtype, elementwise=True):
            return f"a {bias.dtype.name} bias"
    elif len(node.inputs) != 2:
        return f"a matmul with {len(node.inputs)} inputs"
    if not ct.is_supported(node.dtype, elementwise=True):
        return f"a {node.dtype.name} result"
    return ""


def _acc_type(dtype: np.dtype) -> str:
    return "double" if dtype.name == "float64" else "float"


def generate_small_gemm(node: Node, graph: Graph) -> KernelSource:
    """The CUDA source of ``node`` (a matmul :func:`check_small_gemm` takes) as one kernel.

    Entries (each ``(a, b[, bias], out, sam, sbk, sbn)``: ``a``'s row stride, ``b``'s
    strides, in elements; ``out`` C-contiguous M x N): for at most :data:`MAX_ROWS` rows
    ``<name>_k`` for ``b`` with unit k stride, ``<name>_kv`` the same with vector loads
    where ``K`` allows them, ``<name>_n`` for ``b`` with unit n stride; for any rows
    ``<name>_t``, 32 x 32 tiles, either layout, and for at most :data:`MAX_THREAD_TERMS`
    terms ``<name>_e``, an output a thread (short reductions over many small
    products). ``launch`` holds ``m, n, k``, ``mt`` (rows per block of the column
    entries), ``vec`` (0: no vector entry) and ``block``.

    Raises
    ------
    ValueError
        When :func:`check_small_gemm` refuses the node.
    """
    problem = _problem(node, graph)
    why = problem if isinstance(problem, str) else _refusal(node, graph, problem)
    if why:
        raise ValueError(f"node %{node.id}: {why}")
    batch, m, n, k = problem
    a = graph.node(node.inputs[0])
    dtype = np.dtype(a.dtype)
    out_dtype = np.dtype(node.dtype)
    acc = _acc_type(dtype)
    storage = ct.storage_type(dtype)
    mt = _rows_per_block(m)
    vec = 16 // dtype.itemsize
    vec = vec if k % vec == 0 and vec > 1 else 0
    name = kernel_name(node, f"matmul_{node.id}") + "_small"
    act = node.attrs.get("activation") or None
    has_bias = len(node.inputs) == 3
    bias = graph.node(node.inputs[2]) if has_bias else None
    needs: set[str] = set()
    epilogue_fn = ""
    if has_bias or act:
        body = epilogue_body((batch * m, n), dtype,
                             ((n,), bias.dtype) if bias is not None else None, act)
        loads = [Load(node=i, param=p, shape=tuple(body.node(i).shape), strides=(), offset=0)
                 for p, i in enumerate(body.inputs)]
        epilogue_fn, needs = _device_function(f"{name}_epilogue", body, out_dtype,
                                              body.outputs[0], loads)
    product = ct.convert("v", np.dtype("float64") if acc == "double" else np.dtype("float32"),
                         dtype)
    value = f"{name}_epilogue(p" + (f", {ct.from_storage(bias.dtype, 'bias[n]')}"
                                    if bias is not None else "") + ")" \
        if epilogue_fn else ct.convert("p", dtype, out_dtype)
    bias_member = f"    const {ct.storage_type(bias.dtype)}* __restrict__ bias;\n" \
        if bias is not None else ""
    store = (
        f"struct {name}_store {{\n{bias_member}"
        f"    {ct.storage_type(out_dtype)}* __restrict__ out;\n"
        f"    __device__ __forceinline__ void operator()(int m, int n, {acc} v) const {{\n"
        f"        const {ct.compute_type(dtype)} p = {product};  // the product as "
        f"{dtype.name}\n"
        f"        out[m * {n} + n] = {ct.to_storage(out_dtype, value)};\n"
        "    }\n};\n")
    load = (f"struct {name}_load {{\n"
            f"    __device__ __forceinline__ {acc} operator()({storage} x) const {{ "
            f"return {ct.from_storage(dtype, 'x')}; }}\n}};\n")
    params = [f"const {storage}* __restrict__ a", f"const {storage}* __restrict__ b"]
    if bias is not None:
        params.append(f"const {ct.storage_type(bias.dtype)}* __restrict__ bias")
    params += [f"{ct.storage_type(out_dtype)}* __restrict__ out", "long long sam",
               "long long sbk", "long long sbn", "long long sab", "long long sbb"]
    signature = ", ".join(params)
    functor = f"{name}_store{{{'bias, ' if bias is not None else ''}out}}"
    entries = []
    if m <= MAX_ROWS:
        entries += [(f"{name}_k", f"pyc_small_gemm_k<{storage}, {acc}, {mt}, 1>", "sbn"),
                    *([(f"{name}_kv", f"pyc_small_gemm_k<{storage}, {acc}, {mt}, {vec}>",
                        "sbn")] if vec else []),
                    (f"{name}_n", f"pyc_small_gemm_n<{storage}, {acc}, {mt}>", "sbk")]
    entries.append((f"{name}_t", f"pyc_small_gemm_t<{storage}, {acc}>", "sbk, sbn"))
    if k <= MAX_THREAD_TERMS:
        entries.append((f"{name}_e", f"pyc_small_gemm_e<{storage}, {acc}>", "sbk, sbn"))
    kernels = [f'extern "C" __global__ void __launch_bounds__({BLOCK})\n{entry}({signature})\n'
               f"{{\n    {call}(a, b, {m}, {n}, {k}, sam, {strides}, sab, sbb, "
               f"{name}_load{{}}, {functor});\n}}\n"
               for entry, call, strides in entries]
    ops = ("matmul",) + (("bias_add",) if bias is not None else ()) + ((act,) if act else ())
    header = (f"// pyc_lab generated kernel {name} (small GEMM)\n"
              f"// ops: {', '.join(ops)}\n"
              f"// out {dtype_short(out_dtype)}[{batch * m}, {n}] = "
              + (f"{act}(" if act else "")
              + (f"a[{batch}][{m}, {k}] @ b[{batch}][{k}, {n}]" if batch > 1
                 else f"a[{m}, {k}] @ b[{k}, {n}]")
              + (" + bias" if bias is not None else "") + (")" if act else "")
              + f", sums in {acc}\n")
    all_dtypes = {dtype.name, out_dtype.name, *((bias.dtype.name,) if bias is not None else ())}
    sections = [header]
    if "float16" in all_dtypes:
        sections.append(ct.helper("f16"))
    if "bfloat16" in all_dtypes:
        sections.append(ct.helper("bf16"))
    sections.append(ct.helper("vec"))
    sections += [ct.helper(s) for s in ("ipow", "abs", "divmod") if s in needs]
    sections.append(ct.helper("small_gemm"))
    if epilogue_fn:
        sections.append(epilogue_fn)
    sections += [load, store, *kernels]
    source = "\n".join(s.rstrip("\n") + "\n" for s in sections)
    launch = {"batch": batch, "m": m, "n": n, "k": k, "mt": mt, "vec": vec, "block": BLOCK,
              "itemsize": dtype.itemsize, "bias": bias is not None}
    notes = ((f"{batch} x " if batch > 1 else "") + f"{m} x {n} x {k}: one kernel for "
             f"the product and its epilogue ({len(entries)} forms); raced against the "
             "library GEMM and epilogue at the first call")
    return KernelSource(name=name, kind="small_gemm", source=source, ops=ops, notes=notes,
                        entries=tuple(e for e, _, _ in entries), launch=launch)


def entries_for(src: KernelSource, a_strides: tuple[int, int], b_strides: tuple[int, int],
                a_ptr: int, b_ptr: int, batch_strides: tuple[int, int] = (0, 0)
                ) -> list[tuple[str, int, int, int, int, int]]:
    """The entries of ``src`` that take operands with these element strides (of one
    product's rows and columns; ``batch_strides``: from one product's ``a`` and ``b`` to
    the next's) and addresses, each as ``(entry, sam, sbk, sbn, sab, sbb)``: empty where
    ``a``'s k stride is not 1 or ``b`` has no unit stride. The column entries come first
    (the one for ``b``'s layout, vectorised where the alignment allows), then the tiled
    one and the one with an output a thread."""
    launch = src.launch
    m, n, k, vec = launch["m"], launch["n"], launch["k"], launch["vec"]
    sam, sak = a_strides
    sbk, sbn = b_strides
    sab, sbb = batch_strides if launch.get("batch", 1) > 1 else (0, 0)
    sam = sam if m > 1 else k
    sbk = sbk if k > 1 else 1
    sbn = sbn if n > 1 else (1 if sbk != 1 else k)
    if (sak != 1 and k > 1) or 1 not in (sbk, sbn):
        return []
    out = []
    if f"{src.name}_k" in src.entries:
        if sbk == 1:
            align = vec * launch["itemsize"]
            if vec and all(v % vec == 0 for v in (sam, sbn, sab, sbb)) \
                    and a_ptr % align == 0 and b_ptr % align == 0:
                out.append((f"{src.name}_kv", sam, sbk, sbn, sab, sbb))
            out.append((f"{src.name}_k", sam, sbk, sbn, sab, sbb))
        else:
            out.append((f"{src.name}_n", sam, sbk, sbn, sab, sbb))
    out.append((f"{src.name}_t", sam, sbk, sbn, sab, sbb))
    if f"{src.name}_e" in src.entries:
        out.append((f"{src.name}_e", sam, sbk, sbn, sab, sbb))
    return out


def launch_shape(src: KernelSource, entry: str) -> tuple[tuple[int, int, int], tuple[int]]:
    """``(grid, block)`` of ``entry``."""
    launch = src.launch
    batch = launch.get("batch", 1)
    if entry.endswith("_t"):
        return (-(-launch["n"] // 32), -(-launch["m"] // 32), batch), (launch["block"],)
    if entry.endswith("_e"):
        return (-(-launch["m"] * launch["n"] // launch["block"]), 1, batch), (launch["block"],)
    per_block = 32 if entry.endswith("_n") else 8
    return ((-(-launch["n"] // per_block), -(-launch["m"] // launch["mt"]), batch),
            (launch["block"],))
