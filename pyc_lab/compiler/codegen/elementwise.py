"""Elementwise kernels: a fused group (or one elementwise op) as one CUDA kernel.

A fused node's body is a small graph of elementwise ops. It becomes one ``__device__``
function, ``<name>_op``, that maps one element of every input (in compute types) to
one output element, each body node a ``const`` line with its op named beside it. Two
``__global__`` kernels call it:

``<name>``
    The general kernel: a grid-stride loop over the output's elements, each input read
    at its broadcast offset. Shapes and per-input strides are baked into the source as
    constants (a compiled signature has static shapes), after dropping size-1 output
    dimensions and merging dimensions that every array walks contiguously, so the common
    cases (same shapes, a row vector, a scalar) need one or no division per element. Any
    alignment works.

``<name>_vec``
    The vectorised kernel, when the layout allows it: each thread moves ``VEC``
    consecutive output elements, with one aligned load (16 bytes for the widest array:
    ``float4`` for float32, eight halves for float16) from every input that runs along
    the innermost dimension and one scalar load from every input broadcast along it; a
    scalar tail loop finishes the last ``n % VEC`` elements. The host launches it only
    when every vector-accessed pointer is aligned to its vector's size (see
    :attr:`KernelSource.launch`), otherwise the general kernel.

Semantics follow NumPy: operands are converted to the op's result dtype before the op
(comparisons: to the operands' common dtype), every float16 result is rounded to
float16, NaN propagates through ``maximum``/``minimum``/``relu`` as the op templates in
:mod:`pyc_lab.compiler.ops` say.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..ir import Graph, Node, dtype_short
from ..ops import ACTIVATIONS, REGISTRY
from ..views import VIEW_OPS, Load, analyse, broadcasts_to
from . import cuda_types as ct
from .cuda_types import KernelSource
from .elementwise_loops import idx_type, parts_of, pieces_note

__all__ = [
    "BLOCK",
    "body_of",
    "check_elementwise",
    "epilogue_body",
    "float_only_refusal",
    "generate_elementwise",
    "kernel_name",
    "node_expression",
]

log = logging.getLogger(__name__)

#: Threads per block of every elementwise kernel.
BLOCK = 256

_COMPARISONS = frozenset({"less", "less_equal", "greater", "greater_equal", "equal",
                          "not_equal"})
_INT = frozenset({"int32", "int64"})

#: Ops whose registry template is replaced, and why.
_OVERRIDES = {
    # C's pow() has no integer overload: exponentiation by squaring, wrapping like NumPy
    # (native/ipow.cuh).
    ("power", "int"): "pyc_ipow({0}, {1})",
    # abs() on a float may resolve to the int overload in some headers: be explicit
    # (native/abs.cuh).
    ("abs", "any"): "pyc_abs({0})",
    # NumPy computes 1 / sqrt(x), both correctly rounded; rsqrt() is 2 ulp off.
    ("rsqrt", "any"): "(1 / sqrt({0}))",
    # ~ on a C bool is an int (~true == -2, still true): NumPy's invert of bool is "not"
    ("invert", "bool"): "(!{0})",
    # NumPy's floor/ceil/trunc/rint of an integer or bool is that value, in its dtype
    **{(op, kind): "{0}" for op in ("floor", "ceil", "trunc", "rint")
       for kind in ("int", "bool")},
    # C's signbit takes floats only: an integer's sign bit is x < 0
    ("signbit", "operand-int"): "(({0}) < 0)",
    # NumPy's float loops take 180.0f / pi as a float division, not 180 / pi rounded
    **{("rad2deg", dt): "(({0}) * 57.295776)" for dt in ("float16", "float32")},
    # ml_dtypes' bfloat16 sign returns a zero as it is (-0.0 stays -0.0)
    ("sign", "bfloat16"): "(({0}) > 0 ? 1 : (({0}) < 0 ? -1 : ({0})))",
}

#: Ops generated only for float results, and why.
_FLOAT_ONLY = {
    "reciprocal": "integer reciprocal (NumPy's 1/x of ints, x = 0 included) is not "
                  "generated; runs through CuPy",
    "fmod": "integer fmod (NumPy's result for a zero divisor is 0; C's is undefined) is "
            "not generated; runs through CuPy",
}


def float_only_refusal(n: Node) -> str:
    """Why elementwise node ``n`` is not generated for its (non-float) result dtype, or
    ``""`` (bfloat16 counts as a float: it is computed in float)."""
    if n.op not in _FLOAT_ONLY or (ct.is_supported(n.dtype, elementwise=True)
                                   and ct.compute_type(n.dtype) in ("float", "double")):
        return ""
    return _FLOAT_ONLY[n.op]


#: Ops whose operands are read as they are, not converted to the (bool) result.
_AS_IS = frozenset({"isnan", "isinf", "isfinite", "signbit"})


# -- naming and bodies -------------------------------------------------------------------
def kernel_name(node: Node, default: str | None = None) -> str:
    """A C identifier for ``node``'s kernel: ``attrs["name"]`` or ``<op>_<id>``."""
    raw = str(node.attrs.get("name") or default or f"{node.op}_{node.id}")
    name = re.sub(r"[^0-9A-Za-z_]", "_", raw)
    if not name or name[0].isdigit():
        name = f"k_{name}"
    return name


