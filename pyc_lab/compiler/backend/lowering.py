"""Lowering: a graph and an implementation per node become the launch list (no device).

:func:`lower` walks the graph once and gives every node a step (:mod:`.steps`):

========================= ==============================================================
impl                      step
========================= ==============================================================
``fused_kernel``          the generated elementwise kernel of a fused (or elementwise)
                          node (:class:`~.steps._KernelStep`)
``reduction_kernel``      the generated row kernel (softmax, layer norm, last-axis sum,
                          mean, max, min, var, row programs) or column kernel (sum,
                          mean, max, min over leading or middle axes)
``cublas``                the library GEMM on (transposed) views (``pl.matmul``'s
                          library path: cuBLAS, or cuBLASLt where it is faster), then
                          the generated bias/activation epilogue in place on the
                          product (cuBLAS itself inside a CUDA graph); a small
                          matmul (two matrices, a stack over one weight or a batch)
                          also gets the generated small GEMM, raced against that at
                          the first call (:mod:`.small_gemm`)
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

An implementation that cannot serve a node falls back (a generated kernel the code
generator does not cover, cuBLASLt without nvmath-python, a matmul with no tuned
kernel...), with a warning logged and the reason kept in :attr:`LaunchList.fallbacks`
and shown by ``explain()``.

**Memory.** With a :class:`~pyc_lab.compiler.memory.MemoryPlan`, a node writing a
planned buffer writes a view of it with its dtype and shape. Each value's possible
storage (planned buffers, inputs, constants) is tracked along the way, so that

- a kernel never writes a buffer one of its inputs lives in, unless the plan records
  that in-place write and every input in that buffer is read at the output's flat
  index (the kernel is then generated without ``__restrict__``); otherwise the node
  gets a fresh array and a warning is logged;
- a CuPy call whose result may be a view of a planned buffer (transpose, slice, eager
  calls) is copied into the node's own planned buffer, as the plan assumes, so that a
  buffer the plan frees is never still read through a view;
- outputs that live in planned buffers, inputs or constants are copied, so every call
  returns fresh arrays the caller may keep.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..codegen import generate, generate_epilogue, supports
from ..codegen.small_gemm import check_small_gemm, generate_small_gemm
from ..ir import Graph, Node
from ..ops import REGISTRY
from . import small_gemm
from .gemm_operands import batched_gemm
from .steps import (
    _CupyStep,
    _CutlassStep,
    _KernelStep,
    _LibraryStep,
    _LtStep,
    _MatmulStep,
    _RecordedLibraryStep,
    _Step,
    _WrittenStep,
)

__all__ = ["IMPLS", "LaunchList", "lower"]

log = logging.getLogger(__name__)

#: Implementations the executable understands (``source`` for inputs and constants;
#: ``numpy``/``view`` run as ``cupy``).
IMPLS = ("fused_kernel", "reduction_kernel", "cublas", "cublaslt", "cutlass", "cupy", "eager",
         "source", "attention", "conv",
         "numpy", "view")

#: Ops whose CuPy result is always a new array (never a view of an input).
_FRESH_KINDS = frozenset({"norm", "reduction", "matmul", "attention", "conv", "scan"})

_VIEW_OPS = frozenset({"reshape", "expand_dims", "squeeze"})

#: A value's possible storage: ``("buffer", k)``, ``("input", k)``, ``("constant", id)``.
Storage = frozenset[Any]


@dataclass
class LaunchList:
    """What :func:`lower` makes of a graph.

    Attributes
    ----------
    steps
        One step per computed node, in graph order; ``step.release`` lists the values
        nobody reads after it.
    kernels
        The ``describe`` dict of every step shown to users (shape-op views left out).
    copy_outputs
        Per graph output: whether it may live in memory a later call rewrites (a planned
        buffer, an input, a constant), so that it is copied out at every call.
    fallbacks
        Node id -> why its implementation was not used.
    """

    steps: list[_Step] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    copy_outputs: list[bool] = field(default_factory=list)
    fallbacks: dict[int, str] = field(default_factory=dict)


#: With CUDA graphs, a GEMM whose epilogue cuBLASLt would fuse runs as cuBLAS called
#: directly plus a generated epilogue, recorded into the graph with the kernels around
#: it, when its output has at most this many elements: cuBLASLt's fused call runs
#: between graphs for tens of microseconds of host time, more than the epilogue's extra
#: pass over an output this size (8 MiB of float16) costs the GPU.
GRAPH_EPILOGUE_ELEMENTS = 1 << 22


def lower(graph: Graph, impl: dict[int, str], plan: Any = None, *,
          tune_gemms: bool = False, cuda_graph: bool = False) -> LaunchList:
    """The launch list of ``graph`` with implementation ``impl`` per node.

    Parameters
    ----------
    graph
        The optimised graph (static shapes and dtypes).
    impl
        Node id -> implementation (see the module docstring); nodes left out run through
        CuPy.
    plan
        Optional memory plan: ``buffer_of`` (node -> buffer), ``aliases`` (view ->
        source) and ``inplace`` (the in-place writes it records).
    tune_gemms
        cuBLASLt steps measure their candidate algorithms at the first call.
    cuda_graph
        The launch list will be captured into CUDA graphs (see
        :data:`GRAPH_EPILOGUE_ELEMENTS`).
    """
    return _Lowering(graph, impl, plan, tune_gemms, cuda_graph).run()


def _inplace_pairs(plan: Any) -> set[tuple[int, int]]:
    """The plan's in-place writes as ``(node, input)`` pairs (any reasonable encoding)."""
    raw = getattr(plan, "inplace", None) or ()
    pairs: set[tuple[int, int]] = set()
    items = raw.items() if isinstance(raw, dict) else raw
    for item in items:
        if isinstance(item, (tuple, list)) and len(item) == 2:
            pairs.add((int(item[0]), int(item[1])))
    return pairs


