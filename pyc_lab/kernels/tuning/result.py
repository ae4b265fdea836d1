"""What a GEMM tuning found: the winner, every candidate, the libraries beside it.

:class:`TuneResult` is returned by a live tuning; :class:`ReplayResult` by a replay of a
recorded one, with :class:`ReplayInfo` saying which device recorded it, when, and from
which file. Both compare the winner with the baselines measured in the same run
(:meth:`TuneResult.compare`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import PycLabError
from ...hardware.peaks import peak_tflops
from ...units import gemm_flops, tflops
from ..cutlass.config import GemmConfig
from ..lt_algos import LtPick, is_lt_algo
from ..lt_tuned import FAMILY as LT_FAMILY
from ..skinny import SkinnyConfig, is_skinny
from .keys import DeviceKey, Measurement, ProblemKey

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["ReplayInfo", "ReplayResult", "TuneResult", "candidate_table", "config_name",
           "is_tuned_winner", "kernel_config_id", "kernel_family", "kernel_rates"]


def kernel_config_id(config: Mapping[str, Any]) -> str:
    """A tuned kernel's id: ``256x128x64_c2x1x1_...`` for CUTLASS, ``skinny_rt2_w8_st4_s1``
    for the skinny GEMM, ``lt66_t20_s8_k1_c2_f0_3fa2c1`` for a cuBLASLt pick.

    Raises
    ------
    PycLabError
        For a configuration of neither kind.
    """
    if is_skinny(dict(config)):
        return SkinnyConfig.from_dict(dict(config)).id
    if is_lt_algo(dict(config)):
        return LtPick.from_dict(dict(config)).id
    return GemmConfig.from_dict(dict(config)).id


def config_name(config: Mapping[str, Any], fallback: str = "") -> str:
    """:func:`kernel_config_id`, else ``fallback`` (or the measurement's config id)."""
    try:
        return kernel_config_id(config)
    except PycLabError:
        return fallback or Measurement(dict(config), "skipped").config_id


#: Prefixes of :attr:`TuneResult.winner` that name a tuned kernel (not a library).
TUNED_PREFIXES = ("cutlass:", "skinny:", f"{LT_FAMILY}:")


def is_tuned_winner(winner: str) -> bool:
    """Whether a :attr:`TuneResult.winner` names a tuned kernel rather than a library."""
    return str(winner).startswith(TUNED_PREFIXES)


def kernel_family(config: Mapping[str, Any]) -> str:
    """``"skinny"`` for pyc_lab's skinny GEMM, ``"cublaslt-tuned"`` for a cuBLASLt
    pick, else ``"cutlass"``."""
    d = dict(config)
    return "skinny" if is_skinny(d) else LT_FAMILY if is_lt_algo(d) else "cutlass"


def candidate_table(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """The candidate table as a DataFrame: correct ones by time, then the failures."""
    import pandas as pd

    table = pd.DataFrame(list(rows))
    if not table.empty:
        table = table.sort_values(["status", "ms"], key=lambda s: s.map(
            lambda v: (v != "ok") if isinstance(v, str) else v), na_position="last")
    return table.reset_index(drop=True)


def kernel_rates(flops: float, ms: float | None, peak: float | None,
                 cublas_ms: float | None) -> dict[str, float | None]:
    """TFLOP/s of one kernel's time, its % of the dense ``peak`` and its speed relative
    to cuBLAS (``cublas_ms / ms``: above 1 is faster than cuBLAS)."""
    rate = tflops(flops, ms)
    return {"tflops": rate, "pct_of_peak": 100 * rate / peak if rate and peak else None,
            "vs_cublas": cublas_ms / ms if ms and cublas_ms else None}


@dataclass
class TuneResult:
    """What a GEMM tuning found.

    Attributes
    ----------
    problem, device
        The tuning-database keys.
    best
        The winning :class:`~pyc_lab.kernels.tuning.keys.Measurement` (``None`` when no
        candidate was correct).
    table
        One row per candidate: config id, status, ms, TFLOP/s, error, build seconds,
        message (pandas DataFrame).
    baselines
        ``name -> ms`` measured in the same run (``cublas``; ``cublaslt`` and ``torch``
        where they apply).
    seconds
        Wall time of the whole tuning (builds included).
    stopped_by, strategy
        Why the search ended, and how it searched.
    recorded
        Whether the result was written to the tuning database.
    """

    problem: ProblemKey
    device: DeviceKey
    best: Measurement | None
    table: Any
    baselines: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    stopped_by: str = ""
    strategy: str = ""
    recorded: bool = False

    @property
    def flops(self) -> float:
        """Floating-point operations of one GEMM (2 M N K)."""
        return gemm_flops(*self.problem.shape)

    @property
    def best_library(self) -> tuple[str, float] | None:
        """The fastest library timed in the same run, ``(name, ms)``, or ``None``."""
        timed = [(name, ms) for name, ms in self.baselines.items() if ms]
        return min(timed, key=lambda item: item[1]) if timed else None

    @property
    def winner(self) -> str:
        """The overall winner of the run, tuned kernels and libraries together:
        ``"cutlass:<config id>"``, ``"skinny:<config id>"``, a library's name
        (``"cublas"``, ``"cublaslt"``, ``"torch"``), or ``""`` when nothing was timed. A
        tie goes to the library."""
        lib = self.best_library
        ms = self.best.time_ms if self.best is not None and self.best.ok else None
        if ms and (lib is None or ms < lib[1]):
            return (f"{kernel_family(self.best.config)}:"
                    + config_name(self.best.config, self.best.config_id))
        return lib[0] if lib else ""

    @property
    def winner_ms(self) -> float | None:
        """The winner's median milliseconds."""
        lib = self.best_library
        ms = self.best.time_ms if self.best is not None and self.best.ok else None
        times = [t for t in (ms, lib[1] if lib else None) if t]
        return min(times) if times else None

    @property
    def speedup(self) -> float | None:
        """Best library time over the best tuned kernel's time (above 1: the tuned kernel
        is faster; ``None`` without a correct candidate or a library time)."""
        lib = self.best_library
        ms = self.best.time_ms if self.best is not None and self.best.ok else None
        return lib[1] / ms if lib and ms else None

    def compare(self) -> pd.DataFrame:
        """Tuned CUTLASS against the baselines: ms, TFLOP/s, fraction of dense peak and
        speed relative to cuBLAS (pandas DataFrame)."""
        import pandas as pd

        peak = peak_tflops(self.device.gpu_name, self.problem.dtype_a)
        family = kernel_family(self.best.config) if self.best is not None else "cutlass"
        tuned = {"skinny": "tuned skinny GEMM", LT_FAMILY: "tuned cuBLASLt pick"}.get(
            family, "tuned CUTLASS")
        entries = [(tuned, self.best.time_ms if self.best else None),
                   *self.baselines.items()]
        cublas = self.baselines.get("cublas")
        return pd.DataFrame([{"kernel": name, "ms": ms,
                              **kernel_rates(self.flops, ms, peak, cublas)}
                             for name, ms in entries])

    def _best_text(self) -> str:
        if self.best is None:
            return "none"
        return f"{config_name(self.best.config, self.best.config_id)} {self.best.time_ms:.4g} ms"

    def __repr__(self) -> str:
        cublas = self.baselines.get("cublas")
        base = f"cublas {cublas:.4g} ms" if cublas else "no cuBLAS baseline"
        op = "" if self.problem.op == "gemm" else f" {self.problem.op}"
        return (f"TuneResult({self.problem.dtype_a} {self.problem.layout}{op} "
                f"{'x'.join(map(str, self.problem.shape))}: best {self._best_text()}, "
                f"{len(self.table)} candidates, {base})")


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
    """A :class:`TuneResult` replayed from a recording.

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
        name = "cublas" if "cublas" in self.baselines or not self.baselines \
            else next(iter(self.baselines))
        base = self.baselines.get(name)
        base_text = f"{name} {base:.4g} ms" if base else f"no {name} time recorded"
        where = self.replay.label if self.replay else "recorded"
        return (f"ReplayResult({p.dtype_a} {p.layout} {'x'.join(map(str, p.shape))}: "
                f"best {self._best_text()}, {len(self.table)} candidates, {base_text}; "
                f"{self.strategy}, stopped by {self.stopped_by}; {where})")
