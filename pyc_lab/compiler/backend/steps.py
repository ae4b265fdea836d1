"""Launch steps: what runs for one node of the launch list, and how it is launched.

A step computes one node's value into the ``values`` dict of a call. It is built with
no device (the code generators' sources, the buffer it writes); :meth:`_Step.prepare`
compiles and loads at the first call; :meth:`_Step.run` launches; a step that cannot
be captured into a CUDA graph (a library call) also has :meth:`_Step.static_call`, the
call replayed between graphs on static arrays (see :mod:`.graphs`).

========================= ==============================================================
step                      what runs
========================= ==============================================================
:class:`_KernelStep`      a generated elementwise, row or column kernel (launched by
                          :mod:`.launch`: its vectorised entry when the pointers are
                          aligned); an elementwise kernel with several outputs also
                          writes its ``fused_extra`` nodes' arrays
:class:`_WrittenStep`     a ``fused_extra`` node the kernel before it wrote: nothing
:class:`_MatmulStep`      the library GEMM through ``pl.matmul`` (its library path:
                          cuBLAS, or cuBLASLt where it is faster; for a batched float
                          matmul one strided-batched GEMM), ``cupy.matmul`` for
                          integers and mixed dtypes — then the
                          generated bias/activation epilogue in place on the product;
                          for a small matmul (two matrices, a stack over one weight or
                          a batch), the generated small GEMM instead where it won the
                          first call's race (:mod:`.small_gemm`)
:class:`_LtStep`          one cuBLASLt GEMM with the epilogue inside (nvmath-python)
:class:`_CutlassStep`     the tuned CUTLASS kernel from the tuning database, with the
                          cuBLASLt or cuBLAS step to run when it cannot
:class:`_CupyStep`        the op's reference with CuPy arrays (``cupy`` and ``eager``)
========================= ==============================================================

Steps reach the executable for what it owns: the CuPy module (``_cp``), the SM count
(``_sm_count``), typed views of planned buffers (``_buffer_view``) and the record of
fallbacks (``_fallbacks``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from ...errors import PycLabError
from ..codegen.cache import compile_kernel
from ..codegen.cuda_types import KernelSource
from ..ir import Graph, Node
from ..ops import REGISTRY, check_eager_result, evaluate
from .gemm_operands import batched_operands, gemm_operands, library_product
from .launch import ColumnLaunch, alignment_plan, launch_elementwise, launch_rows
from .small_gemm import SmallGemm

__all__ = ["contiguous_operand"]

log = logging.getLogger(__name__)


class Executor(Protocol):
    """What a step reads from the executable that runs it
    (:class:`~pyc_lab.compiler.backend.executable.CupyExecutable`)."""

    graph: Graph
    _cp: Any
    _sm_count: int
    _fallbacks: dict[int, str]

    def _buffer_view(self, buf: int, node: Node) -> Any:
        """The memory plan's buffer ``buf`` as ``node``'s array."""
        ...


def contiguous_operand(value: Any, node: Node, cp: Any) -> Any:
    """An input of a generated kernel: ``node``'s shape and dtype, C-contiguous."""
    if value.dtype != node.dtype:
        value = value.astype(node.dtype)
    if value.shape != node.shape and tuple(value.shape) != tuple(node.shape):
        raise PycLabError(f"value of %{node.id} has shape {tuple(value.shape)}, the graph "
                          f"says {node.shape}")
    if not value.flags.c_contiguous:
        value = cp.ascontiguousarray(value)
    return value


class _Step:
    """One entry of the launch list: computes ``node``'s value into ``values``."""

    #: Whether the step can be captured into a CUDA graph.
    capturable = True

    def __init__(self, node: Node, impl: str, describe: dict[str, Any]) -> None:
        self.node = node
        self.impl = impl
        self.describe = describe
        self.release: list[int] = []  # values nobody reads after this step

    def prepare(self, exe: Executor) -> None:
        """Compile kernels and take buffer views (first call, on the device)."""

    def run(self, exe: Executor, values: dict[int, Any]) -> None:
        raise NotImplementedError

    def static_call(self, exe: Executor, values: dict[int, Any]) -> Any:
        """For a step that cannot be captured: allocate its result once (stored in
        ``values``) and return a function that recomputes it in place from the same
        arrays, for CUDA-graph replays."""
        raise NotImplementedError


