"""cuBLASLt's algorithm space for one GEMM: list, configure and check its algorithms.

cuBLASLt's heuristic (what :class:`~.blas_direct.LtGemm` asks) ranks a few algorithms
with a model of the GPU. The library also lets a caller list every algorithm it has for
the dtypes (``cublasLtMatmulAlgoGetIds``), read what each can be set to (tile shapes,
pipeline stages, split-K with its reduction schemes, CTA swizzling, custom options) and
check one setting against the actual problem (``cublasLtMatmulAlgoCheck``: whether it
runs, and the workspace it needs). Those settings are candidates the tuner measures
beside its own kernels and the libraries (:mod:`.tuning.lt_candidates`); a winner is
stored as an :class:`LtAlgo` and :func:`pyc_lab.matmul` runs it through
:class:`~.blas_direct.LtGemm` — still cuBLASLt, with the setting the measurement chose.

The listing is two steps, to stay small: every algorithm id x tile x stages at split-K 1
(:func:`base_settings`), then for the fastest few of those, their custom options,
swizzles and split-K counts (:func:`expansions`).

Nothing here touches a GPU until a function is called with a cuBLASLt handle.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import PycLabError

__all__ = ["KERNEL", "SPLITS", "LtAlgo", "aligned", "base_settings", "check", "expansions",
           "is_lt_algo", "struct"]

#: The ``"kernel"`` value of a stored :class:`LtAlgo` configuration.
KERNEL = "cublaslt"
#: Split-K counts tried for a problem of few output tiles.
SPLITS = (2, 3, 4, 6, 8, 12, 16, 24, 32)
#: Reduction schemes (``CUBLASLT_REDUCTION_SCHEME_*``): in place, in compute type, in
#: output type.
REDUCTIONS = (1, 2, 4)
#: Most custom options tried per algorithm.
MAX_CUSTOM = 3
#: Scale type of the float32 compute types (``CUDA_R_32F``).
SCALE_32F = 0


@dataclass(frozen=True)
class LtAlgo:
    """One cuBLASLt algorithm setting (``cublasLtMatmulAlgoConfigAttributes_t``).

    Attributes
    ----------
    algo_id
        The algorithm (``CUBLASLT_ALGO_CONFIG_ID``).
    tile, stages
        ``cublasLtMatmulTile_t`` and ``cublasLtMatmulStages_t`` ids (0: undefined).
    splitk
        K split into this many parts (1: none).
    reduction
        How the parts are summed (``cublasLtReductionScheme_t``; 0 without split-K).
    swizzle
        CTA swizzling (0 or 1).
    custom
        The algorithm's custom option.
    """

    algo_id: int
    tile: int = 0
    stages: int = 0
    splitk: int = 1
    reduction: int = 0
    swizzle: int = 0
    custom: int = 0

    @property
    def id(self) -> str:
        """A short name: ``lt66_t20_s8_k1_r0_w0_c0``."""
        return (f"lt{self.algo_id}_t{self.tile}_s{self.stages}_k{self.splitk}_"
                f"r{self.reduction}_w{self.swizzle}_c{self.custom}")

    def to_dict(self) -> dict[str, Any]:
        """The setting as the tuning database stores it (``kernel: "cublaslt"``)."""
        return {"kernel": KERNEL, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LtAlgo:
        """The setting :meth:`to_dict` stored.

        Raises
        ------
        PycLabError
            For a dict that is not a cuBLASLt setting.
        """
        if not is_lt_algo(d):
            raise PycLabError(f"not a cuBLASLt algorithm setting: {d!r}")
        try:
            return cls(*(int(d[f]) for f in ("algo_id", "tile", "stages", "splitk",
                                             "reduction", "swizzle", "custom")))
        except (KeyError, TypeError, ValueError) as exc:
            raise PycLabError(f"cuBLASLt setting {d!r} is incomplete: {exc}") from exc


def is_lt_algo(config: Any) -> bool:
    """Whether a stored configuration (a dict) names a cuBLASLt algorithm setting."""
    return isinstance(config, dict) and config.get("kernel") == KERNEL


def _cap(lt: Any, algo: np.ndarray, name: str) -> list[int]:
    """A capability of an initialised algorithm (``cublasLtMatmulAlgoCapGetAttribute``),
    as a list (empty when the algorithm has none)."""
    attr = getattr(lt.MatmulAlgoCapAttribute, name)
    dt = np.dtype(lt.get_matmul_algo_cap_attribute_dtype(attr))
    written = np.zeros(1, dtype=np.uint64)
    lt.matmul_algo_cap_get_attribute(algo.ctypes.data, attr, 0, 0, written.ctypes.data)
    count = int(written[0]) // dt.itemsize
    if not count:
        return []
    buf = np.zeros(count, dtype=dt)
    lt.matmul_algo_cap_get_attribute(algo.ctypes.data, attr, buf.ctypes.data, buf.nbytes,
                                     written.ctypes.data)
    return [int(x) for x in buf]


def _set(lt: Any, algo: np.ndarray, name: str, value: int) -> None:
    attr = getattr(lt.MatmulAlgoConfigAttribute, name)
    buf = np.array(value, dtype=lt.get_matmul_algo_config_attribute_dtype(attr))
    lt.matmul_algo_config_set_attribute(algo.ctypes.data, attr, buf.ctypes.data, buf.nbytes)


def _init(lt: Any, handle: int, compute: int, types: tuple[int, int, int],
          algo_id: int) -> np.ndarray:
    """An initialised algorithm struct; ``types`` are cuBLASLt's A, B and C/D types."""
    algo = np.zeros(1, dtype=lt.matmul_algo_dtype)
    t_a, t_b, t_c = types
    lt.matmul_algo_init(handle, compute, SCALE_32F, t_a, t_b, t_c, t_c, algo_id,
                        algo.ctypes.data)
    return algo


