"""Row-program kernels: a ``fused_rows`` node (row fusion) as one row kernel.

The body is a small graph over a row space ``X`` reduced over some of its axes (see
:mod:`pyc_lab.compiler.passes.row_fusion`; the space's geometry is :mod:`.row_space`):
elementwise ops on *full* values (one per element), reductions over those axes
(``sum``/``mean``/``max``/``min``) that make *row* values (one per row), elementwise ops
on row values, and 0-d constants. When the last axis is reduced, each row is handled by a
warp or a block, as the plain row kernels (:mod:`.reduction`) are; otherwise (a *column
program*) a block's lanes take neighbouring rows and the threads sharing a row combine
through shared memory (:func:`~.row_space.column_config`). In either layout the
program runs in *phases*: phase ``p`` walks the row once, computing the full values that
the reductions of level ``p + 1`` read (a reduction's level is one more than the
deepest reduction under it) and accumulating them; the partial results are combined
across the threads of the row (warp shuffles, shared memory across warps, a fixed order
so results are deterministic), and the row values depending on them are computed. A
full result is written by the walk that computes it; a row result, and the row values the
body returns besides it (its outputs 1, 2, ...: statistics read elsewhere), are written
by the row's first thread.

When the row fits in registers every thread keeps its values of the full values that a
later phase reads again (the loaded inputs first, then the computed values) in unrolled
local arrays, up to a register budget; what is not kept is recomputed from its inputs,
and without registers the row is re-read each phase (usually from L1/L2).

Every op computes what NumPy computes: elementwise ops as in the elementwise kernels
(operands converted to the op's dtype, float16 results rounded), float16 and bfloat16
sums and means accumulated in float32 and rounded once (``np.mean`` divides first; for
bfloat16 as the reductions' reference does, not NumPy's bfloat16 loop), ``max``/``min``
propagating NaN. Inputs broadcast to the value that reads them as NumPy broadcasts: to
``X`` for full and ``keepdims`` row values, to ``X`` without the reduced axes for row
values without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir import Graph, Node, dtype_short
from ..ops import REGISTRY, is_plain_reduction, normalize_axis
from . import cuda_types as ct
from .cuda_types import KernelSource
from .elementwise import float_only_refusal, kernel_name, node_expression
from .reduction import _Emitter, row_config
from .row_space import (
    Terms,
    across_memory,
    along,
    check_axes,
    col_offset,
    column_config,
    contiguous,
    inner_extent,
    kept_dims,
    kind_in,
    last_axes,
    reduced_ones,
    row_offset,
    strides_over,
    trailing,
)

__all__ = ["ROW_REDUCTIONS", "SHORT_ROW", "check_axes", "check_row_program", "column_config",
           "generate_row_program", "kind_in", "short_row_config"]

#: Reductions a row program computes.
ROW_REDUCTIONS = ("sum", "mean", "max", "min")

#: Rows along memory of at most this many values are each one thread's
#: (:func:`short_row_config`): a warp per row of 3 values took 1.65 ms for 2^24 rows on the
#: H100 against CuPy's 0.42 ms; a thread per row normalised the same 3-D vectors 3.76x and
#: took a softmax over 4 classes 3.43x faster than CuPy (``benchmarks/exp_library_twins.py``).
SHORT_ROW = 16

#: Reader kind -> the kinds of computed values it may read (scalars always).
_READS = {"full": ("full", "row1"), "row1": ("row1",), "row": ("row",)}

#: Values kept in registers per thread (4-byte values; half as many doubles).
_REGISTER_VALUES = 64


@dataclass
class _Access:
    """How one input is read by readers of one kind: its strides over the row dims
    and the terms finding its elements along the row (``col``; none for a value
    constant along it)."""

    k: int
    mode: str  # "X": broadcast to X (full and keepdims readers); "R": to the row dims
    row_strides: list[int]
    col: Terms
    name: str = ""


@dataclass
class _Plan:
    body: Graph
    space: tuple[int, ...]
    axes: tuple[int, ...] = ()
    kind: dict[int, str] = field(default_factory=dict)
    level: dict[int, int] = field(default_factory=dict)
    access: dict[tuple[int, str], _Access] = field(default_factory=dict)
    phases: int = 0
    out_level: int = 0  # the phase whose walk along the row writes a full result

    @property
    def dims(self) -> tuple[int, ...]:
        """The row dims: the space without the reduced axes."""
        return kept_dims(self.space, self.axes)

    @property
    def cols(self) -> int:
        """Values per row: the product of the reduced axes."""
        return int(np.prod([self.space[j] for j in self.axes], dtype=np.int64))

    @property
    def column(self) -> bool:
        """Whether the rows run across memory: a column program."""
        return across_memory(self.space, self.axes)

    @property
    def trailing(self) -> bool:
        """Whether the reduced axes are the last ones: rows lie one after another."""
        return trailing(self.space, self.axes)

    @property
    def out_strides(self) -> tuple[list[int], Terms]:
        """A C-contiguous full output's strides over the row dims and terms along the
        row."""
        cont = contiguous(self.space)
        return ([cont[j] for j in range(len(self.space)) if j not in self.axes],
                along(cont, self.space, self.axes))


def _reader_mode(kind: str) -> str:
    return "R" if kind == "row" else "X"


def _analyse(body: Graph, space: tuple[int, ...],
             axes: tuple[int, ...] | None = None) -> tuple[_Plan | None, str]:
    """The kinds, levels and input accesses of a body, or None and why it is not a row
    program."""
    space = tuple(space)
    if len(space) < 1 or 0 in space:
        return None, f"row space {space} is empty"
    axes = last_axes(space) if axes is None else tuple(axes)
    if why := check_axes(space, axes):
        return None, why
    plan = _Plan(body, space, axes)
    if not body.outputs:
        return None, "a row program without outputs"
    if plan.cols >= 2**31:
        return None, f"rows of {plan.cols} elements are too long"
    index = {bid: k for k, bid in enumerate(body.inputs)}
    for n in body:
        if not ct.is_supported(n.dtype, elementwise=True):  # bfloat16 included
            return None, f"dtype {n.dtype.name} ({n.op}) is not generated"
        if n.op == "input":
            plan.level[n.id] = 0
            continue
        if n.op == "constant":
            if np.ndim(n.attrs.get("value")) != 0:
                return None, "a non-scalar constant inside a row program"
            plan.kind[n.id] = "scalar"
            plan.level[n.id] = 0
            continue
        kind = kind_in(n.shape, space, axes)
        operands = [body.node(i) for i in n.inputs]
        if n.op in ROW_REDUCTIONS:
            x = operands[0] if operands else None
            if x is None or not is_plain_reduction(n) or kind not in ("row1", "row"):
                return None, f"{n.op} %{n.id} is not a plain reduction of a row"
            if tuple(x.shape) != tuple(space) or normalize_axis(
                    n.attrs.get("axis"), len(space)) != axes:
                return None, f"{n.op} %{n.id} does not reduce the rows' axes {axes}"
            if not all(d.kind == "f" or d.name == "bfloat16" for d in (x.dtype, n.dtype)):
                return None, f"{n.op} %{n.id} of {x.dtype.name} is not generated"
            want = reduced_ones(space, axes) if n.attrs.get("keepdims") else \
                kept_dims(space, axes)
            if tuple(n.shape) != want and len(space) > 1:
                return None, f"{n.op} %{n.id} has an unexpected shape"
            readers = {n.inputs[0]: "X"}
            plan.level[n.id] = plan.level[n.inputs[0]] + 1
        else:
            opdef = REGISTRY.get(n.op)
            if opdef is None or opdef.kind != "elementwise" or opdef.cuda is None:
                return None, f"op {n.op!r} inside a row program has no CUDA template"
            if why := float_only_refusal(n):
                return None, why
            if kind not in _READS:
                return None, (f"{n.op} %{n.id} of shape {tuple(n.shape)} is neither a full "
                              f"nor a row value of {tuple(space)}")
            readers = {i: _reader_mode(kind) for i in n.inputs}
            plan.level[n.id] = max((plan.level[i] for i in n.inputs), default=0)
        plan.kind[n.id] = kind if kind else "row"
        for i, mode in readers.items():
            src = body.node(i)
            if src.op == "input":
                target = space if mode == "X" else plan.dims
                if n.op not in ROW_REDUCTIONS and plan.kind[n.id] == "row1":
                    target = reduced_ones(space, axes)
                strides = strides_over(tuple(src.shape), target)
                if strides is None:
                    return None, (f"input {index[i]} of shape {tuple(src.shape)} does not "
                                  f"broadcast to {target}")
                if mode == "X":
                    row = [st for j, st in enumerate(strides) if j not in axes]
                    col = along(strides, space, axes) if target == space else ()
                else:
                    row, col = strides, ()
                acc = plan.access.setdefault((i, mode), _Access(index[i], mode, row, col))
                if acc.row_strides != row or acc.col != col:  # pragma: no cover
                    return None, f"input {index[i]} is read two ways"
            else:
                sk = plan.kind[i]
                want = plan.kind[n.id] if n.op not in ROW_REDUCTIONS else "red"
                if want == "red":
                    if sk != "full":
                        return None, f"{n.op} %{n.id} reduces a {sk} value"
                elif sk != "scalar" and sk not in _READS[want]:
                    return None, (f"{n.op} %{n.id} ({want}) reads %{i}, a {sk} value: "
                                  "not a broadcast along the row")
    out = body.node(body.outputs[0])
    if out.op in ("input", "constant") or plan.kind.get(out.id) not in _READS:
        return None, "the program's output is not a full or row value"
    for k, o in enumerate(body.outputs[1:], start=1):
        if body.node(o).op in ("input", "constant") or plan.kind.get(o) not in ("row", "row1"):
            return None, f"the program's output {k} is not a row value"
    plan.out_level = plan.level[out.id]
    plan.phases = max(plan.level[o] for o in body.outputs)
    if plan.phases == 0:
        return None, "a row program without a reduction"
    return plan, ""


def check_row_program(body: Graph, space: tuple[int, ...], in_shapes: list[tuple[int, ...]],
                      in_dtypes: list[Any], axes: tuple[int, ...] | None = None) -> str:
    """Why ``body`` over row space ``space``, reduced over ``axes`` (default: the last
    axis), cannot be generated, or ``""``."""
    if len(body.inputs) != len(in_shapes):
        return f"the body has {len(body.inputs)} inputs but the node has {len(in_shapes)}"
    for k, (bid, shape, dtype) in enumerate(zip(body.inputs, in_shapes, in_dtypes,
                                                strict=True)):
        b = body.node(bid)
        if tuple(b.shape) != tuple(shape) or b.dtype != np.dtype(dtype):
            return (f"body input {k} is {b.type_text} but the node's input is "
                    f"{dtype_short(dtype)}{list(shape)}")
    _plan, why = _analyse(body, tuple(space), axes)
    return why


# -- generation -------------------------------------------------------------------------------
class _Writer:
    """Emits one entry point (scalar or vectorised) of a row program's kernel."""

    def __init__(self, plan: _Plan, in_dtypes: list[np.dtype], out_dtype: np.dtype,
                 cfg: dict[str, Any], vec: int, acc_dt: np.dtype) -> None:
        self.p = plan
        self.body = plan.body
        self.in_dtypes = in_dtypes
        self.out_dtype = out_dtype
        self.cfg = cfg
        self.vec = vec
        self.acc_dt = acc_dt
        self.cols = plan.cols
        self.em = _Emitter(self.cols, cfg, ct.compute_type(acc_dt), vec)
        self.cached_mode = cfg["cached"] or vec > 1
        self.needs: set[str] = set()
        self.keep: set[Any] = set()      # values kept in registers (ids, ("in", key))
        self.first: dict[Any, int] = {}  # value -> the phase it is first computed in
        self.closures: list[list[Any]] = []
        self._plan_phases()

    # -- planning -----------------------------------------------------------------------
    def _full(self, nid: int) -> bool:
        return self.p.kind.get(nid) == "full"

    def _ref(self, i: int) -> Any:
        """The full value body node ``i`` stands for: its id, or ``("in", i)`` for the
        element of an input read along the row."""
        return ("in", i) if self.body.node(i).op == "input" else i

    def _roots(self, phase: int) -> list[Any]:
        body = self.body
        roots = [self._ref(n.inputs[0]) for n in body if n.op in ROW_REDUCTIONS
                 and self.p.level[n.id] == phase + 1]
        out = body.outputs[0]
        if phase == self.p.out_level and self._full(out):
            roots.append(out)
        return roots

    def _plan_phases(self) -> None:
        budget = _REGISTER_VALUES * 4 // max(self.acc_dt.itemsize, 4)
        per = self.em.per_thread
        kept = 0
        for phase in range(self.p.phases + 1):
            seen: list[Any] = []
            stack = list(reversed(self._roots(phase)))
            visited: set[Any] = set()
            while stack:
                v = stack.pop()
                if v in visited:
                    continue
                visited.add(v)
                if v in self.first and self.first[v] < phase:
                    if v in self.keep:
                        seen.append(v)
                        continue
                    if self.cached_mode and kept + per <= budget:
                        self.keep.add(v)
                        kept += per
                        seen.append(v)
                        continue
                seen.append(v)
                self.first.setdefault(v, phase)
                if isinstance(v, tuple):
                    continue
                n = self.body.node(v)
                for i in n.inputs:
                    src = self.body.node(i)
                    if src.op == "input":
                        acc = self.p.access[(i, "X" if self.p.kind[v] != "row" else "R")]
                        if acc.col:
                            stack.append(("in", i))
                    elif self._full(i):
                        stack.append(i)
            self.closures.append(seen)

    # -- names --------------------------------------------------------------------------
    def _value(self, v: Any, phase: int) -> str:
        """The C name of full value ``v`` inside the loop of ``phase``."""
        if v in self.keep and self.first[v] < phase:
            return f"c{self._tag(v)}[k]"
        return f"v{self._tag(v)}" if not isinstance(v, tuple) else f"x{self._tag(v)}"

    def _tag(self, v: Any) -> str:
        if isinstance(v, tuple):
            i = v[1]
            return f"{self.p.access[(i, 'X')].k}X"
        return str(v)

    def _operands(self, n: Node, phase: int | None) -> dict[int, str]:
        """Body id -> C name for ``n``'s operands (in a phase's loop, or row code)."""
        names: dict[int, str] = {}
        nk = self.p.kind[n.id] if n.op not in ROW_REDUCTIONS else "full"
        for i in n.inputs:
            src = self.body.node(i)
            if src.op == "input":
                mode = "R" if nk == "row" else "X"
                acc = self.p.access[(i, mode)]
                if acc.col and phase is not None:
                    names[i] = self._value(("in", i), phase)
                else:
                    names[i] = f"x{acc.k}{mode}"
            elif src.op == "constant":
                names[i] = f"k{i}"
            elif self._full(i):
                assert phase is not None
                names[i] = self._value(i, phase)
            else:
                names[i] = f"r{i}"
        return names

    # -- emission -----------------------------------------------------------------------
    def _reduce(self, var: str, op: str, identity: str) -> str:
        if self.cfg["mode"] == "warp":
            return f"{var} = pyc_warp_reduce({var}, pyc_{op}_op());"
        if self.cfg["mode"] == "column":
            return (f"{var} = pyc_column_reduce<{self.cfg['tx']}, {self.cfg['threads']}>"
                    f"({var}, pyc_{op}_op(), smem);")
        return f"{var} = pyc_block_reduce({var}, pyc_{op}_op(), {identity}, smem);"

    def _loop(self, phase: int, reds: list[Node]) -> list[str]:
        body = self.body
        vector = self.vec > 1
        loads: list[tuple[str, str, str]] = []
        lines: list[str] = []
        seen = self.closures[phase]
        order = {nid: k for k, nid in enumerate(body.nodes)}
        todo = [v for v in seen if not (v in self.keep and self.first[v] < phase)]
        for v in sorted([v for v in todo if isinstance(v, tuple)], key=lambda t: t[1]):
            i = v[1]
            acc = self.p.access[(i, "X")]
            dt = self.in_dtypes[acc.k]
            name = f"x{acc.k}X"
            if vector:
                loads.append((f"{name}_in", f"in{acc.k}r", ct.storage_type(dt)))
                elem = f"{name}_in.v[e]"
            else:
                elem = f"in{acc.k}r[{col_offset('col', acc.col, self.cols)}]"
            lines.append(f"const {ct.compute_type(dt)} {name} = {ct.from_storage(dt, elem)};")
            if v in self.keep:
                lines.append(f"c{self._tag(v)}[k] = {name};")
        for v in sorted([v for v in todo if not isinstance(v, tuple)], key=order.__getitem__):
            n = body.node(v)
            expr = node_expression(n, body, self._operands(n, phase), self.needs)
            lines.append(f"const {ct.compute_type(n.dtype)} v{v} = {expr};  // {n.op}")
            if v in self.keep:
                lines.append(f"c{v}[k] = v{v};")
        for r in reds:
            x = body.node(r.inputs[0])
            val = ct.convert(self._value(self._ref(x.id), phase), x.dtype, self.acc_dt)
            if r.op in ("sum", "mean"):
                lines.append(f"a{r.id} += {val};")
            else:
                lines.append(f"a{r.id} = pyc_{r.op}_op()(a{r.id}, {val});")
        store = None
        out = body.node(body.outputs[0])
        if phase == self.p.out_level and self._full(out.id):
            value = ct.to_storage(self.out_dtype, self._value(out.id, phase))
            if vector:
                store = ("yout", "yr", ct.storage_type(self.out_dtype))
                lines.append(f"yout.v[e] = {value};")
            else:
                where = "col" if self.p.trailing and not self.p.column else col_offset(
                    "col", self.p.out_strides[1], self.cols)
                # lanes taking rows: a lane past the last row writes nothing
                live = "if (live) " if self.cfg["mode"] == "column" else ""
                lines.append(f"{live}yr[{where}] = {value};")
        return self.em.loop(lines, loads=tuple(loads), store=store)

    def _identity(self, op: str) -> str:
        if op == "max":
            return ct.lowest(self.acc_dt)
        if op == "min":
            return ct.highest(self.acc_dt)
        return ct.literal(0, self.acc_dt)

    def _row_values(self, level: int) -> list[str]:
        """Row-kind nodes of ``level`` that are not reductions, in order."""
        lines = []
        for n in self.body:
            if n.op in ("input", "constant") or n.op in ROW_REDUCTIONS:
                continue
            if self.p.kind[n.id] in ("row1", "row", "scalar") and self.p.level[n.id] == level:
                expr = node_expression(n, self.body, self._operands(n, None), self.needs)
                lines.append(f"        const {ct.compute_type(n.dtype)} r{n.id} = {expr};"
                             f"  // {n.op}")
        return lines

    def kernel(self, entry: str, params: list[str]) -> str:
        body, p = self.body, self.p
        acc = ct.compute_type(self.acc_dt)
        cols = self.cols
        rows = int(np.prod(p.dims, dtype=np.int64))
        lines: list[str] = []
        # per-row pointers and values
        dims = p.dims
        for (_i, mode), a in sorted(p.access.items(), key=lambda t: (t[1].k, t[1].mode)):
            dt = self.in_dtypes[a.k]
            off = row_offset(a.row_strides, dims)
            if a.col:
                lines.append(f"        const {ct.storage_type(dt)}* in{a.k}r = in{a.k} + "
                             f"{off};")
            else:
                lines.append(f"        const {ct.compute_type(dt)} x{a.k}{mode} = "
                             f"{ct.from_storage(dt, f'in{a.k}[{off}]')};")
        out = body.node(body.outputs[0])
        if self._full(out.id):
            off = (f"row * {cols}LL" if p.trailing else row_offset(p.out_strides[0], dims))
            lines.append(f"        {ct.storage_type(self.out_dtype)}* yr = y + {off};")
        per = self.em.per_thread
        for v in sorted(self.keep, key=lambda v: (isinstance(v, tuple), str(v))):
            dt = self.in_dtypes[p.access[(v[1], "X")].k] if isinstance(v, tuple) \
                else body.node(v).dtype
            lines.append(f"        {ct.compute_type(dt)} c{self._tag(v)}[{per}];")
        lines += self._row_values(0)
        for phase in range(p.phases + 1):
            reds = [n for n in body if n.op in ROW_REDUCTIONS and p.level[n.id] == phase + 1]
            for r in reds:
                lines.append(f"        {acc} a{r.id} = {self._identity(r.op)};  // {r.op}")
            if reds or (phase == p.out_level and self._full(out.id)):
                lines += self._loop(phase, reds)
            for r in reds:
                op = "sum" if r.op == "mean" else r.op
                lines.append(f"        {self._reduce(f'a{r.id}', op, self._identity(r.op))}")
                total = f"a{r.id}"
                if r.op == "mean":
                    total = f"{total} / static_cast<{acc}>({cols})"
                if r.dtype.name == "float16":
                    total = f"pyc_round_f16({total})"
                else:
                    total = ct.convert(total, self.acc_dt, r.dtype)
                lines.append(f"        const {ct.compute_type(r.dtype)} r{r.id} = {total};"
                             f"  // {r.op} over the row")
            if phase < p.phases:
                lines += self._row_values(phase + 1)
        stores = [] if self._full(out.id) else \
            [f"            y[row] = {ct.to_storage(self.out_dtype, f'r{out.id}')};"]
        for k, o in enumerate(body.outputs[1:], start=1):  # row values read elsewhere
            stores.append(f"            y{k}[row] = "
                          f"{ct.to_storage(body.node(o).dtype, f'r{o}')};")
        if stores:
            lines += ["        if (t == 0 && live) {" if self.cfg["mode"] == "column"
                      else "        if (t == 0) {",
                      *stores, "        }"]
        consts = [f"    const {ct.compute_type(n.dtype)} k{n.id} = "
                  f"{ct.literal(n.attrs['value'], n.dtype)};" for n in body if n.op == "constant"]
        head = [f'extern "C" __global__ void __launch_bounds__({self.cfg["block"]})',
                f"{entry}({', '.join(params)})", "{", f"    const long long rows = {rows}LL;",
                *consts]
        if self.cfg["mode"] == "column":
            tx, ty = self.cfg["tx"], self.cfg["threads"]
            head += [
                f"    __shared__ {acc} smem[{tx * ty}];",
                f"    const int t = threadIdx.x / {tx};  // this thread's first value of the row",
                f"    for (long long group = blockIdx.x; group * {tx} < rows; "
                "group += gridDim.x) {",
                f"        const long long lane_row = group * {tx} + threadIdx.x % {tx};",
                "        // a lane past the last row reads the last row and writes nothing: it",
                "        // still takes part in every reduction's barriers",
                "        const bool live = lane_row < rows;",
                "        const long long row = live ? lane_row : rows - 1;",
            ]
        elif self.cfg["mode"] == "warp":
            rpb = self.cfg["rows_per_block"]
            head += [
                "    const int t = threadIdx.x & 31;  // lane: this thread's first column",
                f"    const long long first = static_cast<long long>(blockIdx.x) * {rpb} "
                "+ (threadIdx.x >> 5);",
                f"    for (long long row = first; row < rows; row += "
                f"static_cast<long long>(gridDim.x) * {rpb}) {{",
            ]
        else:
            head += [f"    __shared__ {acc} smem[32];", "    const int t = threadIdx.x;",
                     "    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {"]
        return "\n".join(head + lines + ["    }", "}"]) + "\n"


