"""The dynamic batcher: requests in, batches out, each caller its own rows back.

Triton's semantics (``dynamic_batching { max_queue_delay_microseconds }``): a batch takes
as many queued requests as fit ``max_batch`` rows, in arrival order; when fewer rows are
waiting, the batcher holds the batch open until the *oldest* request has waited
``max_delay_ms``, then runs what it has. The batch is padded up to the smallest bucket
that holds it (repeating its last row), so the model sees only ``len(buckets)`` shapes:
each bucket is compiled (and on the GPU captured as a CUDA graph with its own pinned
staging buffers) once.

A request's form is checked when it is submitted (input names, shape, dtype); a bad one
fails alone there and never reaches a batch. Its values are checked against the NaN
policy with the rest of its batch, in one vectorised test of the gathered inputs (a
request's own test, a few NumPy calls, would cost more interpreter time than the rest of
its way through the server): a request holding a NaN or an infinity fails alone with
:class:`~.errors.BadRequestError` and the batch runs without it. If a batch's run
raises, each of its requests is re-run alone, so only the request that fails gets the
error. Futures that were cancelled, or whose timeout passed while they queued, are
skipped. ``close()`` stops taking requests and, by default, finishes those already
queued.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..checks import is_seconds
from .errors import (
    BadRequestError,
    InferenceError,
    QueueFullError,
    RequestTimeoutError,
    ServerClosedError,
)
from .model import CompiledModel
from .stats import BatchRecord, ModelStats
from .waiters import LoopCallback, LoopWaiter, ThreadCallback, resolve

__all__ = ["NAN_POLICIES", "Batcher", "Request", "ServeOptions", "default_buckets"]

log = logging.getLogger(__name__)

_ISFINITE = np.isfinite
_SMALL = 32  # elements up to which Python's sum of the values beats NumPy's test

#: What to do with a NaN or infinite input: refuse the request, or pass it to the model.
NAN_POLICIES = ("reject", "allow")


def default_buckets(max_batch: int) -> tuple[int, ...]:
    """Powers of two below ``max_batch``, and ``max_batch`` itself."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return (*out, max_batch)


@dataclass(frozen=True)
class ServeOptions:
    """Every setting of a served model, with its default (the one source of defaults).

    Attributes
    ----------
    max_batch
        Most rows in one batch (Triton's ``max_batch_size``).
    max_delay_ms
        How long the oldest queued request may wait for a fuller batch (Triton's
        ``max_queue_delay_microseconds``, in ms). 0: run what is there at once.
    buckets
        Batch sizes the model runs at (a batch is padded to the smallest that holds it);
        default: powers of two and ``max_batch``. ``()`` : no padding (every size).
    max_queue
        Most requests waiting; one more is refused with ``QueueFullError``.
    timeout_s
        Default per-request timeout (queue wait included); ``None``: none.
    nan_policy
        ``"reject"`` refuses inputs with NaN or infinity; ``"allow"`` passes them on.
    """

    max_batch: int = 64
    max_delay_ms: float = 2.0
    buckets: tuple[int, ...] | None = None
    max_queue: int = 4096
    timeout_s: float | None = None
    nan_policy: str = "reject"

    def __post_init__(self) -> None:
        if not isinstance(self.max_batch, (int, np.integer)) or self.max_batch < 1:
            raise InferenceError(f"max_batch must be a positive whole number, got "
                                 f"{self.max_batch!r}")
        if not self.max_delay_ms >= 0:
            raise InferenceError(f"max_delay_ms must be >= 0, got {self.max_delay_ms!r}")
        if not isinstance(self.max_queue, (int, np.integer)) or self.max_queue < 1:
            raise InferenceError(f"max_queue must be a positive whole number, got "
                                 f"{self.max_queue!r}")
        if self.timeout_s is not None and not is_seconds(self.timeout_s):
            raise InferenceError(f"timeout_s must be > 0 or None, got {self.timeout_s!r}")
        if self.nan_policy not in NAN_POLICIES:
            raise InferenceError(f"nan_policy must be one of {NAN_POLICIES}, got "
                                 f"{self.nan_policy!r}")
        if self.buckets is not None:
            b = tuple(sorted({int(x) for x in self.buckets}))
            if b and (b[0] < 1 or b[-1] != self.max_batch):
                raise InferenceError(f"buckets must be positive sizes ending at max_batch "
                                     f"({self.max_batch}), got {self.buckets!r}")
            object.__setattr__(self, "buckets", b)

    @property
    def bucket_sizes(self) -> tuple[int, ...]:
        """The buckets in use (``()`` means every size runs as it is)."""
        return default_buckets(self.max_batch) if self.buckets is None else self.buckets

    def bucket_for(self, rows: int) -> int:
        """The batch size ``rows`` rows run at."""
        for b in self.bucket_sizes:
            if b >= rows:
                return b
        return rows


