"""Tuning-database keys and rows: which device, which problem, what was measured.

A result tuned on one device never answers for another: a :class:`DeviceKey` (GPU name,
compute capability, driver and CUDA versions) and a :class:`ProblemKey` (op, dtypes,
layout, M, N, K) key every :class:`Measurement`. :class:`LookupResult` is what a lookup
found (exact, or the nearest tuned problem of the same family within a factor of 2 in
each dimension).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import operator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from ...errors import PycLabError

if TYPE_CHECKING:  # pragma: no cover
    from ...hardware.profile import HardwareProfile

__all__ = [
    "COLUMNS",
    "MAX_EXTENT",
    "STATUSES",
    "DeviceKey",
    "LookupResult",
    "Measurement",
    "ProblemKey",
    "TuningDBError",
    "TuningDBWarning",
    "TuningRecord",
    "device_key",
]

#: The statuses a measurement may have; only ``"ok"`` can win.
#: ``"baseline"`` rows hold a library's time for the same problem in the same run (config
#: ``{"baseline": "cublas"}``); like every status but ``"ok"``, they never win.
STATUSES = ("ok", "compile_error", "wrong_result", "nan", "timeout", "skipped", "baseline")

_DEVICE_COLS = ("gpu_name", "compute_capability", "driver", "cuda")
_PROBLEM_COLS = ("op", "dtype_a", "dtype_b", "dtype_c", "layout", "m", "n", "k")
_KEY_COLS = _DEVICE_COLS + _PROBLEM_COLS
_FAMILY_COLS = _DEVICE_COLS + _PROBLEM_COLS[:5]  # the key without (m, n, k)
_VALUE_COLS = ("config_id", "config", "status", "time_ms", "tflops", "error", "message",
               "run_id", "recorded_at")

#: Columns of :meth:`TuningDB.to_frame` and of exported files, in order.
COLUMNS = (*_KEY_COLS, *_VALUE_COLS, "is_winner", "winner_source")


class TuningDBError(PycLabError):
    """The tuning database was used wrongly: a bad key, measurement, file or a closed DB."""


class TuningDBWarning(UserWarning):
    """The tuning database file was damaged or unknown, was set aside and rebuilt."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def _name_of(value: Any, what: str) -> str:
    """A dtype/op/layout given as a string, a NumPy dtype or a type, as its name."""
    if isinstance(value, str):
        name = value
    elif isinstance(getattr(value, "name", None), str):
        name = value.name
    elif isinstance(getattr(value, "__name__", None), str):
        name = value.__name__
    else:
        raise TuningDBError(f"{what} must be a string (or a dtype), got {value!r}")
    if not name:
        raise TuningDBError(f"{what} must not be empty")
    return name


def _json_default(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # NumPy scalars
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _canonical_json(config: Any) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False,
                      default=_json_default)


#: The largest extent SQLite stores exactly (an INTEGER is signed 64-bit).
MAX_EXTENT = 2**63 - 1


