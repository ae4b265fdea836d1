"""The CuPy backend: run an optimised graph as generated kernels, cuBLAS and CuPy calls.

:class:`CupyExecutable` turns a graph and an implementation per node (from
:mod:`.policy`) into a *launch list* once, then runs it on every call:

========================= ==============================================================
impl                      what runs
========================= ==============================================================
``fused_kernel``          the generated elementwise kernel of a fused (or elementwise)
                          node; its vectorised variant when the pointers are aligned
``reduction_kernel``      the generated row kernel (softmax, layer norm, last-axis sum,
                          mean, max, min, var)
``cublas``                ``cupy.matmul`` on (transposed) views, then the generated
                          bias/activation epilogue in place on the product
``cutlass``               the tuned CUTLASS kernel from the tuning database (bias and
                          activation in its epilogue), into the planned buffer; the
                          ``cublaslt``/``cublas`` step when it cannot run
``cublaslt``              one cuBLASLt GEMM with the bias/activation in its epilogue
                          (:class:`pyc_lab.kernels.cublaslt.FusedGemm`, nvmath-python),
                          written into the planned buffer; algorithms measured at the
                          first call when ``tune_gemms`` (``utilization_first``)
``cupy``, ``eager``       the op's reference, ``ops.evaluate(op, cupy, args, attrs)``;
                          shape ops are views
========================= ==============================================================

Generated sources are made when the executable is built (no GPU needed, see
:attr:`CupyExecutable.kernels`); the device is touched at the first call, which compiles
the kernels (cached by source), uploads the constants and allocates the planned buffers.

**Memory.** With a :class:`~pyc_lab.compiler.memory.MemoryPlan`, every planned buffer is
one ``uint8`` CuPy array allocated once, and a node writing a planned buffer writes a
view of it with its dtype and shape. Each value's possible storage (planned buffers,
inputs, constants) is tracked when the launch list is built, so that

- a kernel never writes a buffer one of its inputs lives in, unless the plan records
  that in-place write and every input in that buffer is read at the output's flat
  index (the kernel is then generated without ``__restrict__``); otherwise the node
  gets a fresh array and a warning is logged;
- a CuPy call whose result may be a view of a planned buffer (transpose, slice, eager
  calls) is copied into the node's own planned buffer, as the plan assumes, so that a
  buffer the plan frees is never still read through a view;
- outputs that live in planned buffers, inputs or constants are copied, so every call
  returns fresh arrays the caller may keep.

**CUDA graphs.** With ``cuda_graph=True`` the first call runs normally (compiling and
warming up), the second captures the launch list once on a non-blocking stream
(``cupy.cuda.Stream(non_blocking=True)``, ``begin_capture``/``end_capture``), reading
static input buffers and allocating from a private memory pool that stays alive with the
capture. CuPy refuses cuBLAS calls while a stream captures, so every matmul closes the
current CUDA graph and runs as a call on static arrays between two graphs (its epilogue
included); everything else is captured. That call and every later one copy the
arguments into the static inputs, replay the graphs and matmul calls in order on the
current stream and copy the outputs out to fresh arrays. If the capture fails (an eager
node that synchronises, say), calls run normally and the reason is kept in
:attr:`CupyExecutable.graph_capture_error`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import PycLabError
from ..codegen import generate, generate_epilogue, supports
from ..codegen.cache import compile_kernel
from ..codegen.cuda_types import KernelSource
from ..ir import Graph, Node
from ..ops import REGISTRY, evaluate

if TYPE_CHECKING:
    from ..memory import MemoryPlan

__all__ = ["IMPLS", "CupyExecutable"]

log = logging.getLogger(__name__)

#: Whether a matmul writes its product straight into its planned buffer (``out=``)
#: instead of letting CuPy allocate it. Off by default: on the H200 the compiled fp16 MLP
#: ran in 0.692 ms with it and 0.515 ms without (benchmarks/results/h200/compiler*.json),
#: although a lone cupy.matmul costs the same either way (matmul_out.json); why is not yet
#: understood. PYC_LAB_MATMUL_OUT=1 turns it back on.
_MATMUL_INTO_PLAN = os.environ.get("PYC_LAB_MATMUL_OUT", "0") == "1"

#: Implementations the executable understands (``source`` for inputs and constants;
#: ``numpy``/``view`` run as ``cupy``).
IMPLS = ("fused_kernel", "reduction_kernel", "cublas", "cublaslt", "cutlass", "cupy", "eager",
         "source",
         "numpy", "view")

#: Ops whose CuPy result is always a new array (never a view of an input).
_FRESH_KINDS = frozenset({"norm", "reduction", "matmul"})

_VIEW_OPS = frozenset({"reshape", "expand_dims", "squeeze"})


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _inplace_pairs(plan: Any) -> set[tuple[int, int]]:
    """The plan's in-place writes as ``(node, input)`` pairs (any reasonable encoding)."""
    raw = getattr(plan, "inplace", None) or ()
    pairs: set[tuple[int, int]] = set()
    items = raw.items() if isinstance(raw, dict) else raw
    for item in items:
        if isinstance(item, (tuple, list)) and len(item) == 2:
            pairs.add((int(item[0]), int(item[1])))
    return pairs