def body_of(node: Node, graph: Graph) -> tuple[Graph, tuple[str, ...]]:
    """The body graph and op names of a ``fused`` node or of one elementwise op.

    A lone elementwise node gets a one-op body with an input per operand, so both go
    through the same generator.
    """
    if node.op == "fused":
        body = node.attrs["body"]
        ops = tuple(node.attrs.get("ops") or tuple(
            n.op for n in body if n.op not in ("input", "constant")))
        return body, ops
    body = Graph(name=kernel_name(node))
    ids = []
    for k, i in enumerate(node.inputs):
        src = graph.node(i)
        ids.append(body.add("input", (), {"index": k}, shape=src.shape, dtype=src.dtype).id)
    out = body.add(node.op, ids, dict(node.attrs), shape=node.shape, dtype=node.dtype)
    body.outputs = [out.id]
    return body, (node.op,)


def epilogue_body(out_shape: tuple[int, ...], product_dtype: Any,
                  bias: tuple[tuple[int, ...], Any] | None, activation: str | None) -> Graph:
    """The body of a GEMM epilogue: ``activation(product + bias)`` over the product."""
    body = Graph(name="epilogue")
    cur = body.add("input", (), {"index": 0}, shape=tuple(out_shape), dtype=product_dtype)
    if bias is not None:
        b = body.add("input", (), {"index": 1}, shape=tuple(bias[0]), dtype=bias[1])
        cur = body.add("add", [cur.id, b.id])
    if activation:
        cur = body.add(activation, [cur.id])
    body.outputs = [cur.id]
    return body


