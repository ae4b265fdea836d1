"""The GEMM tuner's front: ``autotune_gemm`` (live) and ``replay_autotune`` (recorded).

Both put a runner — :class:`~pyc_lab.kernels.tuning.gemm_runner.GemmRunner`, which
builds, checks and times CUTLASS candidates on this GPU, or
:class:`~pyc_lab.kernels.tuning.replay.ReplayRunner`, which looks them up in a
recording — into the shared :class:`~pyc_lab.search.session.TuningSession` with the
strategy, budget and seed of one :class:`~pyc_lab.kernels.tuning.options.GemmTuneOptions`.
A live tuning records every candidate, the baselines of the same run and the winner in
the tuning database, where :func:`pyc_lab.matmul` and the compiler find it; a replay
writes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...search import SearchResult, Trial, TuningSession
from ..cutlass.config import GemmConfig
from .database import TuningDB
from .gemm_runner import GemmRunner
from .options import GemmTuneOptions
from .recording import Recording, check_problem
from .replay import ReplayRunner
from .result import ReplayResult, TuneResult, candidate_table

__all__ = ["TuneResult", "autotune_gemm", "record_tuning", "replay_autotune", "tune_runner"]

log = logging.getLogger(__name__)

#: ``observer(row)``: one dict per finished candidate (config, status, ms, tflops,
#: error, message, build_s, build, tile, cluster, kernel_schedule, epilogue_schedule,
#: tile_scheduler, built, total).
RowObserver = Callable[[dict[str, Any]], None]


def _search(runner: GemmRunner | ReplayRunner, options: GemmTuneOptions,
            observer: RowObserver | None, stop: threading.Event | None) -> SearchResult:
    """One tuning session over ``runner`` with ``options``' strategy, budget and seed."""
    observers = []
    if observer is not None:
        def report(trial: Trial) -> None:
            observer(dict(trial.outcome.details))

        observers.append(report)
    session = TuningSession(runner, options.strategy,
                            strategy_options=options.strategy_options(len(runner.configs)),
                            budget=options.budget(), observers=observers, stop=stop,
                            seed=options.seed)
    return session.run()


def record_tuning(db: TuningDB | None, device: Any, problem: Any,
                  measurements: list[Any], best: Any) -> bool:
    """Record a tuning's measurements and, where the best one is correct, its winner
    (in the user's database when ``db`` is None); whether that worked — a database that
    cannot be written is a warning, never a lost tuning result."""
    db = db if db is not None else TuningDB()
    try:
        db.record_many(device, problem, measurements)
        if best is not None and best.ok:
            db.set_winner(device, problem, best.config_id)
    except Exception as exc:
        log.warning("could not record the tuning in %s: %s", getattr(db, "path", db), exc)
        return False
    return True


def search_best(runner: Any, options: GemmTuneOptions, observer: RowObserver | None,
                stop: threading.Event | None) -> tuple[str, Any]:
    """Search a runner whose best is the searched best (pyc_lab's own kernels, live or
    replayed): why the search stopped, and the best candidate's measurement (``None``
    without one)."""
    if not runner.configs:
        return "no candidates", None
    result = _search(runner, options, observer, stop)
    best = runner.measurement(result.best.candidate) if result.best is not None else None
    return result.stopped_by, best


def tune_runner(runner: Any, options: GemmTuneOptions, observer: RowObserver | None,
                stop: threading.Event | None, db: TuningDB | None, t_start: float
                ) -> TuneResult:
    """Search a live runner of pyc_lab's own kernels (a convolution's, the attention
    kernel's), confirm its fastest candidates against the libraries in interleaved
    rounds (unless stopped), record the run, and make its result."""
    stopped_by, best = search_best(runner, options, observer, stop)
    if best is not None and not (stop is not None and stop.is_set()):
        best = runner.confirm(options.repeats) or best
    recorded = record_tuning(db, runner.device, runner.problem, runner.measurements(), best)
    return TuneResult(runner.problem, runner.device, best, candidate_table(runner.rows.values()),
                      dict(runner.baselines), time.perf_counter() - t_start, stopped_by,
                      options.strategy, recorded)


