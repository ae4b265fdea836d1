"""The conveyor belt: prepare on CPU workers, copy in, compute, copy out, in order.

:class:`Pipeline` keeps ``depth`` items in flight. Each item owns a *slot* (host input
buffers from a :class:`~pyc_lab.runtime.pinned.PinnedPool`, device input buffers and a
host output buffer) from the moment its ``prepare`` starts until its result has been
handed to the caller, so memory stays bounded however slowly the caller consumes.

Stages and their lanes (what a :class:`~pyc_lab.profiling.trace.Trace` shows):

========  ====================  ==================================================
stage     lane                  GPU mode (CuPy)            / CPU mode (NumPy)
========  ====================  ==================================================
prepare   ``cpu-worker-<k>``    ``prepare(item)`` on a :class:`Dispatcher` thread,
                                copied into the slot's host (pinned) buffers
h2d       ``stream h2d``        async copy on a copy stream / copy host -> host
compute   ``stream compute``    ``compute(arrays, stream)`` on a compute stream
d2h       ``stream d2h``        async copy into pinned memory on a second copy
                                stream / copy host -> host
========  ====================  ==================================================

The belt does what both modes share: slots, item order, the prepare workers, spec
checks, failures and timeouts, shutdown, and reusing its threads from run to run. The
h2d, compute and d2h stages run on lanes it picks once, by mode:
:class:`~pyc_lab.runtime.cuda_lanes.CudaLanes` only *queue* each stage on a CUDA stream
behind the item's previous stage, and a ``done`` lane hands each item over once its GPU
work is finished; :class:`~pyc_lab.runtime.host_lanes.HostLanes` do each stage on a
thread and move on. Stage spans are ``perf_counter`` seconds in both modes, and every
stage runs inside an NVTX range for Nsight Systems. The traces the belt makes keep the
spans of the most recent ``trace_items`` items and fold older ones into whole-run figures,
so a belt that runs for hours stays bounded in memory.
"""

from __future__ import annotations

import collections
import inspect
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

import numpy as np

from ..checks import check_callable, check_seconds, check_whole
from ..errors import PycLabError
from ..hardware.device import cupy_status
from ..profiling.nvtx import nvtx_range
from ..profiling.trace import Trace
from .belt_state import Crew, Job, Run, Slot, Spec
from .cuda_lanes import CudaLanes
from .dispatcher import Dispatcher
from .host_lanes import HostLanes
from .lanes import Lanes, StageHooks
from .pinned import PinnedPool
from .shards import ShardedPipeline, check_devices

__all__ = ["Pipeline", "PipelineError", "last_pipeline"]

log = logging.getLogger(__name__)

_LAST: Pipeline | None = None

#: How long shutdown waits for a running stage (when no ``timeout_s`` is set) before the
#: slot it holds is discarded instead of reused.
CLOSE_GRACE_S = 5.0

#: Items whose every stage span a run's trace keeps by default; older items are folded
#: into the trace's whole-run figures (a few hundred items are kept in full).
TRACE_ITEMS = 10_000


class PipelineError(PycLabError):
    """A stage of a :class:`Pipeline` failed, timed out or got inconsistent data.

    Attributes
    ----------
    index
        The item's position in the input (``None`` when no single item is to blame).
    stage
        ``"prepare"``, ``"h2d"``, ``"compute"`` or ``"d2h"`` (or ``None``).
    """

    def __init__(self, message: str, index: int | None = None, stage: str | None = None):
        super().__init__(message)
        self.index = index
        self.stage = stage


def _remember(pipe: Any) -> None:
    global _LAST
    _LAST = pipe


def last_pipeline() -> Pipeline | None:
    """The pipeline whose :meth:`Pipeline.run` started most recently (or ``None``)."""
    return _LAST


