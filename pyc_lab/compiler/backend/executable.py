"""The CuPy executable: a graph's launch list run on the GPU, call after call.

:class:`CupyExecutable` lowers a graph and an implementation per node (from
:mod:`pyc_lab.compiler.policy`) to a launch list once (:mod:`.lowering`, no device
needed: the generated sources are in :attr:`CupyExecutable.kernels`), then runs it on
every call. The device is touched at the first call, which compiles the kernels (cached
by source), uploads the constants and allocates the planned buffers: with a
:class:`~pyc_lab.compiler.memory.MemoryPlan`, every planned buffer is one ``uint8`` CuPy
array allocated once, viewed with each node's dtype and shape.

**CUDA graphs.** With ``cuda_graph=True`` the first call runs normally (compiling and
warming up), the second captures the launch list once (:mod:`.graphs`: CUDA graphs,
with the library calls between them; inputs at the same address as in the first call
are read in place, the others copied at each replay, and an input read in place that
moves later costs a new capture at that call, with that input copied from then on), and
that call and
every later one replay it. Small GEMMs whose epilogue cuBLASLt would fuse run as cuBLAS
plus a generated epilogue instead, so that they are recorded into the graph too
(:data:`~.lowering.GRAPH_EPILOGUE_ELEMENTS`). If
the capture fails (an eager node that synchronises, say), calls run normally and the
reason is kept in :attr:`CupyExecutable.graph_capture_error`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import PycLabError
from ..ir import Graph, Node
from ..ops import VIEW_RESULT_OPS
from .graphs import CaptureError, GraphProgram, Rebind, capture
from .lowering import IMPLS, lower
from .steps import _KernelStep, _MatmulStep, _Step, _WrittenStep

if TYPE_CHECKING:
    from ..memory import MemoryPlan

__all__ = ["AUTO_GRAPH_BYTES", "IMPLS", "CupyExecutable", "auto_graph_refusal"]

log = logging.getLogger(__name__)

#: ``cuda_graph="auto"`` captures programs moving at most this many bytes of inputs and
#: outputs: there the call is bound by its host time, which a replay cuts (on the H200 a
#: SwiGLU block at 1/256 of the suite's size took 160 us a call launched step by step
#: and 36 us replayed, benchmarks/results/h200/issue16-9d76a2b/host-time.json), while an
#: input passed at a new address is copied into the graph's buffer at each replay, and
#: at this size that copy costs a few microseconds of GPU time at most.
AUTO_GRAPH_BYTES = 8 << 20



def _io_bytes(graph: Graph, outputs: bool = True) -> int:
    """Bytes of the graph's inputs (and outputs)."""
    ids = [*graph.inputs, *graph.outputs] if outputs else graph.inputs
    return sum(graph.node(i).nbytes for i in ids)


def auto_graph_refusal(graph: Graph, steps: Sequence[_Step]) -> str:
    """Why ``cuda_graph="auto"`` leaves a launch list uncaptured, or ``""`` to capture it.

    Captured: a program of at most :data:`AUTO_GRAPH_BYTES` of inputs and outputs with at
    least two steps that launch work, each of them recordable (a generated kernel, a CuPy
    op, a GEMM with a direct cuBLAS form). Replaying one launch saves nothing (the
    results are copied out of the graph's buffers), and a library call that cannot be
    recorded splits the graph and costs the replay more than it saves (measured for the
    attention lowering: 363 us a call launched, 464 us replayed).
    """
    io = _io_bytes(graph)
    if io > AUTO_GRAPH_BYTES:
        return (f"inputs and outputs of {io / 2**20:.1f} MiB (over "
                f"{AUTO_GRAPH_BYTES >> 20} MiB): the GPU time, not the launches, is the cost")
    launches = 0
    for step in steps:
        op = step.node.op
        if op == "eager":
            return "a graph break whose shape depends on the data"
        if not step.capturable and not hasattr(step, "graph_call"):
            return f"%{step.node.id} ({op}) is a library call a CUDA graph cannot record"
        if not isinstance(step, _WrittenStep) and op not in VIEW_RESULT_OPS:
            launches += 1
    if launches < 2:
        return "one launch: a replay would save nothing"
    return ""


