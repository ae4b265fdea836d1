"""Replay: the autotuner's real search, run against a recorded tuning database.

A machine without a GPU cannot build or time a CUTLASS kernel, but it can still show
how the tuner searches. :func:`replay_autotune` takes the candidates that a tuning run
on a GPU recorded for one problem (configuration, status, median time), ranks them and
cuts them to ``max_candidates`` exactly as :func:`~pyc_lab.kernels.tuning.autotune.autotune_gemm`
does, and runs the same search strategy under the same budget — only the objective
differs: a candidate's outcome is its recorded status and time, not a new measurement.
The baselines (cuBLAS, torch) are the times recorded in the same run, when the
recording has them.

Nothing here runs a kernel, and nothing pretends to: the result is a
:class:`ReplayResult` whose ``repr``, ``compare()`` and :attr:`ReplayResult.replay`
say which device recorded it, when, and from which file.

pyc_lab ships one recording, ``pyc_lab/data/tuning/h200-gemm.json``: the tuning
database exported by the GPU lane's GEMM benchmark on an NVIDIA H200
(``benchmarks/results/h200/tuning-replay.json``). Any file written by
:meth:`TuningDB.export <pyc_lab.kernels.tuning.database.TuningDB.export>` can be replayed
instead (``source=``).

Examples
--------
>>> from pyc_lab.kernels.tuning.replay import recorded_problems, replay_autotune
>>> recorded_problems()[["gpu_name", "dtype", "m", "n", "k"]]      # doctest: +SKIP
>>> res = replay_autotune(4096, 4096, 4096, dtype="f16")            # doctest: +SKIP
>>> res.replay.label                                                # doctest: +SKIP
'recorded on NVIDIA H200, 2026-11-29'
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import PycLabError
from ...search import STRATEGIES, Budget, Outcome, StopSearch, get_strategy
from ..cutlass import gemm as cg
from .autotune import TuneResult, _config_of, _space, candidate_table, strategy_options
from .database import DeviceKey, Measurement, ProblemKey, TuningDB, TuningRecord

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["RECORDING", "ReplayInfo", "ReplayResult", "recorded_db",
           "recorded_problems", "recorded_result", "recorded_results", "recording_path",
           "refresh_recording", "replay_autotune"]

log = logging.getLogger(__name__)

#: The recording shipped with pyc_lab (under ``pyc_lab/data/tuning/``).
RECORDING = "h200-gemm.json"
#: Timing iterations the live tuner uses at full fidelity (``autotune_gemm``'s default
#: ``repeats``); the replay gives the strategies the same rungs and fidelities.
_REPEATS = 20
#: SM count the ranking model assumes for a recording (the H200 and H100 SXM have 132).
_SM_COUNT = 132


# --------------------------------------------------------------------------- sources


def recording_path(source: str | Path | None = None) -> Path:
    """The file a replay reads: ``source``, or the recording shipped with pyc_lab.

    Parameters
    ----------
    source
        The path of a tuning-database export (``.json`` or ``.csv``, as written by
        ``TuningDB.export``); ``None`` for ``pyc_lab/data/tuning/h200-gemm.json``.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    PycLabError
        If the file does not exist.
    """
    if source is None:
        path = Path(str(resources.files("pyc_lab") / "data" / "tuning" / RECORDING))
        if not path.is_file():
            raise PycLabError(f"the tuning recording shipped with pyc_lab is missing "
                              f"({path}); reinstall pyc_lab or pass source=<an export>")
        return path
    path = Path(source).expanduser()
    if not path.is_file():
        raise PycLabError(f"no tuning recording at {path}: pass the path of a file written "
                          "by TuningDB.export (.json or .csv), or source=None for the H200 "
                          "recording shipped with pyc_lab")
    return path


def _source_label(source: str | Path | None, path: Path) -> str:
    return f"{RECORDING} (shipped with pyc_lab)" if source is None else str(path)


def recorded_db(path: str | Path | None = None) -> TuningDB:
    """A private in-memory tuning database holding a recording.

    Parameters
    ----------
    path
        A tuning-database export (``.json`` or ``.csv``); ``None`` for the H200
        recording shipped with pyc_lab.

    Returns
    -------
    TuningDB
        In memory: writing to it changes neither the recording nor the user's database.

    Raises
    ------
    PycLabError
        If the file is missing or is not a tuning-database export.
    """
    file = recording_path(path)
    db = TuningDB(":memory:")
    db.import_(file)
    return db


def refresh_recording(src: str | Path, dest: str | Path | None = None) -> pd.DataFrame:
    """Check a GPU lane's tuning export and copy it over the shipped recording.

    Run from a source checkout after the GPU lane's GEMM benchmark has written
    ``benchmarks/results/h200/tuning-replay.json``; then re-execute
    ``notebooks/03_autotune_gemm.ipynb`` (its replay outputs come from the recording).

    Parameters
    ----------
    src
        The export to ship.
    dest
        Where to copy it; default the packaged ``pyc_lab/data/tuning/h200-gemm.json``.

    Returns
    -------
    pandas.DataFrame
        :func:`recorded_problems` of the new recording.

    Raises
    ------
    PycLabError
        If ``src`` is missing, unreadable or holds no GEMM problem (nothing is copied).
    """
    problems = recorded_problems(src)
    if problems.empty:
        raise PycLabError(f"{src} holds no GEMM tuning rows; not copying it")
    target = Path(dest) if dest is not None else Path(
        str(resources.files("pyc_lab") / "data" / "tuning" / RECORDING))
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(recording_path(src), target)
    log.info("tuning recording: copied %s to %s (%d problems)", src, target, len(problems))
    return problems


# --------------------------------------------------------------------------- the recording


@dataclass(frozen=True)
class ReplayInfo:
    """Where a replayed result comes from.

    Attributes
    ----------
    gpu_name, compute_capability, driver, cuda
        The device that recorded it (the tuning database's device key).
    recorded_on
        The date (UTC, ``YYYY-MM-DD``) of the latest recorded row of the problem.
    source
        The file read.
    source_label
        ``"h200-gemm.json (shipped with pyc_lab)"`` or the path given.
    run_ids
        The tuning runs the rows come from.
    """

    gpu_name: str
    compute_capability: str
    driver: str
    cuda: str
    recorded_on: str
    source: str
    source_label: str
    run_ids: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``"recorded on NVIDIA H200, 2026-11-29"``."""
        return f"recorded on {self.gpu_name}, {self.recorded_on}"

    @property
    def banner(self) -> str:
        """One sentence for a widget or a command's output."""
        return (f"replayed from a recording made on {self.gpu_name}, {self.recorded_on} "
                f"(driver {self.driver}, CUDA {self.cuda}; {self.source_label}); no kernel "
                "runs here")


@dataclass(repr=False)
class ReplayResult(TuneResult):
    """A :class:`~pyc_lab.kernels.tuning.autotune.TuneResult` replayed from a recording.

    Everything a live result has — ``best``, ``table``, ``baselines``, ``compare()`` —
    with recorded values, and :attr:`replay` saying where they were recorded.
    ``table`` has no build times (``build`` is ``"recorded"``): nothing was built.
    """

    replay: ReplayInfo | None = field(default=None)

    def compare(self) -> pd.DataFrame:
        """:meth:`TuneResult.compare` plus a ``source`` column ("recorded on ...")."""
        frame = super().compare()
        if self.replay is not None:
            frame["source"] = self.replay.label
            frame.attrs["replay"] = self.replay.banner
        return frame

    def __repr__(self) -> str:
        p = self.problem
        best = f"{_config_id(self.best)} {self.best.time_ms:.4g} ms" if self.best else "none"
        cublas = self.baselines.get("cublas")
        cublas_text = f"cublas {cublas:.4g} ms" if cublas else "no cublas time recorded"
        where = self.replay.label if self.replay else "recorded"
        return (f"ReplayResult({p.dtype_a} {p.layout} {'x'.join(map(str, p.shape))}: "
                f"best {best}, {len(self.table)} candidates, {cublas_text}; {self.strategy}, "
                f"stopped by {self.stopped_by}; {where})")


def _config_id(m: Measurement) -> str:
    """The readable config name (``256x256x64_c2x1x1_...``) of a GEMM measurement."""
    try:
        return cg.GemmConfig.from_dict(m.config).id
    except PycLabError:
        return m.config_id


@dataclass
class _Problem:
    """One recorded problem: its candidates (latest row per config) and baselines."""

    device: DeviceKey
    problem: ProblemKey
    candidates: dict[cg.GemmConfig, Measurement]
    baselines: dict[str, Measurement]
    winner: Measurement | None
    run_ids: tuple[str, ...]
    recorded_on: str

    def info(self, path: Path, label: str) -> ReplayInfo:
        d = self.device
        return ReplayInfo(d.gpu_name, d.compute_capability, d.driver, d.cuda,
                          self.recorded_on, str(path), label, self.run_ids)


class _Recording:
    """A recording read once: GEMM problems by (device, problem)."""

    def __init__(self, source: str | Path | None) -> None:
        self.path = recording_path(source)
        self.label = _source_label(source, self.path)
        with recorded_db(self.path) as db:
            records = db.measurements()
            grouped: dict[tuple[DeviceKey, ProblemKey], list[TuningRecord]] = {}
            for rec in records:
                if rec.problem.op == "gemm":
                    grouped.setdefault((rec.device, rec.problem), []).append(rec)
            self.problems = [self._problem(db, dev, prob, recs)
                             for (dev, prob), recs in grouped.items()]
        self.problems.sort(key=lambda p: (p.device.gpu_name, p.problem.dtype_a,
                                          p.problem.layout, p.problem.shape))

    @staticmethod
    def _problem(db: TuningDB, device: DeviceKey, problem: ProblemKey,
                 records: Sequence[TuningRecord]) -> _Problem:
        latest = sorted(records, key=lambda r: r.measurement.recorded_at or "")
        candidates: dict[cg.GemmConfig, Measurement] = {}
        baselines: dict[str, Measurement] = {}
        for rec in latest:  # later rows of the same config replace earlier ones
            m = rec.measurement
            if m.status == "baseline":
                name = m.config.get("baseline")
                if isinstance(name, str) and m.time_ms:
                    baselines[name] = m
                continue
            try:
                candidates[cg.GemmConfig.from_dict(m.config)] = m
            except PycLabError:
                log.debug("recording: %s is not a CUTLASS GEMM config; skipped", m.config)
        dates = [r.measurement.recorded_at or "" for r in records]
        runs = sorted({r.measurement.run_id or "" for r in records} - {""})
        return _Problem(device, problem, candidates, baselines, db.best(device, problem),
                        tuple(runs), max(dates)[:10] if dates else "unknown date")

    def find(self, m: int, n: int, k: int, dtype: str, layout: str) -> _Problem:
        matches = [p for p in self.problems if p.problem.shape == (m, n, k)
                   and p.problem.dtype_a == dtype and p.problem.layout == layout
                   and p.candidates]
        if not matches:
            raise PycLabError(
                f"no recorded tuning of GEMM {m}x{n}x{k} {dtype} {layout} in {self.label}; "
                f"recorded: {self.listing()}. Replay one of those, or tune this problem "
                "live on a GPU with pyc_lab.autotune_gemm")
        return max(matches, key=lambda p: p.recorded_on)  # the newest device's, if several

    def listing(self) -> str:
        if not self.problems:
            return "nothing (the file holds no GEMM tuning rows)"
        return ", ".join(f"{'x'.join(map(str, p.problem.shape))} {p.problem.dtype_a} "
                         f"{p.problem.layout}" for p in self.problems)


def recorded_problems(source: str | Path | None = None) -> pd.DataFrame:
    """What a recording holds: one row per GEMM problem, with its device and date.

    Only plain GEMMs (op ``"gemm"``) are listed and replayed; tunings of fused-epilogue
    GEMMs (``"gemm_bias_gelu"``, ...) in the same file are left out.

    Parameters
    ----------
    source
        A tuning-database export; ``None`` for the H200 recording shipped with pyc_lab.

    Returns
    -------
    pandas.DataFrame
        Columns ``gpu_name``, ``driver``, ``dtype``, ``layout``, ``m``, ``n``, ``k``,
        ``candidates`` (recorded configurations), ``ok`` (of those, how many ran
        correctly), ``best_ms`` and ``best_tflops`` (the recorded winner),
        ``baselines`` (libraries timed in the same run, comma-separated) and
        ``recorded_on`` (UTC date), sorted by device, dtype, layout and shape.
    """
    import pandas as pd

    rec = _Recording(source)
    rows = []
    for p in rec.problems:
        best = p.winner
        rows.append({
            "gpu_name": p.device.gpu_name, "driver": p.device.driver,
            "dtype": p.problem.dtype_a, "layout": p.problem.layout,
            "m": p.problem.m, "n": p.problem.n, "k": p.problem.k,
            "candidates": len(p.candidates),
            "ok": sum(m.ok for m in p.candidates.values()),
            "best_ms": best.time_ms if best else None,
            "best_tflops": _tflops(p.problem, best.time_ms) if best else None,
            "baselines": ", ".join(sorted(p.baselines)),
            "recorded_on": p.recorded_on,
        })
    columns = ["gpu_name", "driver", "dtype", "layout", "m", "n", "k", "candidates", "ok",
               "best_ms", "best_tflops", "baselines", "recorded_on"]
    frame = pd.DataFrame(rows, columns=columns)
    frame.attrs["source"] = rec.label
    return frame


def _tflops(problem: ProblemKey, ms: float | None) -> float | None:
    m, n, k = problem.shape
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12 if ms else None


def _row(problem: ProblemKey, cfg: cg.GemmConfig, meas: Measurement) -> dict[str, Any]:
    """A candidate-table row, as autotune_gemm's table has them."""
    ms = meas.time_ms if meas.status == "ok" else None
    return {"config": cfg.id, "status": meas.status, "ms": ms,
            "tflops": _tflops(problem, ms), "error": meas.error, "build_s": None,
            "build": "recorded", "message": (meas.message or "")[:500], **cfg.to_dict()}


def _baselines(p: _Problem) -> dict[str, float]:
    order = {"cublas": 0, "torch": 1}
    names = sorted(p.baselines, key=lambda name: (order.get(name, 2), name))
    return {name: float(p.baselines[name].time_ms) for name in names}  # type: ignore[arg-type]


def recorded_result(m: int, n: int, k: int, *, dtype: str = "bf16", layout: str = "tn",
                    source: str | Path | None = None) -> ReplayResult:
    """One recorded problem as a result (see :func:`recorded_results`), without a search.

    Raises
    ------
    PycLabError
        If the problem is not in the recording (the message lists what is).
    """
    m, n, k = _check_problem(m, n, k)
    cg._check(dtype, layout)
    rec = _Recording(source)
    return _as_result(rec.find(m, n, k, dtype, layout), rec)


def _as_result(p: _Problem, rec: _Recording) -> ReplayResult:
    rows = [_row(p.problem, cfg, m) for cfg, m in p.candidates.items()]
    return ReplayResult(p.problem, p.device, p.winner, candidate_table(rows), _baselines(p),
                        0.0, "recorded", "recorded", False,
                        replay=p.info(rec.path, rec.label))


def recorded_results(source: str | Path | None = None, *, dtype: str | None = None,
                     layout: str | None = None) -> list[ReplayResult]:
    """Every recorded problem as a result: its recorded winner, candidates and baselines.

    No search runs: ``best`` is the winner the recording's database holds (what
    ``pyc_lab.matmul`` would use on that GPU); ``strategy`` and ``stopped_by`` are
    ``"recorded"``.

    Parameters
    ----------
    source
        A tuning-database export; ``None`` for the shipped H200 recording.
    dtype, layout
        Keep only problems of this dtype / layout.

    Returns
    -------
    list of ReplayResult
        In :func:`recorded_problems` order.
    """
    rec = _Recording(source)
    return [_as_result(p, rec) for p in rec.problems
            if p.candidates and (dtype is None or p.problem.dtype_a == dtype)
            and (layout is None or p.problem.layout == layout)]


# --------------------------------------------------------------------------- the replay


def _check_problem(m: Any, n: Any, k: Any) -> tuple[int, int, int]:
    dims = []
    for name, v in (("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise PycLabError(f"replay_autotune: {name}={v!r}; give a positive whole number")
        dims.append(int(v))
    return dims[0], dims[1], dims[2]


def replay_autotune(m: int, n: int, k: int, *, dtype: str = "bf16", layout: str = "tn",
                    strategy: str = "successive_halving", budget_s: float | None = None,
                    max_candidates: int | None = 16,
                    observer: Callable[[dict[str, Any]], None] | None = None,
                    stop: threading.Event | None = None, seed: int = 0,
                    source: str | Path | None = None, pace_s: float = 0.0) -> ReplayResult:
    """Run the autotuner's search for ``m x n x k`` against a recorded tuning run.

    The candidates are the configurations recorded for this problem, ranked by the
    cheap model and cut to ``max_candidates`` as :func:`~pyc_lab.kernels.tuning.autotune.
    autotune_gemm` does; the same strategy, with the same options, searches them under
    the same budget. A candidate's outcome is what was recorded (status, median time,
    message); a candidate recorded as ``"timeout"`` stops the search, as it did live.
    Nothing is built or run, and nothing is written to any tuning database.

    Parameters
    ----------
    m, n, k
        The problem: ``a`` is M x K, ``b`` K x N. It must be in the recording
        (:func:`recorded_problems`).
    dtype, layout
        As for ``autotune_gemm`` (``"f16"``/``"bf16"``, ``"tn"``/...).
    strategy
        ``"exhaustive"``, ``"random"``, ``"successive_halving"`` or ``"evolutionary"``.
    budget_s
        Stop starting new candidates after this many seconds of the replay's own wall
        time (``pace_s`` per evaluation included; the recorded build and run times are
        not spent again). ``None``: no limit.
    max_candidates
        Consider at most this many configurations (the best-ranked); ``None``: all.
    observer
        Called with a dict per finished candidate, as ``autotune_gemm``'s observer:
        config, status, ms, tflops, error, message, build_s, build (``"recorded"``),
        tile, cluster, kernel_schedule, epilogue_schedule, tile_scheduler, built, total.
    stop
        Set it to stop after the current candidate (a Stop button).
    seed
        The strategies' random seed: the same seed replays the same search.
    source
        A tuning-database export to replay; ``None`` for the shipped H200 recording.
    pace_s
        Seconds to wait per evaluation, so that a live chart can be watched filling in.

    Returns
    -------
    ReplayResult
        ``.replay`` names the recording's device, driver, date and file.

    Raises
    ------
    PycLabError
        For a problem that is not in the recording (the message lists what is), an
        unknown dtype, layout or strategy, or a bad budget.
    """
    m, n, k = _check_problem(m, n, k)
    cg._check(dtype, layout)
    key = str(strategy).strip().lower().replace("-", "_")
    if key not in STRATEGIES:
        get_strategy(strategy)  # raises the registry's error, listing the known ones
    if max_candidates is not None and (isinstance(max_candidates, bool) or
                                       not isinstance(max_candidates, int) or
                                       max_candidates < 1):
        raise PycLabError(f"replay_autotune: max_candidates={max_candidates!r}; give a whole "
                          "number >= 1, or None for every recorded candidate")
    if isinstance(pace_s, bool) or not isinstance(pace_s, (int, float)) or not pace_s >= 0:
        raise PycLabError(f"replay_autotune: pace_s={pace_s!r}; give seconds >= 0")
    budget = Budget(max_seconds=budget_s)  # validates budget_s

    t_start = time.perf_counter()
    rec = _Recording(source)
    p = rec.find(m, n, k, dtype, layout)
    info = p.info(rec.path, rec.label)
    problem = p.problem
    ranked = cg.rank(list(p.candidates), m, n, k, _SM_COUNT)
    if max_candidates is not None:
        ranked = ranked[:max_candidates]
    log.info("replaying %s %s %dx%dx%d: %d of %d recorded candidates, %s (%s)", dtype,
             layout, m, n, k, len(ranked), len(p.candidates), key, info.label)

    rows: dict[str, dict[str, Any]] = {}
    measured: dict[str, Measurement] = {}

    def evaluate(cand: Mapping[str, Any], fidelity: int) -> Outcome:
        if stop is not None and stop.is_set():
            raise StopSearch("stopped")
        cfg = _config_of(cand)
        meas = p.candidates[cfg]
        if pace_s:
            if stop is not None:
                stop.wait(pace_s)
            else:
                time.sleep(pace_s)
        row = _row(problem, cfg, meas)
        rows[cfg.id] = row
        measured[cfg.id] = meas
        if observer is not None:
            try:
                observer({**row, "built": len(ranked), "total": len(ranked)})
            except Exception:
                log.exception("replay observer failed")
        if meas.status == "timeout":
            raise StopSearch(f"{cfg.id} was recorded as hung")
        return Outcome(meas.status, row["ms"], meas.message)

    space, _ = _space(ranked)
    search = get_strategy(key, **strategy_options(key, _REPEATS, len(ranked)))
    result = search.run(space, evaluate, budget, rng=seed)
    best = measured.get(_config_of(result.best.candidate).id) if result.best else None
    return ReplayResult(problem, p.device, best, candidate_table(rows.values()), _baselines(p),
                        time.perf_counter() - t_start, result.stopped_by, key, False,
                        replay=info)
