"""The replay runner: the tuner's search, measured by what a recording holds.

Nothing is built or run: a candidate's outcome is its recorded status and median time.
The candidates are the configurations recorded for the problem, ranked by the cheap
model for the recording device's SM count and cut to ``max_candidates`` exactly as the
live runner does, so the same strategy with the same options makes the same choices it
made live. A candidate recorded as ``"timeout"`` ends the search, as it did live.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from ...errors import PycLabError
from ...search import Outcome, SearchSpace, StopSearch
from ..cutlass.config import GemmConfig, rank
from .gemm_space import config_of, gemm_space
from .keys import Measurement
from .options import GemmTuneOptions
from .recording import RecordedProblem, candidate_row

__all__ = ["ReplayRunner", "check_pace", "pace"]


def check_pace(pace_s: Any, who: str) -> None:
    """``pace_s`` as a replay takes it (seconds >= 0), or a clear error naming ``who``."""
    if isinstance(pace_s, bool) or not isinstance(pace_s, (int, float)) or \
            not pace_s >= 0:
        raise PycLabError(f"{who}: pace_s={pace_s!r}; give seconds >= 0")


def pace(pace_s: float, stop: threading.Event | None) -> None:
    """Wait ``pace_s`` seconds between replayed evaluations (cut short by ``stop``)."""
    if not pace_s:
        return
    if stop is not None:
        stop.wait(pace_s)
    else:
        time.sleep(pace_s)


class ReplayRunner:
    """Measures GEMM candidates by looking them up in a recorded problem.

    Parameters
    ----------
    recorded
        One recorded problem (from :mod:`~pyc_lab.kernels.tuning.recording`).
    options
        The candidate cut (``max_candidates``); the strategy settings are the session's.
    pace_s
        Seconds to wait per evaluation, so that a live chart can be watched filling in.
    stop
        Cuts a paced wait short when set (a Stop button).
    """

    def __init__(self, recorded: RecordedProblem, options: GemmTuneOptions, *, pace_s: float = 0.0,
                 stop: threading.Event | None = None) -> None:
        check_pace(pace_s, "replay_autotune")
        self.recorded = recorded
        self.problem = recorded.problem
        self.device = recorded.device
        m, n, k = recorded.problem.shape
        sm_count = recorded.sm_count
        if sm_count is None:
            raise PycLabError(f"the recording's device {recorded.device.gpu_name!r} is not "
                              "one whose SM count pyc_lab knows (hardware.peaks.SM_COUNTS); "
                              "the ranking model needs it")
        ranked = rank(list(recorded.candidates), m, n, k, sm_count)
        if options.max_candidates is not None:
            ranked = ranked[:options.max_candidates]
        self.configs: list[GemmConfig] = ranked
        self.pace_s = float(pace_s)
        self.stop = stop
        self.rows: dict[str, dict[str, Any]] = {}
        self._measured: dict[str, Measurement] = {}
        self._hung: str | None = None

    def space(self) -> SearchSpace:
        """The recorded configurations kept, as a search space."""
        return gemm_space(self.configs)

    def evaluate(self, candidate: Mapping[str, Any], fidelity: int) -> Outcome:
        """The recorded outcome of one configuration (after ``pace_s``)."""
        if self._hung is not None:
            raise StopSearch(f"{self._hung} was recorded as hung")
        cfg = config_of(candidate)
        meas = self.recorded.candidates[cfg]
        pace(self.pace_s, self.stop)
        row = candidate_row(self.problem, cfg, meas)
        self.rows[cfg.id] = row
        self._measured[cfg.id] = meas
        if meas.status == "timeout":
            self._hung = cfg.id
        details = {**row, "built": len(self.configs), "total": len(self.configs)}
        return Outcome(meas.status, row["ms"], meas.message, details)

    def measurement(self, candidate: Mapping[str, Any]) -> Measurement | None:
        """The recorded measurement of a candidate the search evaluated."""
        return self._measured.get(config_of(candidate).id)