class CupyExecutable:
    """A graph lowered to a launch list of generated kernels, cuBLAS and CuPy calls.

    Parameters
    ----------
    graph
        The optimised graph (static shapes and dtypes).
    impl
        Node id -> implementation (see :mod:`.lowering`); nodes left out run through
        CuPy. A generated implementation the code generator does not cover falls back to
        CuPy, with the reason in :attr:`kernels`.
    plan
        Optional memory plan (:class:`~pyc_lab.compiler.memory.MemoryPlan`): planned
        buffers are allocated once and reused by every call.
    cuda_graph
        Capture the launch list at the second call and replay it from then on (CUDA
        graphs, with cuBLAS calls between them; see :mod:`.graphs`). ``"auto"``: only
        where that pays (:func:`auto_graph_refusal`; the reason either way is in
        :attr:`graph_decision`).
    tune_gemms
        cuBLASLt GEMMs measure their candidate algorithms at the first call and keep
        the fastest (the ``utilization_first`` mode).

    Notes
    -----
    Building needs no GPU; the first call needs CuPy and a CUDA device.
    """

    def __init__(self, graph: Graph, impl: dict[int, str], plan: MemoryPlan | None = None,
                 cuda_graph: bool | str = False, tune_gemms: bool = False) -> None:
        self.graph = graph
        self.tune_gemms = bool(tune_gemms)
        self.impl = dict(impl)
        self.plan = plan
        auto = cuda_graph == "auto"
        #: Whether graphs were asked for (True/False) or left to :func:`auto_graph_refusal`
        self.graph_mode: bool | str = "auto" if auto else bool(cuda_graph)
        # "auto" lowers for graphs where they may be taken (decided after lowering)
        self.cuda_graph = bool(cuda_graph) if not auto else \
            _io_bytes(graph, outputs=False) <= AUTO_GRAPH_BYTES
        #: Why the CUDA graph could not be captured (None: not tried or captured).
        self.graph_capture_error: str | None = None
        self.calls = 0
        self._cp: Any = None
        self._sm_count = 0
        self._buffers: list[Any] = []
        self._views: dict[tuple[int, int], Any] = {}
        self._consts: dict[int, Any] = {}
        self._prepared = False
        self._program: GraphProgram | None = None
        #: Where each input was in the last call (address, strides), and the inputs seen
        #: to move after a capture read them in place (copied from then on).
        self._last_places: list[tuple[int, tuple]] | None = None
        self._moved: set[int] = set()
        #: Successful captures so far: one, plus one per replay that found inputs read
        #: in place at a new address (at most one per input: a moved input is copied).
        self.captures = 0
        self._buffer_bytes = list(getattr(plan, "buffer_bytes", []) or []) \
            if plan is not None else []
        launch = lower(graph, self.impl, plan, tune_gemms=self.tune_gemms,
                       cuda_graph=self.cuda_graph)
        self._steps: list[_Step] = launch.steps
        self._kernels: list[dict[str, Any]] = launch.kernels
        self._copy_outputs: list[bool] = launch.copy_outputs
        #: Node id -> why its implementation was not used (at building or at a call).
        self._fallbacks: dict[int, str] = launch.fallbacks
        #: Why calls replay CUDA graphs or do not (``cuda_graph="auto"``), else None.
        self.graph_decision: str | None = None
        #: Whether the launch list has run once (what a capture needs before it).
        self._warm = False
        if auto:
            refusal = auto_graph_refusal(graph, self._steps)
            self.cuda_graph = not refusal
            self.graph_decision = refusal or "captured at the second call: several " \
                "launches, each recordable, on small arrays (host time is the cost)"
        #: Each input's shape and dtype, as every call checks them
        self._in_specs = [(tuple(graph.node(i).shape), graph.node(i).dtype)
                          for i in graph.inputs]

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

    def _check_args(self, args: Sequence[Any]) -> list[Any]:
        cp = self._cp
        specs = self._in_specs
        if len(args) != len(specs):
            raise PycLabError(f"{self.graph.name} takes {len(specs)} array(s), got "
                              f"{len(args)}")
        ndarray = cp.ndarray
        out = []
        for a, (shape, dtype) in zip(args, specs, strict=True):
            if not isinstance(a, ndarray):
                a = cp.asarray(a)
            if a.shape != shape or a.dtype != dtype:
                k = len(out)
                node = self.graph.node(self.graph.inputs[k])
                raise PycLabError(
                    f"{self.graph.name}: argument {k} is {a.dtype.name}{list(a.shape)}, but "
                    f"this executable was built for {node.type_text}")
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
        return self._run(self._check_args(list(args)))

    def trusted(self, args: Sequence[Any]) -> Callable[[list[Any]], list[Any]] | None:
        """The call for later arguments of the same kind as ``args`` (CuPy arrays of the
        same shapes, dtypes and contiguity, which a call has accepted): it skips the
        argument checks, which such arguments pass. ``None`` where an argument is not a
        CuPy array (the checks convert it). The caller vouches for the kind."""
        self._prepare()
        ndarray = self._cp.ndarray
        if len(args) != len(self._in_specs) or any(type(a) is not ndarray for a in args):
            return None
        return self._run

    def _run(self, args: list[Any]) -> list[Any]:
        self.calls += 1
        self._warm = True
        if self.cuda_graph and self.graph_capture_error is None:
            places = [(a.data.ptr, a.strides) for a in args]
            if self.calls >= 2 and self._program is None:
                self._capture(args, places)
            self._last_places = places
            if self._program is not None:
                try:
                    return self._program.replay(args)
                except Rebind as moved:  # copy those inputs from now on: capture again
                    self._moved.update(moved.positions)
                    self._program = None
                    self._capture(args, places)
                    if self._program is not None:
                        return self._program.replay(args)
        return self._finish(self._execute(args))

    def bind(self, args: Sequence[Any]) -> Callable[[], list[Any]] | None:
        """A replay program reading ``args`` in place as a call — one launch per graph and
        library call, no copies in or out, the outputs the program's own arrays
        (overwritten by its next run) — or ``None`` where CUDA graphs are off or cannot
        be captured.

        The executable's own program serves when it already reads every one of ``args``
        in place; otherwise the binding gets a program of its own, captured now with
        every argument read in place. Binding is not a call: it neither counts as one nor
        moves what the executable's own capture reads in place (an executable never run
        runs its launch list once on ``args`` first, to warm up what the capture records).
        """
        if not self.cuda_graph or self.graph_capture_error is not None:
            return None
        self._prepare()
        args = self._check_args(list(args))
        program = self._program
        if program is not None and program.reads_in_place(args):
            return program.launch
        if not self._warm:
            self._execute(args)
            self._warm = True
        try:
            program = capture(self, args, list(range(len(args))))
        except CaptureError as exc:
            log.debug("binding %s: capture failed (%s)", self.graph.name, exc)
            return None
        self.captures += 1
        return program.launch

    # -- CUDA graph ----------------------------------------------------------------------------
    def _capture(self, args: Sequence[Any], places: list[tuple[int, tuple]]) -> None:
        """Capture the replay program once; on failure keep the reason and run normally.

        Inputs passed at the same address and strides as in the call before (and never
        seen to move) are read in place by the graphs; the others are copied into static
        buffers at every replay."""
        in_place = [k for k, place in enumerate(places)
                    if k not in self._moved and self._last_places is not None
                    and self._last_places[k] == place]
        try:
            program = capture(self, args, in_place)
        except CaptureError as exc:
            self.graph_capture_error = str(exc)
            log.log(logging.DEBUG if self.graph_mode == "auto" else logging.WARNING,
                    "CUDA graph capture of %s failed (%s); running kernel by kernel",
                    self.graph.name, self.graph_capture_error)
            return
        self._program = program
        self.captures += 1
        log.debug("captured %s: %d CUDA graph(s) and %d library call(s)", self.graph.name,
                  program.graph_count, len(program.program) - program.graph_count)

    @property
    def graph_segments(self) -> int:
        """How many CUDA graphs the replay program holds (0 before the capture)."""
        return self._program.graph_count if self._program is not None else 0

    @property
    def graph_captured(self) -> bool:
        """Whether calls replay the captured program (CUDA graphs, cuBLAS between them)."""
        return self._program is not None

    @property
    def launched(self) -> dict[int, str | None]:
        """Node id -> the generated kernel its last call launched (``name`` or
        ``name_vec``; None where nothing ran), for generated kernels, epilogues and small
        GEMMs."""
        return {s.node.id: getattr(s, "last_entry", None) for s in self._steps
                if isinstance(s, (_KernelStep, _MatmulStep)) and
                (not isinstance(s, _MatmulStep) or s.epilogue is not None
                 or s.small is not None)}
