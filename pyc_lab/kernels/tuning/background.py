"""A GEMM tuning in a background thread: its state, what it reported, Stop.

:class:`TuningRun` tunes one problem live on this GPU (``autotune_gemm``) or, where no
CUDA device is usable, replays a recording made on a GPU (``replay_autotune``), in a
thread, keeping every candidate the tuner reported so that a view (the notebook widget,
a progress bar) can show it while it runs. Listeners are told of every change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import PycLabError
from ...units import gemm_flops, tflops
from .options import GemmTuneOptions
from .result import ReplayInfo, TuneResult, config_name

__all__ = ["MODES", "TuningRun"]

log = logging.getLogger(__name__)

#: How a :class:`TuningRun` measures: live, replayed, or live when a GPU is usable.
MODES = ("auto", "live", "replay")


class TuningRun:
    """One GEMM problem tuned (or replayed) in a background thread.

    Parameters
    ----------
    m, n, k
        The problem: ``a`` is M x K, ``b`` K x N.
    options
        The tuning settings (:class:`~pyc_lab.kernels.tuning.options.GemmTuneOptions`;
        its defaults when omitted); ``**settings`` override single fields.
    mode
        ``"live"``: tune on this machine's GPU. ``"replay"``: replay a recording made on
        a GPU (no kernel runs). ``"auto"``: live when a CUDA device is usable, else
        replay.
    source
        The recording to replay; ``None`` for the H200 recording shipped with pyc_lab.
        Implies replay under ``mode="auto"``.
    pace_s
        Replay only: seconds per evaluated candidate (a chart can be watched filling in).

    Attributes
    ----------
    mode : str
        ``"live"`` or ``"replay"`` (``"auto"`` resolved); :attr:`fallback` says whether
        ``"auto"`` fell back to replay for want of a GPU.
    fallback_reason : str or None
        Why ``"auto"`` fell back: the device gate's reason
        (:func:`pyc_lab.hardware.device.no_gpu_reason`); ``None`` when it did not.
    result : TuneResult or None
        The last finished run's result.
    rows : list of dict
        What the tuner reported, one dict per evaluated candidate, in order.
    error : Exception or None
        Why the last run failed, if it did.
    state : str
        ``"not started"``, ``"running"``, ``"done"``, ``"stopped"`` or ``"failed"``.

    Raises
    ------
    PycLabError
        For an unknown mode, ``mode="live"`` without a usable CUDA device, or, in replay
        mode, a problem the recording does not hold (the message lists what it holds).
    """

    def __init__(self, m: int = 4096, n: int = 4096, k: int = 4096, *,
                 options: GemmTuneOptions | None = None, mode: str = "auto",
                 source: str | Path | None = None, pace_s: float = 0.1,
                 **settings: Any) -> None:
        if mode not in MODES:
            raise PycLabError(f"mode={mode!r}: use one of {MODES}")
        self.options = GemmTuneOptions.resolve(options, settings)
        self.m, self.n, self.k = m, n, k
        self.source, self.pace_s = source, pace_s
        self.requested_mode = mode
        self.mode, self.fallback = self._resolve_mode(mode, source)
        self.fallback_reason: str | None = None
        if self.fallback:
            from ...hardware.device import no_gpu_reason

            self.fallback_reason = no_gpu_reason()
        self.device_name = ""
        self.replay_info: ReplayInfo | None = None
        self.recorded_baselines: dict[str, float] = {}
        if self.mode == "replay":
            self._load_recording()
        else:
            from ...hardware.detect import detect_hardware

            gpus = detect_hardware().gpus
            self.device_name = gpus[0].name if gpus and gpus[0].name else "this GPU"
        self.result: TuneResult | None = None
        self.rows: list[dict[str, Any]] = []
        self.error: Exception | None = None
        self.state = "not started"
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[], None]] = []

    # -- set-up -----------------------------------------------------------------------
    @staticmethod
    def _resolve_mode(mode: str, source: str | Path | None) -> tuple[str, bool]:
        """The mode to use and whether "auto" fell back to replay."""
        if mode == "replay":
            return "replay", False
        if source is not None:
            if mode == "live":
                raise PycLabError("source= names a recording to replay; use mode='replay' "
                                  "(or 'auto'), or drop source= to tune live")
            return "replay", False
        from ...hardware.device import cupy_status

        cp, why = cupy_status()
        if cp is not None:
            return "live", False
        if mode == "live":
            raise PycLabError(f"mode='live' needs a CUDA device: {why}. Use mode='replay' to "
                              "replay the tuning recorded on an H200")
        return "replay", True

    def _load_recording(self) -> None:
        from .recording import recorded_result

        recorded = recorded_result(self.m, self.n, self.k, dtype=self.options.dtype,
                                   layout=self.options.layout, source=self.source)
        self.replay_info = recorded.replay
        self.recorded_baselines = dict(recorded.baselines)
        self.device_name = recorded.device.gpu_name

    def configure(self, m: int, n: int, k: int, **settings: Any) -> None:
        """Change the problem and settings before the next :meth:`start`.

        Raises
        ------
        PycLabError
            While running, for a bad setting, or (replay) a problem not recorded.
        """
        if self.running:
            raise PycLabError("cannot change the problem while tuning; press Stop first")
        options = GemmTuneOptions.resolve(self.options, settings)
        changed = (m, n, k, options.dtype, options.layout) != (
            self.m, self.n, self.k, self.options.dtype, self.options.layout)
        self.m, self.n, self.k, self.options = m, n, k, options
        if changed and self.mode == "replay":
            self._load_recording()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (from any thread) whenever the run changes."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # a view update must never break the tuning
                log.exception("a tuning-run listener failed")

    # -- running ----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the tuning thread is running."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def stop_event(self) -> threading.Event:
        """The event passed to the tuner as ``stop=`` (set by :meth:`stop`)."""
        return self._stop

    def start(self, wait: bool = True) -> TuneResult | None:
        """Tune (or replay) the current problem in a background thread.

        Parameters
        ----------
        wait
            Wait for the end and return the result (raising the run's error, if it
            failed); ``False`` returns at once, with the thread running.

        Raises
        ------
        PycLabError
            If a run is already going on, or, when waiting, the run's own error.
        """
        with self._lock:
            if self.running:
                raise PycLabError("already tuning; press Stop (or call .stop()) or wait "
                                  "for it before starting again")
            self._stop.clear()
            self.rows, self.result, self.error = [], None, None
            self.state = "running"
            self._thread = threading.Thread(target=self._work, name="pyc-lab-autotune",
                                            daemon=True)
            self._thread.start()
        self._changed()
        if not wait:
            return None
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.result

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a background run; returns whether it has finished."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.running

    def stop(self) -> None:
        """Stop the running search after the candidate being measured."""
        self._stop.set()

    def _tune(self) -> TuneResult:
        from .autotune import autotune_gemm, replay_autotune

        if self.mode == "replay":
            return replay_autotune(self.m, self.n, self.k, options=self.options,
                                   source=self.source, pace_s=self.pace_s,
                                   observer=self._observe, stop=self._stop)
        return autotune_gemm(self.m, self.n, self.k, options=self.options,
                             observer=self._observe, stop=self._stop)

    def _work(self) -> None:
        try:
            result = self._tune()
        except Exception as exc:  # shown by the view; start(wait=True) raises it
            log.debug("tuning run failed: %s", exc)
            with self._lock:
                self.error = exc
                self.state = "failed"
        else:
            with self._lock:
                self.result = result
                stopped = result.stopped_by == "observer" and self._stop.is_set()
                self.state = "stopped" if stopped else "done"
        self._changed()

    def _observe(self, row: dict[str, Any]) -> None:
        with self._lock:
            self.rows.append(dict(row))
        self._changed()

    # -- what was seen ------------------------------------------------------------------
    def candidates(self) -> list[dict[str, Any]]:
        """The latest report of each candidate, numbered (``_order``, from 1) in the order
        they first finished."""
        with self._lock:
            order: dict[str, int] = {}
            latest: dict[str, dict[str, Any]] = {}
            for row in self.rows:
                cid = row["config"]
                order.setdefault(cid, len(order) + 1)
                latest[cid] = {**row, "_order": order[cid]}
        return sorted(latest.values(), key=lambda r: r["_order"])

    def baselines(self) -> dict[str, float]:
        """Baseline times (ms) known so far: the result's, or the recording's up front."""
        if self.result is not None and self.result.baselines:
            return dict(self.result.baselines)
        return dict(self.recorded_baselines)

    def total(self) -> int:
        """How many candidates the search may evaluate (0 before the first report)."""
        with self._lock:
            return int(self.rows[-1].get("total") or 0) if self.rows else 0

    @property
    def flops(self) -> float:
        """Floating-point operations of one GEMM (2 M N K)."""
        return gemm_flops(self.m, self.n, self.k)

    def tflops(self, ms: float | None) -> float | None:
        """TFLOP/s of this problem done in ``ms`` milliseconds."""
        return tflops(self.flops, ms)

    def best(self) -> tuple[str, float] | None:
        """The winner's name and time: the result's, else the fastest correct so far."""
        if self.result is not None:
            best = self.result.best
            if best is None or best.time_ms is None:
                return None
            return config_name(best.config, best.config_id), best.time_ms
        done = [r for r in self.candidates() if r["status"] == "ok" and r.get("ms")]
        if not done:
            return None
        fastest = min(done, key=lambda r: r["ms"])
        return fastest["config"], fastest["ms"]
