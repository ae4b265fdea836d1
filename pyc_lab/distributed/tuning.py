"""Tuning sweeps over a Dask cluster: ``pl.autotune_many(problems, client=...)``.

Without a client this is :func:`pyc_lab.kernels.tuning.many.autotune_many`, unchanged.
With one, every problem becomes one task that asks for one ``GPU`` resource, so the
scheduler runs at most one tuning per GPU at a time (two candidates are never timed on
one GPU at once) and as many at once as the workers hold GPUs. The CUTLASS candidates
are built first, as tasks that hold no GPU (:mod:`.builds`: each distinct kernel once,
on any worker with nvcc, CPU-only ones included, shipped to the measuring worker under
its content-keyed cache key). A task tunes its problem on its worker's GPU (every
candidate found built; the libraries measured in the same run) into an in-memory tuning
database, and hands back the result with every measurement; the caller merges them
into its own tuning database under the device each worker measured on. Results come
back in the order of the problems.

With ``per_candidate=True`` every candidate a worker measures is reported as it
finishes too: the task publishes it as a Dask worker event (``log_event`` on a topic of
the sweep's own) and the caller hands it to the ``observer`` on its own thread, between
the problems' reports — the GPU each problem runs on, candidate by candidate.

A worker that dies (a kernel that crashes its process, a node lost) loses its one
problem in flight: Dask runs it again on another worker (up to the scheduler's
``distributed.scheduler.allowed-failures``; a problem that keeps killing workers is
reported as not tuned, with the reason). A
problem that fails, and a cluster that goes away mid-sweep, are reported per problem;
the problems already tuned are kept. With ``replay=True`` the tasks replay the recorded
tuning instead (no GPU needed), which is how the sweep runs on a machine without one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import PycLabError
from ..kernels.tuning import many
from ..kernels.tuning.many import GemmProblem, ManyResult
from ..kernels.tuning.options import GemmTuneOptions
from .builds import install_builds, submit_builds
from .cluster import gpu_count

__all__ = ["autotune_many"]

log = logging.getLogger(__name__)


def autotune_many(problems: Iterable[Any], *, client: Any = None,
                  budget_s: float | None = None, db: Any = None,
                  options: GemmTuneOptions | None = None, replay: bool = False,
                  source: str | Path | None = None, pace_s: float = 0.0,
                  retries: int = 2, observer: Callable[[dict[str, Any]], None] | None = None,
                  per_candidate: bool = False, **settings: Any) -> ManyResult:
    """Tune a list of GEMM problems, on this GPU or over a Dask cluster.

    Parameters
    ----------
    problems
        What to tune (:func:`~pyc_lab.kernels.tuning.many.parse_problems`).
    client
        A ``distributed.Client`` (:func:`pyc_lab.cluster` makes one): the problems are
        tuned on its GPU workers, one at a time per GPU. ``None``: on this GPU, as
        :func:`pyc_lab.kernels.tuning.many.autotune_many` (whose other arguments,
        ``workers``, ``cache`` and ``stop``, pass through ``settings``).
    budget_s
        Total wall seconds (default 60 per problem). Over a cluster every problem gets
        ``budget_s * GPUs / problems``: the GPUs tune side by side.
    db
        Where the measurements are merged (the user's tuning database by default).
    options, **settings
        :class:`~pyc_lab.kernels.tuning.options.GemmTuneOptions` fields for every problem.
    replay, source
        Replay a recorded tuning (no GPU needed) instead of tuning.
    pace_s
        With ``replay``, seconds per replayed candidate (to watch a sweep fill in).
    observer
        Over a cluster, called on the caller's thread as each problem finishes (in the
        order they finish) with a dict: ``problem`` (its label), ``worker``, ``status``
        (``"tuned"`` or ``"not tuned"``), ``winner``, ``speedup``, ``seconds``,
        ``message``, ``done`` / ``total`` and ``event``: ``"problem"`` — per-GPU
        progress for a bar or a widget. An observer that raises is logged; the sweep
        goes on.
    per_candidate
        Also report every candidate as its worker finishes measuring it: dicts with
        ``event``: ``"candidate"``, ``problem``, ``worker``, ``config``, ``status``,
        ``ms``, ``tflops``, ``built`` and ``candidates`` (the problem's total so far).
        Needs an ``observer``.
    retries
        Times a problem whose tuning raised an unexpected error is run again (a worker
        that dies has its problem rescheduled by Dask itself, up to the scheduler's
        ``allowed-failures``).

    Returns
    -------
    ManyResult
        With :attr:`~pyc_lab.kernels.tuning.many.ManyResult.workers`: where each problem
        was tuned.

    Raises
    ------
    PycLabError
        For unreadable problems or options, a ``client`` that is not a
        ``distributed.Client``, or a live sweep on a cluster whose workers declare no GPU.
    """
    if per_candidate and observer is None:
        raise PycLabError("autotune_many: per_candidate=True reports candidates to an "
                          "observer; pass observer=... (a SweepProgress, say)")
    if client is None:
        if observer is not None:
            raise PycLabError("autotune_many: observer= reports a sweep over a cluster; "
                              "pass client=... (AutotuneWidget shows a local tuning live)")
        if pace_s:
            raise PycLabError("autotune_many: pace_s applies to a replay over a cluster; "
                              "pass client=...")
        return many.autotune_many(problems, budget_s=budget_s, db=db, options=options,
                                  replay=replay, source=source, **settings)
    import distributed

    if not isinstance(client, distributed.Client):
        raise PycLabError(f"autotune_many(client=...) takes a distributed.Client, got "
                          f"{type(client).__name__}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise PycLabError(f"autotune_many: retries={retries!r}; give an integer >= 0")
    opts, items, budget_s = many.resolve_sweep(problems, options, settings, budget_s)
    gpus = gpu_count(client)
    if gpus == 0 and not replay:
        raise PycLabError(
            "autotune_many: no worker of this cluster declares a GPU resource, so nothing "
            "could measure; start one with pl.cluster() on a GPU machine (one worker per "
            "GPU), or give workers resources={'GPU': 1}")
    share = budget_s * max(1, gpus) / len(items)
    resources = {"GPU": 1} if gpus else None
    started = time.perf_counter()
    result = ManyResult(items, {p: None for p in items}, budget_s=budget_s, replay=replay)
    run = uuid.uuid4().hex[:8]
    shipped: list[list[Any]] = [[] for _ in items]
    if not replay:
        shipped, result.builds_requested, result.builds_distinct = submit_builds(
            client, items, opts, resources)
    topic = f"pyc-tune-{run}" if per_candidate else None
    candidates: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
    if topic is not None:
        client.subscribe_topic(topic, lambda event: candidates.put(event[1]))
    futures = []
    for i, p in enumerate(items):
        popts = dataclasses.replace(opts, dtype=p.dtype, layout=p.layout, budget_s=share,
                                    bias=p.bias, activation=p.activation)
        futures.append(client.submit(tune_one, p, popts, replay, source, pace_s, shipped[i],
                                     topic, key=f"pyc-tune-{run}-{i}", resources=resources,
                                     retries=retries, pure=False))
    problem_of = {future.key: p for p, future in zip(items, futures, strict=True)}
    records: dict[GemmProblem, list[Any]] = {}  # the workers' measurements, to merge
    try:
        for done, future in enumerate(_finished(distributed, futures, candidates, observer),
                                      1):
            p = problem_of[future.key]
            _collect(p, future, result, records)
            if observer is not None:
                _tell(observer, p, result, done, len(items))
    finally:
        for future in futures:
            future.release()
        if topic is not None:
            time.sleep(0.2)  # the last reports travel worker -> scheduler -> here
            _drain(candidates, observer)
            try:
                client.unsubscribe_topic(topic)
            except Exception as exc:  # a client already closed
                log.debug("autotune_many: unsubscribing %s: %s", topic, exc)
    if not replay:
        _merge(result, records, db)
    result.total_seconds = time.perf_counter() - started
    return result


def _finished(distributed: Any, futures: list[Any], candidates: queue.SimpleQueue,
              observer: Callable[[dict[str, Any]], None] | None) -> Iterable[Any]:
    """The futures as they finish; between them, the candidates reported so far go to
    ``observer`` (on this thread)."""
    finished = distributed.as_completed(futures)
    while not finished.is_empty():
        batch = finished.next_batch(block=False)
        _drain(candidates, observer)
        if not batch:
            time.sleep(0.05)
        yield from batch


def _drain(candidates: queue.SimpleQueue, observer: Callable[[dict[str, Any]], None] | None) \
        -> None:
    while observer is not None:
        try:
            event = candidates.get_nowait()
        except queue.Empty:
            return
        try:
            observer(dict(event))
        except Exception as exc:
            log.warning("autotune_many: the observer raised %s: %s", type(exc).__name__, exc)


def _candidate_reporter(topic: str, problem: GemmProblem) -> Callable[[dict[str, Any]], None]:
    """An autotune observer publishing each candidate row as a worker event on ``topic``
    (plain values only: events travel through the scheduler)."""
    worker = _worker_name()

    def report(row: dict[str, Any]) -> None:
        config = row.get("config")
        event = {"event": "candidate", "problem": problem.label, "worker": worker,
                 "config": str(getattr(config, "id", config)), "status": str(row.get("status")),
                 "ms": _number(row.get("ms")), "tflops": _number(row.get("tflops")),
                 "built": _number(row.get("built")), "candidates": _number(row.get("total"))}
        try:
            from distributed import get_worker

            get_worker().log_event(topic, event)
        except Exception as exc:  # no worker (run in the caller) or a closing one
            log.debug("candidate report not sent: %s", exc)

    return report


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def tune_one(problem: GemmProblem, options: GemmTuneOptions, replay: bool,
             source: str | Path | None, pace_s: float,
             shipped: Sequence[dict[str, Any]] = (), topic: str | None = None) \
        -> dict[str, Any]:
    """One problem, tuned on the worker that runs this (its GPU): the result, every
    measurement taken (live), where it ran and how long it took. A ``PycLabError`` (a
    problem no kernel takes, one not in the recording) is an answer, not a failure to
    retry: it comes back as ``error``. ``shipped``: the builds of its candidates (see
    :mod:`.builds`), stored in this worker's kernel cache first. ``topic``: publish each
    candidate measured as a worker event there (``per_candidate``)."""
    t0 = time.perf_counter()
    if shipped:
        install_builds(shipped)
    observer = None if topic is None else _candidate_reporter(topic, problem)
    try:
        res, records = _tune(problem, options, replay, source, pace_s, observer)
    except PycLabError as exc:
        return {"error": str(exc), "worker": _worker_name(),
                "seconds": time.perf_counter() - t0}
    return {"result": res, "records": records, "worker": _worker_name(),
            "seconds": time.perf_counter() - t0}


def _tune(problem: GemmProblem, options: GemmTuneOptions, replay: bool,
          source: str | Path | None, pace_s: float,
          observer: Callable[[dict[str, Any]], None] | None = None) -> tuple[Any, list[Any]]:
    records: list[Any] = []
    if replay:
        from ..kernels.tuning.autotune import replay_autotune

        res = replay_autotune(problem.m, problem.n, problem.k, options=options,
                              source=source, pace_s=pace_s, observer=observer)
    else:
        from ..kernels.tuning.autotune import autotune_gemm
        from ..kernels.tuning.database import TuningDB

        scratch = TuningDB(":memory:")  # the caller's database gets the measurements
        res = autotune_gemm(problem.m, problem.n, problem.k, options=options, db=scratch,
                            observer=observer)
        records = scratch.measurements()
        scratch.close()
    return res, records


def _worker_name() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return "local"


def _collect(p: GemmProblem, future: Any, result: ManyResult,
             records: dict[GemmProblem, list[Any]]) -> None:
    """``p``'s outcome into ``result`` and its measurements into ``records`` (a failure
    becomes its message)."""
    try:
        out = future.result()
    except (Exception, asyncio.CancelledError) as exc:  # a worker lost past its retries,
        # the cluster gone (a cancelled future), an unexpected error raised every time
        result.messages[p] = f"{type(exc).__name__}: {exc}"
        log.warning("autotune_many: %s lost: %s: %s", p.label, type(exc).__name__, exc)
        return
    result.seconds[p] = out["seconds"]
    result.workers[p] = out["worker"]
    if "error" in out:
        result.messages[p] = out["error"]
        log.info("autotune_many: %s not tuned: %s", p.label, out["error"])
        return
    result.results[p] = out["result"]
    records[p] = out["records"]


def _tell(observer: Callable[[dict[str, Any]], None], p: GemmProblem, result: ManyResult,
          done: int, total: int) -> None:
    res = result.results.get(p)
    event = {"event": "problem", "problem": p.label, "worker": result.workers.get(p),
             "status": "tuned" if res is not None else "not tuned",
             "winner": getattr(res, "winner", None),
             "speedup": getattr(res, "speedup", None),
             "seconds": result.seconds.get(p), "message": result.messages.get(p, ""),
             "done": done, "total": total}
    try:
        observer(event)
    except Exception as exc:
        log.warning("autotune_many: the observer raised %s: %s", type(exc).__name__, exc)


def _merge(result: ManyResult, records: dict[GemmProblem, list[Any]], db: Any) -> None:
    """Every live measurement into the caller's tuning database, the winners pinned."""
    from ..kernels.tuning.database import TuningDB

    target = db if db is not None else TuningDB()
    for p, rows in records.items():
        res = result.results[p]
        if not rows:
            continue
        try:
            target.record_many(res.device, res.problem, [r.measurement for r in rows])
            winner = next((r for r in rows if r.is_winner), None)
            if winner is not None:
                target.set_winner(res.device, res.problem, winner.measurement.config_id)
            res.recorded = True
        except Exception as exc:
            res.recorded = False
            result.messages[p] = f"tuned, but not recorded in the database: {exc}"
            log.warning("autotune_many: %s not recorded: %s", p.label, exc)