class _Step:
    """One entry of the launch list: computes ``node``'s value into ``values``."""

    #: Whether the step can be captured into a CUDA graph.
    capturable = True

    def __init__(self, node: Node, impl: str, describe: dict[str, Any]) -> None:
        self.node = node
        self.impl = impl
        self.describe = describe
        self.release: list[int] = []  # values nobody reads after this step

    def prepare(self, exe: CupyExecutable) -> None:
        """Compile kernels and take buffer views (first call, on the device)."""

    def run(self, exe: CupyExecutable, values: dict[int, Any]) -> None:
        raise NotImplementedError

    def static_call(self, exe: CupyExecutable, values: dict[int, Any]) -> Any:
        """For a step that cannot be captured: allocate its result once (stored in
        ``values``) and return a function that recomputes it in place from the same
        arrays, for CUDA-graph replays."""
        raise NotImplementedError


class _KernelStep(_Step):
    """A generated elementwise or row kernel writing one output."""

    def __init__(self, node: Node, impl: str, src: KernelSource, out_buffer: int | None,
                 inplace_input: int | None, describe: dict[str, Any]) -> None:
        super().__init__(node, impl, describe)
        self.src = src
        self.out_buffer = out_buffer
        self.inplace_input = inplace_input
        self.kernels: dict[str, Any] = {}
        self.in_nodes: list[Node] = []
        self.last_entry: str | None = None  # the kernel the last call launched

    def prepare(self, exe: CupyExecutable) -> None:
        self.kernels = {e: compile_kernel(self.src, e) for e in self.src.entries}
        self.in_nodes = [exe.graph.node(i) for i in self.node.inputs]

    def _output(self, exe: CupyExecutable, cp: Any) -> Any:
        if self.out_buffer is not None:
            return exe._buffer_view(self.out_buffer, self.node)
        return cp.empty(self.node.shape, dtype=self.node.dtype)

    def run(self, exe: CupyExecutable, values: dict[int, Any]) -> None:
        cp = exe._cp
        ins = [exe._operand(values[i], n, cp) for i, n in zip(self.node.inputs, self.in_nodes,
                                                             strict=True)]
        out = self._output(exe, cp)
        if self.src.kind == "rows":
            self.last_entry = _launch_rows(exe, self.kernels, self.src, ins, out)
        else:
            self.last_entry = _launch_elementwise(exe, self.kernels, self.src, ins, out)
        values[self.node.id] = out


def _gemm_operands(node: Node, values: dict[int, Any]) -> tuple[Any, Any]:
    """A matmul node's two operands as multiplied: views with its transposes applied."""
    a, b = values[node.inputs[0]], values[node.inputs[1]]
    if node.attrs.get("transpose_a") and a.ndim >= 2:
        a = a.swapaxes(-1, -2)
    if node.attrs.get("transpose_b") and b.ndim >= 2:
        b = b.swapaxes(-1, -2)
    return a, b


class _MatmulStep(_Step):
    """``cupy.matmul`` (cuBLAS) and the generated epilogue in place on the product."""

    capturable = False  # CuPy refuses cuBLAS calls while a stream is capturing

    def __init__(self, node: Node, impl: str, epilogue: KernelSource | None,
                 out_buffer: int | None, describe: dict[str, Any]) -> None:
        super().__init__(node, impl, describe)
        self.epilogue = epilogue
        self.out_buffer = out_buffer
        self.kernels: dict[str, Any] = {}
        self.product_dtype: np.dtype = node.dtype
        self.bias_node: Node | None = None
        self.last_entry: str | None = None

    def prepare(self, exe: CupyExecutable) -> None:
        g = exe.graph
        a, b = g.node(self.node.inputs[0]), g.node(self.node.inputs[1])
        self.product_dtype = np.result_type(a.dtype, b.dtype)
        if len(self.node.inputs) == 3:
            self.bias_node = g.node(self.node.inputs[2])
        if self.epilogue is not None:
            self.kernels = {e: compile_kernel(self.epilogue, e) for e in self.epilogue.entries}

    def run(self, exe: CupyExecutable, values: dict[int, Any]) -> None:
        cp = exe._cp
        node = self.node
        a, b = _gemm_operands(node, values)
        planned = self.out_buffer is not None and self.product_dtype == node.dtype \
            and _MATMUL_INTO_PLAN
        if planned:
            product = cp.matmul(a, b, out=exe._buffer_view(self.out_buffer, node))
        else:
            product = cp.matmul(a, b)
        if self.epilogue is None:
            values[node.id] = product
            return
        ins = [product]
        if self.bias_node is not None:
            ins.append(exe._operand(values[node.inputs[2]], self.bias_node, cp))
        if self.epilogue.launch.get("inplace"):
            out = product
        elif self.out_buffer is not None:
            out = exe._buffer_view(self.out_buffer, node)
        else:
            out = cp.empty(node.shape, dtype=node.dtype)
        self.last_entry = _launch_elementwise(exe, self.kernels, self.epilogue, ins, out)
        values[node.id] = out

    def static_call(self, exe: CupyExecutable, values: dict[int, Any]) -> Any:
        cp = exe._cp
        node = self.node
        a, b = _gemm_operands(node, values)  # views of the static arrays: they see new data
        planned = self.out_buffer is not None and self.product_dtype == node.dtype
        product = exe._buffer_view(self.out_buffer, node) if planned else \
            cp.empty(node.shape, dtype=self.product_dtype)
        out = product
        if self.epilogue is not None and not self.epilogue.launch.get("inplace"):
            out = exe._buffer_view(self.out_buffer, node) if self.out_buffer is not None \
                else cp.empty(node.shape, dtype=node.dtype)
        bias = values[node.inputs[2]] if self.bias_node is not None else None
        values[node.id] = out

        def call() -> None:
            cp.matmul(a, b, out=product)
            if self.epilogue is None:
                return
            ins = [product]
            if bias is not None:  # made contiguous on every call: a copy would go stale
                ins.append(exe._operand(bias, self.bias_node, cp))
            self.last_entry = _launch_elementwise(exe, self.kernels, self.epilogue, ins, out)

        return call


