"""CUTLASS GEMM configurations: what ``cutlass_cppgen`` offers, pruned and ranked for a problem.

:func:`configurations` enumerates every kernel configuration ``cutlass_cppgen`` offers
for a dtype and layout on a compute capability (its ``tile_descriptions()``: CTA tile,
cluster shape, kernel schedule, epilogue schedule, tile scheduler), without a GPU
(:func:`~pyc_lab.kernels.cutlass.compat.prepare_offline`). :func:`prune` drops what
cannot work for a problem (alignment, CTA tiles far larger than the output, the
Cooperative-schedule/small-tile combination that trips a static assert);
:func:`rank` orders the rest by a cheap model (wave quantisation on the GPU's SMs, tile
arithmetic intensity, schedule). :class:`Epilogue` says what a kernel does after the
product (bias, activation).

Layouts use BLAS letters: ``t`` is row-major (the operand as stored is the matrix), ``n``
column-major; ``"tn"`` is ``A`` (M x K) row-major times ``B`` stored as an N x K
row-major array (a linear layer's weight). The output is row-major M x N; accumulation
is float32.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ...errors import DeviceUnavailableError, PycLabError

__all__ = ["ACTIVATIONS", "ALIGNMENTS", "DECOMPOSITIONS", "DTYPES", "LAYOUTS", "RASTERS",
           "Epilogue", "GemmConfig", "check_dtype_layout", "config_issue",
           "configurations", "live_configurations", "problem_alignment", "problem_issue",
           "prune", "rank", "score", "swapped_layout"]

log = logging.getLogger(__name__)

#: pyc_lab dtype names -> the operands' NumPy dtype. ``f16``/``bf16``: tensor cores with
#: float32 accumulation; ``tf32``: float32 operands on tensor cores in TF32 (10-bit
#: mantissa); ``f32``: float32 on the CUDA cores (SIMT, exact float32 arithmetic).
DTYPES = {"f16": "float16", "bf16": "bfloat16", "tf32": "float32", "f32": "float32"}
#: Layout letters (A then B).
LAYOUTS = ("tn", "tt", "nt", "nn")
#: Elements per access each dtype's kernels assume (16 bytes; the SIMT kernel: 1).
ALIGNMENTS = {"f16": 8, "bf16": 8, "tf32": 4, "f32": 1}
#: Activations a fused epilogue can apply, and CUTLASS's functor for each (gelu is the
#: tanh approximation, as in :func:`pyc_lab.compiler.functions.gelu` and cuBLASLt).
ACTIVATIONS = {"relu": "cutlass::epilogue::thread::ReLu",
               "gelu": "cutlass::epilogue::thread::GELU_taylor",
               "silu": "cutlass::epilogue::thread::SiLu"}
_CXX_TYPES = {"f16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t", "tf32": "float",
              "f32": "float"}
_TMA_EPILOGUES = ("TmaWarpSpecialized", "TmaWarpSpecializedCooperative")


@dataclass(frozen=True)
class Epilogue:
    """What a kernel does after the product: ``act(alpha * a @ b + beta * c + bias)``.

    ``bias`` is a row vector of length N (one value per output column, as a linear
    layer's); ``activation`` one of :data:`ACTIVATIONS` or None. The plain epilogue
    (no bias, no activation) is ``Epilogue()``. Fused ones use CUTLASS's epilogue fusion
    (``LinCombPerColBiasEltAct`` and relatives) and need a TMA epilogue schedule.
    """

    bias: bool = False
    activation: str | None = None

    def __post_init__(self) -> None:
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise PycLabError(f"CUTLASS epilogue activation {self.activation!r} is not one "
                              f"of {sorted(ACTIVATIONS)}")

    @property
    def fused(self) -> bool:
        """Whether there is anything beyond ``alpha * a @ b + beta * c``."""
        return self.bias or self.activation is not None

    @property
    def name(self) -> str:
        """``""``, ``"bias"``, ``"relu"``, ``"bias_gelu"``, ..."""
        return "_".join(p for p in ("bias" if self.bias else "", self.activation or "") if p)

    @property
    def op(self) -> str:
        """The tuning database's op for GEMMs with this epilogue: ``gemm[_<name>]``."""
        return f"gemm_{self.name}" if self.fused else "gemm"

    @classmethod
    def from_op(cls, op: str) -> Epilogue:
        """Inverse of :attr:`op`."""
        parts = op.split("_")
        if parts[0] != "gemm":
            raise PycLabError(f"{op!r} is not a GEMM op")
        act = next((p for p in parts[1:] if p != "bias"), None)
        return cls("bias" in parts[1:], act)

    def fusion_op(self, dtype: str) -> str:
        """The C++ fusion operation for the epilogue CollectiveBuilder (``""`` if plain)."""
        if not self.fused:
            return ""
        t = _CXX_TYPES[dtype]
        ns = "cutlass::epilogue::fusion::"
        if self.bias and self.activation:
            return f"{ns}LinCombPerColBiasEltAct<{ACTIVATIONS[self.activation]}, {t}, float>"
        if self.bias:
            return f"{ns}LinCombPerColBias<{t}, float>"
        return f"{ns}LinCombEltAct<{ACTIVATIONS[self.activation]}, {t}, float>"


#: Raster orders of the persistent tile scheduler (``RasterOrderOptions``).
RASTERS = ("Heuristic", "AlongM", "AlongN")
#: Work decompositions of the Stream-K tile scheduler (``DecompositionMode``).
DECOMPOSITIONS = ("Heuristic", "DataParallel", "SplitK", "StreamK")


@dataclass(frozen=True)
class GemmConfig:
    """One CUTLASS kernel configuration (what ``tile_descriptions()`` lists, and variants).

    ``tile`` is the threadblock shape as ``cutlass_cppgen`` states it (M x N x K of the
    whole cluster's work); ``cta_tile`` is what one CTA computes.

    The fields after ``tile_scheduler`` widen the space beyond ``cutlass_cppgen``'s list
    (their defaults are the plain kernel, so that configurations recorded before they
    existed keep their dicts and ids):

    ``alignment``
        Elements per global access of A, B and C; ``0`` is the dtype's 16-byte default
        (:data:`ALIGNMENTS`). Lower alignments (2 or 4 for 2-byte dtypes) take rows whose
        length is not a multiple of 8; they need a cp.async mainloop and a no-smem
        epilogue (TMA needs 16-byte strides).
    ``raster``, ``swizzle``
        The persistent tile scheduler's raster order (:data:`RASTERS`) and maximum
        swizzle (1, 2, 4 or 8 tiles): which output tiles run together, for L2 reuse.
    ``splits``, ``decomposition``
        The Stream-K scheduler's work split (:data:`DECOMPOSITIONS`): ``"SplitK"`` with
        ``splits`` pieces of K per tile, ``"StreamK"``, ``"DataParallel"`` or the
        scheduler's own ``"Heuristic"`` (data-parallel / Stream-K hybrid).
    ``swap``
        Compute ``C^T = B^T A^T``: the kernel's M runs along the problem's N, so a
        small-M (GEMV-like) problem maps its long dimension onto the tiles and its short
        one onto a narrow N tile. The kernel writes a column-major ``C^T``, which is the
        row-major ``C``; :class:`~pyc_lab.kernels.cutlass.launch.CutlassGemm` swaps the
        operands itself, so callers see an ordinary ``a @ b``.
    """

    tile: tuple[int, int, int]
    cluster: tuple[int, int, int]
    kernel_schedule: str
    epilogue_schedule: str
    tile_scheduler: str
    alignment: int = 0
    raster: str = "Heuristic"
    swizzle: int = 1
    splits: int = 1
    decomposition: str = "Heuristic"
    swap: bool = False

    def __post_init__(self) -> None:
        if self.alignment not in (0, 1, 2, 4, 8):
            raise PycLabError(f"GemmConfig alignment={self.alignment!r}: give 0 (the dtype's "
                              "default), 1, 2, 4 or 8 elements")
        if self.raster not in RASTERS:
            raise PycLabError(f"GemmConfig raster={self.raster!r}: give one of {RASTERS}")
        if self.swizzle not in (1, 2, 4, 8):
            raise PycLabError(f"GemmConfig swizzle={self.swizzle!r}: give 1, 2, 4 or 8")
        if self.decomposition not in DECOMPOSITIONS:
            raise PycLabError(f"GemmConfig decomposition={self.decomposition!r}: give one of "
                              f"{DECOMPOSITIONS}")
        if (isinstance(self.splits, bool) or not isinstance(self.splits, int)
                or not 1 <= self.splits <= 64):
            raise PycLabError(f"GemmConfig splits={self.splits!r}: give a whole number 1..64")
        stream_k_only = self.splits > 1 or self.decomposition != "Heuristic"
        if stream_k_only and self.tile_scheduler != "StreamK":
            raise PycLabError(f"GemmConfig splits/decomposition need the StreamK tile "
                              f"scheduler, not {self.tile_scheduler}")
        if self.decomposition == "SplitK" and self.splits < 2:
            raise PycLabError("GemmConfig decomposition 'SplitK' needs splits >= 2")

    @property
    def cta_tile(self) -> tuple[int, int, int]:
        """The per-CTA tile: the threadblock shape divided by the cluster."""
        return (self.tile[0] // self.cluster[0], self.tile[1] // self.cluster[1], self.tile[2])

    @property
    def base(self) -> GemmConfig:
        """The same kernel schedule and tile without the variant fields (what
        ``cutlass_cppgen`` lists, or the narrow tile's schedule template)."""
        return GemmConfig(self.tile, self.cluster, self.kernel_schedule,
                          self.epilogue_schedule, self.tile_scheduler)

    @property
    def is_variant(self) -> bool:
        """Whether any field beyond ``cutlass_cppgen``'s five is set."""
        return self != self.base

    @property
    def id(self) -> str:
        """A short readable name, e.g. ``128x256x64_c2x1x1_Cooperative_TmaCoop_Default``
        (variants append ``_a2``, ``_rAlongN``, ``_sw4``, ``_SplitK4``, ``_swap``)."""
        def short(s: str) -> str:
            return (s.replace("TmaWarpSpecialized", "Tma").replace("WarpSpecialized", "WS")
                    .replace("Cooperative", "Coop").replace("Schedule", ""))
        name = (f"{'x'.join(map(str, self.tile))}_c{'x'.join(map(str, self.cluster))}_"
                f"{short(self.kernel_schedule)}_{short(self.epilogue_schedule)}_"
                f"{self.tile_scheduler}")
        if self.alignment:
            name += f"_a{self.alignment}"
        if self.raster != "Heuristic":
            name += f"_r{self.raster}"
        if self.swizzle != 1:
            name += f"_sw{self.swizzle}"
        if self.decomposition != "Heuristic":
            name += f"_{self.decomposition}" + (str(self.splits) if self.splits > 1 else "")
        elif self.splits > 1:
            name += f"_splits{self.splits}"
        if self.swap:
            name += "_swap"
        return name

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the tuning database's config); variant fields only when set."""
        d: dict[str, Any] = {"tile": list(self.tile), "cluster": list(self.cluster),
                             "kernel_schedule": self.kernel_schedule,
                             "epilogue_schedule": self.epilogue_schedule,
                             "tile_scheduler": self.tile_scheduler}
        for name, default in _VARIANT_DEFAULTS.items():
            value = getattr(self, name)
            if value != default:
                d[name] = value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GemmConfig:
        """Inverse of :meth:`to_dict`."""
        try:
            extra = {name: type(default)(d[name]) for name, default in _VARIANT_DEFAULTS.items()
                     if name in d}
            return cls(tuple(d["tile"]), tuple(d["cluster"]), str(d["kernel_schedule"]),
                       str(d["epilogue_schedule"]), str(d["tile_scheduler"]), **extra)
        except (KeyError, TypeError, ValueError) as exc:
            raise PycLabError(f"not a CUTLASS GEMM config: {d!r} ({exc})") from None


_VARIANT_DEFAULTS: dict[str, Any] = {"alignment": 0, "raster": "Heuristic", "swizzle": 1,
                                     "splits": 1, "decomposition": "Heuristic", "swap": False}


def _enum_name(value: Any) -> str:
    return getattr(value, "name", str(value)).split(".")[-1]


def check_dtype_layout(dtype: str, layout: str) -> None:
    """Raise a clear error for a dtype or layout no kernel here is built for."""
    if dtype not in DTYPES:
        raise PycLabError(f"CUTLASS GEMM dtype {dtype!r} is not built here; use one of "
                          f"{sorted(DTYPES)}")
    if layout not in LAYOUTS:
        raise PycLabError(f"layout {layout!r} is not one of {LAYOUTS} (A then B: t = "
                          "row-major, n = column-major)")


_PLAN_LOCK = threading.Lock()


@lru_cache(maxsize=16)
def _plan(dtype: str, layout: str, cc: int,
          layout_c: str = "t") -> tuple[Any, dict[GemmConfig, Any]]:
    import numpy as np

    from .compat import prepare_offline

    c = prepare_offline(cc)
    element = {"f16": np.float16, "bf16": c.DataType.bf16}.get(dtype, np.float32)
    lay = {"t": c.LayoutType.RowMajor, "n": c.LayoutType.ColumnMajor}
    with _PLAN_LOCK:
        plan = c.op.Gemm(element=element, element_accumulator=np.float32,
                         layout_A=lay[layout[0]], layout_B=lay[layout[1]],
                         layout_C=lay[layout_c], cc=cc)
        if dtype == "f32":  # float32 on the CUDA cores (the default is TF32 tensor cores)
            plan.opclass = c.OpcodeClass.Simt
        tds = plan.tile_descriptions()
    configs: dict[GemmConfig, Any] = {}
    for td in tds:
        cfg = GemmConfig(tuple(int(x) for x in td.threadblock_shape),
                         tuple(int(x) for x in td.cluster_shape),
                         _enum_name(td.kernel_schedule), _enum_name(td.epilogue_schedule),
                         _enum_name(td.tile_scheduler))
        configs.setdefault(cfg, td)
    return plan, configs


def live_configurations(dtype: str = "f16", layout: str = "tn",
                        cc: int = 90) -> list[GemmConfig]:
    """Every configuration ``cutlass_cppgen`` offers for ``dtype``/``layout`` on ``cc``,
    in its order. Needs nvidia-cutlass and ``nvcc`` (for its version), not a GPU."""
    check_dtype_layout(dtype, layout)
    return list(_plan(dtype, layout, cc)[1])


@lru_cache(maxsize=1)
def _shipped() -> dict[str, Any]:
    import json

    from ...paths import data_path

    path = data_path("cutlass", "configurations.json")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PycLabError(f"pyc_lab's shipped CUTLASS configurations are unreadable ({path}: "
                          f"{exc}); reinstall pyc_lab") from exc
    return doc


def configurations(dtype: str = "f16", layout: str = "tn", cc: int = 90) -> list[GemmConfig]:
    """Every configuration CUTLASS offers for ``dtype``/``layout`` on ``cc``, sorted by id.

    From ``cutlass_cppgen`` itself where it can be imported (nvidia-cutlass and ``nvcc``
    installed; no GPU needed); elsewhere from the table pyc_lab ships
    (``pyc_lab/data/cutlass/configurations.json``, written from ``cutlass_cppgen`` by
    ``scripts/make_cutlass_configurations.py``), so that the configuration space, the
    ranking model and replays work on a machine without the CUDA toolkit.

    Raises
    ------
    PycLabError
        For an unknown dtype or layout, or a compute capability the table lacks when
        ``cutlass_cppgen`` is not there to ask.
    """
    check_dtype_layout(dtype, layout)
    try:
        configs = live_configurations(dtype, layout, cc)
    except DeviceUnavailableError as exc:
        doc = _shipped()
        rows = doc["configurations"].get(f"{dtype}/{layout}/sm_{cc}")
        if rows is None:
            raise PycLabError(f"no CUTLASS configurations for {dtype} {layout} on sm_{cc} here: "
                              f"{exc}; pyc_lab ships the table for sm_90 only") from None
        log.info("CUTLASS configurations for %s %s sm_%d from the shipped table "
                 "(nvidia-cutlass %s): %s", dtype, layout, cc, doc.get("nvidia_cutlass"), exc)
        configs = [GemmConfig.from_dict(r) for r in rows]
    return sorted(configs, key=lambda c: c.id)


#: Alignments (elements) a dtype's kernels may be built with, widest first: the 16-byte
#: default, then the cp.async kernels' narrower ones (4-byte accesses at the least).
LOWER_ALIGNMENTS = {"f16": (8, 4, 2), "bf16": (8, 4, 2), "tf32": (4, 2, 1), "f32": (1,)}
_CP_ASYNC = ("CpAsyncWarpSpecialized", "CpAsyncWarpSpecializedCooperative",
             "CpAsyncWarpSpecializedPingpong")


def swapped_layout(layout: str) -> str:
    """The layout of the swapped problem ``C^T = B^T A^T`` (``"tn"`` stays ``"tn"``)."""
    flip = {"t": "n", "n": "t"}
    return flip[layout[1]] + flip[layout[0]]


def _contiguous(m: int, n: int, k: int, layout: str) -> dict[str, int]:
    return {"A": k if layout[0] == "t" else m, "B": n if layout[1] == "t" else k, "C": n}


def problem_alignment(m: int, n: int, k: int, layout: str, dtype: str = "f16") -> int:
    """The widest alignment (elements) among :data:`LOWER_ALIGNMENTS` that every
    contiguous extent of the problem is a multiple of, or 0 when none is."""
    extents = _contiguous(m, n, k, layout).values()
    return next((al for al in LOWER_ALIGNMENTS[dtype] if all(d % al == 0 for d in extents)), 0)


def problem_issue(m: int, n: int, k: int, layout: str, dtype: str = "f16",
                  alignment: int = 0) -> str:
    """Why no ``dtype`` kernel of ``alignment`` elements (0: the dtype's 16-byte default)
    can take this problem, or ``""``."""
    if min(m, n, k) <= 0:
        return f"empty problem {m}x{n}x{k}"
    align = alignment or ALIGNMENTS[dtype]
    bad = [f"{op} ({d})" for op, d in _contiguous(m, n, k, layout).items() if d % align]
    if bad:
        return (f"the contiguous extent of {', '.join(bad)} is not a multiple of "
                f"{align} (the {dtype} kernels of alignment {align} need rows of "
                f"{align * (2 if dtype in ('f16', 'bf16') else 4)}-byte multiples)")
    if max(m, n, k) >= 2**31:
        return "a dimension of 2**31 or more"
    return ""


def config_issue(cfg: GemmConfig, m: int, n: int, k: int, layout: str = "tn",
                 dtype: str = "f16", epilogue: Epilogue | None = None) -> str:
    """Why ``cfg`` cannot run an ``m x n x k`` problem (alignment, variant rules), or ``""``.

    The problem-independent rules of the variants: a lower alignment needs a cp.async
    mainloop and the no-smem epilogue; a swapped kernel cannot fuse a per-column bias.
    """
    issue = problem_issue(m, n, k, layout, dtype, cfg.alignment)
    if issue:
        return issue
    if cfg.alignment and cfg.alignment < ALIGNMENTS[dtype] and (
            cfg.kernel_schedule not in _CP_ASYNC or cfg.epilogue_schedule in _TMA_EPILOGUES):
        return (f"alignment {cfg.alignment} needs a cp.async mainloop and a no-smem "
                "epilogue (TMA needs 16-byte strides)")
    if cfg.swap and epilogue is not None and epilogue.bias:
        return "a swapped kernel cannot fuse a per-column bias"
    return ""


def prune(configs: Iterable[GemmConfig], m: int, n: int, k: int, layout: str = "tn",
          dtype: str = "f16", epilogue: Epilogue | None = None, stream_k: bool = False
          ) -> tuple[list[GemmConfig], dict[str, str]]:
    """Keep the configurations that can work for an ``m x n x k`` problem.

    Stream-K tile-scheduler candidates are opt-in (``stream_k=True``): on the shapes
    benchmarked (``benchmarks/results/h200/gemm-streamk.json``) every one ran correctly
    but slower than the best data-parallel tile, so by default they only cost tuning
    time. (The wider space of :func:`pyc_lab.kernels.tuning.gemm_space.problem_configs`
    adds split-K and Stream-K variants where the problem's shape calls for them.)

    A fused ``epilogue`` (bias and/or activation) keeps only the TMA epilogue schedules,
    the ones CUTLASS's epilogue fusion runs on. A swapped configuration (``swap``) is
    judged on the swapped problem (``n x m``).

    Returns
    -------
    kept, dropped
        The kept configurations (input order) and ``config id -> reason`` for the rest.
    """
    kept: list[GemmConfig] = []
    dropped: dict[str, str] = {}
    fused = epilogue is not None and epilogue.fused
    for cfg in configs:
        cm, cn, _ck = cfg.cta_tile
        pm, pn = (n, m) if cfg.swap else (m, n)
        why = config_issue(cfg, m, n, k, layout, dtype, epilogue)
        if not why and not stream_k and cfg.tile_scheduler == "StreamK" and not cfg.is_variant:
            why = "Stream-K candidates are opt-in (stream_k=True)"
        if not why and fused and cfg.epilogue_schedule not in _TMA_EPILOGUES:
            why = (f"a fused {epilogue.name} epilogue needs a TMA epilogue schedule "
                   f"({cfg.epilogue_schedule} has none)")
        if not why and "Cooperative" in cfg.kernel_schedule and cm < 128:
            why = "a Cooperative kernel needs a CTA tile of at least 128 along M"
        if not why and (cm > 2 * max(pm, 64) or cn > 2 * max(pn, 64)):
            why = f"CTA tile {cm}x{cn} is far larger than the {pm}x{pn} output"
        if not why and ((cfg.cluster[0] > 1 and pm <= cm) or (cfg.cluster[1] > 1 and pn <= cn)):
            why = "a cluster larger than the problem's tiles along that dimension"
        if why:
            dropped[cfg.id] = why
        else:
            kept.append(cfg)
    return kept, dropped


def score(cfg: GemmConfig, m: int, n: int, k: int, sm_count: int) -> float:
    """A cheap guess of a configuration's speed for a problem (higher is better).

    The product of: wave efficiency (the last wave's idle SMs; Stream-K removes most of
    it), tile arithmetic intensity (``cm*cn/(cm+cn)``, normalised to a 128x256 tile), a
    schedule prior (TMA warp-specialised kernels first, cp.async ones last) and an
    epilogue prior (TMA epilogues before the no-shared-memory one).
    """
    cm, cn, _ = cfg.cta_tile
    if cfg.swap:
        m, n = n, m
    units = math.ceil(m / cm) * math.ceil(n / cn) * max(1, cfg.splits)
    waves = units / sm_count
    eff = units / (math.ceil(waves) * sm_count) if units else 0.0
    if cfg.tile_scheduler == "StreamK" and cfg.decomposition in ("Heuristic", "StreamK"):
        eff = max(eff, 0.9 if waves >= 1 else min(1.0, 2 * eff))
    intensity = (cm * cn / (cm + cn)) / (128 * 256 / (128 + 256))
    waste = (m * n) / (math.ceil(m / cm) * cm * math.ceil(n / cn) * cn)
    prior = {"TmaWarpSpecializedCooperative": 1.0, "TmaWarpSpecializedPingpong": 1.0,
             "TmaWarpSpecialized": 0.9, "ScheduleAuto": 0.95}.get(cfg.kernel_schedule, 0.6)
    # the epilogue: TMA stores are coalesced; the no-smem epilogue stores from registers,
    # which costs most when K is short and the store is a large share of the work
    epi = {"TmaWarpSpecialized": 1.0, "TmaWarpSpecializedCooperative": 1.0,
           "ScheduleAuto": 0.95}.get(cfg.epilogue_schedule, 0.85)
    narrow = 0.7 if cfg.alignment else 1.0  # cp.async loads, narrower accesses
    # splitting K costs a reduction through the workspace
    split = 0.85 if cfg.splits > 1 or cfg.decomposition == "StreamK" else 1.0
    return eff * min(intensity, 1.2) * waste * prior * epi * narrow * split


def rank(configs: Iterable[GemmConfig], m: int, n: int, k: int,
         sm_count: int) -> list[GemmConfig]:
    """``configs`` ordered by :func:`score`, best first, spread over kinds.

    Greedy: each pick is the best score after a 10 % discount per configuration already
    picked with the same CTA tile and kernel schedule, so that a short budget still
    sees different tiles and schedules rather than one kind's epilogue variants.
    """
    left = sorted(configs, key=lambda c: (-score(c, m, n, k, sm_count), c.id))
    base = {c: score(c, m, n, k, sm_count) for c in left}
    seen: dict[tuple, int] = {}
    out: list[GemmConfig] = []
    while left:
        best = max(left, key=lambda c: base[c] * 0.9 ** seen.get(
            (c.cta_tile, c.kernel_schedule), 0))
        left.remove(best)
        group = (best.cta_tile, best.kernel_schedule)
        seen[group] = seen.get(group, 0) + 1
        out.append(best)
    return out