def _opt_float(value: Any, what: str) -> float | None:
    """``None`` for missing or non-finite values (SQLite cannot store NaN), else a float."""
    if value is None or (isinstance(value, str) and value == ""):
        return None
    if isinstance(value, bool):
        raise TuningDBError(f"{what} must be a number or None, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        raise TuningDBError(f"{what} must be a number or None, got {value!r:.80}") from None
    return f if math.isfinite(f) else None


@dataclass(frozen=True)
class DeviceKey:
    """The device part of a key: a result tuned on one device never answers for another.

    Parameters
    ----------
    gpu_name
        The GPU's marketing name, e.g. ``"NVIDIA H200"``.
    compute_capability
        ``"major.minor"``, e.g. ``"9.0"``.
    driver
        The NVIDIA driver version, e.g. ``"580.159.04"``.
    cuda
        The CUDA version the driver supports, e.g. ``"13.0"``.
    """

    gpu_name: str
    compute_capability: str
    driver: str
    cuda: str

    def __post_init__(self) -> None:
        for name in _DEVICE_COLS:
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise TuningDBError(f"DeviceKey.{name} must be a non-empty string, "
                                    f"got {value!r}")

    @classmethod
    def from_profile(cls, profile: HardwareProfile, index: int = 0) -> DeviceKey:
        """The key of GPU ``index`` of a :class:`~pyc_lab.runtime.HardwareProfile`.

        Values the profile does not know become ``"unknown"``.

        Parameters
        ----------
        profile
            From :func:`pyc_lab.detect_hardware` (live or a snapshot).
        index
            The GPU's CUDA ordinal (``GPUInfo.index``).

        Raises
        ------
        TuningDBError
            If the profile has no GPU with that index.
        """
        gpu = next((g for g in profile.gpus if g.index == index), None)
        if gpu is None:
            have = [g.index for g in profile.gpus]
            raise TuningDBError(f"the hardware profile has no GPU {index} (it has {have}); "
                                "pass the index of one of its GPUs")
        return cls(
            gpu_name=gpu.name or "unknown",
            compute_capability=gpu.compute_capability or "unknown",
            driver=profile.driver_version or "unknown",
            cuda=profile.cuda_driver_version or "unknown",
        )


@dataclass(frozen=True)
class ProblemKey:
    """The problem part of a key: what is computed, in which types and layout, at what size.

    Parameters
    ----------
    op
        The operation, e.g. ``"gemm"``.
    dtype_a, dtype_b, dtype_c
        Element types of the operands and the output, e.g. ``"f16"``, ``"f16"``, ``"f32"``
        (NumPy dtypes are accepted and stored by name).
    layout
        Operand layouts, e.g. ``"tn"`` (A transposed, B not).
    m, n, k
        The problem size; positive integers.
    """

    op: str
    dtype_a: str
    dtype_b: str
    dtype_c: str
    layout: str
    m: int
    n: int
    k: int

    def __post_init__(self) -> None:
        for name in _PROBLEM_COLS[:5]:
            object.__setattr__(self, name, _name_of(getattr(self, name), f"ProblemKey.{name}"))
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            try:
                if isinstance(value, bool):
                    raise TypeError
                size = operator.index(value)
            except TypeError:
                raise TuningDBError(f"ProblemKey.{name} must be an integer, got {value!r}") \
                    from None
            if size <= 0:
                raise TuningDBError(f"ProblemKey.{name} must be positive, got {size}")
            if size > MAX_EXTENT:
                raise TuningDBError(f"ProblemKey.{name} must be below 2**63 (what the "
                                    f"database stores), got {size}")
            object.__setattr__(self, name, size)

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(m, n, k)``."""
        return (self.m, self.n, self.k)


@dataclass
class Measurement:
    """One measured (or failed) candidate kernel for one problem on one device.

    Parameters
    ----------
    config
        JSON-able dict identifying the kernel (tile shape, cluster, schedule, ...). It is
        normalised through JSON (tuples become lists), so what comes back from the
        database equals what is stored.
    status
        One of :data:`STATUSES`; only ``"ok"`` measurements can win.
    time_ms
        Median time per call in milliseconds; required for ``"ok"``.
    tflops
        Achieved TFLOP/s.
    error
        Maximum error against the reference.
    message
        Why it failed (compiler output, mismatch summary), or a note.
    run_id, recorded_at
        Filled in by the database: the tuning run that recorded it and when (ISO UTC).
        They take no part in equality.

    Notes
    -----
    Non-finite numbers (NaN, inf) are stored as ``None``: SQLite has no NaN.
    """

    config: dict
    status: str
    time_ms: float | None = None
    tflops: float | None = None
    error: float | None = None
    message: str = ""
    run_id: str | None = field(default=None, compare=False)
    recorded_at: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.config, dict):
            raise TuningDBError(f"Measurement.config must be a dict, got "
                                f"{type(self.config).__name__}")
        try:
            self.config = json.loads(_canonical_json(self.config))
        except RecursionError:
            raise TuningDBError("Measurement.config is nested too deeply") from None
        except (TypeError, ValueError) as exc:
            raise TuningDBError(f"Measurement.config must be JSON-able: {exc}") from None
        if self.status not in STATUSES:
            raise TuningDBError(f"Measurement.status must be one of {STATUSES}, "
                                f"got {self.status!r}")
        self.time_ms = _opt_float(self.time_ms, "time_ms")
        self.tflops = _opt_float(self.tflops, "tflops")
        self.error = _opt_float(self.error, "error")
        if self.status == "ok" and (self.time_ms is None or self.time_ms <= 0):
            raise TuningDBError("a measurement with status 'ok' needs a positive, finite "
                                f"time_ms, got {self.time_ms!r}")
        self.message = "" if self.message is None else str(self.message)

    @property
    def config_id(self) -> str:
        """A stable id of the config: SHA-256 of its sorted-keys JSON, first 16 hex digits."""
        return hashlib.sha256(_canonical_json(self.config).encode()).hexdigest()[:16]

    @property
    def ok(self) -> bool:
        """Whether the candidate ran and was correct."""
        return self.status == "ok"


@dataclass(frozen=True)
class LookupResult:
    """What :meth:`TuningDB.lookup` found.

    Attributes
    ----------
    measurement
        The winning measurement of ``problem_matched``.
    problem_matched
        The tuned problem it comes from: the one asked for, or the nearest in its bucket.
    match
        ``"exact"`` or ``"bucket"``.
    distance
        Euclidean distance of ``log2(m, n, k)`` between the asked and the matched problem
        (0.0 for an exact match; at most ``sqrt(3)`` within a bucket).
    """

    measurement: Measurement
    problem_matched: ProblemKey
    match: Literal["exact", "bucket"]
    distance: float


@dataclass(frozen=True)
class TuningRecord:
    """One stored row: device, problem, measurement and whether it is the winner."""

    device: DeviceKey
    problem: ProblemKey
    measurement: Measurement
    is_winner: bool = False


def _log_distance(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    return math.sqrt(sum(math.log2(x / y) ** 2 for x, y in zip(a, b, strict=True)))


def _in_bucket(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    """Each dimension within a factor of 2 (inclusive)."""
    return all(abs(math.log2(x / y)) <= 1.0 + 1e-12 for x, y in zip(a, b, strict=True))


def _key_values(device: DeviceKey, problem: ProblemKey) -> tuple:
    if not isinstance(device, DeviceKey):
        raise TuningDBError(f"expected a DeviceKey, got {type(device).__name__}")
    if not isinstance(problem, ProblemKey):
        raise TuningDBError(f"expected a ProblemKey, got {type(problem).__name__}")
    return (device.gpu_name, device.compute_capability, device.driver, device.cuda,
            problem.op, problem.dtype_a, problem.dtype_b, problem.dtype_c, problem.layout,
            problem.m, problem.n, problem.k)


@lru_cache(maxsize=8)
def device_key(index: int = 0) -> tuple[DeviceKey, int, int]:
    """This machine's GPU ``index``: its tuning-database key, its compute capability as
    an int (90) and its SM count (detected once per process).

    Raises
    ------
    PycLabError
        Without that GPU, or when its SM count cannot be read.
    """
    from ...hardware.detect import detect_hardware

    hw = detect_hardware()
    gpu = next((g for g in hw.gpus if g.index == index), None)
    if gpu is None:
        raise PycLabError(f"no GPU {index} on this machine: tuning and tuned kernels need a "
                          "CUDA device")
    cc = int(str(gpu.compute_capability).replace(".", "") or 0)
    sm_count = gpu.sm_count
    if not sm_count:
        from ...hardware.device import require_cupy

        cp = require_cupy("reading the GPU's SM count")
        sm_count = cp.cuda.Device(index).attributes["MultiProcessorCount"]
    return DeviceKey.from_profile(hw, index), cc, int(sm_count)