def _bias_at_replay(exe: CupyExecutable, step: Any, values: dict[int, Any],
                    bias: Any) -> Callable[[], Any]:
    """For a GEMM step's CUDA-graph replays: the bias to pass at each call — the bound
    one, or, when that was made contiguous (a copy), a fresh copy of its source."""
    if step.bias_node is None:
        return lambda: None
    src = values[step.node.inputs[2]]
    if src.data.ptr == bias.data.ptr:
        return lambda: bias
    return lambda: exe._operand(src, step.bias_node, exe._cp).reshape(-1)


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

    def prepare(self, exe: CupyExecutable) -> None:
        from ...kernels.cublaslt import FusedGemm

        if len(self.node.inputs) == 3:
            self.bias_node = exe.graph.node(self.node.inputs[2])
        self.gemm = FusedGemm(self.node.attrs.get("activation"),
                              has_bias=self.bias_node is not None, autotune=self.autotune)

    def _operands(self, exe: CupyExecutable, values: dict[int, Any]) -> tuple[Any, ...]:
        node = self.node
        a, b = _gemm_operands(node, values)
        bias = None
        if self.bias_node is not None:
            bias = exe._operand(values[node.inputs[2]], self.bias_node, exe._cp)
            bias = bias.reshape(bias.shape[-1])
        out = exe._buffer_view(self.out_buffer, node) if self.out_buffer is not None \
            else exe._cp.empty(node.shape, dtype=node.dtype)
        return a, b, out, bias

    def run(self, exe: CupyExecutable, values: dict[int, Any]) -> None:
        a, b, out, bias = self._operands(exe, values)
        self.gemm(a, b, out, bias)
        values[self.node.id] = out

    def static_call(self, exe: CupyExecutable, values: dict[int, Any]) -> Any:
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

    def prepare(self, exe: CupyExecutable) -> None:
        from ...kernels.matmul import tuned_kernel

        self.fallback.prepare(exe)
        if len(self.node.inputs) == 3:
            self.bias_node = exe.graph.node(self.node.inputs[2])
        self.kernel, self.why = tuned_kernel(*self.problem)
        if self.kernel is None:
            log.warning("node %%%d (matmul): tuned CUTLASS kernel not used: %s; %s instead",
                        self.node.id, self.why, self.fallback.describe.get("implementation"))
            exe._fallbacks[self.node.id] = f"cutlass not used: {self.why}"

    def _operands(self, exe: CupyExecutable, values: dict[int, Any]) -> tuple[Any, ...] | None:
        from ...kernels.matmul import operand_layout

        if self.kernel is None:
            return None
        node = self.node
        a, b = _gemm_operands(node, values)
        if operand_layout(a, b) != self.problem[4]:
            exe._fallbacks[node.id] = (f"cutlass not used at a call: operands not in layout "
                                       f"{self.problem[4]!r}")
            return None
        bias = None
        if self.bias_node is not None:
            bias = exe._operand(values[node.inputs[2]], self.bias_node, exe._cp).reshape(-1)
        out = exe._buffer_view(self.out_buffer, node) if self.out_buffer is not None \
            else exe._cp.empty(node.shape, dtype=node.dtype)
        return a, b, out, bias

    def run(self, exe: CupyExecutable, values: dict[int, Any]) -> None:
        ops = self._operands(exe, values)
        if ops is None:
            self.fallback.run(exe, values)
            return
        a, b, out, bias = ops
        self.kernel(a, b, out, bias=bias)
        values[self.node.id] = out

    def static_call(self, exe: CupyExecutable, values: dict[int, Any]) -> Any:
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

    def run(self, exe: CupyExecutable, values: dict[int, Any]) -> None:
        cp = exe._cp
        node = self.node
        out = cp.asarray(evaluate(node.op, cp, [values[i] for i in node.inputs], node.attrs))
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