class _KernelStep(_Step):
    """A generated elementwise or row kernel writing one output."""

    def __init__(self, node: Node, impl: str, src: KernelSource, out_buffer: int | None,
                 inplace_input: int | None, describe: dict[str, Any],
                 extras: Sequence[tuple[int | None, int | None]] = ()) -> None:
        super().__init__(node, impl, describe)
        self.src = src
        self.out_buffer = out_buffer
        self.inplace_input = inplace_input
        #: For outputs 1, 2, ... of a body with several: (the fused_extra node reading it,
        #: or None when nothing reads it; its planned buffer, or None for a fresh array)
        self.extras = list(extras)
        self._extra_places: list[Any] = []  # set by prepare
        self.kernels: dict[str, Any] = {}
        self.last_entry: str | None = None  # the kernel the last call launched
        self.columns: ColumnLaunch | None = None
        #: The vectorised entry's pointer alignments (launch.alignment_plan)
        self.plan = alignment_plan(src, len(node.inputs))
        #: (value id, its node) per input, as every call reads them (set by prepare)
        self.operands: list[tuple[int, Node]] = []

    def prepare(self, exe: Executor) -> None:
        self.kernels = {e: compile_kernel(self.src, e) for e in self.src.entries}
        self.attach(exe)

    def attach(self, exe: Executor) -> None:
        """What every call reads from ``exe``, worked out once: the operands' nodes, the
        extra outputs' planned buffers (or types) and a column kernel's launch."""
        self.operands = [(i, exe.graph.node(i)) for i in self.node.inputs]
        body = self.node.attrs.get("body")
        # per output 1, 2, ...: its planned buffer's view, or the type of a fresh array
        self._extra_places = [
            exe._buffer_view(buf, exe.graph.node(nid)) if nid is not None and buf is not None
            else (body.node(body.outputs[k]).shape, body.node(body.outputs[k]).dtype)
            for k, (nid, buf) in enumerate(self.extras, start=1)]
        if self.src.kind == "columns":  # the split's workspace, allocated before capture
            self.columns = ColumnLaunch(self.src, exe._sm_count, exe._cp)

    def _output(self, exe: Executor, cp: Any) -> Any:
        if self.out_buffer is not None:
            return exe._buffer_view(self.out_buffer, self.node)
        return cp.empty(self.node.shape, dtype=self.node.dtype)

    def run(self, exe: Executor, values: dict[int, Any]) -> None:
        cp = exe._cp
        ins = [contiguous_operand(values[i], n, cp) for i, n in self.operands]
        out = self._output(exe, cp)
        kind = self.src.kind
        if kind == "columns":
            self.last_entry = self.columns.launch(self.kernels, ins[0], out)
        else:
            extra = [cp.empty(*place) if type(place) is tuple else place
                     for place in self._extra_places]
            if kind == "rows":
                self.last_entry = launch_rows(exe._sm_count, self.kernels, self.src, ins, out,
                                              self.plan, extra)
            else:
                self.last_entry = launch_elementwise(exe._sm_count, self.kernels, self.src,
                                                     ins, out, extra, self.plan)
            for (nid, _), arr in zip(self.extras, extra, strict=True):
                if nid is not None:
                    values[nid] = arr
        values[self.node.id] = out



class _WrittenStep(_Step):
    """A ``fused_extra`` node whose value the fused kernel before it wrote: nothing runs."""

    def run(self, exe: Executor, values: dict[int, Any]) -> None:
        if self.node.id not in values:  # pragma: no cover - the lowering pairs them
            raise PycLabError(f"%{self.node.id} (fused_extra) was not written by "
                              f"%{self.node.inputs[0]}'s kernel")


