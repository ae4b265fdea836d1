"""``pl.serve``: models served inside the kernel — sync, futures, asyncio, HTTP.

.. code-block:: python

    server = pl.serve(pl.inference.load("model.onnx"), max_batch=64, max_delay_ms=2)
    y = server.predict(x)                  # blocks; x may be one row or several
    fut = server.submit(x)                 # concurrent.futures.Future
    y = await server.predict_async(x)      # in a coroutine (Jupyter's loop included)
    url = server.http(port=0).url          # KServe v2 over HTTP on 127.0.0.1
    server.close()                         # finishes the queued work

Several models at once: ``pl.serve({"a": model_a, "b": model_b})`` and
``server.predict(x, model="a")``. Each model has its own :class:`~.batcher.Batcher`
(queue and worker threads) and statistics. ``pl.serve(model, devices=[0, 1])`` places a
replica of each model on every GPU listed (``replicas=`` of them on each) behind its one
batcher: batches run on the GPUs at once. Running servers are listed by
:func:`running_servers` (what ``%pyc_serve`` shows).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np

from ..checks import is_seconds
from .batcher import Batcher, ServeOptions
from .errors import BadRequestError, InferenceError, RequestTimeoutError, ServerClosedError
from .model import CompiledModel, as_model
from .waiters import timeouts_for

__all__ = ["Server", "running_servers", "serve"]

log = logging.getLogger(__name__)


def _nothing() -> None:
    return None


@functools.lru_cache(maxsize=64)
def _timeout_text(server: str, timeout_s: float) -> str:
    """What a timed-out request says (made once per server and timeout: a coroutine
    request hands it to the timeout wheel before it knows whether it will be needed)."""
    return (f"{server}: no result within {timeout_s} s; give a longer timeout_s, or lower "
            "the load")

_REGISTRY: dict[int, weakref.ref] = {}
_REGISTRY_LOCK = threading.Lock()
_IDS = itertools.count(1)


def running_servers() -> list[Server]:
    """The servers of this process that are open, oldest first."""
    with _REGISTRY_LOCK:
        out = [r() for _, r in sorted(_REGISTRY.items())]
    return [s for s in out if s is not None and not s.closed]


def _close_batchers(batchers: list[Batcher]) -> None:
    for b in batchers:
        b.close(drain=False, timeout_s=1.0)


class Server:
    """Models behind dynamic batchers, in this process. Build one with :func:`serve`.

    Attributes
    ----------
    name
        ``server-<n>`` (numbered in this process), or the name given.
    options
        The :class:`~pyc_lab.inference.batcher.ServeOptions` of every model.
    models
        Served name -> :class:`~pyc_lab.inference.model.CompiledModel`.
    devices, replicas
        The GPUs every model has replicas on and how many on each (``None``: one
        executor, as ``device`` says); see :func:`serve`.
    """

    def __init__(self, models: Mapping[str, CompiledModel], options: ServeOptions, *,
                 name: str | None = None, device: str = "auto",
                 devices: Sequence[int] | None = None, replicas: int = 1) -> None:
        if not models:
            raise InferenceError("serve needs at least one model")
        self.id = next(_IDS)
        self.name = name or f"server-{self.id}"
        self.options = options
        self.device = device
        self.devices = None if devices is None else [int(d) for d in devices]
        self.replicas = int(replicas)
        self.models: dict[str, CompiledModel] = {}
        self._batchers: dict[str, Batcher] = {}
        self._http: Any = None
        self._closed = False
        #: The batcher a request naming no model goes to (``None`` unless exactly one).
        self._sole: Batcher | None = None
        for model_name, model in models.items():
            self.add(model, name=model_name)
        self._finalizer = weakref.finalize(self, _close_batchers, list(self._batchers.values()))
        with _REGISTRY_LOCK:
            _REGISTRY[self.id] = weakref.ref(self)

    # -- models ------------------------------------------------------------------------------
    def add(self, model: Any, *, name: str | None = None) -> CompiledModel:
        """Serve one more model (a :class:`CompiledModel`, or anything :func:`load` takes)."""
        if self._closed:
            raise ServerClosedError(f"{self.name} is closed")
        cm = as_model(model)
        served = name or cm.name
        if served in self._batchers:
            raise InferenceError(f"{self.name} serves a model named {served!r} already; pass "
                                 "another name")
        if served != cm.name:
            cm = CompiledModel(served, cm.compiled, cm.inputs, cm.outputs, cm.weights,
                               source=cm.source, imported=cm.imported)
        executor: Any = None
        if self.devices is not None:
            from .gpu import replica_executors

            executor = replica_executors(cm, self.options, self.devices, self.replicas)
        elif self.device != "cpu":
            from .gpu import bucket_executor

            executor = bucket_executor(cm, self.options, self.device)
        self.models[served] = cm
        self._batchers[served] = Batcher(cm, self.options, executor)
        self._sole = next(iter(self._batchers.values())) if len(self._batchers) == 1 else None
        if hasattr(self, "_finalizer"):
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _close_batchers,
                                               list(self._batchers.values()))
        return cm

    def _batcher(self, model: str | None) -> Batcher:
        if model is None:
            if self._sole is None:
                raise InferenceError(f"{self.name} serves {', '.join(self._batchers)}: say "
                                     "which with model=...")
            return self._sole
        if model not in self._batchers:
            raise InferenceError(f"{self.name} serves no model {model!r}; it serves "
                                 f"{', '.join(self._batchers)}")
        return self._batchers[model]

    # -- requests ------------------------------------------------------------------------------
    def submit(self, *args: Any, model: str | None = None, timeout_s: float | None = None,
               **inputs: Any) -> Future:
        """Queue one request; a ``concurrent.futures.Future`` of its outputs.

        Parameters
        ----------
        *args, **inputs
            The inputs: positional arrays, keywords by input name, or one dict. A request
            may carry several rows (axis 0), or one row without the batch axis.
        model
            Which model (needed when several are served).
        timeout_s
            This request's timeout (default: the server's ``timeout_s``).

        Returns
        -------
        Future
            Resolves to the output array (a tuple for several outputs, a dict when the
            inputs came as a dict), or to the request's error.

        Raises
        ------
        BadRequestError
            If the inputs do not fit the model (they never reach a batch).
        QueueFullError
            If ``max_queue`` requests wait already.
        ServerClosedError
            If the server is closed.
        """
        return self._enqueue(args, inputs, model, timeout_s, None)

    def _enqueue(self, args: tuple, inputs: dict[str, Any], model: str | None,
                 timeout_s: float | None, loop: Any, callback: Any = None) -> Any:
        """Bind and queue one request: a concurrent future, or with ``loop`` an asyncio
        future of that loop, or with ``callback`` too a
        :class:`~.waiters.LoopCallback` (see :meth:`.batcher.Batcher.submit`)."""
        if self._closed:
            raise ServerClosedError(f"{self.name} is closed; start another with pl.serve(...)")
        if timeout_s is not None and not is_seconds(timeout_s):
            raise BadRequestError(f"timeout_s must be a number of seconds > 0 (or None for "
                                  f"the server's), got {timeout_s!r}")
        b = self._sole if model is None and self._sole is not None else self._batcher(model)
        if not inputs and args and type(args[0]) is np.ndarray \
                and len(args) == b.n_inputs:  # arrays in order (the common request)
            return b.submit(args, timeout_s=timeout_s, loop=loop, callback=callback)
        as_dict = len(args) == 1 and not inputs and type(args[0]) is not np.ndarray \
            and isinstance(args[0], Mapping)  # an array is never one: skip the ABC check
        try:
            arrays = b.model.bind(args[0] if as_dict else None, () if as_dict else args,
                                  inputs)
        except BadRequestError:
            b.stats.count("rejected")
            raise
        return b.submit(arrays, timeout_s=timeout_s, as_dict=as_dict, loop=loop,
                        callback=callback)

    def predict(self, *args: Any, model: str | None = None, timeout_s: float | None = None,
                **inputs: Any) -> Any:
        """Run one request and wait for its outputs (see :meth:`submit`).

        Raises
        ------
        RequestTimeoutError
            If it did not finish within its timeout.
        """
        fut = self.submit(*args, model=model, timeout_s=timeout_s, **inputs)
        timeout = self.options.timeout_s if timeout_s is None else timeout_s
        try:
            return fut.result(timeout=timeout)
        except FutureTimeout:
            fut.cancel()
            raise RequestTimeoutError(_timeout_text(self.name, timeout)) from None

    async def predict_async(self, *args: Any, model: str | None = None,
                            timeout_s: float | None = None, **inputs: Any) -> Any:
        """``await server.predict_async(x)``: :meth:`predict` without blocking the loop.

        The result arrives on this loop with the rest of its batch (one wake-up per
        batch, :mod:`.waiters`); past the timeout (to within
        :data:`~.waiters.TIMEOUT_GRANULARITY_S`) the request fails with
        :class:`~.errors.RequestTimeoutError` and, if it has not run yet, is skipped.
        """
        fut, forget = self.request_on_loop(asyncio.get_running_loop(), args, inputs, model,
                                           timeout_s)
        try:
            return await fut
        finally:
            forget()

    def request_on_loop(self, loop: asyncio.AbstractEventLoop, args: tuple,
                        inputs: dict[str, Any], model: str | None = None,
                        timeout_s: float | None = None
                        ) -> tuple[asyncio.Future, Callable[[], None]]:
        """Queue one request from ``loop``'s thread (the loop running): ``(future,
        forget)``, where ``future`` is an ``asyncio.Future`` of that loop resolving to the
        outputs, failed with :class:`~.errors.RequestTimeoutError` past the timeout, and
        ``forget()`` — to be called once the future is done — drops the timeout's entry.

        This is :meth:`predict_async` without a coroutine frame, for callers that drive
        many requests from callbacks (the load generator's clients: a done-callback that
        sends the next request costs less interpreter time than resuming a task).
        ``args`` and ``inputs`` are :meth:`submit`'s positional and keyword inputs.

        Raises
        ------
        BadRequestError, QueueFullError, ServerClosedError
            As :meth:`submit`.
        """
        fut = self._enqueue(args, inputs, model, timeout_s, loop)
        timeout = self.options.timeout_s if timeout_s is None else timeout_s
        if timeout is None:
            return fut, _nothing
        wheel = timeouts_for(loop)
        slot = wheel.add(fut, timeout, _timeout_text(self.name, timeout))
        return fut, functools.partial(wheel.discard, slot, fut)

    def request_with_callback(self, loop: asyncio.AbstractEventLoop | None,
                              callback: Callable[[Any, BaseException | None], None],
                              args: tuple, inputs: dict[str, Any] | None = None,
                              model: str | None = None, timeout_s: float | None = None
                              ) -> None:
        """Queue one request from ``loop``'s thread (the loop running) and have
        ``callback(outputs, None)`` — or ``callback(None, error)``, a
        :class:`~.errors.RequestTimeoutError` past the timeout — called on that loop
        when it is answered, once.

        :meth:`request_on_loop` without the future: for callers that drive many
        requests from callbacks (the load generator's clients, as perf_analyzer's async
        mode), whose answers then cost no done-callback scheduled per request.
        ``args`` and ``inputs`` are :meth:`submit`'s positional and keyword inputs.

        With ``loop=None`` the callback runs on the model's batcher thread as the batch
        is answered (:class:`~.waiters.ThreadCallback`; from any thread, no loop): it must
        be short and never wait for another request. Its timeout, as :meth:`submit`'s,
        bounds the wait in the queue.

        Raises
        ------
        BadRequestError, QueueFullError, ServerClosedError
            As :meth:`submit` (and then ``callback`` is never called).
        """
        handle = self._enqueue(args, {} if inputs is None else inputs, model, timeout_s,
                               loop, callback)
        timeout = self.options.timeout_s if timeout_s is None else timeout_s
        if loop is not None and timeout is not None and not handle.done():
            handle.time_out(timeouts_for(loop), timeout, _timeout_text(self.name, timeout))

    def warm_up(self, model: str | None = None) -> dict[int, float]:
        """Run one batch at every bucket size, so that tracing, compiling and (on the GPU)
        graph capture happen now rather than in a measured request.

        Returns
        -------
        dict
            Bucket size -> milliseconds its first request took (submit to result).
        """
        import time

        b = self._batcher(model)
        sizes = b.options.bucket_sizes or (1, b.options.max_batch)
        out: dict[int, float] = {}
        for size in sizes:
            arrays = b.model.example(size, seed=size)
            t0 = time.perf_counter()
            b.submit(arrays).result(timeout=300)
            out[int(size)] = (time.perf_counter() - t0) * 1e3
        return out

    # -- state ------------------------------------------------------------------------------------
    def stats(self, model: str | None = None) -> Any:
        """The :class:`~pyc_lab.inference.stats.ModelStats` of ``model`` (the only one by
        default)."""
        return self._batcher(model).stats

    def summary(self) -> Any:
        """One row per model: settings, counters, percentiles (a DataFrame)."""
        import pandas as pd

        rows = []
        for name, b in self._batchers.items():
            snap = b.stats.snapshot()
            snap.pop("uptime_s")
            rows.append({"server": self.name, "model": name,
                         "max_batch": self.options.max_batch,
                         "max_delay_ms": self.options.max_delay_ms, "queued": b.queued,
                         **snap})
        return pd.DataFrame(rows)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def url(self) -> str | None:
        """The HTTP endpoint's URL, when one runs."""
        return None if self._http is None else self._http.url

    def describe(self) -> str:
        """One line per model: name, inputs -> outputs, settings (no timings)."""
        o = self.options
        head = (f"{self.name}: {len(self.models)} model(s), max_batch={o.max_batch}, "
                f"max_delay_ms={o.max_delay_ms:g}, buckets={list(o.bucket_sizes)}, "
                f"max_queue={o.max_queue}" + ("" if not self.closed else " (closed)"))
        return "\n".join([head, *(f"  {m.describe()}" for m in self.models.values())])

    def __repr__(self) -> str:
        return self.describe()

    # -- HTTP ------------------------------------------------------------------------------------
    def http(self, port: int = 0, host: str = "127.0.0.1") -> Any:
        """Serve the KServe v2 protocol over HTTP on ``host:port`` (a background thread).

        Parameters
        ----------
        port
            0 picks a free port (see the returned endpoint's ``url``).
        host
            Loopback by default: other processes on this machine only.

        Returns
        -------
        HttpEndpoint
            ``.url``, ``.port``, ``.close()``. Closing the server closes it too.
        """
        if self._closed:
            raise ServerClosedError(f"{self.name} is closed")
        if self._http is not None:
            return self._http
        from .http import HttpEndpoint

        self._http = HttpEndpoint(self, host=host, port=port)
        return self._http

    # -- closing ---------------------------------------------------------------------------------
    def close(self, drain: bool = True, timeout_s: float | None = 30.0) -> None:
        """Stop taking requests, finish the queued ones (``drain``), stop HTTP and the
        workers. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._http is not None:
            self._http.close()
        for b in self._batchers.values():
            b.close(drain=drain, timeout_s=timeout_s)
        self._finalizer.detach()
        with _REGISTRY_LOCK:
            _REGISTRY.pop(self.id, None)
        log.debug("%s closed", self.name)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(model: Any, *, max_batch: int = ServeOptions.max_batch,
          max_delay_ms: float = ServeOptions.max_delay_ms,
          buckets: tuple[int, ...] | None = ServeOptions.buckets,
          max_queue: int = ServeOptions.max_queue,
          timeout_s: float | None = ServeOptions.timeout_s,
          nan_policy: str = ServeOptions.nan_policy, name: str | None = None,
          device: str = "auto", devices: Sequence[int] | None = None,
          replicas: int = 1) -> Server:
    """Serve one model, or several, behind dynamic batchers in this process.

    Parameters
    ----------
    model
        A :class:`~pyc_lab.inference.model.CompiledModel`, anything
        :func:`~pyc_lab.inference.model.load` takes (an ONNX path or ``ModelProto``), or a
        dict ``{served name: model}``.
    max_batch, max_delay_ms, buckets, max_queue, timeout_s, nan_policy
        See :class:`~pyc_lab.inference.batcher.ServeOptions` (the defaults live there).
    name
        The server's name (default ``server-<n>``).
    device
        ``"auto"``: batches of a model compiled for the GPU run on it through per-bucket
        CUDA graphs and pinned staging buffers where a GPU is usable, else on the CPU;
        ``"cpu"``: always the model's own call on host arrays; ``"gpu"``: require a GPU.
    devices
        GPU indices to place model replicas on, each with its own pinned staging, device
        buffers, weights and CUDA graphs, all fed by the model's one batcher (Triton's
        instance groups): a batch runs on whichever replica is free. Needs GPUs and a
        model compiled for them.
    replicas
        Replicas on each GPU of ``devices`` (batches overlap on one GPU when the host
        side of a batch is the bottleneck).

    Returns
    -------
    Server

    Raises
    ------
    InferenceError
        An unknown ``device``, ``devices`` with ``device="cpu"``, an empty ``devices``,
        ``replicas`` below 1, or a device index that is not a GPU here.
    DeviceUnavailableError
        ``devices`` on a machine without a usable GPU.
    """
    if device not in ("auto", "cpu", "gpu"):
        raise InferenceError(f"device must be 'auto', 'cpu' or 'gpu', got {device!r}")
    if devices is not None:
        if device == "cpu":
            raise InferenceError("devices= places replicas on GPUs; leave device='auto' (or "
                                 "'gpu') with it, or drop devices= to serve on the CPU")
        if isinstance(devices, (int, str)) or not list(devices):
            raise InferenceError(f"devices must be a non-empty list of GPU indices, e.g. "
                                 f"[0, 1], got {devices!r}")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise InferenceError(f"replicas must be a whole number >= 1, got {replicas!r}")
    if replicas > 1 and devices is None:
        raise InferenceError("replicas= counts replicas on each GPU of devices=; pass "
                             "devices too (e.g. devices=[0], replicas=2)")
    options = ServeOptions(max_batch=max_batch, max_delay_ms=max_delay_ms, buckets=buckets,
                           max_queue=max_queue, timeout_s=timeout_s, nan_policy=nan_policy)
    models = dict(model) if isinstance(model, Mapping) else {None: model}
    resolved = {}
    for key, m in models.items():
        cm = as_model(m)
        resolved[key or cm.name] = cm
    return Server(resolved, options, name=name, device=device, devices=devices,
                  replicas=replicas)