def autotune_gemm(m: int, n: int, k: int, *, options: GemmTuneOptions | None = None,
                  restrict: Callable[[GemmConfig], bool] | None = None,
                  db: TuningDB | None = None, cache: Any = None,
                  observer: RowObserver | None = None, stop: threading.Event | None = None,
                  builds: Any = None, **settings: Any) -> TuneResult:
    """Tune a GEMM for ``m x n x k`` on this GPU and record the result.

    The CUTLASS candidates are searched; for a plain f16/bf16 ``"tn"`` problem of at most
    64 rows every configuration of pyc_lab's skinny GEMM is measured too, and for any
    plain f16/bf16 problem cuBLASLt's heuristic picks beyond its first. The libraries
    (cuBLAS, cuBLASLt, torch) are measured in the same run and recorded as
    ``"baseline"`` rows; ``result.winner`` is the fastest of all (a tuned kernel or a
    library) and ``result.speedup`` the best tuned kernel's time against the best
    library's.

    Parameters
    ----------
    m, n, k
        The problem: ``a`` is M x K, ``b`` K x N.
    options
        A :class:`~pyc_lab.kernels.tuning.options.GemmTuneOptions` (its defaults when
        omitted).
    restrict
        ``restrict(config) -> bool``: only configurations it accepts are considered.
    db, cache
        Tuning database and kernel cache (the user-cache-directory ones by default).
    observer
        Called with a dict per finished candidate (config, status, ms, tflops, error,
        message, built / total) — for progress bars and live charts.
    stop
        Set it to stop after the candidate being measured (a Stop button).
    builds
        A :class:`~pyc_lab.kernels.tuning.builds.SharedBuilds` shared with other
        problems (what :func:`~pyc_lab.kernels.tuning.many.autotune_many` passes).
    **settings
        Any field of :class:`~pyc_lab.kernels.tuning.options.GemmTuneOptions`, over
        ``options``: ``dtype``, ``layout``, ``strategy``, ``budget_s``,
        ``max_candidates``, ``repeats``, ``seed``, ``workers``, ``hang_s``, ``bias``,
        ``activation``, ``stream_k``, ``wide``, ``skinny``, ``cutlass``, ``lt_search``.

    Returns
    -------
    TuneResult
        ``.best``, ``.table``, ``.baselines``, ``.compare()``.

    Raises
    ------
    PycLabError
        No GPU, no nvcc or nvidia-cutlass, a problem no kernel here can take, every
        candidate excluded, or an unknown setting.
    """
    opts = GemmTuneOptions.resolve(options, settings)
    m, n, k = check_problem(m, n, k, "autotune_gemm")
    t_start = time.perf_counter()
    runner = GemmRunner(m, n, k, opts, restrict=restrict, cache=cache, builds=builds)
    if observer is not None:
        for row in (*runner.skinny.values(), *runner.lt_picks.values()):
            observer({**row, "built": 0, "total": len(runner.configs)})
    result = _search(runner, opts, observer, stop) if runner.configs else None
    measurements = runner.measurements()
    searched = (runner.measurement(result.best.candidate)
                if result is not None and result.best is not None else None)
    best = runner.best(searched)
    recorded = record_tuning(db, runner.device, runner.problem, measurements, best)
    return TuneResult(runner.problem, runner.device, best, candidate_table(runner.rows.values()),
                      dict(runner.baselines), time.perf_counter() - t_start,
                      result.stopped_by if result is not None else "no CUTLASS candidates",
                      opts.strategy, recorded)


def replay_autotune(m: int, n: int, k: int, *, options: GemmTuneOptions | None = None,
                    source: str | Path | None = None, pace_s: float = 0.0,
                    observer: RowObserver | None = None, stop: threading.Event | None = None,
                    **settings: Any) -> ReplayResult:
    """Run the tuner's search for ``m x n x k`` against a recorded tuning.

    The candidates are the configurations recorded for this problem, ranked by the
    cheap model and cut to ``max_candidates`` as :func:`autotune_gemm` does; the same
    strategy, with the same options, searches them under the same budget. A candidate's
    outcome is what was recorded (status, median time, message); a candidate recorded
    as ``"timeout"`` stops the search, as it did live. Nothing is built or run, and
    nothing is written to any tuning database.

    Parameters
    ----------
    m, n, k
        The problem; it must be in the recording
        (:func:`~pyc_lab.kernels.tuning.recording.recorded_problems`).
    options, **settings
        As for :func:`autotune_gemm` (``dtype``, ``layout``, ``strategy``, ``budget_s``,
        ``max_candidates``, ``repeats``, ``seed``); the budget counts the replay's own
        wall time (``pace_s`` per evaluation included). Plain GEMMs only: a recording's
        fused-epilogue tunings are not replayed.
    source
        A tuning-database export to replay; ``None`` for the shipped H200 recording.
    pace_s
        Seconds to wait per evaluation, so that a live chart can be watched filling in.
    observer, stop
        As for :func:`autotune_gemm`.

    Returns
    -------
    ReplayResult
        ``.replay`` names the recording's device, driver, date and file.

    Raises
    ------
    PycLabError
        For a problem that is not in the recording (the message lists what is), a bad
        option, or a fused epilogue.
    """
    opts = GemmTuneOptions.resolve(options, settings)
    m, n, k = check_problem(m, n, k, "replay_autotune")
    if opts.epilogue.fused:
        from ...errors import PycLabError

        raise PycLabError("replay_autotune replays plain GEMMs; tune a fused epilogue live "
                          "with autotune_gemm(..., bias=..., activation=...)")
    t_start = time.perf_counter()
    rec = Recording(source)
    recorded = rec.find(m, n, k, opts.dtype, opts.layout)
    runner = ReplayRunner(recorded, opts, pace_s=pace_s, stop=stop)
    info = recorded.info(rec.path, rec.label)
    log.info("replaying %s %s %dx%dx%d: %d of %d recorded candidates, %s (%s)", opts.dtype,
             opts.layout, m, n, k, len(runner.configs), len(recorded.candidates),
             opts.strategy, info.label)
    result = _search(runner, opts, observer, stop)
    best = runner.measurement(result.best.candidate) if result.best is not None else None
    return ReplayResult(recorded.problem, recorded.device, best,
                        candidate_table(runner.rows.values()), recorded.baseline_times(),
                        time.perf_counter() - t_start, result.stopped_by, opts.strategy,
                        False, replay=info)