class _MatmulStep(_Step):
    """The library GEMM (:func:`~.gemm_operands.library_product`) and the generated
    epilogue in place on the product.

    CuPy refuses cuBLAS calls while a stream captures, so the step is no capturable one
    as it is; :meth:`graph_call` gives the same GEMM issued to cuBLAS directly, which a
    capture may record (see :mod:`.graphs`)."""

    capturable = False

    def __init__(self, node: Node, impl: str, epilogue: KernelSource | None,
                 out_buffer: int | None, describe: dict[str, Any],
                 small: KernelSource | None = None) -> None:
        super().__init__(node, impl, describe)
        self.epilogue = epilogue
        self.out_buffer = out_buffer
        self.kernels: dict[str, Any] = {}
        self.product_dtype: np.dtype = node.dtype
        self.bias_node: Node | None = None
        self.last_entry: str | None = None
        self.small = SmallGemm(small) if small is not None else None

    @property
    def graph_workspace(self) -> bool:
        """Whether :meth:`graph_call` needs the program's cuBLAS workspace (made before
        the capture): not when the small GEMM won the first call's race."""
        return not (self.small is not None and self.small.use)

    def prepare(self, exe: Executor) -> None:
        g = exe.graph
        a, b = g.node(self.node.inputs[0]), g.node(self.node.inputs[1])
        self.product_dtype = np.result_type(a.dtype, b.dtype)
        if len(self.node.inputs) == 3:
            self.bias_node = g.node(self.node.inputs[2])
        if self.epilogue is not None:
            self.kernels = {e: compile_kernel(self.epilogue, e) for e in self.epilogue.entries}
        if self.small is not None:
            self.small.prepare()

    def _planned_product(self, exe: Executor) -> Any | None:
        """The planned buffer's view the product can be written into, or None (no
        planned buffer, or the product's dtype is not the node's)."""
        if self.out_buffer is None or self.product_dtype != self.node.dtype:
            return None
        return exe._buffer_view(self.out_buffer, self.node)

    def _product(self, exe: Executor, a: Any, b: Any) -> Any:
        """The GEMM's product, a fresh array from CuPy's allocator.

        Not written into the planned buffer with ``out=``: the compiled fp16 MLP with
        cuBLAS through CuPy writing ``out=`` was measured slower
        (benchmarks/results/h200/compiler-matmul-into-plan.json against compiler.json),
        although a lone ``cupy.matmul`` costs the same either way (matmul_out.json).
        ``benchmarks/exp_matmul_out.py`` measures both forms, replacing this method for
        the second.
        """
        batched = batched_operands(a, b)
        if batched is not None:  # CuPy's batched matmul computes 16-bit floats in float32
            from ...kernels.matmul import matmul

            a3, b3, shape = batched
            return matmul(a3, b3).reshape(shape)
        return library_product(exe._cp, a, b)

    def run(self, exe: Executor, values: dict[int, Any]) -> None:
        node = self.node
        a, b = gemm_operands(node, values)
        small = self._small_call(exe, values, a, b)
        if small is not None:
            small()
            return
        bias = None if self.bias_node is None else \
            contiguous_operand(values[node.inputs[2]], self.bias_node, exe._cp)
        values[node.id] = self._library(exe, a, b, bias)

    def _library(self, exe: Executor, a: Any, b: Any, bias: Any) -> Any:
        """The library GEMM, then the epilogue (if any): the node's value."""
        cp = exe._cp
        product = self._product(exe, a, b)
        if self.epilogue is None:
            return product
        ins = [product] + ([bias] if bias is not None else [])
        if self.epilogue.launch.get("inplace"):
            out = product
        elif self.out_buffer is not None:
            out = exe._buffer_view(self.out_buffer, self.node)
        else:
            out = cp.empty(self.node.shape, dtype=self.node.dtype)
        self.last_entry = launch_elementwise(exe._sm_count, self.kernels, self.epilogue, ins,
                                             out)
        return out

    def _small_call(self, exe: Executor, values: dict[int, Any], a: Any,
                    b: Any) -> Callable[[], None] | None:
        """The small GEMM (:mod:`.small_gemm`) as a call writing this node's output (its
        array entered in ``values`` now), where it won the first call's race — run here,
        outside a capture, when it has not been yet; ``None`` where the library path
        runs (no candidate, the race lost, or operands neither kernel reads)."""
        small = self.small
        if small is None or small.use is False or not small.kernels:
            return None
        plans = small.plans(a, b)
        if not plans:
            return None
        cp = exe._cp
        node = self.node
        src = values[node.inputs[2]] if self.bias_node is not None else None

        def bias() -> Any:  # made contiguous at every call: a copy would go stale
            return None if src is None else contiguous_operand(src, self.bias_node, cp)

        if small.use is None:
            scratch = cp.empty(node.shape, dtype=node.dtype)
            first = bias()
            won = small.decide(cp, lambda: self._library(exe, a, b, first), [
                (p[0], lambda p=p: small.launch(p, a, b, first, scratch)) for p in plans])
            if small.note:
                self.describe["notes"] = "; ".join(
                    t for t in (self.describe.get("notes"), small.note) if t)
            if not won:
                return None
        plan = next(p for p in plans if p[0] == small.choice)
        out = exe._buffer_view(self.out_buffer, node) if self.out_buffer is not None \
            else cp.empty(node.shape, dtype=node.dtype)
        values[node.id] = out

        def call() -> None:
            small.launch(plan, a, b, bias(), out)
            self.last_entry = plan[0]

        return call

    def static_call(self, exe: Executor, values: dict[int, Any]) -> Any:
        cp = exe._cp
        a, b = gemm_operands(self.node, values)  # views of the static arrays: new data
        batched = batched_operands(a, b)
        if batched is not None:
            from ...kernels.matmul import matmul

            a3, b3, _ = batched
            return self._call_on_static(exe, values, a, b, lambda product: matmul(
                a3, b3, out=product.reshape(a3.shape[0], a3.shape[1], b3.shape[-1])))
        return self._call_on_static(exe, values, a, b,
                                    lambda product: library_product(cp, a, b, out=product))

    def graph_call(self, exe: Executor, values: dict[int, Any],
                   workspace: tuple[int, int] | None) -> Callable[[], None] | None:
        """This GEMM (and its epilogue) as a call that can run inside a CUDA-graph
        capture: the small GEMM where it won the first call's race, else cuBLAS issued
        directly (:class:`~pyc_lab.kernels.blas_direct.CublasGemm`, the call
        ``cupy.matmul`` makes, with ``workspace``, one the program owns) on the static
        arrays; ``None`` where there is no direct form (no workspace: nvmath-python
        missing; mixed dtypes, operands that are not BLAS matrices). Nothing is launched
        here; the operands' values are read when the call runs."""
        from ...kernels.matmul_plan import direct_for

        cp = exe._cp
        a, b = gemm_operands(self.node, values)
        small = self._small_call(exe, values, a, b)
        if small is not None:
            return small
        if workspace is None:
            return None
        direct = direct_for(a, b, None, "cublas", 1.0, 0.0, np.dtype(self.product_dtype).name)
        if direct is None:
            return None
        gemm = direct.gemm
        return self._call_on_static(exe, values, a, b, lambda product: gemm(
            a.data.ptr, b.data.ptr, product.data.ptr, cp.cuda.get_current_stream().ptr,
            workspace))

    def _call_on_static(self, exe: Executor, values: dict[int, Any], a: Any, b: Any,
                        gemm: Callable[[Any], None]) -> Callable[[], None]:
        """The replay call of :meth:`static_call` and :meth:`graph_call`: ``gemm(product)``
        into the planned (or a fresh) product, then the epilogue; the output is entered
        in ``values`` now, the work done when the call runs."""
        cp = exe._cp
        node = self.node
        product = self._planned_product(exe)
        if product is None:
            product = cp.empty(node.shape, dtype=self.product_dtype)
        out = product
        if self.epilogue is not None and not self.epilogue.launch.get("inplace"):
            out = exe._buffer_view(self.out_buffer, node) if self.out_buffer is not None \
                else cp.empty(node.shape, dtype=node.dtype)
        bias = values[node.inputs[2]] if self.bias_node is not None else None
        values[node.id] = out

        def call() -> None:
            gemm(product)
            if self.epilogue is None:
                return
            ins = [product]
            if bias is not None:  # made contiguous on every call: a copy would go stale
                ins.append(contiguous_operand(bias, self.bias_node, cp))
            self.last_entry = launch_elementwise(exe._sm_count, self.kernels, self.epilogue,
                                                 ins, out)

        return call


