"""CUDA graphs: the launch list captured once as a replay program, then replayed.

Every generated kernel and CuPy call is recorded into a CUDA graph, and so is a GEMM
whose step offers a direct form (:meth:`~.steps._MatmulStep.graph_call`: cuBLAS issued
straight through nvmath-python's bindings with the capture stream's own workspace, made
before the capture) and a library op whose step offers a recordable one
(:meth:`~.steps._RecordedLibraryStep.graph_call`: a convolution run by pyc_lab's direct
kernel). CuPy refuses its own cuBLAS calls while a stream captures, and the
cuBLASLt and CUTLASS steps are library calls whose host adapters run between graphs, so
the launch list is split into *segments* around those (:func:`segments` says which
steps can be recorded as they are): runs of recordable steps, each one CUDA graph, and
the library calls between them, each kept as a call on static arrays (its epilogue
included, see :meth:`~.steps._Step.static_call`).

:func:`capture` records the program on a non-blocking stream
(``cupy.cuda.Stream(non_blocking=True)``, ``begin_capture``/``end_capture``), allocating
from a private memory pool that stays alive with the program. Inputs are read from
static buffers that :meth:`GraphProgram.replay` copies the arguments into — except the
inputs passed at the same address in the two calls before the capture (a model's
weights, as torch's CUDA graphs treat parameters): the graphs read those in place, so a
replay copies nothing for them and sees their current values. A replay given such an
input at another address raises :class:`Rebind`; the executable then captures again,
with that input copied from then on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...errors import PycLabError
from .steps import Executor, _Step

__all__ = ["CaptureError", "GraphProgram", "Rebind", "capture", "segments"]

log = logging.getLogger(__name__)


class GraphHost(Executor, Protocol):
    """What capture reads from the executable: its steps and constants besides what a
    step reads."""

    _steps: list[_Step]
    _consts: dict[int, Any]


class CaptureError(PycLabError):
    """The launch list could not be captured into CUDA graphs."""


class Rebind(Exception):
    """A replay got an input the graphs read in place at another address.

    Attributes
    ----------
    positions
        The inputs that moved (to be copied into static buffers from now on).
    """

    def __init__(self, positions: list[int]) -> None:
        super().__init__(f"inputs {positions} moved since the capture")
        self.positions = positions


def segments(steps: Sequence[_Step]) -> list[tuple[str, list[_Step]]]:
    """The launch list split around the steps that cannot be captured.

    Returns
    -------
    list of (kind, steps)
        In launch order: ``("graph", [...])`` for each run of consecutive capturable
        steps (one CUDA graph) and ``("call", [step])`` for each library call.
    """
    out: list[tuple[str, list[_Step]]] = []
    for step in steps:
        if not step.capturable:
            out.append(("call", [step]))
        elif out and out[-1][0] == "graph":
            out[-1][1].append(step)
        else:
            out.append(("graph", [step]))
    return out


@dataclass
class GraphProgram:
    """A captured launch list and everything it reads or writes.

    Attributes
    ----------
    cp
        The CuPy module.
    program
        ``("graph", cupy.cuda.graph.Graph)`` and ``("call", function)`` items, replayed
        in order.
    static_inputs
        The arrays the program reads the graph's inputs from.
    values
        Every value the program left alive, the graph's outputs included.
    outputs
        The graph's output node ids.
    pool, stream
        The private memory pool the capture allocated from, and its stream; kept alive
        with the program.
    """

    cp: Any
    program: list[tuple[str, Any]]
    static_inputs: list[Any]
    values: dict[int, Any]
    outputs: list[int]
    pool: Any
    stream: Any
    #: Inputs read in place: position -> (pointer, strides) they were captured at.
    bound: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    #: What the recorded calls point at besides values (the direct GEMMs' workspace).
    keep: list[Any] = field(default_factory=list)

    @property
    def graph_count(self) -> int:
        """How many CUDA graphs the program holds."""
        return sum(1 for kind, _ in self.program if kind == "graph")

    def replay(self, args: Sequence[Any]) -> list[Any]:
        """Run the program on ``args`` on the current stream; fresh output arrays.

        Raises
        ------
        Rebind
            An input read in place was passed at another address (nothing was run).
        """
        cp = self.cp
        if self.bound:
            moved = [i for i, (ptr, strides) in self.bound.items()
                     if args[i].data.ptr != ptr or args[i].strides != strides]
            if moved:
                raise Rebind(moved)
        stream = cp.cuda.get_current_stream()
        for dst, src in zip(self.static_inputs, args, strict=True):
            if dst is None:  # read in place
                continue
            if src.flags.c_contiguous:  # one cudaMemcpyAsync, no kernel
                dst.data.copy_from_device_async(src.data, src.nbytes, stream)
            else:
                cp.copyto(dst, src)
        self._run(stream)
        outs = []
        for o in self.outputs:
            v = self.values[o]
            if v.flags.c_contiguous:
                out = cp.empty(v.shape, dtype=v.dtype)
                out.data.copy_from_device_async(v.data, v.nbytes, stream)
            else:
                out = v.copy()
            outs.append(out)
        return outs

    def _run(self, stream: Any) -> None:
        for kind, item in self.program:
            if kind == "graph":
                item.launch(stream=stream)
            else:
                item()

    def reads_in_place(self, args: Sequence[Any]) -> bool:
        """Whether every one of ``args`` is an input the graphs read in place, at the
        address and strides it was captured at (so a run needs no copy of any)."""
        if len(self.bound) != len(args) or len(args) != len(self.static_inputs):
            return False
        return all(self.bound.get(i) == (a.data.ptr, a.strides) for i, a in enumerate(args))

    def launch(self) -> list[Any]:
        """Run the program on the current stream with every input read in place (see
        :meth:`reads_in_place`): no copy in, no copy out — the outputs are the program's
        own arrays, overwritten by its next run."""
        self._run(self.cp.cuda.get_current_stream())
        return [self.values[o] for o in self.outputs]


def capture(exe: GraphHost, args: Sequence[Any] | None = None,
            in_place: Sequence[int] = ()) -> GraphProgram:
    """Record ``exe``'s launch list once as a replay program on static memory.

    The executable must be prepared (kernels compiled, constants uploaded).

    Parameters
    ----------
    exe
        The executable.
    args, in_place
        The arguments of the call that captures, and the positions among them to read
        in place (the graphs keep their addresses; the program keeps the arrays alive).
        Every other input gets a static buffer.

    Raises
    ------
    CaptureError
        The launch list could not be recorded (an eager node that synchronises, say);
        the message names the original error. The stream is out of capture mode and
        nothing of the recording is kept.
    """
    cp = exe._cp
    graph = exe.graph
    read_in_place = set(in_place) if args is not None else set()
    static_in: list[Any] = []
    inputs: list[Any] = []
    bound: dict[int, tuple[int, tuple[int, ...]]] = {}
    for k, nid in enumerate(graph.inputs):
        if k in read_in_place:
            static_in.append(None)
            inputs.append(args[k])
            bound[k] = (args[k].data.ptr, tuple(args[k].strides))
            continue
        buf = cp.empty(graph.node(nid).shape, dtype=graph.node(nid).dtype)
        buf.fill(0)  # recording reads nothing, but keep the buffers defined
        static_in.append(buf)
        inputs.append(buf)
    pool = cp.cuda.MemoryPool()
    stream = cp.cuda.Stream(non_blocking=True)
    values: dict[int, Any] = dict(zip(graph.inputs, inputs, strict=True))
    values.update(exe._consts)
    program: list[tuple[str, Any]] = []
    owned: list[Any] = []
    try:
        _record(exe, values, program, pool, stream, owned)
    except Exception as exc:
        raise CaptureError(f"{type(exc).__name__}: {exc}") from exc
    # the inputs read in place stay alive as long as the program
    in_place_values = {graph.inputs[k]: args[k] for k in read_in_place}
    return GraphProgram(cp=cp, program=program, static_inputs=static_in,
                        values={**values, **in_place_values}, outputs=list(graph.outputs),
                        pool=pool, stream=stream, bound=bound, keep=owned)


def _direct_blas_workspace(owned: list[Any]) -> tuple[int, int] | None:
    """The ``(pointer, bytes)`` of a cuBLAS workspace the program owns (appended to
    ``owned``; the device's handle made too), made now, outside the capture, for the
    direct cuBLAS calls recorded into its graphs; ``None`` without nvmath-python."""
    from ...kernels import blas_direct, cublaslt

    if not cublaslt.status()[0]:
        return None
    try:
        mem = blas_direct.private_workspace()
    except Exception as exc:  # no handle: the GEMMs stay calls between graphs
        log.debug("direct cuBLAS calls not recorded: %s", exc)
        return None
    owned.append(mem)
    return mem.ptr, mem.size


def _record(exe: GraphHost, values: dict[int, Any], program: list[tuple[str, Any]],
            pool: Any, stream: Any, owned: list[Any]) -> None:
    """Run the launch list once on ``stream``, capturing each run of recordable steps
    (capturable ones, and GEMMs with a direct form) into a CUDA graph and keeping each
    other library call as a call on the static arrays."""
    cp = exe._cp
    with cp.cuda.using_allocator(pool.malloc), stream:
        gemms = any(not s.capturable and (getattr(s, "graph_workspace", False)
                                          or getattr(s, "wants_workspace", False))
                    for s in exe._steps)
        workspace = _direct_blas_workspace(owned) if gemms else None  # 32 MiB: only if used
        capturing = False
        try:
            for step in exe._steps:
                call = None
                if not step.capturable and hasattr(step, "graph_call") \
                        and (workspace is not None or not step.graph_workspace):
                    call = step.graph_call(exe, values, workspace)
                if step.capturable or call is not None:
                    if not capturing:
                        stream.begin_capture()
                        capturing = True
                    if call is not None:
                        call()
                        owned.append(call)  # and what it holds, as long as the graph
                    else:
                        step.run(exe, values)
                else:
                    if capturing:
                        program.append(("graph", stream.end_capture()))
                        capturing = False
                    program.append(("call", step.static_call(exe, values)))
                _release(step, values)
            if capturing:
                program.append(("graph", stream.end_capture()))
                capturing = False
        except BaseException:
            if capturing:
                with contextlib.suppress(Exception):  # leave capture mode
                    stream.end_capture()
            raise


def _release(step: _Step, values: dict[int, Any]) -> None:
    for nid in step.release:
        values.pop(nid, None)
