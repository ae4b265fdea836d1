"""CUDA-graph replays of one fixed library GEMM, for about three microseconds of host time.

A direct library call (:mod:`.blas_direct`) passes only pointers, but the library still
does its own host work on every call: ``cublasGemmEx`` took 7.7-11.1 us per call on the
H200's host (``benchmarks/results/h200/issue14-e473658/matmul_host.json``), more than
a plan's whole budget. A loop that calls a plan on the same arrays — a serving loop's
static buffers, a solver's iterations, a benchmark — repeats the same four addresses
``(a, b, out, stream)`` every time, and for fixed addresses the whole call can be a CUDA
graph: :class:`GraphReplays` captures the GEMM once per repeated address set and then
launches the graph (``cudaGraphLaunch``), which reads the operands' *current* contents.

The rules, each for a reason:

- An address set is captured at its second call and launched from the third on; the
  first call runs directly. A capture costs a few hundred microseconds, so a set seen
  once (a new output each call) never pays for one.
- Only a settled library call is captured: a :class:`~.blas_direct.CublasGemm` or
  :class:`~.blas_direct.LtGemm`, or a :class:`~.raced.RacedGemm` once its race has
  picked one of those. The padded challenger's scratch lives in the shared per-stream
  table, which may free it while a graph still points at it.
- Never while the caller's stream is being captured: the call then records itself into
  the caller's graph as a direct call, as it always did.
- The graphs' workspace is owned here, one per ``(device, stream)`` and shared by the
  graphs launched on that stream (which run one after another); each graph keeps a
  reference to it, so it lives as long as a graph may read it.
- At most :data:`CAPACITY` graphs per GEMM: the oldest is dropped after its device is
  synchronised. A capture that fails is logged and that address set runs directly
  from then on.
- Address sets that cycle through more than the capacity (32 layers of one shape, each
  with its own weight and output) would capture and synchronise on every pass: after
  :data:`CAPACITY` graphs have been dropped, the GEMM captures nothing more (the graphs
  it holds still replay), so it pays for at most ``2 * CAPACITY`` captures in all.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

from . import blas_direct
from .raced import RacedGemm

__all__ = ["AFTER", "CAPACITY", "GraphReplays", "settled"]

log = logging.getLogger(__name__)

#: Graphs kept per GEMM (address sets; the oldest is dropped).
CAPACITY = 4
#: The call of an address set that captures it (earlier ones run directly).
AFTER = 2
#: Address sets counted before capture (the oldest count is forgotten).
SIGHTINGS = 32

_LOCK = threading.Lock()
#: ``(device, stream) -> cupy.cuda.Memory``: the workspace of graphs launched on a stream
#: (at most :data:`~.blas_direct.MAX_STREAMS`; a forgotten one lives on in its graphs).
_WORKSPACES: OrderedDict[tuple[int, int], Any] = OrderedDict()


def settled(gemm: Any) -> Any:
    """The library call a graph may record for ``gemm``: the GEMM itself when it is a
    direct cuBLAS or cuBLASLt call, the one a raced pair picked once its race has run,
    else ``None``."""
    if isinstance(gemm, RacedGemm):
        if gemm.use_challenger is None:
            return None
        gemm = gemm.challenger if gemm.use_challenger else gemm.default
    if isinstance(gemm, (blas_direct.CublasGemm, blas_direct.LtGemm)):
        return gemm
    return None


def _graph_workspace(device: int, stream: int, need: int) -> Any:
    """The workspace of graphs launched on ``stream`` of ``device``: at least
    :data:`~.blas_direct.WORKSPACE_BYTES` and ``need`` bytes; a larger need makes a new
    one (graphs captured on the old one keep it alive)."""
    key = (device, stream)
    with _LOCK:
        mem = _WORKSPACES.pop(key, None)
        if mem is None or mem.size < need:
            mem = blas_direct.private_workspace(need)
        _WORKSPACES[key] = mem
        while len(_WORKSPACES) > blas_direct.MAX_STREAMS:
            _WORKSPACES.popitem(last=False)
    return mem


def _capture_stream() -> Any:
    """A stream of our own to capture on (the caller's may be the legacy default stream,
    which cannot be captured; a graph launches on any stream)."""
    import cupy as cp

    return cp.cuda.Stream(non_blocking=True)


class _Replay:
    """One captured graph and what it needs alive: its executable's owner (the CuPy
    graph) and the workspace its library call was recorded with."""

    __slots__ = ("exec_ptr", "graph", "workspace")

    def __init__(self, graph: Any, workspace: Any) -> None:
        self.graph = graph
        self.workspace = workspace
        self.exec_ptr = graph.graphExec


class GraphReplays:
    """CUDA graphs of one GEMM's library call, one per repeated ``(a, b, out, stream)``.

    Parameters
    ----------
    gemm
        The call ``gemm(a_ptr, b_ptr, out_ptr, stream)`` (a direct library GEMM or a
        raced pair of them, see :func:`settled`).
    device
        The CUDA device it runs on.
    runtime
        The CUDA runtime bindings (default: CuPy's).

    Attributes
    ----------
    captures
        Graphs captured so far (each address set at most once unless dropped).
    refused
        Why a capture was not made or failed, for the last time it happened (``""``).
    """

    def __init__(self, gemm: Any, device: int, runtime: Any = None) -> None:
        if runtime is None:
            from cupy_backends.cuda.api import runtime
        self._rt = runtime
        self.gemm = gemm
        self.device = device
        self.captures = 0
        self.refused = ""
        self._graphs: OrderedDict[tuple[int, int, int, int], _Replay] = OrderedDict()
        self._seen: OrderedDict[tuple[int, int, int, int], int] = OrderedDict()
        self._failed: set[tuple[int, int, int, int]] = set()
        self._stream: Any = None
        self._dropped = 0
        self._lock = threading.Lock()

    @property
    def graphs(self) -> int:
        """Graphs held now (at most :data:`CAPACITY`)."""
        return len(self._graphs)

    def __call__(self, a_ptr: int, b_ptr: int, out_ptr: int, stream: int) -> None:
        """Compute the product on ``stream`` (a ``cudaStream_t`` of the current device):
        a graph launch for an address set seen before, else the direct call."""
        rt = self._rt
        key = (a_ptr, b_ptr, out_ptr, stream)
        replay = self._graphs.get(key)
        if replay is not None and not rt.streamIsCapturing(stream):
            rt.graphLaunch(replay.exec_ptr, stream)
            return
        if replay is None and key not in self._failed and self._dropped < CAPACITY:
            with self._lock:  # counts and captures: one thread at a time
                if self._sighted(key) >= AFTER and not rt.streamIsCapturing(stream):
                    replay = self._graphs.get(key) or self._capture(key)
            if replay is not None:
                rt.graphLaunch(replay.exec_ptr, stream)
                return
        self.gemm(a_ptr, b_ptr, out_ptr, stream)

    def _sighted(self, key: tuple[int, int, int, int]) -> int:
        """Count a call of ``key``; return how many there have been (bounded memory)."""
        n = self._seen.pop(key, 0) + 1
        self._seen[key] = n
        while len(self._seen) > SIGHTINGS:
            self._seen.popitem(last=False)
        return n

    def _capture(self, key: tuple[int, int, int, int]) -> _Replay | None:
        """Record the settled call for ``key`` into a graph (on a stream of our own,
        with the stream's graph workspace), keep it, and return it; ``None`` when there
        is no settled call yet or the capture fails."""
        gemm = settled(self.gemm)
        if gemm is None:
            self.refused = ("the call is not a settled cuBLAS/cuBLASLt call (a race not "
                            "yet run, or the padded GEMM)")
            return None
        a_ptr, b_ptr, out_ptr, stream = key
        try:
            ws = _graph_workspace(self.device, stream, getattr(gemm, "workspace_need", 0))
            if self._stream is None:
                self._stream = _capture_stream()
            cap = self._stream
            cap.begin_capture()
            try:
                gemm(a_ptr, b_ptr, out_ptr, cap.ptr, workspace=(ws.ptr, ws.size))
            finally:
                graph = cap.end_capture()
        except Exception as exc:  # this address set runs directly from now on
            self._failed.add(key)
            self.refused = f"capture failed: {type(exc).__name__}: {exc}"
            log.info("GEMM graph capture failed; running directly: %s", exc)
            return None
        replay = self._graphs[key] = _Replay(graph, ws)
        self._seen.pop(key, None)
        self.captures += 1
        if len(self._graphs) > CAPACITY:
            self._drop_oldest()
        return replay

    def _drop_oldest(self) -> None:
        """Forget the oldest graph, after everything queued on the device has run (a
        launch of it may still be in flight; its stream may be gone)."""
        _key, _old = self._graphs.popitem(last=False)
        blas_direct._synchronise_device(self.device)
        self._dropped += 1
        if self._dropped >= CAPACITY:
            self._seen.clear()
            self.refused = (f"more than {CAPACITY} address sets cycle through this GEMM; "
                            "no more graphs are captured (the ones held still replay)")
            log.info("GEMM graph replays: %s", self.refused)