def _bias_at_replay(exe: Executor, step: Any, values: dict[int, Any],
                    bias: Any) -> Callable[[], Any]:
    """For a GEMM step's CUDA-graph replays: the bias to pass at each call — the bound
    one, or, when that was made contiguous (a copy), a fresh copy of its source."""
    if step.bias_node is None:
        return lambda: None
    src = values[step.node.inputs[2]]
    if src.data.ptr == bias.data.ptr:
        return lambda: bias
    return lambda: contiguous_operand(src, step.bias_node, exe._cp).reshape(-1)


class _LtStep(_Step):
    """One cuBLASLt GEMM with the bias/activation inside (nvmath-python)."""

    capturable = False  # a library call between CUDA graphs, like cuBLAS

    def __init__(self, node: Node, impl: str, out_buffer: int | None,
                 describe: dict[str, Any], autotune: bool) -> None:
        super().__init__(node, impl, describe)
        self.out_buffer = out_buffer
        self.autotune = autotune
        self.gemm: Any = None
        self.bias_node: Node | None = None

    def prepare(self, exe: Executor) -> None:
        from ...kernels.cublaslt import FusedGemm

        if len(self.node.inputs) == 3:
            self.bias_node = exe.graph.node(self.node.inputs[2])
        self.gemm = FusedGemm(self.node.attrs.get("activation"),
                              has_bias=self.bias_node is not None, autotune=self.autotune)

    def _operands(self, exe: Executor, values: dict[int, Any]) -> tuple[Any, ...]:
        node = self.node
        a, b = gemm_operands(node, values)
        bias = None
        if self.bias_node is not None:
            bias = contiguous_operand(values[node.inputs[2]], self.bias_node, exe._cp)
            bias = bias.reshape(bias.shape[-1])
        out = exe._buffer_view(self.out_buffer, node) if self.out_buffer is not None \
            else exe._cp.empty(node.shape, dtype=node.dtype)
        return a, b, out, bias

    def run(self, exe: Executor, values: dict[int, Any]) -> None:
        a, b, out, bias = self._operands(exe, values)
        self.gemm(a, b, out, bias)
        values[self.node.id] = out

    def static_call(self, exe: Executor, values: dict[int, Any]) -> Any:
        a, b, out, bias = self._operands(exe, values)  # views of static arrays
        values[self.node.id] = out
        bias_now = _bias_at_replay(exe, self, values, bias)

        def call() -> None:
            self.gemm(a, b, out, bias_now())

        return call


