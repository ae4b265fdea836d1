"""Replaying a convolution tuning recorded on a GPU, on a machine without one.

pyc_lab ships ``pyc_lab/data/tuning/h200-conv.json``: for each ResNet-50 layer and dtype
that ``benchmarks/bench_conv_cutlass.py`` tuned on an NVIDIA H200, every CUTLASS
candidate's outcome (status, median time, error against float32) and cuDNN's time from
the same run (``scripts/refresh_conv_recording.py`` makes it from a run's JSON).
:func:`replay_autotune_conv` runs :func:`~pyc_lab.kernels.tuning.conv_tune.autotune_conv`'s
search over a recorded layer — the same strategy, options, observers and result type —
with each candidate's outcome read from the recording instead of built and timed.
Nothing is built or run, and nothing is written to any tuning database.

Examples
--------
>>> import pyc_lab as pl
>>> from pyc_lab.kernels.tuning.conv_replay import recorded_conv_layers
>>> recorded_conv_layers()[["layer", "dtype", "candidates"]]          # doctest: +SKIP
>>> res = pl.replay_autotune_conv("resnet50 256->256 14x14 3x3 s1", dtype="bf16")
>>> res.table, res.baselines, res.replay.banner                      # doctest: +SKIP
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import PycLabError
from ...paths import data_path
from ...search import Outcome, StopSearch
from ..conv_cutlass import conv_problem_key
from ..cutlass.conv import ConvConfig, ConvKernel
from .autotune import search_best
from .conv_tune import CONV_DEFAULTS, conv_geometry_of
from .kernel_rows import CandidateRows
from .keys import DeviceKey
from .options import GemmTuneOptions
from .replay import check_pace, pace
from .result import ReplayInfo, ReplayResult, candidate_table

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["CONV_RECORDING", "RecordedLayer", "recorded_conv_layers", "replay_autotune_conv"]

#: The convolution recording shipped with pyc_lab (under ``pyc_lab/data/tuning/``).
CONV_RECORDING = "h200-conv.json"


@dataclass(frozen=True)
class RecordedLayer:
    """One recorded convolution tuning: the problem, its candidates and cuDNN's time."""

    layer: str
    dtype: str
    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    stride: int
    padding: int
    cudnn_ms: float
    candidates: tuple[dict[str, Any], ...]


