"""Synthetic tuning recordings (tuning-database exports) for the replay tests.

The shipped H200 recording has only correct candidates and (so far) no baseline rows;
these recordings have failures of every kind, cuBLAS and torch baselines, more
candidates than ``max_candidates`` and, optionally, a candidate recorded as hung.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from pyc_lab.kernels.cutlass import GemmConfig
from pyc_lab.kernels.tuning.database import DeviceKey, Measurement, ProblemKey, TuningDB

DEVICE = DeviceKey("NVIDIA H200", "9.0", "580.159.04", "13.0")
SHAPE = (2048, 2048, 2048)
FLOPS = 2.0 * 2048 ** 3
CUBLAS_MS = 0.0300
TORCH_MS = 0.0310

_TILES = [(128, 128, 64), (128, 256, 64), (256, 128, 64), (256, 256, 64)]
_CLUSTERS = [(1, 1, 1), (2, 1, 1), (1, 2, 1)]
_SCHEDULES = [("TmaWarpSpecializedCooperative", "TmaWarpSpecializedCooperative"),
              ("TmaWarpSpecializedPingpong", "TmaWarpSpecialized")]
FAILURES = {2: ("compile_error", "ptxas error: too much shared data"),
            7: ("wrong_result", "max error 0.41 > 0.005 vs cuBLAS"),
            11: ("nan", "NaN or Inf in the output")}


@dataclass
class Recording:
    """What a synthetic recording holds, for the tests to check against."""

    path: Path
    configs: list[GemmConfig]
    times: dict[GemmConfig, float] = field(default_factory=dict)
    failures: dict[GemmConfig, tuple[str, str]] = field(default_factory=dict)
    hung: GemmConfig | None = None

    @property
    def fastest_ms(self) -> float:
        return min(self.times.values())


def configs() -> list[GemmConfig]:
    """24 distinct configurations (4 tiles x 3 clusters x 2 schedules)."""
    return [GemmConfig(t, c, ks, es, "Default")
            for t, c, (ks, es) in itertools.product(_TILES, _CLUSTERS, _SCHEDULES)]


def write_recording(path: Path, *, hung: bool = False, baselines: bool = True,
                    date: str = "2026-11-30") -> Recording:
    """Write a tuning-database export of f16 tn 2048^3 to ``path``, with a bf16 problem and
    a fused-epilogue (``gemm_bias_gelu``) one beside it."""
    cfgs = configs()
    rec = Recording(path, cfgs)
    measurements = []
    for i, cfg in enumerate(cfgs):
        if i in FAILURES:
            status, message = FAILURES[i]
            rec.failures[cfg] = (status, message)
            measurements.append(Measurement(cfg.to_dict(), status,
                                            error=0.41 if status == "wrong_result" else None,
                                            message=message))
        elif hung and i == 5:
            rec.hung = cfg
            measurements.append(Measurement(cfg.to_dict(), "timeout",
                                            message="still running after 20 s"))
        else:
            ms = 0.0320 + 0.0011 * ((i * 7) % 24)  # distinct, scattered over the rank order
            rec.times[cfg] = ms
            measurements.append(Measurement(cfg.to_dict(), "ok", ms, FLOPS / ms / 1e9,
                                            error=1e-4))
    if baselines:
        measurements += [
            Measurement({"baseline": "cublas"}, "baseline", CUBLAS_MS, FLOPS / CUBLAS_MS / 1e9),
            Measurement({"baseline": "torch"}, "baseline", TORCH_MS, FLOPS / TORCH_MS / 1e9)]
    with TuningDB(":memory:") as db:
        db.record_many(DEVICE, ProblemKey("gemm", "f16", "f16", "f16", "tn", *SHAPE),
                       measurements, run_id="synthetic-run")
        bf16 = ProblemKey("gemm", "bf16", "bf16", "bf16", "tn", 1024, 1024, 1024)
        db.record_many(DEVICE, bf16, [Measurement(cfgs[0].to_dict(), "ok", 0.01, 214.7)],
                       run_id="synthetic-run")
        fused = ProblemKey("gemm_bias_gelu", "f16", "f16", "f16", "tn", *SHAPE)
        db.record_many(DEVICE, fused, [
            Measurement(cfgs[1].to_dict(), "ok", 0.05, FLOPS / 0.05 / 1e9),
            Measurement({"baseline": "cublaslt"}, "baseline", 0.04, FLOPS / 0.04 / 1e9)],
            run_id="synthetic-run")
        db.export(path)
    # the export stamps rows with today's date; give them a fixed one
    text = path.read_text()
    text = re.sub(r'"recorded_at": "\d{4}-\d\d-\d\d', f'"recorded_at": "{date}', text)
    path.write_text(text)
    return rec
