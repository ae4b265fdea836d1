"""``pl.inference.load_test``: a server measured the way Triton's perf_analyzer does.

For each concurrency level, that many clients send requests back to back (each waits for
its answer before sending the next: closed-loop, perf_analyzer's ``--concurrency-range``)
for a warm-up period, not counted, then for ``duration_s``, measured. The clients are
callbacks on one event loop in a thread of their own (perf_analyzer's async mode: each
answer's callback sends that client's next request; requests made with
``Server.request_with_callback``, no future each), so that a high concurrency does not
mean dozens of Python threads, or dozens of tasks to resume, competing with the batcher
for the interpreter. With ``clients="workers"`` they are callbacks on the server's own
worker thread(s) instead (perf_analyzer's in-process mode, whose callbacks run on the
server's threads): no thread of the load generator's at all, so each batch is not
handed between two threads — and, on a machine of several cores, between two cores,
whose caches then hold none of what the other thread just touched. Client-side
end-to-end latency goes into a :class:`~pyc_lab.profiling.quantiles.QuantileSketch`
(bounded memory, 1 % relative accuracy); the server reports each measured request's
queue wait and compute time and its batch's size through an observer of its statistics.
Before the first level the server is warmed up (every bucket traced, compiled and, on a
GPU, captured) and that time is reported apart, in ``frame.attrs["warmup_ms"]``.

:func:`sweep` repeats the test over ``max_batch`` and ``max_delay_ms`` settings (a
server each), which is how to tune them: the throughput-vs-latency curve per setting.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ..profiling.quantiles import QuantileSketch
from .errors import InferenceError
from .stats import BatchRecord

__all__ = ["CLIENTS", "COLUMNS", "load_test", "sweep"]

log = logging.getLogger(__name__)

#: The columns of a load test's frame, in order.
COLUMNS = ["concurrency", "max_batch", "max_delay_ms", "requests", "errors", "duration_s",
           "throughput_rps", "rows_per_s", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms",
           "queue_mean_ms", "queue_p99_ms", "compute_mean_ms", "compute_p99_ms",
           "mean_batch", "batch_hist", "clients"]

#: Where a load test's clients run: ``"loop"``, callbacks on an event loop in a thread of
#: their own (asyncio callers, as the HTTP endpoint's); ``"workers"``, callbacks on the
#: server's worker threads (in-process callers that react where the answer arrives,
#: perf_analyzer's in-process mode).
CLIENTS = ("loop", "workers")


class _State:
    """Whether a level measures and whether its clients stop: plain attributes, read by
    every request's callbacks (cheaper than an ``Event``'s method) and written under the
    interpreter lock from the clients' loop (and, to stop, from the caller's thread)."""

    __slots__ = ("measuring", "stop")

    def __init__(self) -> None:
        self.measuring = False
        self.stop = False


def _level(server: Any, model: str | None, arrays: list[Any], concurrency: int,
           duration_s: float, warmup_s: float, request_timeout_s: float,
           clients: str = "loop") -> dict[str, Any]:
    stats = server.stats(model)
    state = _State()
    lock = threading.Lock()
    latency = QuantileSketch()
    queue = QuantileSketch()
    compute = QuantileSketch()
    batch_hist: Counter[int] = Counter()
    counts = {"errors": 0}
    rows_per_request = int(arrays[0].shape[0]) if arrays and arrays[0].ndim else 1
    error_text: list[str] = []

    def observe(record: BatchRecord) -> None:  # on the batcher's thread
        if not state.measuring or not record.ok:
            return
        with lock:
            queue.add_many(record.queue_s)
            compute.add(record.compute_s, record.requests)  # one per request
            batch_hist[record.batch_rows] += 1

    # the clients' latencies: appended by their callbacks, gathered a few hundred at a
    # time and counted in one vectorised call (under ``flush``)
    done: list[float] = []
    timing: dict[str, float] = {}

    request = server.request_with_callback
    perf_counter = time.perf_counter

    def error(exc: BaseException) -> None:
        """A request refused or failed: counted while measuring, the first one kept."""
        if not error_text:
            error_text.append(f"{type(exc).__name__}: {exc}")
        if state.measuring:
            counts["errors"] += 1

    def unanswered(n: int) -> None:
        """``n`` clients' last requests were not answered ``request_timeout_s`` after
        the level ended (a stuck server): errors, and the level ends."""
        counts["errors"] += n
        if not error_text:
            error_text.append(f"{n} request(s) unanswered {request_timeout_s} s after the "
                              "level ended")

    flush = threading.Lock()  # on the workers, several replicas may answer at once

    class Client:
        """One closed-loop client: its answer's callback sends its next request —
        requested with ``loop`` (``None``: the callback runs on the server's worker);
        ``retry(client)`` sends again a request refused at once, ``stopped()`` counts
        the client out once the level has ended."""

        __slots__ = ("answered", "loop", "retry", "stopped", "t0")

        def __init__(self, loop: Any, retry: Callable[[Client], None],
                     stopped: Callable[[], None]) -> None:
            self.loop, self.retry, self.stopped = loop, retry, stopped
            self.t0 = 0.0
            self.answered = self._answered  # bound once, not per request

        def send(self) -> None:
            if state.stop:
                self.stopped()
                return
            self.t0 = perf_counter()
            try:
                request(self.loop, self.answered, arrays, None, model)
            except Exception as exc:  # refused at once (a full queue)
                error(exc)
                self.retry(self)

        def _answered(self, outputs: Any, exc: BaseException | None) -> None:
            dt = perf_counter() - self.t0
            if exc is not None:
                error(exc)
            elif state.measuring:
                done.append(dt)
                if len(done) >= 512:
                    with flush:
                        latency.add_many(done)
                        done.clear()
            self.send()

    def measured(elapsed_s: float) -> None:
        timing["elapsed"] = elapsed_s
        with flush:
            latency.add_many(done)
            done.clear()

    async def drive() -> None:
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        running = [concurrency]

        def stopped() -> None:
            running[0] -= 1
            if not running[0] and not finished.done():
                finished.set_result(None)

        def retry(client: Client) -> None:
            # again a millisecond later: a busy retry would keep the batcher's thread
            # from the interpreter it needs to answer with
            loop.call_later(0.001, client.send)

        for _ in range(concurrency):
            loop.call_soon(Client(loop, retry, stopped).send)
        try:
            await asyncio.sleep(warmup_s)
            state.measuring = True
            t0 = time.perf_counter()
            await asyncio.sleep(duration_s)
            state.measuring = False
            measured(time.perf_counter() - t0)
        finally:
            state.stop = True
            # every client's last request answered; those still unanswered
            # request_timeout_s later (a stuck server) are errors, and the level ends
            await asyncio.wait([finished], timeout=request_timeout_s)
            if not finished.done():
                unanswered(running[0])

    def drive_on_workers() -> None:
        """The clients as callbacks on the server's worker thread(s): an answer sends
        that client's next request where it arrives. The calling thread only starts
        them, keeps the time and re-sends requests a full queue refused."""
        finished = threading.Event()
        running = [concurrency]
        refused: list[Client] = []

        def stopped() -> None:
            with flush:
                running[0] -= 1
                if not running[0]:
                    finished.set()

        def wait(seconds: float) -> None:
            end = time.perf_counter() + seconds
            while (left := end - time.perf_counter()) > 0:
                time.sleep(min(left, 0.001 if refused else 0.05))
                for _ in range(len(refused)):  # each once a millisecond
                    refused.pop(0).send()

        for _ in range(concurrency):
            Client(None, refused.append, stopped).send()
        try:
            wait(warmup_s)
            state.measuring = True
            t0 = time.perf_counter()
            wait(duration_s)
            state.measuring = False
            measured(time.perf_counter() - t0)
        finally:
            state.stop = True
            while refused:
                refused.pop().send()  # stops it
            if not finished.wait(request_timeout_s):
                unanswered(running[0])

    unobserve = stats.observe(observe)
    try:
        if clients == "workers":
            drive_on_workers()
        else:
            # the clients are callbacks on one event loop in a thread of their own (like
            # perf_analyzer's async mode): one client thread, not one per client,
            # competes with the batcher for the interpreter, and an answer's callback
            # sends the client's next request without a task to resume
            runner = threading.Thread(target=asyncio.run, args=(drive(),),
                                      name="pyc-lab-load", daemon=True)
            runner.start()
            runner.join()
    finally:
        state.stop = True
        unobserve()
    elapsed = timing.get("elapsed", duration_s)

    def ms(sketch: QuantileSketch, q: float) -> float | None:
        v = sketch.quantile(q)
        return None if v is None else v * 1e3

    n = latency.count
    nb = sum(batch_hist.values())
    if error_text:
        log.warning("load test at concurrency %d: %d error(s), the first: %s", concurrency,
                    counts["errors"], error_text[0])
    return {
        "concurrency": concurrency, "max_batch": server.options.max_batch,
        "max_delay_ms": server.options.max_delay_ms, "requests": n,
        "errors": counts["errors"], "duration_s": elapsed,
        "throughput_rps": n / elapsed, "rows_per_s": n * rows_per_request / elapsed,
        "p50_ms": ms(latency, 0.5), "p90_ms": ms(latency, 0.9), "p95_ms": ms(latency, 0.95),
        "p99_ms": ms(latency, 0.99),
        "mean_ms": latency.total / n * 1e3 if n else None,
        "queue_mean_ms": queue.total / queue.count * 1e3 if queue.count else None,
        "queue_p99_ms": ms(queue, 0.99),
        "compute_mean_ms": compute.total / compute.count * 1e3 if compute.count else None,
        "compute_p99_ms": ms(compute, 0.99),
        "mean_batch": (sum(k * v for k, v in batch_hist.items()) / nb) if nb else None,
        "batch_hist": dict(sorted(batch_hist.items())), "clients": clients,
    }


def load_test(server: Any, concurrency: Sequence[int] = (1, 4, 16, 64), *,
              duration_s: float = 2.0, warmup_s: float = 0.25, model: str | None = None,
              inputs: Sequence[Any] | None = None, rows: int = 1,
              request_timeout_s: float = 30.0,
              on_level: Callable[[dict[str, Any]], None] | None = None,
              clients: str = "loop") -> Any:
    """Measure a server under closed-loop load at several concurrency levels.

    Parameters
    ----------
    server
        A running :class:`~pyc_lab.inference.server.Server`.
    concurrency
        Clients per level, each sending its next request when the previous one answered.
    duration_s
        Measured seconds per level.
    warmup_s
        Seconds per level before measuring (not counted).
    model
        Which model (needed when the server has several).
    inputs
        One request's inputs (default: random rows of the model's inputs, never zeros).
    rows
        Rows per request when ``inputs`` is not given.
    request_timeout_s
        How long a level waits, once its time is up, for the requests still in flight;
        each one unanswered by then counts as an error (so a stuck server ends the test
        instead of hanging it). Requests carry the server's own ``timeout_s``, as a
        user's would; a request that takes long but is answered counts with its latency
        (as perf_analyzer measures).
    on_level
        Called with each level's row as soon as it is measured (live views).
    clients
        Where the clients run (:data:`CLIENTS`): ``"loop"`` (default), callbacks on an
        event loop in a thread of their own, as asyncio callers and the HTTP endpoint
        reach the server — each batch then crosses between that thread and the
        batcher's, which take turns holding the interpreter; ``"workers"``, callbacks
        on the server's worker thread(s) (:class:`~.waiters.ThreadCallback`), as an
        in-process caller that reacts where its answer arrives (perf_analyzer's
        in-process mode): what the server sustains without a second thread.

    Returns
    -------
    pandas.DataFrame
        One row per level (columns :data:`COLUMNS`: throughput in requests/s and rows/s,
        p50/p90/p95/p99 and mean end-to-end latency, queue wait vs compute, mean batch
        size, the batch-size histogram ``{size: batches}``). ``frame.attrs["warmup_ms"]``
        holds the warm-up: bucket size -> ms of its first run.

    Raises
    ------
    InferenceError
        If the server is closed or the settings are not positive.
    """
    import pandas as pd

    if server.closed:
        raise InferenceError(f"{server.name} is closed; load-test a running server")
    levels = [int(c) for c in concurrency]
    if not levels or min(levels) < 1:
        raise InferenceError(f"concurrency must be positive numbers of clients, got "
                             f"{list(concurrency)!r}")
    if not duration_s > 0 or warmup_s < 0:
        raise InferenceError("duration_s must be > 0 and warmup_s >= 0")
    if clients not in CLIENTS:
        raise InferenceError(f"clients must be one of {CLIENTS}, got {clients!r}")
    batcher = server._batcher(model)
    arrays = list(inputs) if inputs is not None else batcher.model.example(int(rows), seed=7)
    warm = server.warm_up(model)
    out = []
    for c in levels:
        row = _level(server, model, arrays, c, float(duration_s), float(warmup_s),
                     float(request_timeout_s), clients)
        out.append(row)
        log.debug("load test %s at concurrency %d: %.1f req/s", server.name, c,
                  row["throughput_rps"])
        if on_level is not None:
            on_level(row)
    frame = pd.DataFrame(out, columns=COLUMNS)
    frame.attrs["warmup_ms"] = warm
    frame.attrs["model"] = batcher.model.name
    frame.attrs["server"] = server.name
    return frame


def sweep(model: Any, *, max_batch: Sequence[int] = (1, 8, 64),
          max_delay_ms: Sequence[float] = (0.0, 2.0), concurrency: Sequence[int] = (1, 16, 64),
          duration_s: float = 1.0, warmup_s: float = 0.2, inputs: Sequence[Any] | None = None,
          on_level: Callable[[dict[str, Any]], None] | None = None, clients: str = "loop",
          **serve_options: Any) -> Any:
    """Load-test ``model`` under every ``max_batch`` x ``max_delay_ms`` setting.

    Each setting gets its own server (closed afterwards); the frames are concatenated.

    Returns
    -------
    pandas.DataFrame
        :func:`load_test`'s columns, one row per setting and concurrency level.
        ``frame.attrs["warmup_ms"]`` maps ``(max_batch, max_delay_ms)`` to that server's
        warm-up.
    """
    import pandas as pd

    from .server import serve

    frames, warm = [], {}
    for mb in max_batch:
        for delay in max_delay_ms:
            server = serve(model, max_batch=int(mb), max_delay_ms=float(delay),
                           **serve_options)
            try:
                f = load_test(server, concurrency, duration_s=duration_s, warmup_s=warmup_s,
                              inputs=inputs, on_level=on_level, clients=clients)
            finally:
                server.close()
            warm[(int(mb), float(delay))] = f.attrs["warmup_ms"]
            frames.append(f)
    frame = pd.concat(frames, ignore_index=True)
    frame.attrs["warmup_ms"] = warm
    return frame
