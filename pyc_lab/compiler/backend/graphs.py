"""CUDA graphs: the launch list captured once as a replay program, then replayed.

CuPy refuses cuBLAS calls while a stream captures, and the cuBLASLt and CUTLASS steps
are library calls too, so the launch list is split into *segments* (:func:`segments`):
runs of capturable steps (generated kernels, CuPy calls), each captured into one CUDA
graph, and the library calls between them, each kept as a call on static arrays (its
epilogue included, see :meth:`~.steps._Step.static_call`).

:func:`capture` records the program on a non-blocking stream
(``cupy.cuda.Stream(non_blocking=True)``, ``begin_capture``/``end_capture``), reading
static input buffers and allocating from a private memory pool that stays alive with
the program. :meth:`GraphProgram.replay` copies the arguments into the static inputs,
replays the graphs and calls in order on the current stream and copies the outputs out
to fresh arrays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ...errors import PycLabError
from .steps import Executor, _Step

__all__ = ["CaptureError", "GraphProgram", "capture", "segments"]


class GraphHost(Executor, Protocol):
    """What capture reads from the executable: its steps and constants besides what a
    step reads."""

    _steps: list[_Step]
    _consts: dict[int, Any]


class CaptureError(PycLabError):
    """The launch list could not be captured into CUDA graphs."""


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

    @property
    def graph_count(self) -> int:
        """How many CUDA graphs the program holds."""
        return sum(1 for kind, _ in self.program if kind == "graph")

    def replay(self, args: Sequence[Any]) -> list[Any]:
        """Run the program on ``args`` on the current stream; fresh output arrays."""
        cp = self.cp
        stream = cp.cuda.get_current_stream()
        for dst, src in zip(self.static_inputs, args, strict=True):
            if src.flags.c_contiguous:  # one cudaMemcpyAsync, no kernel
                dst.data.copy_from_device_async(src.data, src.nbytes, stream)
            else:
                cp.copyto(dst, src)
        for kind, item in self.program:
            if kind == "graph":
                item.launch(stream=stream)
            else:
                item()
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


def capture(exe: GraphHost) -> GraphProgram:
    """Record ``exe``'s launch list once as a replay program on static memory.

    The executable must be prepared (kernels compiled, constants uploaded).

    Raises
    ------
    CaptureError
        The launch list could not be recorded (an eager node that synchronises, say);
        the message names the original error. The stream is out of capture mode and
        nothing of the recording is kept.
    """
    cp = exe._cp
    graph = exe.graph
    static_in = [cp.empty(graph.node(i).shape, dtype=graph.node(i).dtype)
                 for i in graph.inputs]
    for a in static_in:
        a.fill(0)  # recording reads nothing, but keep the buffers defined
    pool = cp.cuda.MemoryPool()
    stream = cp.cuda.Stream(non_blocking=True)
    values: dict[int, Any] = dict(zip(graph.inputs, static_in, strict=True))
    values.update(exe._consts)
    program: list[tuple[str, Any]] = []
    try:
        _record(exe, values, program, pool, stream)
    except Exception as exc:
        raise CaptureError(f"{type(exc).__name__}: {exc}") from exc
    return GraphProgram(cp=cp, program=program, static_inputs=static_in, values=values,
                        outputs=list(graph.outputs), pool=pool, stream=stream)


def _record(exe: GraphHost, values: dict[int, Any], program: list[tuple[str, Any]],
            pool: Any, stream: Any) -> None:
    """Run the launch list once on ``stream``, capturing each segment of capturable steps
    into a CUDA graph and keeping each library call as a call on the static arrays."""
    cp = exe._cp
    with cp.cuda.using_allocator(pool.malloc), stream:
        for kind, steps in segments(exe._steps):
            if kind == "call":
                (step,) = steps
                program.append(("call", step.static_call(exe, values)))
                _release(step, values)
                continue
            stream.begin_capture()
            try:
                for step in steps:
                    step.run(exe, values)
                    _release(step, values)
                program.append(("graph", stream.end_capture()))
            except BaseException:
                with contextlib.suppress(Exception):  # leave capture mode
                    stream.end_capture()
                raise


def _release(step: _Step, values: dict[int, Any]) -> None:
    for nid in step.release:
        values.pop(nid, None)