class _CutlassStep(_Step):
    """A tuned CUTLASS kernel from the tuning database, bias/activation in its epilogue.

    Holds the step the node would otherwise run (cuBLASLt or cuBLAS + generated
    epilogue): it runs instead when the kernel cannot be loaded, or when the operands at
    a call are not in the memory order the kernel was tuned for.
    """

    capturable = False  # launched by the kernel's host adapter, between CUDA graphs

    def __init__(self, node: Node, problem: tuple[Any, ...], fallback: _Step,
                 describe: dict[str, Any]) -> None:
        super().__init__(node, "cutlass", describe)
        self.problem = problem  # (m, n, k, dtype, layout, epilogue)
        self.fallback = fallback
        self.out_buffer: int | None = getattr(fallback, "out_buffer", None)
        self.kernel: Any = None
        self.why = ""
        self.bias_node: Node | None = None

    def prepare(self, exe: Executor) -> None:
        from ...kernels.matmul import winning_kernel

        self.fallback.prepare(exe)
        if len(self.node.inputs) == 3:
            self.bias_node = exe.graph.node(self.node.inputs[2])
        self.kernel, self.why, _ = winning_kernel(*self.problem)
        if self.kernel is None:
            log.warning("node %%%d (matmul): tuned CUTLASS kernel not used: %s; %s instead",
                        self.node.id, self.why, self.fallback.describe.get("implementation"))
            exe._fallbacks[self.node.id] = f"cutlass not used: {self.why}"

    def _operands(self, exe: Executor, values: dict[int, Any]) -> tuple[Any, ...] | None:
        from ...kernels.matmul import operand_layout

        if self.kernel is None:
            return None
        node = self.node
        a, b = gemm_operands(node, values)
        if operand_layout(a, b) != self.problem[4]:
            exe._fallbacks[node.id] = (f"cutlass not used at a call: operands not in layout "
                                       f"{self.problem[4]!r}")
            return None
        bias = None
        if self.bias_node is not None:
            bias = contiguous_operand(values[node.inputs[2]], self.bias_node,
                                      exe._cp).reshape(-1)
        out = exe._buffer_view(self.out_buffer, node) if self.out_buffer is not None \
            else exe._cp.empty(node.shape, dtype=node.dtype)
        return a, b, out, bias

    def run(self, exe: Executor, values: dict[int, Any]) -> None:
        ops = self._operands(exe, values)
        if ops is None:
            self.fallback.run(exe, values)
            return
        a, b, out, bias = ops
        self.kernel(a, b, out, bias=bias)
        values[self.node.id] = out

    def static_call(self, exe: Executor, values: dict[int, Any]) -> Any:
        ops = self._operands(exe, values)  # views of the static arrays
        if ops is None:
            return self.fallback.static_call(exe, values)
        a, b, out, bias = ops
        values[self.node.id] = out
        bias_now = _bias_at_replay(exe, self, values, bias)

        def call() -> None:
            self.kernel(a, b, out, bias=bias_now())

        return call