@dataclass(eq=False, slots=True)
class Request:
    """One caller's inputs on their way through the queue."""

    arrays: list[np.ndarray]
    rows: int
    future: Future | LoopWaiter | ThreadCallback
    t_submit: float
    deadline: float | None
    unbatched: bool = False
    as_dict: bool = False
    trailing: tuple = field(default=())


Executor = Callable[[list[np.ndarray]], list[np.ndarray]]


class Batcher:
    """The queue and the worker threads of one served model.

    Parameters
    ----------
    model
        What runs.
    options
        The settings.
    executor
        ``executor(arrays) -> outputs`` for one padded batch (default: the model's own
        call; a GPU server passes :class:`~pyc_lab.inference.gpu.BucketExecutor`), or a
        sequence of them: model *replicas* (one per GPU, say, as Triton's instance
        groups), each run by a worker thread of its own that takes the next batch from
        the one queue, so batches run on the replicas at once.
    """

    def __init__(self, model: CompiledModel, options: ServeOptions,
                 executor: Executor | Sequence[Executor] | None = None) -> None:
        self.model = model
        self.options = options
        if executor is None:
            executors: list[Executor] = [model.run]
        elif callable(executor):
            executors = [executor]
        else:
            executors = list(executor)
            if not executors or not all(callable(e) for e in executors):
                raise InferenceError("executor must be a callable or a non-empty sequence of "
                                     "callables (one per replica)")
        #: The replicas' executors; :attr:`executor` is the first.
        self.executors: list[Executor] = executors
        self.executor: Executor = executors[0]
        self.stats = ModelStats(options.max_batch)
        #: Per input, what :meth:`_fast_check` compares: dtype, rank and the dimensions
        #: after the batch axis (None when one is free).
        self._specs = [self._fast_spec(s) for s in model.inputs]
        #: The inputs whose values the NaN policy tests, batch by batch (:meth:`_finite`).
        self._tested = [i for i, s in enumerate(model.inputs)
                        if options.nan_policy == "reject" and np.dtype(s.dtype).kind in "fc"]
        #: How many inputs a request carries.
        self.n_inputs = len(model.inputs)
        self._fixed_trailing = tuple(s[2] for s in self._specs)
        self._queue: deque[Request] = deque()
        self._queued_rows = 0  # rows in the queue (when to wake the worker early)
        self._lock = threading.Lock()  # what callers take to queue (a C-level lock)
        self._cond = threading.Condition(self._lock)
        self._closing = False
        self._drain = True
        name = f"pyc-lab-batcher-{model.name}"
        self._threads = [
            threading.Thread(target=self._loop, args=(ex,), daemon=True,
                             name=name if len(executors) == 1 else f"{name}-{k}")
            for k, ex in enumerate(executors)]
        for thread in self._threads:
            thread.start()

    # -- the caller's side -------------------------------------------------------------------
    def check(self, arrays: Sequence[Any]) -> tuple[list[np.ndarray], int, bool, tuple]:
        """Validate and convert one request's inputs: arrays, rows, unbatched, trailing
        shapes (their form: the values meet the NaN policy in their batch, :meth:`_finite`).

        Raises
        ------
        BadRequestError
            With the input, what was expected and what came.
        """
        return self._fast_check(arrays) or self._full_check(arrays)

    def _full_check(self, arrays: Sequence[Any]
                    ) -> tuple[list[np.ndarray], int, bool, tuple]:
        """:meth:`check` for any request (:meth:`_fast_check` takes the common one)."""
        out: list[np.ndarray] = []
        rows: int | None = None
        unbatched = False
        trailing = []
        for spec, value in zip(self.model.inputs, arrays, strict=True):
            try:
                a = np.asarray(value)
            except Exception as exc:
                raise BadRequestError(f"input {spec.name!r}: not an array ({exc})") from None
            want = np.dtype(spec.dtype)
            if a.dtype != want:
                if a.dtype == object or not np.can_cast(a.dtype, want, "same_kind"):
                    raise BadRequestError(f"input {spec.name!r}: dtype {a.dtype} cannot be "
                                          f"converted to the model's {want} (pass {want})")
                a = a.astype(want)
            if a.ndim == len(spec.shape) - 1:
                a, unbatched = a[None], True
            if a.ndim != len(spec.shape):
                raise BadRequestError(f"input {spec.name!r}: shape {a.shape} does not fit the "
                                      f"model's {spec.describe()} (axis 0 is the batch)")
            for axis, (got, dim) in enumerate(zip(a.shape[1:], spec.shape[1:], strict=True)):
                if dim is not None and got != dim:
                    raise BadRequestError(
                        f"input {spec.name!r}: shape {a.shape} does not fit the model's "
                        f"{spec.describe()} (axis {axis + 1} is {got}, expected {dim})")
            if rows is None:
                rows = a.shape[0]
            elif a.shape[0] != rows:
                raise BadRequestError(f"input {spec.name!r} has {a.shape[0]} rows but the "
                                      f"first input has {rows}: every input needs the same")
            trailing.append(a.shape[1:])
            out.append(np.ascontiguousarray(a))
        rows = int(rows or 0)
        if rows < 1:
            raise BadRequestError("a request needs at least one row")
        if rows > self.options.max_batch:
            raise BadRequestError(f"a request of {rows} rows is larger than max_batch="
                                  f"{self.options.max_batch}: split it, or serve with a "
                                  "larger max_batch")
        return out, rows, unbatched, tuple(trailing)

    def _fast_spec(self, spec: Any) -> tuple:
        want = np.dtype(spec.dtype)
        fixed = None if any(d is None for d in spec.shape[1:]) else tuple(spec.shape[1:])
        if want.kind == "c":
            fixed = None  # complex inputs are rare: the full check takes them
        return want, len(spec.shape), fixed

    def _fast_check(self, arrays: Sequence[Any]) -> tuple | None:
        """:meth:`check` for the common request — C-contiguous NumPy arrays of the
        model's dtypes and fixed dimensions, with the batch axis, the same rows each, at
        most ``max_batch`` — in a few attribute reads; ``None`` for anything else (the
        full check then runs and explains). Nothing here lets the interpreter go: a
        request is checked without handing the batcher's thread the interpreter in the
        middle of it."""
        specs = self._specs
        if len(arrays) != len(specs):
            return None
        max_batch = self.options.max_batch
        if len(specs) == 1:  # one input (most models): no loop
            (want, ndim, fixed), a = specs[0], arrays[0]
            if fixed is None or type(a) is not np.ndarray \
                    or (a.dtype is not want and a.dtype != want) \
                    or a.ndim != ndim or not a.flags.c_contiguous:
                return None
            shape = a.shape
            rows = shape[0]
            if shape[1:] != fixed or not 1 <= rows <= max_batch:
                return None
            return [a], rows, False, self._fixed_trailing
        rows = -1
        for (want, ndim, fixed), a in zip(specs, arrays, strict=True):
            if fixed is None or type(a) is not np.ndarray \
                    or (a.dtype is not want and a.dtype != want) \
                    or a.ndim != ndim or not a.flags.c_contiguous:
                return None  # a free dimension, or anything unusual: the full check
            shape = a.shape
            if shape[1:] != fixed:
                return None
            if rows < 0:
                rows = shape[0]
                if not 1 <= rows <= max_batch:
                    return None
            elif shape[0] != rows:
                return None
        return list(arrays), rows, False, self._fixed_trailing

    def submit(self, arrays: Sequence[Any], *, timeout_s: float | None = None,
               as_dict: bool = False, loop: Any = None,
               callback: Callable[[Any, BaseException | None], None] | None = None
               ) -> Future | asyncio.Future | LoopCallback | ThreadCallback:
        """Queue one request; its future resolves to the outputs.

        With ``loop`` (the running event loop of the caller), an ``asyncio.Future`` of
        that loop, resolved through its :class:`~.waiters.Mailbox` (one loop wake-up per
        batch) — or, with ``callback`` too, a :class:`~.waiters.LoopCallback` that calls
        it there; with ``callback`` alone, a :class:`~.waiters.ThreadCallback` that calls
        it on the worker thread; else a ``concurrent.futures.Future``.
        """
        if self._closing:
            raise ServerClosedError(f"model {self.model.name!r}: the server is closed; start "
                                    "another with pl.serve(...)")
        try:  # the fast check first, without check()'s call around it
            checked, rows, unbatched, trailing = \
                self._fast_check(arrays) or self._full_check(arrays)
        except BadRequestError:
            self.stats.count("rejected")
            raise
        now = time.monotonic()
        timeout = self.options.timeout_s if timeout_s is None else timeout_s
        handle: Future | LoopWaiter | ThreadCallback = (
            (Future() if callback is None else ThreadCallback(callback)) if loop is None
            else LoopWaiter(loop, None if callback is None else LoopCallback(callback)))
        req = Request(checked, rows, handle, now, None if timeout is None else now + timeout,
                      unbatched, as_dict, trailing)
        with self._lock:  # the condition's lock, taken without its Python-level wrapper
            if self._closing:
                raise ServerClosedError(f"model {self.model.name!r}: the server is closed")
            if len(self._queue) >= self.options.max_queue:
                self.stats.count("rejected")
                raise QueueFullError(
                    f"model {self.model.name!r}: the queue holds max_queue="
                    f"{self.options.max_queue} requests already; retry later, or serve with a "
                    "larger max_queue or max_batch")
            # the worker waits for a first request, then holds the batch open until the
            # delay passes or max_batch rows could be taken: wake it only for those
            wake = not self._queue
            self._queue.append(req)
            self._queued_rows += rows
            if wake or self._queued_rows >= self.options.max_batch:
                self._cond.notify()
        return handle if loop is None else handle.future

    @property
    def queued(self) -> int:
        """Requests waiting now."""
        return len(self._queue)

    # -- the worker's side ---------------------------------------------------------------------
    def _take(self) -> list[Request] | None:
        """Wait for the next batch (Triton's rule); ``None`` when closed and drained.

        Several replicas' workers wait here together: the one that finds rows takes
        them, one that woke to an empty queue waits again, and a worker leaving rows
        behind wakes another for them.
        """
        opts = self.options
        delay = opts.max_delay_ms / 1e3
        max_batch = opts.max_batch
        queue = self._queue
        with self._cond:
            while True:
                while not queue:
                    if self._closing:
                        return None
                    self._cond.wait()
                if self._closing and not self._drain:
                    return None
                hold_until = queue[0].t_submit + delay
                while not self._closing and queue:
                    # fewer rows queued than a batch: no need to count those that fit
                    if self._queued_rows >= max_batch and self._rows_ready() >= max_batch:
                        break
                    remaining = hold_until - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if queue:  # another replica may have taken them while this one waited
                    break
            batch = [queue.popleft()]
            rows = batch[0].rows
            first = batch[0].trailing
            while queue and rows + queue[0].rows <= max_batch \
                    and (queue[0].trailing is first or queue[0].trailing == first):
                req = queue.popleft()
                batch.append(req)
                rows += req.rows
            self._queued_rows -= rows
            if queue and len(self._threads) > 1:
                self._cond.notify()  # the rest for another replica
            return batch

    def _rows_ready(self) -> int:
        """Rows at the head of the queue that one batch could take (same trailing
        shapes; the fast check hands every request of a fixed-shape model one tuple)."""
        rows = 0
        first = self._queue[0].trailing
        max_batch = self.options.max_batch
        for req in self._queue:
            trailing = req.trailing
            if trailing is not first and trailing != first:
                break
            rows += req.rows
            if rows >= max_batch:
                break
        return rows

    def _loop(self, executor: Executor) -> None:
        while True:
            batch = self._take()
            if batch is None:
                break
            try:
                self._run(batch, executor)
            except BaseException as exc:  # pragma: no cover - a bug in the batcher itself
                log.exception("batcher of %r failed", self.model.name)
                for req in batch:
                    if not req.future.done():
                        req.future.set_exception(InferenceError(f"the batcher failed: {exc}"))
        self._fail_left(ServerClosedError(f"model {self.model.name!r}: the server closed "
                                          "before this request ran"))

    def _fail_left(self, exc: Exception) -> None:
        with self._cond:
            left, self._queue = list(self._queue), deque()
            self._queued_rows = 0
        for req in left:
            if req.future.set_running_or_notify_cancel():
                req.future.set_exception(exc)

    def _run(self, batch: list[Request], executor: Executor) -> None:
        now = time.monotonic()
        live: list[Request] = []
        for req in batch:
            if req.deadline is not None and now > req.deadline:
                if req.future.set_running_or_notify_cancel():
                    req.future.set_exception(RequestTimeoutError(
                        f"model {self.model.name!r}: the request waited "
                        f"{(now - req.t_submit) * 1e3:.1f} ms in the queue, past its timeout; "
                        "give a longer timeout_s, or lower the load"))
                    self.stats.count("timed_out")
                continue
            if req.future.set_running_or_notify_cancel():
                live.append(req)
        if not live:
            return
        try:
            self._compute(live, executor)
        except Exception as exc:
            if len(live) == 1:
                self._fail(live[0], exc)
            else:
                log.debug("batch of %d requests failed (%s); re-running them one by one",
                          len(live), exc)
                for req in live:
                    try:
                        self._compute([req], executor)
                    except Exception as one:
                        self._fail(req, one)

    def _fail(self, req: Request, exc: Exception) -> None:
        err = exc if isinstance(exc, InferenceError) else InferenceError(
            f"model {self.model.name!r} failed on this request: {type(exc).__name__}: {exc}")
        if err is not exc:
            err.__cause__ = exc
        now = time.monotonic()
        req.future.set_exception(err)
        waited = np.array([now - req.t_submit])
        self.stats.record_failed(BatchRecord(waited, 0.0, waited, req.rows, req.rows, ok=False))

    def _finite(self, arrays: list[np.ndarray]) -> bool:
        """Whether the tested inputs of a gathered batch hold only finite values: one
        NumPy test per input for the whole batch (a few values — one row unbatched —
        are Python's ``sum`` of them, cheaper still: a finite sum means every value is
        finite, and a sum that is not, overflow included, is settled request by request
        by :meth:`_refuse_non_finite`)."""
        for i in self._tested:
            a = arrays[i]
            if not (math.isfinite(sum(a.ravel().tolist()))
                    if a.size <= _SMALL and a.dtype.kind == "f" else _ISFINITE(a).all()):
                return False
        return True

    def _refuse_non_finite(self, reqs: list[Request]) -> list[Request]:
        """Fail each request holding a NaN or an infinity (``BadRequestError``, counted as
        rejected); the others, to run."""
        names = self.model.input_names
        keep = []
        for req in reqs:
            bad = next((i for i in self._tested if not _ISFINITE(req.arrays[i]).all()), None)
            if bad is None:
                keep.append(req)
                continue
            self.stats.count("rejected")
            req.future.set_exception(BadRequestError(
                f"input {names[bad]!r} holds NaN or infinity; the server's nan_policy is "
                "'reject' (serve with nan_policy='allow' to pass them to the model)"))
        return keep

    def _compute(self, reqs: list[Request], executor: Executor) -> None:
        t0 = time.monotonic()
        rows = sum(r.rows for r in reqs)
        bucket = self.options.bucket_for(rows)
        n_in = len(self.model.inputs)
        if len(reqs) == 1 and bucket == rows:
            arrays = reqs[0].arrays
        else:
            arrays = []
            for i in range(n_in):
                parts = [r.arrays[i] for r in reqs]
                if bucket > rows:
                    last = parts[-1][-1:]
                    parts.append(np.broadcast_to(last, (bucket - rows, *last.shape[1:])))
                arrays.append(np.concatenate(parts))
        if self._tested and not self._finite(arrays):
            good = self._refuse_non_finite(reqs)
            if len(good) < len(reqs):  # else finite values whose sum overflowed: run
                if good:
                    self._compute(good, executor)
                return
        # one copy of each output per batch (the executor may reuse its buffers), each
        # request a view of its own rows in it
        outs = [np.array(o) if not hasattr(o, "get") else o.get()
                for o in executor(arrays)]
        t1 = time.monotonic()
        results: list[tuple[Any, Any]] = []
        if rows == len(reqs):  # a row each (the common case): the views made in C
            per_output = [list(o[:rows, None]) for o in outs]
            shares: Any = zip(*per_output, strict=True)
        else:
            offsets = np.cumsum([0] + [r.rows for r in reqs]).tolist()
            shares = ([o[a:b] for o in outs] for a, b in itertools.pairwise(offsets))
        for req, mine in zip(reqs, shares, strict=True):
            if req.unbatched:
                mine = [m[0] for m in mine]
            if req.as_dict:
                results.append((req.future, dict(zip(self.model.output_names, mine,
                                                     strict=True))))
            else:
                results.append((req.future, mine[0] if len(mine) == 1 else tuple(mine)))
        resolve(results)
        done = time.monotonic()
        submitted = np.fromiter([req.t_submit for req in reqs], np.float64, len(reqs))
        self.stats.record_batch(BatchRecord(t0 - submitted, t1 - t0, done - submitted, rows,
                                            bucket))

    # -- closing ---------------------------------------------------------------------------------
    def close(self, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stop taking requests; finish the queued ones (``drain``) or fail them."""
        with self._cond:
            self._closing = True
            self._drain = drain
            self._cond.notify_all()
        if not drain:
            self._fail_left(ServerClosedError(f"model {self.model.name!r}: the server was "
                                              "closed without draining its queue"))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self.alive:
            return
        for executor in self.executors:
            release = getattr(executor, "close", None)
            if release is not None:
                release()  # a GPU executor gives its pinned buffers back

    @property
    def alive(self) -> bool:
        """Whether a worker thread runs."""
        return any(thread.is_alive() for thread in self._threads)