def _norm_spec(spec: Any) -> Spec:
    """``(shape, dtype)`` or a list of them, as a list of (tuple shape, NumPy dtype)."""

    def pair(shape: Any, dtype: Any) -> tuple[tuple[int, ...], np.dtype]:
        dims = (shape,) if isinstance(shape, int) else shape
        return tuple(int(d) for d in dims), np.dtype(dtype)

    try:
        return [pair(*spec)]
    except (TypeError, ValueError):
        pass
    try:
        out = [pair(*p) for p in spec]
    except (TypeError, ValueError) as exc:
        raise PipelineError(f"spec must be (shape, dtype) or a list of them, got {spec!r} "
                            f"({exc})") from None
    if not out:
        raise PipelineError("spec lists no arrays")
    return out


def _fmt_spec(spec: Sequence[tuple[tuple[int, ...], np.dtype]]) -> str:
    return ", ".join(f"{dt}{list(shape)}" for shape, dt in spec)


class Pipeline:
    """A bounded conveyor belt: ``prepare`` -> H2D -> ``compute`` -> D2H, results in order.

    Parameters
    ----------
    prepare
        ``prepare(item)`` returns a NumPy array or a tuple of arrays. The first item fixes
        their shapes and dtypes; each is copied into the item's (pinned) slot buffers.
        Or ``prepare(item, out)`` (two parameters; needs ``spec``) writes the item
        straight into ``out``, the slot's pinned array(s), with no extra copy. In GPU
        mode, arrays ``prepare`` returns that are already page-locked (and C-contiguous)
        are copied to the device as they are, without staging (they must stay unchanged
        until the item's result arrives).
    compute
        ``compute(arrays, stream)`` (or ``compute(arrays)``) gets the device arrays (a
        single array when ``prepare`` returned one) and returns an array or a tuple of
        arrays. In CPU mode ``stream`` is ``None``.
    depth
        Items in flight at most; also the number of slots.
    device
        CUDA device ordinal (GPU mode).
    devices
        Several GPUs: one belt per device (its own pinned pool on that GPU's NUMA node,
        streams, prepare workers and ``depth`` slots), items dealt round robin, results
        still in item order, one trace with a lane group per GPU
        (:mod:`~pyc_lab.runtime.shards`: with two or more, the belt made is a
        :class:`~pyc_lab.runtime.shards.ShardedPipeline`, which runs, traces and closes
        the same way). Replaces ``device``; a ``pool`` cannot be shared by the belts. In
        CPU mode the same dealing runs over host belts.
    workers
        Prepare threads; default ``min(depth, os.cpu_count())``.
    h2d
        Copy prepared data to the device; with ``False`` compute gets the host arrays.
    d2h
        Copy results back into pinned memory and yield NumPy arrays; with ``False`` the
        compute results are yielded as they are (device arrays in GPU mode; if
        ``compute`` worked in place they are the slot's buffers, which the belt holds
        until the next result is asked for).
    mode
        ``"gpu"``, ``"cpu"`` (threads and NumPy, same semantics and trace stages) or
        ``"auto"`` (GPU when :func:`~pyc_lab.hardware.device.cupy_status` is ok).
    timeout_s
        A stage running longer than this many seconds (a positive finite number) stops
        the belt with a :class:`PipelineError`; ``None``: no limit.
    trace
        ``None`` (default): each run gets a new :class:`~pyc_lab.profiling.trace.Trace`
        keeping ``trace_items`` items, so :attr:`trace` shows the latest run. A ``Trace``
        (or any object with ``record(item, stage, lane, start_s, end_s, nbytes, **meta)``):
        every run records into it, with its own retention. ``False``: no spans are
        recorded at all (:attr:`trace` stays empty), for runs where not even the bounded
        bookkeeping is wanted.
    trace_items
        How many of the most recent items the belt keeps every detail of: the stage
        spans in its own traces and the prepare workers' task records. Older items are
        folded into running whole-run figures, so ``trace.overlap()`` and
        :attr:`dispatcher_metrics` still cover the whole run while the timeline and
        Chrome export show the recent items, and memory stays bounded. ``None`` keeps
        everything (memory then grows with every item).
    pool
        The :class:`PinnedPool` for slot buffers (a new one by default, closed by
        :meth:`close`).
    spec
        The prepared arrays' ``(shape, dtype)`` (or a list of them) when known up front:
        required by ``prepare(item, out)``, otherwise every item is checked against it.
    copy_results
        ``True`` (default): each result is a fresh NumPy array (copied out of the slot's
        pinned output on the consumer's thread, so the D2H lane goes on meanwhile).
        ``False``: results are views of the slot's pinned output buffers, valid until the
        next result is asked for (as in pinned-memory data loaders); the copy, and the
        page faults of a fresh array, are saved.
    compute_streams
        GPU mode: item ``i`` computes on stream ``i % compute_streams`` (lanes
        ``stream compute``, ``stream compute 1``, ...), so one item's last kernels can
        overlap the next one's first. Items must then not depend on each other's compute
        order (they never share buffers here). CPU mode has one compute lane.

    Examples
    --------
    >>> import numpy as np
    >>> with Pipeline(lambda i: np.full(4, i, "f4"), lambda x: x * 2, mode="cpu") as pipe:
    ...     [float(r[0]) for r in pipe.run(range(3))]
    [0.0, 2.0, 4.0]
    """

    def __new__(cls, *args: Any, devices: Sequence[int] | None = None, **kwargs: Any) -> Any:
        ids = None if devices is None else check_devices(devices, PipelineError)
        if ids is None or len(ids) == 1:
            return super().__new__(cls)
        return ShardedPipeline(cls, ids, *args, error=PipelineError, on_run=_remember,
                               **kwargs)

    def __init__(
        self,
        prepare: Callable[[Any], Any],
        compute: Callable[..., Any],
        *,
        depth: int = 3,
        device: int = 0,
        workers: int | None = None,
        h2d: bool = True,
        d2h: bool = True,
        mode: str = "auto",
        timeout_s: float | None = None,
        trace: Any = None,
        pool: PinnedPool | None = None,
        spec: Any = None,
        copy_results: bool = True,
        compute_streams: int = 1,
        trace_items: int | None = TRACE_ITEMS,
        devices: Sequence[int] | None = None,
    ) -> None:
        err = PipelineError
        if devices is not None:  # one device (__new__ made a ShardedPipeline for more)
            device = devices[0]
        check_callable("Pipeline", "prepare", prepare, "prepare(item) returning an array or "
                       "a tuple of arrays, or prepare(item, out) with spec=", error=err)
        check_callable("Pipeline", "compute", compute, "compute(arrays, stream) or "
                       "compute(arrays) returning an array or a tuple of arrays", error=err)
        if mode not in ("auto", "cpu", "gpu"):
            raise PipelineError(f"mode must be 'auto', 'cpu' or 'gpu', not {mode!r}")
        self.depth = check_whole("Pipeline", "depth", depth, error=err)
        self.compute_streams = check_whole("Pipeline", "compute_streams", compute_streams,
                                           error=err)
        self.device = check_whole("Pipeline", "device", device, minimum=0, error=err)
        self.workers = (check_whole("Pipeline", "workers", workers, error=err)
                        if workers is not None
                        else max(1, min(self.depth, os.cpu_count() or 1)))
        self.timeout_s = check_seconds("Pipeline", "timeout_s", timeout_s, error=err)
        self.trace_items = (None if trace_items is None else
                            check_whole("Pipeline", "trace_items", trace_items, error=err))
        if not (trace is None or isinstance(trace, bool)
                or callable(getattr(trace, "record", None))):
            raise PipelineError(f"Pipeline trace must be None (a new Trace per run), False "
                                f"(no tracing) or a Trace, got {type(trace).__name__}")
        self.prepare = prepare
        self.compute = compute
        self.h2d = bool(h2d)
        self.d2h = bool(d2h)
        cp, reason = (None, "CPU mode requested") if mode == "cpu" else cupy_status()
        if mode == "gpu" and cp is None:
            from ..hardware.device import require_cupy

            require_cupy("Pipeline(mode='gpu')")
        self.mode = "gpu" if cp is not None else "cpu"
        self.mode_reason = (
            "ok" if cp is not None else reason if mode == "cpu" else f"no GPU: {reason}"
        )
        self._own_pool = pool is None
        self.pool = pool if pool is not None else PinnedPool(
            device=self.device, mode="auto" if self.mode == "gpu" else "cpu"
        )
        self.traced = trace is not False  # False: spans are not recorded at all
        self._own_trace = isinstance(trace, bool) or trace is None
        self._trace = self._new_trace() if self._own_trace else trace
        self._compute_takes_stream = self._takes_stream(compute)
        self.copy_results = bool(copy_results)
        self.spec = _norm_spec(spec) if spec is not None else None
        self._prepare_into = self._required_positional(prepare) >= 2  # prepare(item, out)
        if self._prepare_into and self.spec is None:
            raise PipelineError("prepare(item, out) writes into the slot's buffers, so their "
                                "shapes must be known up front: pass spec=(shape, dtype) "
                                "(or a list of them)")
        self._lock = threading.Lock()
        self._signal = threading.Event()
        self._live: set[int] = set()
        self.max_live_slots = 0
        self._last_dispatch: Dispatcher | None = None  # for dispatcher_metrics
        # weak, so that a generator the caller drops (``break``) is closed and cleans up
        self._gen: weakref.ref[Generator[Any, None, None]] | None = None
        self._closed = False
        # the run in progress: its cancel flag (close() from another thread sets it) and
        # whether it is over (close() waits for that before freeing the pool)
        self._cancel: threading.Event | None = None
        self._run_over = threading.Event()
        self._run_over.set()
        # where h2d, compute and d2h run: chosen once, by mode
        hooks = StageHooks(self._record, self._begin, self._fail, self._finish)
        self._lanes: Lanes = HostLanes(self.pool, hooks) if cp is None else CudaLanes(
            cp, self.pool, hooks, device=self.device, compute_streams=self.compute_streams)
        # the lanes' crew and the prepare dispatcher, kept from one run to the next while
        # runs end cleanly (a loader reused epoch after epoch pays for threads once)
        self._crew: tuple[Crew, Dispatcher] | None = None
        self._spare: list[Slot] | None = None

    # -- helpers ---------------------------------------------------------------------
    @staticmethod
    def _takes_stream(fn: Callable[..., Any]) -> bool:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return True
        positional = [
            p for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
        return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in positional)

    @staticmethod
    def _required_positional(fn: Callable[..., Any]) -> int:
        """How many positional parameters ``fn`` requires (no default)."""
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return 1
        return sum(1 for p in params if p.default is p.empty
                   and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))

    def _new_trace(self) -> Trace:
        return Trace(max_items=self.trace_items)

    @property
    def trace(self) -> Any:
        """The :class:`~pyc_lab.profiling.trace.Trace` every stage of every item goes to
        (empty when the belt was made with ``trace=False``)."""
        return self._trace

    @property
    def dispatcher_metrics(self) -> dict[str, Any] | None:
        """The prepare workers' queue-wait and run-time metrics (p50/p99) of the latest
        run (see :meth:`~pyc_lab.runtime.dispatcher.Dispatcher.metrics`); ``None``
        before the first run."""
        return None if self._last_dispatch is None else self._last_dispatch.metrics()

    @property
    def live_slots(self) -> int:
        """Slots currently holding an item (never more than ``depth``)."""
        with self._lock:
            return len(self._live)

    def _record(self, job: Job, stage: str, lane: str, start: float, end: float,
                nbytes: int = 0) -> None:
        if not self.traced:
            return
        try:
            self._trace.record(job.index, stage, lane, start, end, nbytes=nbytes,
                               mode=self.mode)
        except Exception as exc:  # a tracing bug must not break the belt
            log.warning("trace.record failed: %s", exc)

    def _begin(self, job: Job, stage: str) -> float | None:
        """Mark ``stage`` running; ``None`` when the belt is stopping."""
        with self._lock:  # _shutdown sets run.cancel under the same lock
            if job.run.cancel.is_set():
                job.done.set()
                self._signal.set()
                return None
            job.stage = stage
            job.started = time.perf_counter()
            job.running = True
            return job.started

    def _fail(self, job: Job, stage: str, exc: BaseException) -> None:
        job.running = False
        job.error, job.error_stage = exc, stage
        job.done.set()
        self._signal.set()

    def _finish(self, job: Job) -> None:
        job.running = False
        job.done.set()
        self._signal.set()

    # -- stages (run on worker and lane threads) ------------------------------------------
    @staticmethod
    def _ranged(stage: str, fn: Callable[[Job], None], job: Job) -> None:
        """Run one stage of one item inside an NVTX range (Nsight Systems shows it as
        ``pyc_lab <stage> item <i>`` on the thread that ran it)."""
        with nvtx_range(f"pyc_lab {stage} item {job.index}"):
            fn(job)

    def _pass_on(self, job: Job, stage: str, fn: Callable[[Job], None]) -> None:
        """Queue the item's next stage on its lane. A lane already stopped (the belt is
        stopping) refuses it: the item fails there instead of waiting for ever."""
        if not job.run.crew.lanes[stage].submit(lambda: self._ranged(stage, fn, job)):
            self._fail(job, stage, PipelineError(
                f"item {job.index}: the belt was stopped before its {stage} stage",
                job.index, stage))

    def _stage_prepare(self, job: Job) -> None:
        start = self._begin(job, "prepare")
        if start is None:
            return
        try:
            slot = job.slot
            if self._prepare_into:
                assert self.spec is not None
                if not slot.host:
                    slot.alloc_host(self.pool, self.spec)
                views = slot.host_views
                self.prepare(job.item, views[0] if len(views) == 1 else tuple(views))
                nbytes = sum(v.nbytes for v in views)
                self._after_prepare(job, start, nbytes)
                return
            out = self.prepare(job.item)
            arrays = [np.asarray(a) for a in (out if isinstance(out, tuple) else (out,))]
            got = [(a.shape, a.dtype) for a in arrays]
            if job.index == 0 and job.run.spec is None:
                job.run.spec = got
                job.run.spec_ready.set()
            else:
                while not job.run.spec_ready.wait(0.05):
                    if job.run.cancel.is_set():
                        self._finish(job)
                        return
                if job.run.spec is None:  # item 0 failed; the belt is stopping
                    self._finish(job)
                    return
                job.started = time.perf_counter()  # the timeout covers this item's own work
                if got != job.run.spec:
                    raise PipelineError(
                        f"item {job.index}: prepare returned {_fmt_spec(got)}, expected "
                        f"{_fmt_spec(job.run.spec)} "
                        f"({'spec=' if self.spec is not None else 'fixed by item 0'}); "
                        "every item must have the same shapes and dtypes",
                        job.index, "prepare",
                    )
            nbytes = sum(a.nbytes for a in arrays)
            if self.h2d and self._lanes.pinned_as_is(arrays):
                job.host_src = arrays  # already pinned: the H2D copy reads it as it is
            else:
                if not slot.host:
                    slot.alloc_host(self.pool, got)
                for view, a in zip(slot.host_views, arrays, strict=True):
                    np.copyto(view, a)
        except BaseException as exc:
            if job.index == 0 and not job.run.spec_ready.is_set():
                job.run.spec_ready.set()
            self._fail(job, "prepare", exc)
            return
        self._after_prepare(job, start, nbytes)

    def _after_prepare(self, job: Job, start: float, nbytes: int) -> None:
        name = threading.current_thread().name
        lane = "cpu-worker-" + name.rsplit("-", 1)[-1]
        self._record(job, "prepare", lane, start, time.perf_counter(), nbytes)
        job.running = False
        if self.h2d:
            self._pass_on(job, "h2d", self._stage_h2d)
            self._lanes.yield_gil()  # let the copy lane take the GIL now, not after more prepares
        else:
            job.value = tuple(job.slot.host_views)
            self._pass_on(job, "compute", self._stage_compute)

    def _stage_h2d(self, job: Job) -> None:
        start = self._begin(job, "h2d")
        if start is None:
            return
        try:
            self._lanes.h2d(job, start)
        except BaseException as exc:
            self._fail(job, "h2d", exc)
            return
        job.running = False
        job.value = tuple(job.slot.dev)
        self._pass_on(job, "compute", self._stage_compute)

    def _stage_compute(self, job: Job) -> None:
        start = self._begin(job, "compute")
        if start is None:
            return
        try:
            arrays = job.value
            arg = arrays[0] if len(arrays) == 1 else arrays

            def call(stream: Any) -> Any:
                return (self.compute(arg, stream) if self._compute_takes_stream
                        else self.compute(arg))

            out = self._lanes.compute(job, start, call)
        except BaseException as exc:
            self._fail(job, "compute", exc)
            return
        job.running = False
        job.value = out
        if self.d2h:
            self._pass_on(job, "d2h", self._stage_d2h)
        else:
            job.result = out
            self._lanes.hand_over(job)

    def _stage_d2h(self, job: Job) -> None:
        start = self._begin(job, "d2h")
        if start is None:
            return
        try:
            out = job.value
            many = isinstance(out, tuple)
            views = self._lanes.d2h(job, start, list(out) if many else [out])
        except BaseException as exc:
            self._fail(job, "d2h", exc)
            return
        job.value = None
        # views of the slot's pinned output; with copy_results the consumer's thread
        # copies them out, so that this lane is free for the next item's copy meanwhile
        job.result = tuple(views) if many else views[0]
        job.result_in_slot = True
        self._lanes.hand_over(job)

    # -- the belt ----------------------------------------------------------------------
    def _start(self) -> Run:
        """Set up a run, or refuse when the belt was closed since :meth:`run` was called.

        From the closed check on, a :meth:`close` on another thread sees this run (its
        cancel flag) and waits for it to end."""
        cancel = threading.Event()
        with self._lock:
            if self._closed:
                raise PipelineError("this Pipeline was closed before its run started; "
                                    "create a new one")
            self._cancel = cancel
            self._run_over.clear()
        try:
            if self._own_trace and self.traced and len(self._trace):
                self._trace = self._new_trace()  # pipe.trace: the latest run's spans
            if self._crew is not None:  # the last run ended cleanly: threads and streams go on
                crew, dispatcher = self._crew
                dispatcher.reset_metrics()  # its records: this run's tasks only
                self._lanes.resume(crew)
            else:
                crew = self._lanes.start()
                cpus = self.pool.node_cpus if self.mode == "gpu" else None
                dispatcher = Dispatcher(self.workers, queue_size=self.depth, name="prepare",
                                        cpus=cpus, keep_records=self.trace_items)
                self._crew = (crew, dispatcher)
        except BaseException:
            self._end_run()
            raise
        run = Run(crew, dispatcher, cancel)
        if self.spec is not None:  # known up front: every item is checked against it
            run.spec = self.spec
            run.spec_ready.set()
        return run

    def run(self, items: Iterable[Any]) -> Generator[Any, None, None]:
        """Push ``items`` through the belt; yield the compute results in item order.

        A belt can be run again and again (epoch after epoch): a run whose results were
        all taken hands its worker threads, streams, event clock and slot device buffers
        to the next run; a run that stopped early (an error, ``break``, ``close()``)
        lets them go, and the next run starts fresh ones. Each run gets a new
        :attr:`trace` unless one was passed in.

        Raises
        ------
        PipelineError
            ``"item <i>: <stage> failed: ..."`` (chained from the original exception),
            ``"item <i>: <stage> timed out ..."``, or a shape/dtype mismatch naming the
            item. The belt stops first and every slot goes back to the pool.
        KeyboardInterrupt
            Re-raised as is, after the same cleanup.
        """
        global _LAST
        source = iter(items)
        with self._lock:  # two threads calling run() at once: one of them is refused
            if self._closed:
                raise PipelineError("this Pipeline is closed; create a new one")
            if self._gen is not None and self._gen() is not None:
                raise PipelineError("this Pipeline is already running; finish or close "
                                    "that run")
            gen = self._run(source)
            self._gen = weakref.ref(gen)
        _LAST = self
        return gen

    def _end_run(self) -> None:
        with self._lock:
            self._cancel = None
        self._run_over.set()

    def _run(self, items: Any) -> Generator[Any, None, None]:
        self._signal.clear()
        run = self._start()
        try:
            yield from self._belt(run, items)
        finally:
            self._end_run()

    def _belt(self, run: Run, items: Any) -> Generator[Any, None, None]:
        inflight: collections.deque[Job] = collections.deque()
        free, self._spare = self._spare or [Slot(k) for k in range(self.depth)], None
        index = 0
        exhausted = False
        try:
            while True:
                while not exhausted and len(inflight) < self.depth:
                    try:
                        item = next(items)
                    except StopIteration:
                        exhausted = True
                        break
                    slot = free.pop()
                    job = Job(index, item, slot, run)
                    with self._lock:
                        self._live.add(slot.index)
                        self.max_live_slots = max(self.max_live_slots, len(self._live))
                    inflight.append(job)
                    run.dispatcher.submit(self._ranged, "prepare", self._stage_prepare, job)
                    if index == 0:
                        self._lanes.yield_gil()  # let a worker start item 0 before queueing more
                    index += 1
                if not inflight:
                    return
                head = inflight[0]
                self._wait(head, inflight)
                inflight.popleft()
                result, head.result = head.result, None
                if head.result_in_slot and self.copy_results:
                    result = (tuple(np.array(r) for r in result) if isinstance(result, tuple)
                              else np.array(result))
                else:  # the result may be a view of the slot's buffers: keep the slot
                    held = head.slot       # until the consumer asks for the next one
                    try:
                        yield result
                    finally:
                        free.append(held)
                        with self._lock:
                            self._live.discard(held.index)
                    continue
                free.append(head.slot)
                with self._lock:
                    self._live.discard(head.slot.index)
                yield result
        finally:
            self._shutdown(run, inflight, free)
            self._gen = None

    def _wait(self, head: Job, inflight: Sequence[Job]) -> None:
        """Block until ``head`` is done; raise on any failure or stage timeout."""
        while True:
            failed = [j for j in inflight if j.done.is_set() and j.error is not None]
            if failed:
                job = min(failed, key=lambda j: j.index)
                exc, stage = job.error, job.error_stage
                assert exc is not None
                if not isinstance(exc, Exception):
                    raise exc  # KeyboardInterrupt, SystemExit: as they are
                if isinstance(exc, PipelineError):
                    raise exc
                raise PipelineError(
                    f"item {job.index}: {stage} failed: {type(exc).__name__}: {exc}",
                    job.index, stage,
                ) from exc
            if head.run.cancel.is_set():  # only close() sets it while a run waits
                raise PipelineError("the Pipeline was closed while this run was in "
                                    "progress; the items still on the belt were dropped")
            if head.done.is_set():
                return
            wait = 0.25
            if self.timeout_s is not None:
                now = time.perf_counter()
                for j in inflight:
                    started = j.started
                    if j.running and started is not None:
                        left = started + self.timeout_s - now
                        if left <= 0 and j.running:
                            raise PipelineError(
                                f"item {j.index}: {j.stage} timed out after {self.timeout_s} s "
                                "(timeout_s); the belt was stopped",
                                j.index, j.stage,
                            )
                        wait = min(wait, max(left, 0.001))
            self._signal.wait(wait)
            self._signal.clear()

    def _shutdown(self, run: Run, inflight: Sequence[Job], free: list[Slot]) -> None:
        """Stop the belt: cancel what has not started, wait (bounded) for what runs,
        give every slot buffer back to the pool (or discard those a hung stage holds)."""
        with self._lock:  # after this no stage starts; running ones are waited for
            run.cancel.set()
        run.spec_ready.set()
        disp = run.dispatcher
        self._last_dispatch = disp
        if not inflight and self._crew is not None and self._crew[1] is disp:
            for s in free:  # every item was handed over: nothing runs, nothing is queued
                s.release(keep_device=True)
            self._spare = free  # their device buffers serve the next run
            with self._lock:
                self._live.clear()
            return
        self._crew = None  # stopped early: this run's threads and streams are let go
        disp.close(wait=False, cancel_pending=True)
        for j in inflight:  # jobs whose prepare was cancelled before it started
            fut_cancelled = not j.running and j.started is None
            if fut_cancelled:
                j.done.set()
        grace = self.timeout_s if self.timeout_s is not None else CLOSE_GRACE_S
        deadline = time.perf_counter() + grace
        hung: list[Job] = []
        for j in inflight:
            while j.running and not j.done.is_set():
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                j.done.wait(min(left, 0.05))
            if j.running and not j.done.is_set():
                hung.append(j)
        run.crew.stop()
        if not hung and not self._lanes.wait_idle(run.crew, deadline):  # pragma: no cover - GPU
            log.warning("Pipeline: GPU work is still queued after %.1f s; the in-flight "
                        "slot buffers are discarded, not reused", grace)
            hung = list(inflight)
        if not hung:
            disp.close(wait=True)
        for j in inflight:
            if j in hung:
                log.warning(
                    "Pipeline: item %s is stuck in %s; its slot buffers are discarded",
                    j.index, j.stage,
                )
                j.slot.discard(self.pool)
            else:
                free.append(j.slot)
            j.result = j.value = j.item = j.host_src = None
            j.keep = []
        for s in free:
            s.release()
        with self._lock:
            self._live.clear()
        run.crew.streams = {}

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop a run in progress (its slots go back to the pool) and free the pool.

        Safe from any thread: a run that is executing on another thread right now is
        cancelled there (its consumer gets a :class:`PipelineError`) and waited for
        (bounded by ``timeout_s``, else :data:`CLOSE_GRACE_S`) before the pool is freed.
        """
        with self._lock:  # from here on run() refuses and a run not yet set up never starts
            self._closed = True
            cancel = self._cancel
        gen = self._gen() if self._gen is not None else None
        if gen is not None:
            try:
                gen.close()  # a suspended run cleans up here, on this thread
            except ValueError:  # "generator already executing": on another thread
                self._stop_elsewhere(cancel)
        self._gen = None
        self._spare = None
        if self._crew is not None:
            crew, disp = self._crew
            self._crew = None
            crew.stop()
            disp.close(wait=True)
        if self._own_pool:
            self.pool.close()

    def _stop_elsewhere(self, cancel: threading.Event | None) -> None:
        """Cancel the run executing on another thread; wait (bounded) for its cleanup."""
        if cancel is not None:
            with self._lock:  # as in _shutdown: no stage starts after this
                cancel.set()
            self._signal.set()
        grace = (self.timeout_s if self.timeout_s is not None else CLOSE_GRACE_S) + 1.0
        if not self._run_over.wait(grace):
            log.warning("Pipeline.close: the run on another thread did not stop within "
                        "%.1f s; closing anyway", grace)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Pipeline(mode={self.mode!r}, depth={self.depth}, workers={self.workers}, "
            f"h2d={self.h2d}, d2h={self.d2h})"
        )