def check_elementwise(body: Graph, in_shapes: Sequence[tuple[int, ...]],
                      in_dtypes: Sequence[Any], out_shape: tuple[int, ...],
                      out_dtype: Any) -> str:
    """Why ``body`` cannot be generated, or ``""`` when it can."""
    if len(body.inputs) != len(in_shapes):
        return (f"the body has {len(body.inputs)} inputs but the node has "
                f"{len(in_shapes)}")
    for k, (bid, shape, dtype) in enumerate(zip(body.inputs, in_shapes, in_dtypes,
                                                strict=True)):
        bnode = body.node(bid)
        if tuple(bnode.shape) != tuple(shape) or bnode.dtype != np.dtype(dtype):
            return (f"body input {k} is {bnode.type_text} but the node's input is "
                    f"{dtype_short(dtype)}{list(shape)}")
    for n in body:
        if not ct.is_supported(n.dtype, elementwise=True):
            return f"dtype {n.dtype.name} ({n.op}) is not generated; runs through CuPy"
        if n.op == "input":
            continue
        if n.op == "constant":
            if np.ndim(n.attrs.get("value")) != 0:
                return "a non-scalar constant inside a fused body is not generated"
            continue
        if n.op in VIEW_OPS or n.op in ("concatenate", "gather"):
            continue  # views and gathers of inputs, an output concatenation: analyse()
        opdef = REGISTRY.get(n.op)
        if opdef is None or opdef.kind != "elementwise" or opdef.cuda is None:
            return f"op {n.op!r} inside a fused body has no CUDA template"
        if why := float_only_refusal(n):
            return why
        for i in n.inputs:
            if not ct.is_supported(body.node(i).dtype, elementwise=True):
                return f"dtype {body.node(i).dtype.name} is not generated"
    pieces = analyse(body)
    if isinstance(pieces, str):
        return pieces
    for piece in pieces:
        for load in piece.loads:
            if not broadcasts_to(load.shape, piece.shape):
                what = body.node(load.node)
                return (f"{what.op} %{what.id} of shape {load.shape} does not broadcast to "
                        f"{piece.shape}" + (" (it is larger)" if len(load.shape) <= len(
                            piece.shape) else ""))
    out = body.node(body.outputs[0])
    if tuple(out.shape) != tuple(out_shape):
        return f"the body's output is {out.type_text} but the node's is {list(out_shape)}"
    for extra in body.outputs[1:]:
        if not ct.is_supported(body.node(extra).dtype, elementwise=True):
            return f"dtype {body.node(extra).dtype.name} is not generated; runs through CuPy"
    if out.dtype != np.dtype(out_dtype):
        return f"the body's output is {out.type_text} but the node's dtype is " \
               f"{np.dtype(out_dtype).name}"
    if not ct.is_supported(out_dtype, elementwise=True):
        return f"dtype {np.dtype(out_dtype).name} is not generated; runs through CuPy"
    return ""


# -- the body as a device function -------------------------------------------------------
def _template(n: Node, body: Graph | None = None) -> str:
    kind = "int" if n.dtype.name in _INT else "bool" if n.dtype.kind == "b" else "other"
    keys = [(n.op, n.dtype.name), (n.op, kind), (n.op, "any")]
    if body is not None and n.inputs and body.node(n.inputs[0]).dtype.kind in "iub":
        keys.insert(0, (n.op, "operand-int"))
    for key in keys:
        if key in _OVERRIDES:
            return _OVERRIDES[key]
    template = REGISTRY[n.op].cuda
    assert template is not None
    return template


def _operand_dtypes(n: Node, body: Graph) -> list[np.dtype | None]:
    """The dtype each operand is converted to before the op (None: as it is)."""
    ins = [body.node(i).dtype for i in n.inputs]
    if n.op in _COMPARISONS:
        common = np.result_type(*ins)
        return [common] * len(ins)
    if n.op == "where":
        return [None, n.dtype, n.dtype]
    if n.op == "astype" or n.op in _AS_IS:
        return [None] * len(ins)
    return [n.dtype] * len(ins)


_EXP_CALL = re.compile(r"(?<![\w.])exp\(")
_FLOAT_LITERAL = re.compile(r"(?<![\w.{])(\d+\.\d+(?:[eE][+-]?\d+)?)(?![\w.])")


def _result(expr: str, dtype: np.dtype) -> str:
    """The value of an op's C expression as a ``dtype`` result (float16: rounded)."""
    if dtype.name == "float16":
        return f"pyc_round_f16({expr})"
    if dtype.name == "bfloat16":
        return f"pyc_round_bf16({expr})"
    return expr


def node_expression(n: Node, body: Graph, var: dict[int, str], needs: set[str]) -> str:
    """The C expression of elementwise body node ``n`` in its compute type.

    Operands are named by ``var`` (body node id -> C name, each in its node's compute
    type) and converted to the op's operand dtypes first; a float16 result is rounded to
    float16 as NumPy rounds it. The helper sections the expression needs are added to
    ``needs``. Shared by the elementwise kernels and the fused row kernels.
    """
    targets = _operand_dtypes(n, body)
    operands = []
    for i, target in zip(n.inputs, targets, strict=True):
        src = body.node(i)
        operands.append(var[i] if target is None else ct.convert(var[i], src.dtype, target))
    template = _template(n, body)
    if ct.compute_type(n.dtype) == "float":
        # The registry's templates write constants as C doubles (0.5); in float
        # arithmetic they must be float literals (0.5f), or the whole expression —
        # tanh included — is evaluated in slow double precision.
        template = _FLOAT_LITERAL.sub(r"\1f", template)
    if "pyc_ipow" in template:
        needs.add("ipow")
    if "pyc_abs" in template:
        needs.add("abs")
    if any(f in template for f in ("pyc_floor_divide", "pyc_remainder", "_shift(")):
        needs.add("divmod")
    template = _EXP_CALL.sub(ct.exp_function(n.dtype) + "(", template)
    if n.op == "divide":
        return _result(ct.divide(*operands, n.dtype), n.dtype)
    return _result(template.format(*operands), n.dtype)