class _CupyStep(_Step):
    """The op's reference run with CuPy arrays (``cupy`` and ``eager``)."""

    def __init__(self, node: Node, impl: str, materialize: str | None,
                 out_buffer: int | None, describe: dict[str, Any]) -> None:
        super().__init__(node, impl, describe)
        self.materialize = materialize  # None, "buffer" or "copy"
        self.out_buffer = out_buffer

    def run(self, exe: Executor, values: dict[int, Any]) -> None:
        cp = exe._cp
        node = self.node
        out = cp.asarray(evaluate(node.op, cp, [values[i] for i in node.inputs], node.attrs))
        if node.op == "eager":
            check_eager_result(node, out)  # a data-dependent shape: the caller runs eagerly
        if out.dtype != node.dtype:
            out = out.astype(node.dtype)
        if tuple(out.shape) != tuple(node.shape):
            raise PycLabError(f"node %{node.id} ({node.op}) gave shape {tuple(out.shape)}, "
                              f"the graph says {node.shape}")
        if self.materialize == "buffer":
            view = exe._buffer_view(self.out_buffer, node)
            cp.copyto(view, out)
            out = view
        elif self.materialize == "copy":
            out = out.copy()
        values[node.id] = out


#: A library step keeps its op's bound call (:attr:`OpDef.bound`) for inputs of at most
#: this many bytes together: there a call's cost is its host time, and the bound call
#: keeps the last call's inputs alive until inputs at other addresses replace them.
BOUND_INPUT_BYTES = 8 << 20


def _small(ins: Sequence[Any]) -> bool:
    """Whether a library step's inputs are small enough for a binding to keep them
    (:data:`BOUND_INPUT_BYTES`)."""
    return sum(x.nbytes for x in ins) <= BOUND_INPUT_BYTES


