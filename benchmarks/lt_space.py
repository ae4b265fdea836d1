"""cuBLASLt's listed algorithm space for one GEMM (``benchmarks/exp_cublaslt_search.py``).

Every algorithm id cuBLASLt has for the dtypes (``cublasLtMatmulAlgoGetIds``) x the tiles
and stages each takes, then for the fastest few their custom options, swizzles and
split-K counts, each checked against the problem (``cublasLtMatmulAlgoCheck``). On
Hopper this space does not reach the kernels cuBLASLt's heuristic returns
(``benchmarks/results/h100/issue14-7ec7fe4/``), so the library keeps the heuristic's
picks instead (:mod:`pyc_lab.kernels.lt_algos`); the listing stays here, with the
experiment that measured it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyc_lab.kernels.lt_algos import capability, check

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
    """One cuBLASLt algorithm setting (``cublasLtMatmulAlgoConfigAttributes_t``) of the
    listed space.

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
            tiles = capability(lt, algo, "TILE_IDS") or [0]
            stages = capability(lt, algo, "STAGES_IDS") or [0]
        except Exception:  # an id this build cannot initialise
            continue
        out += _taken(lt, handle, compute, types, desc, layouts, max_workspace,
                      (LtAlgo(algo_id, tile, st) for tile in tiles for st in stages))
    return out


def expansions(lt: Any, handle: int, compute: int, types: tuple[int, int, int], desc: int,
               layouts: tuple[int, int, int], base: LtAlgo, max_workspace: int,
               split: bool) -> list[tuple[LtAlgo, np.ndarray]]:
    """``base``'s other custom options and swizzles, and with ``split`` its split-K
    counts and reduction schemes, that the problem takes (``base`` itself left out)."""
    try:
        algo = _init(lt, handle, compute, types, base.algo_id)
        custom = (capability(lt, algo, "CUSTOM_OPTION_MAX") or [0])[0]
        swizzle = (capability(lt, algo, "CTA_SWIZZLING_SUPPORT") or [0])[0]
        splitk = (capability(lt, algo, "SPLITK_SUPPORT") or [0])[0]
        mask = (capability(lt, algo, "REDUCTION_SCHEME_MASK") or [0])[0]
    except Exception:
        return []
    splits = [(1, 0)] + [(k, r) for k in SPLITS for r in REDUCTIONS
                         if split and splitk and mask & r]
    settings = (LtAlgo(base.algo_id, base.tile, base.stages, k, r, sw, co)
                for co in range(min(custom, MAX_CUSTOM) + 1)
                for sw in range(min(swizzle, 1) + 1) for k, r in splits)
    return _taken(lt, handle, compute, types, desc, layouts, max_workspace,
                  (s for s in settings if s != base))


def _taken(lt: Any, handle: int, compute: int, types: tuple[int, int, int], desc: int,
           layouts: tuple[int, int, int], max_workspace: int,
           settings: Iterable[LtAlgo]) -> list[tuple[LtAlgo, np.ndarray]]:
    """The ``settings`` the problem takes, each with its record."""
    out = []
    for setting in settings:
        try:
            cfg = struct(lt, handle, compute, types, setting)
        except Exception:  # a value this build cannot set
            continue
        rec = check(lt, handle, desc, layouts, cfg, max_workspace)
        if rec is not None:
            out.append((setting, rec))
    return out