def _device_function(fname: str, body: Graph, out_dtype: np.dtype, root: int,
                     loads: Sequence[Load]) -> tuple[str, set[str]]:
    """``__device__`` function computing body node ``root`` from one parameter per load;
    also the helper sections it needs."""
    needs: set[str] = set()
    pos = {nid: k for k, nid in enumerate(body.nodes)}
    var: dict[int, str] = {}
    params = []
    for k, load in enumerate(loads):
        var[load.node] = f"a{k}"
        params.append(f"{ct.compute_type(body.node(load.node).dtype)} a{k}")
    wanted: set[int] = set()
    stack = [root]
    while stack:  # the nodes root needs, stopping at the loads
        nid = stack.pop()
        if nid in wanted or nid in var:
            continue
        wanted.add(nid)
        stack.extend(body.node(nid).inputs)
    lines = []
    for n in body:
        if n.id not in wanted:
            continue
        name = f"v{pos[n.id]}"
        ctype = ct.compute_type(n.dtype)
        if n.op == "constant":
            lines.append(f"    const {ctype} {name} = {ct.literal(n.attrs['value'], n.dtype)};"
                         f"  // constant {n.type_text}")
        else:
            expr = node_expression(n, body, var, needs)
            lines.append(f"    const {ctype} {name} = {expr};  // {n.op} -> {n.type_text}")
        var[n.id] = name
    out = body.node(root)
    ret = ct.convert(var[out.id], out.dtype, out_dtype)
    sig = ", ".join(params) if params else "void"
    text = (f"__device__ __forceinline__ {ct.compute_type(out_dtype)} {fname}({sig})\n{{\n"
            + "\n".join([*lines, f"    return {ret};"]) + "\n}\n")
    return text, needs