def _acc_dtype(plan: _Plan) -> np.dtype:
    """Partial results in double when any reduction is of float64, else float."""
    reds = [n for n in plan.body if n.op in ROW_REDUCTIONS]
    wide = any(n.dtype.name == "float64" or plan.body.node(n.inputs[0]).dtype.name == "float64"
               for n in reds)
    return np.dtype(np.float64 if wide else np.float32)


def _vector_width(plan: _Plan, in_dtypes: list[np.dtype], out_dtype: np.dtype,
                  cfg: dict[str, Any], acc_dt: np.dtype) -> int:
    """Elements per aligned vector access, or 0: 16 bytes of the widest array read or
    written along the row, when the rows split into whole vectors that stay aligned."""
    if plan.column or cfg["mode"] == "column":
        return 0
    cols = plan.cols
    along = [a for a in plan.access.values() if a.col]
    sizes = [in_dtypes[a.k].itemsize for a in along]
    if kind_in(plan.body.node(plan.body.outputs[0]).shape, plan.space) == "full":
        sizes.append(out_dtype.itemsize)
    if not sizes or not cfg["cached"]:
        return 0
    vec = 16 // max(sizes)
    if vec < 2 or cols % vec or not plan.trailing or any(a.col != ((1, cols, 1),)
                                                         for a in along):
        return 0
    if any(s % vec for a in along for s in a.row_strides):
        return 0
    per = -(-(cols // vec) // cfg["threads"]) * vec
    limit = (32 if cfg["mode"] == "warp" else 16) * 4 // max(acc_dt.itemsize, 4)
    return vec if per <= limit else 0


def short_row_config(cols: int, acc_itemsize: int = 4) -> dict[str, Any]:
    """Launch shape of a row program over rows of at most :data:`SHORT_ROW` values along
    memory: a block's 256 threads take 256 neighbouring rows, one each (the column
    programs' layout with one thread per row), the row in registers."""
    limit = 16 * 4 // max(acc_itemsize, 4)
    return {"threads": 1, "block": 256, "mode": "column", "per_thread": cols,
            "cached": cols <= limit, "rows_per_block": 256, "tx": 256, "unroll": 4}


def generate_row_program(node: Node, graph: Graph) -> KernelSource:
    """The CUDA source of a ``fused_rows`` node.

    Entries: ``name`` (any alignment) and, when the layout allows, ``name_vec``
    (aligned vector loads and stores; the launcher checks the pointers). A program
    reducing axes before the last one (``attrs["axes"]``) is a *column program*: its
    rows run across memory, so lanes take neighbouring rows and the threads sharing a
    row combine through shared memory (:func:`column_config`).
    """
    body, space = node.attrs["body"], tuple(node.attrs["space"])
    axes = tuple(node.attrs.get("axes") or last_axes(space))
    ins = [graph.node(i) for i in node.inputs]
    in_dtypes = [n.dtype for n in ins]
    why = check_row_program(body, space, [tuple(n.shape) for n in ins], in_dtypes, axes)
    if why:
        raise ValueError(f"node %{node.id} (fused_rows): {why}")
    plan, _ = _analyse(body, space, axes)
    assert plan is not None
    name = kernel_name(node)
    out_dtype = node.dtype
    acc_dt = _acc_dtype(plan)
    rows, cols = int(np.prod(plan.dims, dtype=np.int64)), plan.cols
    if plan.column:
        cfg = column_config(rows, inner_extent(space, axes), cols, acc_dt.itemsize)
    elif cols <= SHORT_ROW:
        # a row of a few values along memory: a thread's alone, lanes taking neighbouring
        # rows (a warp per row left most of it idle and waited on one row's load at a
        # time); the column programs' layout with one thread per row
        cfg = short_row_config(cols, acc_dt.itemsize)
    else:
        cfg = row_config(cols, acc_dt.itemsize)
        if not plan.trailing:  # each element's offset takes a division: unroll its loop
            cfg = {**cfg, "unroll": 4}
    params = [f"const {ct.storage_type(d)}* __restrict__ in{k}" for k, d in enumerate(in_dtypes)]
    params.append(f"{ct.storage_type(out_dtype)}* __restrict__ y")
    params += [f"{ct.storage_type(body.node(o).dtype)}* __restrict__ y{k}"
               for k, o in enumerate(body.outputs[1:], start=1)]
    vec = _vector_width(plan, in_dtypes, out_dtype, cfg, acc_dt)
    writers = [(name, _Writer(plan, in_dtypes, out_dtype, cfg, 1, acc_dt))]
    if vec:
        writers.append((f"{name}_vec", _Writer(plan, in_dtypes, out_dtype, cfg, vec, acc_dt)))
    kernels = [w.kernel(entry, params) for entry, w in writers]
    needs = set().union(*(w.needs for _, w in writers))
    ops = tuple(node.attrs.get("ops") or ())
    kept = writers[0][1].keep
    mode = cfg["mode"]
    who = ("warp" if mode == "warp" else f"block of {cfg['block']} threads" if mode == "block"
           else f"thread (a block: {cfg['tx']} rows)" if cfg["threads"] == 1
           else f"group of {cfg['threads']} threads (a block: {cfg['tx']} rows)")
    header = [
        f"// pyc_lab generated kernel {name} (rows: a fused row program"
        + (f" over axes {axes}, rows across memory)" if plan.column else ")"),
        f"// ops: {', '.join(ops)}",
        f"// {rows} rows of {cols} ({dtype_short(out_dtype)}{list(node.shape)} <- "
        + ", ".join(f"in{k} {n.type_text}" for k, n in enumerate(ins)) + ")",
        f"// {plan.phases} reduction phase(s); one {who} per row, "
        + (f"{len(kept)} value(s) a thread kept in registers" if kept else
           ("nothing kept in registers" if cfg["cached"] else "the row re-read each phase"))
        + f"; partial results in {ct.compute_type(acc_dt)}",
        f"// {name}: any alignment" + (f"; {name}_vec: {vec} columns per aligned load/store"
                                       if vec else "; no vectorised variant"),
    ]
    sections = ["\n".join(header) + "\n"]
    dtypes = {out_dtype.name, *(d.name for d in in_dtypes), *(n.dtype.name for n in body)}
    sections += [ct.helper(h) for h, dt in (("f16", "float16"), ("bf16", "bfloat16"))
                 if dt in dtypes]
    if vec:
        sections.append(ct.helper("vec"))
    sections += [ct.helper(s) for s in ("ipow", "abs", "divmod") if s in needs]
    sections.append(ct.helper("reduce"))
    sections += kernels
    align: dict[str, int] = {}
    if vec:
        align = {f"in{a.k}": vec * in_dtypes[a.k].itemsize for a in plan.access.values()
                 if a.col}
        if kind_in(node.shape, space, axes) == "full":
            align["out"] = vec * out_dtype.itemsize
    launch = {"rows": rows, "cols": cols, "block": cfg["block"],
              "threads_per_row": cfg["threads"], "rows_per_block": cfg["rows_per_block"],
              "mode": mode, "cached": cfg["cached"], "vec": vec,
              "vec_kernel": f"{name}_vec" if vec else None, "align_bytes": align,
              "phases": plan.phases, "axes": axes, "outputs": len(body.outputs)}
    unit = ("thread" if cfg["threads"] == 1
            else {"warp": "warp", "block": "block", "column": "thread group"}[mode])
    notes = (f"{rows} rows x {cols}"
             + (f" (over axes {axes}: lanes across neighbouring rows)" if plan.column else "")
             + f": {plan.phases} reduction phase(s) in one kernel, one "
             f"{unit} per row"
             + (f", {len(kept)} value(s) kept in registers" if kept else "")
             + (f"; vectorised by {vec} when aligned" if vec else "")
             + (f"; also writes {len(body.outputs) - 1} row value(s) read elsewhere"
                if len(body.outputs) > 1 else ""))
    return KernelSource(name=name, kind="rows", source="\n".join(sections), ops=ops,
                        notes=notes, entries=tuple(e for e, _ in writers), launch=launch)