class _LibraryStep(_CupyStep):
    """The op's reference as a library call a CUDA graph does not record (``attention``:
    torch's SDPA, launched through torch's own machinery): run between graphs, and at
    each replay recomputed into the array the first call made.

    An op with a bound form (:attr:`OpDef.bound`) runs it while the inputs stay where
    the last call had them (small inputs, :data:`BOUND_INPUT_BYTES`): the conversions
    and choices the reference makes at every call are made once per placement.
    """

    capturable = False

    def __init__(self, node: Node, impl: str, materialize: str | None,
                 out_buffer: int | None, describe: dict[str, Any]) -> None:
        super().__init__(node, impl, materialize, out_buffer, describe)
        #: (the inputs' addresses, strides and dtypes; the bound call, or None)
        self._bound: tuple[tuple, Callable[[Any], None] | None] | None = None
        #: (the inputs' and output's placements; the op bound into that output, or None)
        self._into: tuple[tuple, Callable[[], None] | None] | None = None
        #: set while a CUDA graph's capture runs the step (:meth:`static_call`)
        self._capturing = False

    def _bound_call(self, exe: Executor, ins: Sequence[Any]) -> Callable[[Any], None] | None:
        """The op's bound call for ``ins`` where they sit (made at a new placement)."""
        make = REGISTRY[self.node.op].bound
        if make is None:
            return None
        places = tuple((x.data.ptr, x.shape, x.strides, x.dtype) for x in ins)
        memo = self._bound
        if memo is not None and memo[0] == places:
            return memo[1]
        self._bound = None  # let go of the last placement's inputs first
        call = make(exe._cp, ins, self.node.attrs) \
            if _small(ins) else None
        self._bound = (places, call)
        return call

    def _into_call(self, exe: Executor, ins: Sequence[Any], out: Any) -> Callable[[], None] | None:
        """The op bound into ``out`` (:attr:`OpDef.bind`) for ``ins`` where they sit: made
        at a new placement, else the one made for it before."""
        bind = REGISTRY[self.node.op].bind
        if bind is None:
            return None
        places = tuple((x.data.ptr, x.shape, x.strides, x.dtype) for x in (*ins, out))
        memo = self._into
        if memo is not None and memo[0] == places:
            return memo[1]
        self._into = None  # let go of the last placement's arrays first
        call = bind(exe._cp, ins, self.node.attrs, out)
        self._into = (places, call)
        return call

    def run(self, exe: Executor, values: dict[int, Any]) -> None:
        node = self.node
        ins = [values[i] for i in node.inputs]
        call = self._bound_call(exe, ins)
        if call is None and self.materialize == "buffer":
            # the op straight into its planned buffer where it can write into an array it
            # is given (no fresh result copied across); bound once per placement, kept
            # between calls for small inputs only (it holds the inputs, as the bound call
            # does) and for the capture that follows
            out = exe._buffer_view(self.out_buffer, node)
            into = self._into_call(exe, ins, out)
            if into is not None:
                into()
                values[node.id] = out
                if not self._capturing and not _small(ins):
                    self._into = None
                return
        if call is None:
            super().run(exe, values)
            return
        out = exe._buffer_view(self.out_buffer, node) if self.materialize == "buffer" \
            else exe._cp.empty(node.shape, dtype=node.dtype)
        call(out)
        values[node.id] = out

    def static_call(self, exe: Executor, values: dict[int, Any]) -> Any:
        self._capturing = True
        try:
            self.run(exe, values)
        finally:
            self._capturing = False
        cp = exe._cp
        node = self.node
        result = values[node.id]
        ins = [values[i] for i in node.inputs]
        bound = self._into_call(exe, ins, result)  # the one run just made, where it did
        if bound is not None:  # the operands' conversions made once, not at each replay
            if not _small(ins):
                self._into = None  # the replays hold it
            return bound
        make = REGISTRY[node.op].bound
        # the call self.run just made (small inputs), else one for the replay's arrays
        call_out = self._bound_call(exe, ins) or (
            make(cp, ins, node.attrs) if make is not None else None)
        if call_out is not None:
            return lambda: call_out(result)

        def call() -> None:
            out = evaluate(node.op, cp, ins, node.attrs)
            cp.copyto(result, out.astype(node.dtype, copy=False))

        return call


class _RecordedLibraryStep(_LibraryStep):
    """A library op with a form a CUDA graph can record (:attr:`OpDef.record`: ``conv``,
    :mod:`pyc_lab.kernels.conv_graph`): :meth:`graph_call` gives it; where there is none
    this time the op runs between graphs as a :class:`_LibraryStep`. It is recorded with
    or without a cuBLAS workspace (``graph_workspace`` false), and uses one where the
    program has it (:attr:`wants_workspace`: one is made for the graphs)."""

    graph_workspace = False

    @property
    def wants_workspace(self) -> bool:
        """Whether the recorded form may issue cuBLAS (:attr:`OpDef.record_workspace`)."""
        wants = REGISTRY[self.node.op].record_workspace
        return wants is not None and wants(self.node.attrs)

    def graph_call(self, exe: Executor, values: dict[int, Any],
                   workspace: tuple[int, int] | None) -> Callable[[], None] | None:
        """The op into its output (the planned buffer, or a fresh array of the program's
        pool) as a recordable call on the static arrays, entered in ``values`` now and
        run when the call runs; ``None`` where the op has no recordable form for these
        operands. ``workspace``: the program's cuBLAS workspace, or ``None``."""
        node = self.node
        record = REGISTRY[node.op].record
        if record is None:
            return None
        out = exe._buffer_view(self.out_buffer, node) if self.materialize == "buffer" \
            else exe._cp.empty(node.shape, dtype=node.dtype)
        call = record(exe._cp, [values[i] for i in node.inputs], node.attrs, out, workspace)
        if call is not None:
            values[node.id] = out
        return call
