"""Tuning recordings: a tuning database export read back, problem by problem.

A machine without a GPU cannot build or time a CUTLASS kernel, but it can show what a
tuning on a GPU found, and replay its search (:mod:`~pyc_lab.kernels.tuning.replay`).
pyc_lab ships one recording, ``pyc_lab/data/tuning/h200-gemm.json``: the tuning database
exported by the GEMM benchmark on an NVIDIA H200 (``benchmarks/results/h200/
tuning-replay.json``; ``scripts/refresh_recording.py`` copies a new one in). Any file
written by :meth:`TuningDB.export <pyc_lab.kernels.tuning.database.TuningDB.export>` can
be read instead (``source=``). Every result says which device recorded it, when, and
from which file.

Examples
--------
>>> from pyc_lab.kernels.tuning.recording import recorded_problems, recorded_result
>>> recorded_problems()[["gpu_name", "dtype", "m", "n", "k"]]      # doctest: +SKIP
>>> recorded_result(4096, 4096, 4096, dtype="f16").replay.label     # doctest: +SKIP
'recorded on NVIDIA H200, 2026-11-29'
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import PycLabError
from ...hardware.peaks import known_sm_count
from ...paths import data_path
from ...units import gemm_flops, tflops
from ..cutlass.config import GemmConfig, check_dtype_layout
from .database import TuningDB
from .keys import DeviceKey, Measurement, ProblemKey, TuningRecord
from .options import GemmTuneOptions
from .result import ReplayInfo, ReplayResult, candidate_table

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["RECORDING", "RecordedProblem", "Recording", "candidate_row", "check_problem",
           "recorded_db", "recorded_problems", "recorded_result", "recorded_results",
           "recording_path"]

log = logging.getLogger(__name__)

#: The recording shipped with pyc_lab (under ``pyc_lab/data/tuning/``).
RECORDING = "h200-gemm.json"


def check_problem(m: Any, n: Any, k: Any, who: str) -> tuple[int, int, int]:
    """``(m, n, k)`` as positive whole numbers, or a clear error naming ``who``."""
    dims = []
    for name, v in (("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise PycLabError(f"{who}: {name}={v!r}; give a positive whole number")
        dims.append(int(v))
    return dims[0], dims[1], dims[2]


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
        path = data_path("tuning", RECORDING)
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


@dataclass
class RecordedProblem:
    """One recorded problem: its candidates (latest row per config) and baselines."""

    device: DeviceKey
    problem: ProblemKey
    candidates: dict[GemmConfig, Measurement]
    baselines: dict[str, Measurement]
    winner: Measurement | None
    run_ids: tuple[str, ...]
    recorded_on: str

    def baseline_times(self) -> dict[str, float]:
        """``name -> ms`` of the libraries timed in the recorded run, cuBLAS first."""
        order = {"cublas": 0, "torch": 1}
        names = sorted(self.baselines, key=lambda name: (order.get(name, 2), name))
        return {name: float(self.baselines[name].time_ms or 0.0) for name in names}

    @property
    def sm_count(self) -> int | None:
        """The recording device's SM count (published specifications)."""
        return known_sm_count(self.device.gpu_name)

    def info(self, path: Path, label: str) -> ReplayInfo:
        d = self.device
        return ReplayInfo(d.gpu_name, d.compute_capability, d.driver, d.cuda,
                          self.recorded_on, str(path), label, self.run_ids)


class Recording:
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
                 records: Sequence[TuningRecord]) -> RecordedProblem:
        latest = sorted(records, key=lambda r: r.measurement.recorded_at or "")
        candidates: dict[GemmConfig, Measurement] = {}
        baselines: dict[str, Measurement] = {}
        for rec in latest:  # later rows of the same config replace earlier ones
            m = rec.measurement
            if m.status == "baseline":
                name = m.config.get("baseline")
                if isinstance(name, str) and m.time_ms:
                    baselines[name] = m
                continue
            try:
                candidates[GemmConfig.from_dict(m.config)] = m
            except PycLabError:
                log.debug("recording: %s is not a CUTLASS GEMM config; skipped", m.config)
        dates = [r.measurement.recorded_at or "" for r in records]
        runs = sorted({r.measurement.run_id or "" for r in records} - {""})
        return RecordedProblem(device, problem, candidates, baselines, db.best(device, problem),
                        tuple(runs), max(dates)[:10] if dates else "unknown date")

    def find(self, m: int, n: int, k: int, dtype: str, layout: str) -> RecordedProblem:
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

    rec = Recording(source)
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
    return tflops(gemm_flops(*problem.shape), ms)


def candidate_row(problem: ProblemKey, cfg: GemmConfig, meas: Measurement) -> dict[str, Any]:
    """A candidate-table row, as autotune_gemm's table has them."""
    ms = meas.time_ms if meas.status == "ok" else None
    return {"config": cfg.id, "status": meas.status, "ms": ms,
            "tflops": _tflops(problem, ms), "error": meas.error, "build_s": None,
            "build": "recorded", "message": (meas.message or "")[:500], **cfg.to_dict()}


def recorded_result(m: int, n: int, k: int, *, dtype: str = GemmTuneOptions.dtype,
                    layout: str = GemmTuneOptions.layout,
                    source: str | Path | None = None) -> ReplayResult:
    """One recorded problem as a result (see :func:`recorded_results`), without a search.

    Raises
    ------
    PycLabError
        If the problem is not in the recording (the message lists what is).
    """
    m, n, k = check_problem(m, n, k, "recorded_result")
    check_dtype_layout(dtype, layout)
    rec = Recording(source)
    return _as_result(rec.find(m, n, k, dtype, layout), rec)


def _as_result(p: RecordedProblem, rec: Recording) -> ReplayResult:
    rows = [candidate_row(p.problem, cfg, m) for cfg, m in p.candidates.items()]
    return ReplayResult(p.problem, p.device, p.winner, candidate_table(rows), p.baseline_times(),
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
    rec = Recording(source)
    return [_as_result(p, rec) for p in rec.problems
            if p.candidates and (dtype is None or p.problem.dtype_a == dtype)
            and (layout is None or p.problem.layout == layout)]