def generate_elementwise(name: str, body: Graph, in_shapes: Sequence[tuple[int, ...]],
                         in_dtypes: Sequence[Any], out_shape: tuple[int, ...],
                         out_dtype: Any, ops: tuple[str, ...], *, kind: str = "elementwise",
                         inplace: bool = False, title: str = "") -> KernelSource:
    """The CUDA source of an elementwise body over static shapes.

    Parameters
    ----------
    name
        Kernel base name (a C identifier): the general kernel is ``name``, the vectorised
        one ``name + "_vec"``.
    body
        Graph of elementwise ops and 0-d constants over its inputs, with one output; it
        may read views of its inputs and its output may be a concatenation
        (:mod:`pyc_lab.compiler.views`).
    in_shapes, in_dtypes
        The operands (C-contiguous at run time).
    out_shape, out_dtype
        The result.
    ops
        Op names, for the header and :class:`KernelSource`.
    kind
        ``KernelSource.kind`` (``"elementwise"`` or ``"epilogue"``).
    inplace
        The output may be the same memory as an operand of the output's shape read only
        at each element's own position: no ``__restrict__`` anywhere (element ``i`` is
        read before it is written, by the same thread).
    title
        Extra header line.
    """
    out_dtype = np.dtype(out_dtype)
    in_dtypes = [np.dtype(d) for d in in_dtypes]
    out_shape = tuple(int(d) for d in out_shape)
    in_shapes = [tuple(int(d) for d in s) for s in in_shapes]
    why = check_elementwise(body, in_shapes, in_dtypes, out_shape, out_dtype)
    if why:
        raise ValueError(f"{name}: {why}")
    pieces = analyse(body)
    assert not isinstance(pieces, str)
    n = int(np.prod(out_shape, dtype=np.int64))
    largest = max([n, *(int(np.prod(s, dtype=np.int64)) for s in in_shapes)])
    itype, sfx = idx_type(largest)
    out_dtypes = [out_dtype] + [body.node(o).dtype for o in body.outputs[1:]]
    parts = parts_of(name, pieces, body, out_dtypes, _device_function)
    itemsizes = [d.itemsize for d in out_dtypes] + [d.itemsize for part in parts
                                        for d, a in zip(part.dtypes, part.along, strict=True)
                                        if a]
    vec = 16 // max(itemsizes)
    vec_ok = n > 0 and vec > 1 and all(part.vector_ok(vec) for part in parts)
    if len(parts) == 1 and parts[0].n < vec:
        vec_ok = False
    n_vec = sum(part.n // vec for part in parts) if vec_ok else 0

    needs = set().union(*(part.needs for part in parts))
    all_dtypes = {*(d.name for d in out_dtypes), *(d.name for d in in_dtypes),
                  *(nd.dtype.name for nd in body)}
    restrict = "" if inplace else " __restrict__"
    params = [f"const {ct.storage_type(d)}*{restrict} in{k}" for k, d in enumerate(in_dtypes)]
    params.append(f"{ct.storage_type(out_dtype)}*{restrict} out")
    params += [f"{ct.storage_type(d)}*{restrict} out{k}" for k, d in enumerate(out_dtypes)
               if k]
    signature = ", ".join(params)

    def grid_loop(var: str, start: str, limit: str, body_lines: list[str]) -> list[str]:
        head = f"    for ({itype} {var} = {start}; {var} < {limit}; {var} += stride) {{"
        return [head, *body_lines, "    }"]

    tid = f"static_cast<{itype}>(blockIdx.x) * blockDim.x + threadIdx.x"
    stride_line = f"    const {itype} stride = static_cast<{itype}>(blockDim.x) * gridDim.x;"
    general = [f'extern "C" __global__ void __launch_bounds__({BLOCK})',
               f"{name}({signature})", "{", stride_line]
    for p, part in enumerate(parts):
        if part.n == 0:
            continue
        limit = "n" if len(parts) == 1 else f"n{p}"
        general.append(f"    const {itype} {limit} = {part.n}{sfx};" + pieces_note(part, p,
                                                                              len(parts)))
        general += grid_loop("i", tid, limit,
                             part.element_lines("i", "        ", itype, sfx))
    general.append("}")

    vec_lines: list[str] = []
    aligned_inputs: list[int] = []
    align_bytes: dict[str, int] = {}
    if vec_ok:
        aligned_inputs = sorted({ld.param for part in parts
                                 for ld, a in zip(part.loads, part.along, strict=True) if a})
        align_bytes = {"out": vec * out_dtype.itemsize,
                       **{f"out{k}": vec * d.itemsize for k, d in enumerate(out_dtypes) if k},
                       **{f"in{k}": vec * in_dtypes[k].itemsize for k in aligned_inputs}}
        vec_lines = [f'extern "C" __global__ void __launch_bounds__({BLOCK})',
                     f"{name}_vec({signature})", "{", stride_line]
        for p, part in enumerate(parts):
            if part.n == 0:
                continue
            pv = part.n // vec
            nv_name = "n_vec" if len(parts) == 1 else f"n_vec{p}"
            vec_lines += [
                f"    const {itype} {nv_name} = {pv}{sfx};  // vectors of {vec} elements"
                + (f" (loop {p})" if len(parts) > 1 else ""),
                f"    for ({itype} iv = {tid}; iv < {nv_name}; iv += stride) {{",
                f"        const {itype} i = iv * {vec}{sfx};",
                *part.vector_lines(vec, itype, sfx),
                "    }",
            ]
            if part.n % vec:
                limit = "n" if len(parts) == 1 else f"n{p}"
                vec_lines += [
                    f"    // the last {part.n % vec} element(s), one per thread",
                    f"    const {itype} {limit} = {part.n}{sfx};",
                    *grid_loop("i", f"{nv_name} * {vec}{sfx} + {tid}", limit,
                               part.element_lines("i", "        ", itype, sfx)),
                ]
        vec_lines.append("}")

    # -- header and assembly --
    ins_text = ", ".join(f"in{k} {dtype_short(d)}{list(s)}"
                         for k, (d, s) in enumerate(zip(in_dtypes, in_shapes, strict=True)))
    header = [
        f"// pyc_lab generated kernel {name} ({kind})",
        f"// ops: {', '.join(ops)}",
    ]
    if title:
        header.append(f"// {title}")
    header.append(f"// out {dtype_short(out_dtype)}{list(out_shape)} <- {ins_text or 'no inputs'}")
    for part in parts:
        where = (f"{len(part.pieces)} piece(s) of {part.n} elements at output offsets "
                 f"{[piece.out_offset for piece in part.pieces]}" if len(pieces) > 1
                 else f"{n} elements")
        reads = "".join(
            f", in{ld.param}" + (f"+{ld.offset}" if ld.offset else "") + f" {s}"
            for ld, s in zip(part.loads, part.in_str, strict=True))
        header.append(f"// layout: {where} as {part.dims}; strides (elements, 0 = "
                      f"broadcast): out {part.out_str}{reads}")
    header.append(f"// {name}: grid-stride loop, any alignment"
                  + (f"; {name}_vec: {vec} elements per aligned access "
                     f"({vec * max(itemsizes)} bytes)" if vec_ok else "; no vectorised variant"))
    if inplace:
        header.append("// in place: out may be an input's memory, so no pointer is "
                      "restrict-qualified")
    sections = ["\n".join(header)]
    if "float16" in all_dtypes:
        sections += [ct.helper("f16")]
    if "bfloat16" in all_dtypes:
        sections += [ct.helper("bf16")]
    if vec_ok:
        sections += [ct.helper("vec")]
    sections += [ct.helper(section) for section in ("ipow", "abs", "divmod")
                 if section in needs]
    sections += [func for part in parts for func in part.funcs]
    sections += ["\n".join(general) + "\n"]
    if vec_ok:
        sections += ["\n" + "\n".join(vec_lines) + "\n"]
    source = "\n".join(s.rstrip("\n") + "\n" if s else "" for s in sections)
    dims = parts[0].dims if len(pieces) == 1 else [n]
    gathers = sum(1 for part in parts for ld in part.loads if ld.gather is not None)
    views = sum(1 for part in parts for ld in part.loads if not ld.direct) - gathers
    launch = {
        "n": n, "block": BLOCK, "vec": vec if vec_ok else 0,
        "vec_kernel": f"{name}_vec" if vec_ok else None, "n_vec": n_vec,
        "align_bytes": align_bytes, "aligned_inputs": aligned_inputs,
        "dims": list(dims), "inplace": inplace, "outputs": len(out_dtypes),
    }
    notes = (f"{n} elements, layout {dims}"
             + (f" in {len(pieces)} pieces of a concatenation" if len(pieces) > 1 else "")
             + (f"; {views} view(s) read in place" if views else "")
             + (f"; {gathers} gather(s): indices read first, out-of-range ones wrapped "
                "modulo the axis (as CuPy's take)" if gathers else "")
             + "; " + (f"vectorised by {vec} when aligned" if vec_ok else "scalar only"))
    return KernelSource(name=name, kind=kind, source=source, ops=tuple(ops), notes=notes,
                        entries=(name, f"{name}_vec") if vec_ok else (name,), launch=launch)


def activation_ok(activation: str | None) -> str:
    """Why ``activation`` cannot be an epilogue, or ``""``."""
    if activation and activation not in ACTIVATIONS:
        return f"activation {activation!r} is not one of {sorted(ACTIVATIONS)}"
    if activation and REGISTRY.get(activation) is None:
        return f"activation {activation!r} has no elementwise op"
    return ""


def log_source(src: KernelSource) -> None:
    """Log a generated source at DEBUG level."""
    log.debug("generated %s (%s):\n%s", src.name, src.kind, src.source)