def _pointer_ok(arr: Any, nbytes: int) -> bool:
    return arr.data.ptr % nbytes == 0


def _launch_elementwise(exe: CupyExecutable, kernels: dict[str, Any], src: KernelSource,
                        ins: list[Any], out: Any) -> str | None:
    """Launch the vectorised kernel when every vector pointer is aligned, else the general
    one; the name of the kernel launched (None: nothing to do)."""
    launch = src.launch
    n = launch["n"]
    if n == 0:
        return None
    block = launch["block"]
    cap = exe._sm_count * (2048 // block)
    vec_kernel = launch.get("vec_kernel")
    if vec_kernel:
        need = launch["align_bytes"]
        aligned = _pointer_ok(out, need["out"]) and all(
            _pointer_ok(ins[k], need[f"in{k}"]) for k in launch["aligned_inputs"])
        if aligned:
            grid = max(1, min(_cdiv(launch["n_vec"], block), cap))
            kernels[vec_kernel]((grid,), (block,), (*ins, out))
            return vec_kernel
    grid = max(1, min(_cdiv(n, block), cap))
    kernels[src.name]((grid,), (block,), (*ins, out))
    return src.name


def _launch_rows(exe: CupyExecutable, kernels: dict[str, Any], src: KernelSource,
                 ins: list[Any], out: Any) -> str | None:
    """Launch a row kernel: the vectorised entry when every vector pointer is aligned;
    the name of the kernel launched (None: no rows)."""
    launch = src.launch
    rows = launch["rows"]
    if rows == 0:
        return None
    block = launch["block"]
    cap = exe._sm_count * max(1, 2048 // block)
    grid = max(1, min(_cdiv(rows, launch["rows_per_block"]), cap))
    entry = src.name
    vec_kernel = launch.get("vec_kernel")
    if vec_kernel:
        arrays = {"out": out, **{f"in{k}": a for k, a in enumerate(ins)}}
        if all(_pointer_ok(arrays[key], nbytes)
               for key, nbytes in launch["align_bytes"].items()):
            entry = vec_kernel
    kernels[entry]((grid,), (block,), (*ins, out))
    return entry


class CupyExecutable:
    """A graph lowered to a launch list of generated kernels, cuBLAS and CuPy calls.

    Parameters
    ----------
    graph
        The optimised graph (static shapes and dtypes).
    impl
        Node id -> implementation (see the module docstring); nodes left out run through
        CuPy. A generated implementation the code generator does not cover falls back to
        CuPy, with the reason in :attr:`kernels`.
    plan
        Optional memory plan (:class:`~pyc_lab.compiler.memory.MemoryPlan`): planned
        buffers are allocated once and reused by every call.
    cuda_graph
        Capture the launch list at the second call and replay it from then on (CUDA
        graphs, with cuBLAS calls between them; see the module docstring).
    tune_gemms
        cuBLASLt GEMMs measure their candidate algorithms at the first call and keep
        the fastest (the ``utilization_first`` mode).

    Notes
    -----
    Building needs no GPU; the first call needs CuPy and a CUDA device.
    """

    def __init__(self, graph: Graph, impl: dict[int, str], plan: MemoryPlan | None = None,
                 cuda_graph: bool = False, tune_gemms: bool = False) -> None:
        self.graph = graph
        self.tune_gemms = bool(tune_gemms)
        self.impl = dict(impl)
        self.plan = plan
        self.cuda_graph = bool(cuda_graph)
        #: Why the CUDA graph could not be captured (None: not tried or captured).
        self.graph_capture_error: str | None = None
        self.calls = 0
        self._cp: Any = None
        self._sm_count = 0
        self._buffers: list[Any] = []
        self._views: dict[tuple[int, int], Any] = {}
        self._consts: dict[int, Any] = {}
        self._prepared = False
        self._graph_exec: list[tuple[str, Any]] | None = None
        self._graph_keep: dict[str, Any] = {}
        self._kernels: list[dict[str, Any]] = []
        self._buffer_of: dict[int, int] = dict(getattr(plan, "buffer_of", {}) or {}) \
            if plan is not None else {}
        self._buffer_bytes = list(getattr(plan, "buffer_bytes", []) or []) \
            if plan is not None else []
        self._aliases = dict(getattr(plan, "aliases", {}) or {}) if plan is not None else {}
        self._inplace = _inplace_pairs(plan) if plan is not None else set()
        self._output_owners = {self._aliases.get(o, o) for o in graph.outputs}
        self._steps: list[_Step] = []
        self._copy_outputs: list[bool] = []
        self._fallbacks: dict[int, str] = {}
        self._build()

    # -- building (no device) --------------------------------------------------------------
    def _own_buffer(self, node: Node) -> int | None:
        """The planned buffer ``node`` writes, if any.

        Views have none of their own; nor do the nodes whose storage an output is: they
        write a fresh array on every call, which is returned as it is (a planned output
        buffer would have to be copied out at every call, since the next call rewrites
        it).
        """
        if node.id in self._aliases or node.id in self._output_owners:
            return None
        return self._buffer_of.get(node.id)

    def _build(self) -> None:
        g = self.graph
        storage: dict[int, frozenset[Any]] = {}
        for k, nid in enumerate(g.inputs):
            storage[nid] = frozenset({("input", k)})
        for node in g:
            if node.op == "input":
                continue
            if node.op == "constant":
                storage[node.id] = frozenset({("constant", node.id)})
                continue
            choice = self.impl.get(node.id, "cupy")
            if choice not in IMPLS:
                log.warning("node %%%d (%s): unknown implementation %r; running it through "
                            "CuPy", node.id, node.op, choice)
                choice = "cupy"
            in_storage = frozenset().union(*(storage[i] for i in node.inputs)) \
                if node.inputs else frozenset()
            step = None
            if choice in ("fused_kernel", "reduction_kernel"):
                step = self._kernel_step(node, choice, in_storage, storage)
            elif choice == "cublaslt":
                step = self._lt_step(node, in_storage, storage)
                if step is None:  # the generated-epilogue path instead
                    step = self._matmul_step(node, "cublas", in_storage, storage)
            elif choice == "cutlass":
                step = self._cutlass_step(node, in_storage, storage)
            elif choice == "cublas":
                step = self._matmul_step(node, choice, in_storage, storage)
            if step is None:
                step = self._cupy_step(node, choice, in_storage, storage)
            self._steps.append(step)
            if step.describe:
                self._kernels.append(step.describe)
        # release values after their last reader (outputs are kept)
        last: dict[int, int] = {}
        for pos, step in enumerate(self._steps):
            for i in step.node.inputs:
                last[i] = pos
        keep = set(g.outputs) | set(g.inputs)
        for nid, pos in last.items():
            if nid not in keep and g.node(nid).op != "constant":
                self._steps[pos].release.append(nid)
        self._copy_outputs = [bool(storage.get(o)) for o in g.outputs]

    def _fallback(self, node: Node, choice: str, why: str) -> None:
        log.warning("node %%%d (%s): %s not used: %s; running it through CuPy", node.id,
                    node.op, choice, why)
        self._fallbacks[node.id] = f"{choice} not used: {why}"

    def _kernel_step(self, node: Node, choice: str, in_storage: frozenset[Any],
                     storage: dict[int, frozenset[Any]]) -> _Step | None:
        g = self.graph
        ok, why = supports(node, g)
        if ok and node.op == "matmul":
            ok, why = False, "a matmul runs through cuBLAS, not a generated kernel"
        if not ok:
            self._fallback(node, choice, why)
            return None
        out_buffer = self._own_buffer(node)
        inplace_input = None
        if out_buffer is not None and ("buffer", out_buffer) in in_storage:
            inplace_input = self._valid_inplace(node, out_buffer, storage)
            if inplace_input is None:
                log.warning("node %%%d (%s): its planned buffer %d holds one of its inputs "
                            "and the plan records no valid in-place write; writing a fresh "
                            "array instead", node.id, node.op, out_buffer)
                out_buffer = None
        src = generate(node, g, inplace=inplace_input is not None)
        storage[node.id] = frozenset({("buffer", out_buffer)}) if out_buffer is not None \
            else frozenset()
        describe = {"node": node.id, "name": src.name, "kind": src.kind, "ops": list(src.ops),
                    "impl": choice, "implementation": f"generated {src.kind} kernel",
                    "source": src.source, "notes": src.notes}
        if inplace_input is not None:
            describe["implementation"] += f", in place over %{inplace_input}"
        return _KernelStep(node, choice, src, out_buffer, inplace_input, describe)

    def _valid_inplace(self, node: Node, buf: int, storage: dict[int, frozenset[Any]]) \
            -> int | None:
        """The input ``node`` may overwrite in buffer ``buf``, if the write is safe."""
        if REGISTRY[node.op].kind not in ("fused", "elementwise"):
            return None
        recorded = [i for (n, i) in self._inplace if n == node.id]
        if not recorded:
            return None
        size = int(np.prod(node.shape, dtype=np.int64))
        g = self.graph
        for i in node.inputs:
            if ("buffer", buf) in storage[i]:
                src = g.node(i)
                # read at the output's flat index: same element count and element size
                if int(np.prod(src.shape, dtype=np.int64)) != size or \
                        src.dtype.itemsize != node.dtype.itemsize:
                    return None
                if len(storage[i]) != 1:
                    return None
        return recorded[0]

    def _matmul_step(self, node: Node, choice: str, in_storage: frozenset[Any],
                     storage: dict[int, frozenset[Any]]) -> _Step | None:
        if node.op != "matmul":
            self._fallback(node, choice, f"{node.op} is not a matmul")
            return None
        epilogue = None
        if len(node.inputs) == 3 or node.attrs.get("activation"):
            ok, why = supports(node, self.graph)
            if not ok:
                self._fallback(node, choice, f"epilogue: {why}")
                return None
            epilogue = generate_epilogue(node, self.graph)
        out_buffer = self._gemm_output(node, in_storage, storage)
        backend = "cuBLAS (cupy.matmul)" + (" in place of a tuned CUTLASS kernel"
                                             if choice == "cutlass" else "")
        describe = {"node": node.id, "name": epilogue.name if epilogue else f"matmul_{node.id}",
                    "kind": "cublas", "ops": ["matmul", *(epilogue.ops if epilogue else ())],
                    "impl": choice,
                    "implementation": backend + (" + generated epilogue" if epilogue else ""),
                    "source": epilogue.source if epilogue else "",
                    "notes": epilogue.notes if epilogue else ""}
        return _MatmulStep(node, choice, epilogue, out_buffer, describe)

    def _gemm_output(self, node: Node, in_storage: frozenset[Any],
                     storage: dict[int, frozenset[Any]]) -> int | None:
        """The planned buffer a GEMM writes (None: a fresh array), and its storage noted."""
        out_buffer = self._own_buffer(node)
        if out_buffer is not None and ("buffer", out_buffer) in in_storage:
            log.warning("node %%%d (matmul): its planned buffer %d holds an operand; writing "
                        "a fresh array instead", node.id, out_buffer)
            out_buffer = None
        storage[node.id] = frozenset({("buffer", out_buffer)}) if out_buffer is not None \
            else frozenset()
        return out_buffer

    def _cutlass_step(self, node: Node, in_storage: frozenset[Any],
                      storage: dict[int, frozenset[Any]]) -> _Step | None:
        from ..policy import lt_problem, tuned_problem

        epilogue = len(node.inputs) == 3 or bool(node.attrs.get("activation"))
        fallback = None
        if node.op == "matmul" and epilogue and not lt_problem(node, self.graph):
            fallback = self._lt_step(node, in_storage, storage)
        if fallback is None:
            fallback = self._matmul_step(node, "cublas", in_storage, storage)
        if fallback is None:
            return None
        problem, why = tuned_problem(node, self.graph)
        if problem is None:
            self._fallback(node, "cutlass", why)
            return fallback
        m, n, k, dtype, layout, epi = problem
        describe = {**fallback.describe, "kind": "cutlass", "impl": "cutlass",
                    "implementation": (f"tuned CUTLASS GEMM {m}x{n}x{k} {dtype} {layout}"
                                       + (f", epilogue {epi.name} fused" if epi.fused else "")
                                       + f" (else {fallback.describe.get('implementation')})"),
                    "notes": "kernel from the tuning database (pyc_lab.autotune_gemm)"}
        return _CutlassStep(node, problem, fallback, describe)

    def _lt_step(self, node: Node, in_storage: frozenset[Any],
                 storage: dict[int, frozenset[Any]]) -> _Step | None:
        from ..policy import lt_problem

        why = lt_problem(node, self.graph) if node.op == "matmul" else \
            f"{node.op} is not a matmul"
        if why:
            log.warning("node %%%d (%s): cublaslt not used: %s; cuBLAS and a generated "
                        "epilogue instead", node.id, node.op, why)
            self._fallbacks[node.id] = f"cublaslt not used: {why}"
            return None
        out_buffer = self._gemm_output(node, in_storage, storage)
        act = node.attrs.get("activation")
        ops = ["matmul"] + (["bias_add"] if len(node.inputs) == 3 else []) + \
            ([act] if act else [])
        from ...kernels.cublaslt import EPILOGUES

        epilogue = EPILOGUES[(len(node.inputs) == 3, act)]
        describe = {"node": node.id, "name": f"matmul_{node.id}_lt", "kind": "cublaslt",
                    "ops": ops, "impl": "cublaslt",
                    "implementation": f"cuBLASLt (nvmath-python), epilogue {epilogue}",
                    "source": "",
                    "notes": ("out.T = epilogue(b.T @ a.T + bias): the row-major problem "
                              "as cuBLASLt's column-major one, no copies; algorithm "
                              + ("measured at the first call" if self.tune_gemms
                                 else "from the heuristic"))}
        return _LtStep(node, "cublaslt", out_buffer, describe, self.tune_gemms)

    def _cupy_step(self, node: Node, choice: str, in_storage: frozenset[Any],
                   storage: dict[int, frozenset[Any]]) -> _Step:
        kind = REGISTRY[node.op].kind
        fresh = kind in _FRESH_KINDS
        out_storage = frozenset() if fresh else in_storage
        planned_in = any(tag[0] == "buffer" for tag in out_storage)
        materialize = None
        out_buffer = None
        if node.id in self._aliases or (node.op in _VIEW_OPS and node.id not in self._buffer_of):
            pass  # a view the plan knows about (or of inputs/constants): keep it
        elif planned_in:
            out_buffer = self._own_buffer(node)
            if out_buffer is not None and ("buffer", out_buffer) not in in_storage:
                materialize = "buffer"
                out_storage = frozenset({("buffer", out_buffer)})
            else:
                materialize = "copy"
                out_storage = frozenset()
        storage[node.id] = out_storage
        describe: dict[str, Any] = {}
        if kind != "shape" or node.id in self._fallbacks:
            describe = {"node": node.id,
                        "name": str(node.attrs.get("name") or f"{node.op}_{node.id}"),
                        "kind": "eager" if choice == "eager" else "cupy",
                        "ops": list(node.attrs.get("ops") or (node.op,)),
                        "impl": choice,
                        "implementation": "eager (the original call)" if choice == "eager"
                        else "CuPy (the op's reference)",
                        "source": "", "notes": self._fallbacks.get(node.id, "")}
        impl = "eager" if choice == "eager" else "cupy"
        return _CupyStep(node, impl, materialize, out_buffer, describe)

    @property
    def kernels(self) -> list[dict[str, Any]]:
        """What runs, in order: name, kind, ops, impl, implementation, source, notes, node.

        ``source`` is the generated CUDA text (empty for CuPy calls); shape ops (views)
        are left out.
        """
        return [dict(k) for k in self._kernels]

    # -- device side -------------------------------------------------------------------------
    def _prepare(self) -> None:
        if self._prepared:
            return
        from ...hardware.device import require_cupy

        cp = require_cupy("the CuPy backend")
        self._cp = cp
        dev = cp.cuda.Device()
        self._sm_count = int(dev.attributes["MultiProcessorCount"])
        self._buffers = [cp.empty(max(int(b), 1), dtype=cp.uint8)
                         for b in self._buffer_bytes]
        for node in self.graph:
            if node.op == "constant":
                value = cp.asarray(np.asarray(node.attrs["value"]))
                if value.dtype != node.dtype:
                    value = value.astype(node.dtype)
                self._consts[node.id] = value
        for step in self._steps:
            step.prepare(self)
        self._prepared = True

    def _buffer_view(self, buf: int, node: Node) -> Any:
        """``node``'s typed view of planned buffer ``buf`` (made once, then reused: the
        buffers live as long as the executable)."""
        view = self._views.get((buf, node.id))
        if view is not None:
            return view
        nbytes = node.nbytes
        if nbytes > self._buffers[buf].size:
            raise PycLabError(f"memory plan: buffer {buf} has {self._buffers[buf].size} bytes, "
                              f"node %{node.id} needs {nbytes}")
        view = self._buffers[buf][:nbytes].view(node.dtype).reshape(node.shape)
        self._views[(buf, node.id)] = view
        return view

    @staticmethod
    def _operand(value: Any, node: Node, cp: Any) -> Any:
        """An input of a generated kernel: the node's shape and dtype, C-contiguous."""
        if value.dtype != node.dtype:
            value = value.astype(node.dtype)
        if tuple(value.shape) != tuple(node.shape):
            raise PycLabError(f"value of %{node.id} has shape {tuple(value.shape)}, the graph "
                              f"says {node.shape}")
        if not value.flags.c_contiguous:
            value = cp.ascontiguousarray(value)
        return value

    def _check_args(self, args: Sequence[Any]) -> list[Any]:
        cp = self._cp
        g = self.graph
        if len(args) != len(g.inputs):
            raise PycLabError(f"{g.name} takes {len(g.inputs)} array(s), got {len(args)}")
        out = []
        for k, (a, nid) in enumerate(zip(args, g.inputs, strict=True)):
            node = g.node(nid)
            if not isinstance(a, cp.ndarray):
                a = cp.asarray(a)
            if tuple(a.shape) != tuple(node.shape) or a.dtype != node.dtype:
                raise PycLabError(
                    f"{g.name}: argument {k} is {a.dtype.name}{list(a.shape)}, but this "
                    f"executable was built for {node.type_text}")
            out.append(a)
        return out

    def _execute(self, args: Sequence[Any]) -> dict[int, Any]:
        """Run the launch list on the current stream; the values of the outputs."""
        values: dict[int, Any] = dict(zip(self.graph.inputs, args, strict=True))
        values.update(self._consts)
        for step in self._steps:
            step.run(self, values)
            for nid in step.release:
                values.pop(nid, None)
        return values

    def _finish(self, values: dict[int, Any]) -> list[Any]:
        outs = []
        for o, copy in zip(self.graph.outputs, self._copy_outputs, strict=True):
            v = values[o]
            outs.append(v.copy() if copy else v)
        return outs

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        """Run the graph on ``args`` (CuPy arrays, one per graph input), in order.

        Returns
        -------
        list of cupy.ndarray
            The graph's outputs, fresh arrays on every call.
        """
        self._prepare()
        args = self._check_args(list(args))
        self.calls += 1
        if self.cuda_graph and self.graph_capture_error is None and self.calls >= 2:
            if self._graph_exec is None:
                self._capture()
            if self._graph_exec is not None:
                return self._replay(args)
        return self._finish(self._execute(args))

    # -- CUDA graph ----------------------------------------------------------------------------
    def _capture(self) -> None:
        """Record the launch list once as a replay program on static memory.

        Capturable steps (generated kernels, CuPy calls) are captured on a non-blocking
        stream into CUDA graphs; CuPy refuses cuBLAS calls during a capture, so each
        matmul ends the current graph and becomes a call on static arrays between two
        graphs. Everything is allocated from a private pool, kept with the program.
        """
        cp = self._cp
        static_in = [cp.empty(self.graph.node(i).shape, dtype=self.graph.node(i).dtype)
                     for i in self.graph.inputs]
        for a in static_in:
            a.fill(0)  # recording reads nothing, but keep the buffers defined
        pool = cp.cuda.MemoryPool()
        stream = cp.cuda.Stream(non_blocking=True)
        values: dict[int, Any] = dict(zip(self.graph.inputs, static_in, strict=True))
        values.update(self._consts)
        program: list[tuple[str, Any]] = []
        try:
            with cp.cuda.using_allocator(pool.malloc), stream:
                capturing = False
                try:
                    for step in self._steps:
                        if step.capturable:
                            if not capturing:
                                stream.begin_capture()
                                capturing = True
                            step.run(self, values)
                        else:
                            if capturing:
                                program.append(("graph", stream.end_capture()))
                                capturing = False
                            program.append(("call", step.static_call(self, values)))
                        for nid in step.release:
                            values.pop(nid, None)
                    if capturing:
                        program.append(("graph", stream.end_capture()))
                        capturing = False
                except BaseException:
                    if capturing:  # leave capture mode; nothing of it is kept
                        with contextlib.suppress(Exception):
                            stream.end_capture()
                    raise
        except Exception as exc:
            self.graph_capture_error = f"{type(exc).__name__}: {exc}"
            log.warning("CUDA graph capture of %s failed (%s); running kernel by kernel",
                        self.graph.name, self.graph_capture_error)
            return
        # Everything the program reads or writes stays alive with it: the static inputs,
        # the values (outputs included) and the private pool it allocated from.
        self._graph_keep = {"inputs": static_in, "values": values, "pool": pool,
                            "stream": stream}
        self._graph_exec = program
        log.debug("captured %s: %d CUDA graph(s) and %d cuBLAS call(s)", self.graph.name,
                  self.graph_segments, len(program) - self.graph_segments)

    def _replay(self, args: Sequence[Any]) -> list[Any]:
        cp = self._cp
        static_in = self._graph_keep["inputs"]
        stream = cp.cuda.get_current_stream()
        for dst, src in zip(static_in, args, strict=True):
            if src.flags.c_contiguous:  # one cudaMemcpyAsync, no kernel
                dst.data.copy_from_device_async(src.data, src.nbytes, stream)
            else:
                cp.copyto(dst, src)
        for kind, item in self._graph_exec:
            if kind == "graph":
                item.launch(stream=stream)
            else:
                item()
        values = self._graph_keep["values"]
        outs = []
        for o in self.graph.outputs:
            v = values[o]
            if v.flags.c_contiguous:
                out = cp.empty(v.shape, dtype=v.dtype)
                out.data.copy_from_device_async(v.data, v.nbytes, stream)
            else:
                out = v.copy()
            outs.append(out)
        return outs

    @property
    def graph_segments(self) -> int:
        """How many CUDA graphs the replay program holds (0 before the capture)."""
        return sum(1 for kind, _ in (self._graph_exec or ()) if kind == "graph")

    @property
    def launched(self) -> dict[int, str | None]:
        """Node id -> the generated kernel its last call launched (``name`` or
        ``name_vec``; None where nothing ran), for generated kernels and epilogues."""
        return {s.node.id: getattr(s, "last_entry", None) for s in self._steps
                if isinstance(s, (_KernelStep, _MatmulStep)) and
                (not isinstance(s, _MatmulStep) or s.epilogue is not None)}

    @property
    def graph_captured(self) -> bool:
        """Whether calls replay the captured program (CUDA graphs, cuBLAS between them)."""
        return self._graph_exec is not None