def _read(source: str | Path | None) -> tuple[dict[str, Any], Path, str]:
    path = data_path("tuning", CONV_RECORDING) if source is None else \
        Path(source).expanduser()
    label = f"{CONV_RECORDING} (shipped with pyc_lab)" if source is None else str(path)
    if not path.is_file():
        raise PycLabError(f"no convolution tuning recording at {path}: pass the path of a "
                          "file written by scripts/refresh_conv_recording.py, or "
                          "source=None for the H200 recording shipped with pyc_lab")
    try:
        data = json.loads(path.read_text())
        layers = [RecordedLayer(d["layer"], d["dtype"], tuple(d["x_shape"]),
                                tuple(d["w_shape"]), int(d["stride"]), int(d["padding"]),
                                float(d["cudnn_ms"]), tuple(d["candidates"]))
                  for d in data["layers"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PycLabError(f"{path} is not a convolution tuning recording ({exc}); make one "
                          "with scripts/refresh_conv_recording.py") from exc
    return {**data, "layers": layers}, path, label


def recorded_conv_layers(source: str | Path | None = None) -> pd.DataFrame:
    """The layers a convolution recording holds, one row per (layer, dtype).

    Parameters
    ----------
    source
        A recording's path; ``None`` for the H200 recording shipped with pyc_lab.

    Returns
    -------
    pandas.DataFrame
        ``layer``, ``dtype``, ``x_shape``, ``w_shape``, ``stride``, ``padding``,
        ``candidates`` (how many were recorded), ``cudnn_ms``, ``best_ms`` (the fastest
        correct candidate) and ``device``.
    """
    import pandas as pd

    data, _, _ = _read(source)
    rows = []
    for lay in data["layers"]:
        ok = [c["ms"] for c in lay.candidates if c["status"] == "ok" and c["ms"]]
        rows.append({"layer": lay.layer, "dtype": lay.dtype, "x_shape": lay.x_shape,
                     "w_shape": lay.w_shape, "stride": lay.stride, "padding": lay.padding,
                     "candidates": len(lay.candidates), "cudnn_ms": lay.cudnn_ms,
                     "best_ms": min(ok) if ok else None, "device": data["device"]})
    return pd.DataFrame(rows)


class ConvReplayRunner(CandidateRows):
    """Measures convolution candidates by reading them from a recorded layer.

    The candidates are the recorded configurations in the order they were tuned (the
    live runner's rank order), cut to ``max_candidates``.
    """

    config_type = ConvConfig

    def __init__(self, recorded: RecordedLayer, device: DeviceKey,
                 options: GemmTuneOptions, *, pace_s: float = 0.0,
                 stop: threading.Event | None = None) -> None:
        check_pace(pace_s, "replay_autotune_conv")
        geometry = conv_geometry_of(recorded.x_shape, recorded.w_shape,
                                    stride=recorded.stride, padding=recorded.padding)
        kernel = ConvKernel(recorded.dtype, geometry.spatial)
        self.problem = conv_problem_key(geometry, kernel)
        self.device = device
        self.flops = geometry.flops
        self.recorded = {ConvConfig.from_dict(c): c for c in recorded.candidates}
        configs = list(self.recorded)
        if options.max_candidates is not None:
            configs = configs[:options.max_candidates]
        self.configs = configs
        self.baselines = {"cudnn": recorded.cudnn_ms}
        self._builds, self._futures, self._deadline, self._hung = {}, {}, None, None
        self.pace_s = float(pace_s)
        self.stop = stop
        self._init_rows()

    def evaluate(self, candidate: Mapping[str, Any], fidelity: int) -> Outcome:
        """The recorded outcome of one configuration (after ``pace_s``)."""
        if self._hung is not None:
            raise StopSearch(f"{self._hung} was recorded as hung")
        cfg = ConvConfig.from_dict(dict(candidate))
        rec = self.recorded[cfg]
        pace(self.pace_s, self.stop)
        if rec["status"] == "timeout":
            self._hung = cfg.id
        return self._finish(cfg, rec["status"], rec.get("ms"), rec.get("error"),
                            rec.get("message") or "")


def replay_autotune_conv(layer: str, *, dtype: str = "f16",
                         options: GemmTuneOptions | None = None,
                         source: str | Path | None = None, pace_s: float = 0.0,
                         observer: Callable[[dict[str, Any]], None] | None = None,
                         stop: threading.Event | None = None,
                         **settings: Any) -> ReplayResult:
    """Run :func:`~pyc_lab.kernels.tuning.conv_tune.autotune_conv`'s search for a
    recorded layer against its recording.

    Parameters
    ----------
    layer
        A recorded layer's name, as :func:`recorded_conv_layers` lists it (e.g.
        ``"resnet50 256->256 14x14 3x3 s1"``).
    dtype
        ``"f16"``, ``"bf16"`` (or ``"tf32"``): which recorded tuning of the layer.
    options, **settings
        As for ``autotune_conv`` (``strategy``, default ``"exhaustive"``;
        ``max_candidates``; ``budget_s``; ``seed``); nothing is built or timed.
    source
        A recording's path; ``None`` for the H200 recording shipped with pyc_lab.
    pace_s
        Seconds to wait per evaluation, so that a live chart can be watched filling in.
    observer, stop
        As for ``autotune_conv``.

    Returns
    -------
    ReplayResult
        ``.best``, ``.table``, ``.baselines`` (``{"cudnn": ms}`` of the recorded run),
        ``.speedup`` against cuDNN, and ``.replay`` naming the device, driver, date and
        file.

    Raises
    ------
    PycLabError
        A layer and dtype that are not in the recording (the message lists what is), an
        unreadable recording, or a bad setting.
    """
    t_start = time.perf_counter()
    merged = {**{k: v for k, v in CONV_DEFAULTS.items() if options is None}, **settings,
              "dtype": dtype}
    opts = GemmTuneOptions.resolve(options, merged)
    data, path, label = _read(source)
    found = [lay for lay in data["layers"] if lay.layer == layer and lay.dtype == opts.dtype]
    if not found:
        have = sorted({f"{lay.layer} ({lay.dtype})" for lay in data["layers"]})
        raise PycLabError(f"replay_autotune_conv: {layer!r} in {opts.dtype} is not in "
                          f"{label}; it holds: {', '.join(have)}")
    device = DeviceKey(data["device"], str(data.get("compute_capability", "9.0")),
                       data["driver"], data["cuda"])
    runner = ConvReplayRunner(found[0], device, opts, pace_s=pace_s, stop=stop)
    stopped_by, best = search_best(runner, opts, observer, stop)
    info = ReplayInfo(device.gpu_name, device.compute_capability, device.driver,
                      device.cuda, str(data["date"])[:10], str(path), label,
                      (str(data.get("git_sha", "")),))
    return ReplayResult(runner.problem, device, best, candidate_table(runner.rows.values()),
                        dict(runner.baselines), time.perf_counter() - t_start, stopped_by,
                        opts.strategy, False, replay=info)