def struct(lt: Any, handle: int, compute: int, types: tuple[int, int, int],
           setting: LtAlgo) -> np.ndarray:
    """The algorithm struct of ``setting`` (not yet checked against a problem)."""
    algo = _init(lt, handle, compute, types, setting.algo_id)
    _set(lt, algo, "TILE_ID", setting.tile)
    _set(lt, algo, "STAGES_ID", setting.stages)
    _set(lt, algo, "SPLITK_NUM", setting.splitk)
    if setting.splitk > 1:
        _set(lt, algo, "REDUCTION_SCHEME", setting.reduction)
    _set(lt, algo, "CTA_SWIZZLING", setting.swizzle)
    _set(lt, algo, "CUSTOM_OPTION", setting.custom)
    return algo


def check(lt: Any, handle: int, desc: int, layouts: tuple[int, int, int], algo: np.ndarray,
          max_workspace: int) -> np.ndarray | None:
    """The heuristic-result record (the algorithm first, then its workspace size) of a
    setting the problem takes within ``max_workspace`` bytes, else ``None``."""
    result = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
    la, lb, lc = layouts
    try:
        lt.matmul_algo_check(handle, desc, la, lb, lc, lc, algo.ctypes.data,
                             result.ctypes.data)
    except Exception:  # cuBLASLt refuses the setting for this problem
        return None
    if int(result["workspace_size"][0]) > max_workspace:
        return None
    result["algo"][0] = algo[0]
    return result


def aligned(lt: Any, algo: np.ndarray, alignments: tuple[int, int, int]) -> bool:
    """Whether pointers of these alignments (cuBLASLt's A, B and C/D, in bytes) meet the
    algorithm's minimum alignments (a setting checked on one problem may need 16-byte
    pointers that another call of the same shape does not have)."""
    needs = []
    for which in ("A", "B", "C", "D"):
        try:
            needs.append((_cap(lt, algo, f"MIN_ALIGNMENT_{which}_BYTES") or [1])[0])
        except Exception:  # a build without the capability: assume the strictest
            needs.append(16)
    have = (alignments[0], alignments[1], alignments[2], alignments[2])
    return all(h >= n for h, n in zip(have, needs, strict=True))


def base_settings(lt: Any, handle: int, compute: int, types: tuple[int, int, int],
                  desc: int, layouts: tuple[int, int, int], max_workspace: int,
                  deadline: float | None = None) -> list[tuple[LtAlgo, np.ndarray]]:
    """Every algorithm id x tile x stages the problem takes, at split-K 1, swizzle 0 and
    custom option 0, with their records; the listing stops at ``deadline``
    (``time.perf_counter()``) between algorithms."""
    out = []
    for algo_id in (int(i) for i in lt.matmul_algo_get_ids(
            handle, compute, SCALE_32F, types[0], types[1], types[2], types[2], 512)):
        if deadline is not None and time.perf_counter() > deadline:
            break
        try:
            algo = _init(lt, handle, compute, types, algo_id)
            tiles = _cap(lt, algo, "TILE_IDS") or [0]
            stages = _cap(lt, algo, "STAGES_IDS") or [0]
        except Exception:  # an id this build cannot initialise
            continue
        for tile in tiles:
            for st in stages:
                setting = LtAlgo(algo_id, tile, st)
                try:
                    cfg = struct(lt, handle, compute, types, setting)
                except Exception:
                    continue
                rec = check(lt, handle, desc, layouts, cfg, max_workspace)
                if rec is not None:
                    out.append((setting, rec))
    return out


def expansions(lt: Any, handle: int, compute: int, types: tuple[int, int, int], desc: int,
               layouts: tuple[int, int, int], base: LtAlgo, max_workspace: int,
               split: bool) -> list[tuple[LtAlgo, np.ndarray]]:
    """``base``'s other custom options and swizzles, and with ``split`` its split-K
    counts and reduction schemes, that the problem takes (``base`` itself left out)."""
    try:
        algo = _init(lt, handle, compute, types, base.algo_id)
        custom = (_cap(lt, algo, "CUSTOM_OPTION_MAX") or [0])[0]
        swizzle = (_cap(lt, algo, "CTA_SWIZZLING_SUPPORT") or [0])[0]
        splitk = (_cap(lt, algo, "SPLITK_SUPPORT") or [0])[0]
        mask = (_cap(lt, algo, "REDUCTION_SCHEME_MASK") or [0])[0]
    except Exception:
        return []
    splits = [(1, 0)] + [(k, r) for k in SPLITS for r in REDUCTIONS
                         if split and splitk and mask & r]
    out = []
    for co in range(min(custom, MAX_CUSTOM) + 1):
        for sw in range(min(swizzle, 1) + 1):
            for k, r in splits:
                setting = LtAlgo(base.algo_id, base.tile, base.stages, k, r, sw, co)
                if setting == base:
                    continue
                try:
                    cfg = struct(lt, handle, compute, types, setting)
                except Exception:
                    continue
                rec = check(lt, handle, desc, layouts, cfg, max_workspace)
                if rec is not None:
                    out.append((setting, rec))
    return out