class _Lowering:
    """One walk over the graph: a step per node, the storage of every value tracked."""

    def __init__(self, graph: Graph, impl: dict[int, str], plan: Any,
                 tune_gemms: bool, cuda_graph: bool = False) -> None:
        self.graph = graph
        self.impl = impl
        self.tune_gemms = tune_gemms
        self.cuda_graph = cuda_graph
        self._buffer_of: dict[int, int] = dict(getattr(plan, "buffer_of", {}) or {}) \
            if plan is not None else {}
        self._aliases = dict(getattr(plan, "aliases", {}) or {}) if plan is not None else {}
        self._inplace = _inplace_pairs(plan) if plan is not None else set()
        self._output_owners = {self._aliases.get(o, o) for o in graph.outputs}
        self._fallbacks: dict[int, str] = {}
        self._written: set[int] = set()  # fused_extra nodes a fused kernel writes

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

    def run(self) -> LaunchList:
        g = self.graph
        out = LaunchList(fallbacks=self._fallbacks)
        storage: dict[int, Storage] = {}
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
            if node.op == "fused_extra":
                step = self._written_step(node, storage)
            elif choice in ("fused_kernel", "reduction_kernel"):
                step = self._kernel_step(node, choice, in_storage, storage)
            elif choice == "cublaslt" and self._graph_epilogue(node):
                step = self._matmul_step(node, "cublas", in_storage, storage)
                if step is not None:
                    step.describe["implementation"] += (
                        ", recorded into the CUDA graph (cuBLASLt's fused epilogue would "
                        "be a library call between graphs)")
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
            out.steps.append(step)
            if step.describe:
                out.kernels.append(step.describe)
        # release values after their last reader (outputs are kept)
        last: dict[int, int] = {}
        for pos, step in enumerate(out.steps):
            for i in step.node.inputs:
                last[i] = pos
        keep = set(g.outputs) | set(g.inputs)
        for nid, pos in last.items():
            if nid not in keep and g.node(nid).op != "constant":
                out.steps[pos].release.append(nid)
        out.copy_outputs = [bool(storage.get(o)) for o in g.outputs]
        return out

    def _graph_epilogue(self, node: Node) -> bool:
        """Whether a cuBLASLt-epilogue GEMM runs as cuBLAS + a generated epilogue inside
        the CUDA graph instead (:data:`GRAPH_EPILOGUE_ELEMENTS`); noted as a fallback."""
        if not self.cuda_graph or node.op != "matmul":
            return False
        size = int(np.prod(node.shape, dtype=np.int64))
        if size > GRAPH_EPILOGUE_ELEMENTS:
            return False
        self._fallbacks[node.id] = (
            f"cublaslt not used: with CUDA graphs, a {size}-element output's epilogue is "
            "generated and recorded into the graph with the GEMM, cuBLAS called directly")
        return True

    def _fallback(self, node: Node, choice: str, why: str) -> None:
        log.warning("node %%%d (%s): %s not used: %s; running it through CuPy", node.id,
                    node.op, choice, why)
        self._fallbacks[node.id] = f"{choice} not used: {why}"

    def _kernel_step(self, node: Node, choice: str, in_storage: Storage,
                     storage: dict[int, Storage]) -> _Step | None:
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
        extras = self._extra_outputs(node, storage)
        describe = {"node": node.id, "name": src.name, "kind": src.kind, "ops": list(src.ops),
                    "impl": choice, "implementation": f"generated {src.kind} kernel",
                    "source": src.source, "notes": src.notes}
        if inplace_input is not None:
            describe["implementation"] += f", in place over %{inplace_input}"
        written = [f"%{e}" for e, _ in extras if e is not None]
        if written:
            describe["implementation"] += f", also writing {', '.join(written)}"
        return _KernelStep(node, choice, src, out_buffer, inplace_input, describe, extras)

    def _extra_outputs(self, node: Node, storage: dict[int, Storage]) \
            -> list[tuple[int | None, int | None]]:
        """For a fused body with several outputs: per output 1, 2, ... the fused_extra
        node reading it (None: unread) and its buffer; their storage noted, and the
        nodes recorded as written by this kernel."""
        body = node.attrs.get("body")
        if node.op not in ("fused", "fused_rows") or body is None or len(body.outputs) < 2:
            return []
        readers = {u.attrs["output"]: u for u in self.graph
                   if u.op == "fused_extra" and u.inputs and u.inputs[0] == node.id}
        extras: list[tuple[int | None, int | None]] = []
        for k in range(1, len(body.outputs)):
            extra = readers.get(k)
            if extra is None:
                extras.append((None, None))
                continue
            buf = self._own_buffer(extra)
            storage[extra.id] = frozenset({("buffer", buf)}) if buf is not None \
                else frozenset()
            self._written.add(extra.id)
            extras.append((extra.id, buf))
        return extras

    def _written_step(self, node: Node, storage: dict[int, Storage]) -> _Step:
        """A fused_extra node: nothing to run when its fused node's kernel wrote it, else
        its reference through CuPy (the fused node itself fell back)."""
        if node.id in self._written:
            return _WrittenStep(node, "fused_kernel", {})
        in_storage = frozenset().union(*(storage[i] for i in node.inputs))
        return self._cupy_step(node, "cupy", in_storage, storage)

    def _valid_inplace(self, node: Node, buf: int, storage: dict[int, Storage]) -> int | None:
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

    def _matmul_step(self, node: Node, choice: str, in_storage: Storage,
                     storage: dict[int, Storage]) -> _Step | None:
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
        a, b = (self.graph.node(i) for i in node.inputs[:2])
        batched = batched_gemm(tuple(a.shape), a.dtype, tuple(b.shape), b.dtype)
        backend = ("pl.matmul (one strided-batched GEMM; CuPy's batched matmul computes "
                   "16-bit floats in float32)" if batched else
                   "library GEMM (pl.matmul's path: cuBLAS, or cuBLASLt where it is faster)") + (
            " in place of a tuned CUTLASS kernel" if choice == "cutlass" else "")
        small = None
        if small_gemm.ENABLED and not check_small_gemm(node, self.graph):
            small = generate_small_gemm(node, self.graph)
        describe = {"node": node.id, "name": epilogue.name if epilogue else f"matmul_{node.id}",
                    "kind": "cublas", "ops": ["matmul", *(epilogue.ops if epilogue else ())],
                    "impl": choice,
                    "implementation": backend + (" + generated epilogue" if epilogue else "")
                    + (f"; or the generated small GEMM {small.name} (product and epilogue "
                       "in one kernel) where the first call measures it faster"
                       if small is not None else ""),
                    "source": epilogue.source if epilogue else "",
                    "notes": epilogue.notes if epilogue else ""}
        return _MatmulStep(node, choice, epilogue, out_buffer, describe, small)

    def _gemm_output(self, node: Node, in_storage: Storage,
                     storage: dict[int, Storage]) -> int | None:
        """The planned buffer a GEMM writes (None: a fresh array), and its storage noted."""
        out_buffer = self._own_buffer(node)
        if out_buffer is not None and ("buffer", out_buffer) in in_storage:
            log.warning("node %%%d (matmul): its planned buffer %d holds an operand; writing "
                        "a fresh array instead", node.id, out_buffer)
            out_buffer = None
        storage[node.id] = frozenset({("buffer", out_buffer)}) if out_buffer is not None \
            else frozenset()
        return out_buffer

    def _cutlass_step(self, node: Node, in_storage: Storage,
                      storage: dict[int, Storage]) -> _Step | None:
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

    def _lt_step(self, node: Node, in_storage: Storage,
                 storage: dict[int, Storage]) -> _Step | None:
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

    def _cupy_step(self, node: Node, choice: str, in_storage: Storage,
                   storage: dict[int, Storage]) -> _Step:
        opdef = REGISTRY[node.op]
        kind = opdef.kind
        fresh = kind in _FRESH_KINDS
        out_storage = frozenset() if fresh else in_storage
        planned_in = any(tag[0] == "buffer" for tag in out_storage)
        materialize = None
        out_buffer = None
        own = self._own_buffer(node) if choice == "conv" else None
        if own is not None and (opdef.record is not None or opdef.bind is not None):
            # a library op that writes into an array it is given (a convolution): its
            # planned buffer, so its output's memory is reused as the plan says rather
            # than a fresh array of its own held as long as the program
            out_buffer = own
            materialize = "buffer"
            out_storage = frozenset({("buffer", out_buffer)})
        elif node.id in self._aliases or (node.op in _VIEW_OPS
                                          and node.id not in self._buffer_of):
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
        if choice == "attention":
            describe.update(kind="library", implementation=(
                "pl.attention: torch's scaled_dot_product_attention where torch is "
                "installed, else the blocked online softmax (a call between CUDA graphs)"))
            return _LibraryStep(node, "attention", materialize, out_buffer, describe)
        if choice == "conv":
            describe.update(kind="library", implementation=(
                "pl.conv: cuDNN, the GEMM form or pyc_lab's direct kernel (whichever its "
                "first call measured fastest) where torch is installed, else im2col; the "
                "direct kernel is recorded into CUDA graphs, the libraries are calls "
                "between them"))
            return _RecordedLibraryStep(node, "conv", materialize, out_buffer, describe)
        if kind == "scan":  # CUB's scans and sorts take workspace a capture cannot record
            describe.update(kind="library", implementation=(
                f"CuPy's {node.op} (a library call between CUDA graphs)"))
            return _LibraryStep(node, "cupy", materialize, out_buffer, describe)
        impl = "eager" if choice == "eager" else "cupy"
        return _CupyStep(node, impl, materialize, out_buffer, describe)
