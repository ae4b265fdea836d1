"""GEMM configurations as a search space: a candidate is a CUTLASS configuration.

:func:`problem_configs` chooses a problem's candidates: ``cutlass_cppgen``'s listed
configurations, widened per problem by the variants of
:mod:`~pyc_lab.kernels.cutlass.variants` where the shape calls for them —

- extents that are not multiples of 8 (2-byte dtypes): cp.async kernels of alignment 4
  or 2 (the listed 16-byte ones are pruned);
- small M (``m <= 64``, GEMV-like): swapped operands with narrow tiles, and their
  split-K variants;
- few output tiles for the SMs and a long K: split-K (2, 4, 8), Stream-K and the
  data-parallel / Stream-K hybrid of the Stream-K scheduler;
- many output tiles (two waves or more): raster order along M / along N and swizzles of
  4 and 8 of the best-ranked persistent kernels;

then pruned (:func:`~pyc_lab.kernels.cutlass.config.prune`) and ranked by the cheap
model (:func:`~pyc_lab.kernels.cutlass.config.rank`).

The space's parameters are the configuration's fields (tile, cluster, kernel schedule,
epilogue schedule, tile scheduler and the variant fields), restricted to the
combinations that exist, so that the strategies' neighbour moves (one field to an
adjacent value) stay meaningful.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...search import SearchSpace
from ..cutlass.config import (
    ALIGNMENTS,
    Epilogue,
    GemmConfig,
    configurations,
    problem_alignment,
    prune,
    rank,
)
from ..cutlass.variants import lower_alignment, narrow_tiles, raster_variants, split_variants

__all__ = ["SMALL_M", "config_of", "gemm_space", "problem_configs"]

#: Problems with at most this many rows get the swapped narrow-tile candidates.
SMALL_M = 64
_NAMES = ("tile", "cluster", "kernel_schedule", "epilogue_schedule", "tile_scheduler",
          "alignment", "raster", "swizzle", "splits", "decomposition", "swap")


def _shape(values: tuple[int, ...]) -> str:
    return "x".join(map(str, values))


def _key(cfg: GemmConfig) -> tuple:
    return (_shape(cfg.tile), _shape(cfg.cluster), cfg.kernel_schedule,
            cfg.epilogue_schedule, cfg.tile_scheduler, cfg.alignment, cfg.raster,
            cfg.swizzle, cfg.splits, cfg.decomposition, cfg.swap)


def gemm_space(configs: Sequence[GemmConfig]) -> SearchSpace:
    """The search space whose valid candidates are exactly ``configs``."""
    keys = [_key(c) for c in configs]
    params = {name: sorted({k[i] for k in keys}) for i, name in enumerate(_NAMES)}
    allowed = set(keys)

    def exists(cand: Mapping[str, Any]) -> bool:
        return tuple(cand[name] for name in _NAMES) in allowed

    return SearchSpace(params, restrictions=[exists])


def config_of(candidate: Mapping[str, Any]) -> GemmConfig:
    """The configuration a candidate of :func:`gemm_space` stands for."""
    return GemmConfig(tuple(int(x) for x in candidate["tile"].split("x")),
                      tuple(int(x) for x in candidate["cluster"].split("x")),
                      candidate["kernel_schedule"], candidate["epilogue_schedule"],
                      candidate["tile_scheduler"],
                      **{name: candidate[name] for name in _NAMES[5:] if name in candidate})


def problem_configs(m: int, n: int, k: int, dtype: str = "f16", layout: str = "tn",
                    cc: int = 90, sm_count: int = 132, epilogue: Epilogue | None = None,
                    stream_k: bool = False, wide: bool = True,
                    listed: Sequence[GemmConfig] | None = None
                    ) -> tuple[list[GemmConfig], dict[str, str]]:
    """A problem's candidate configurations, ranked best first, and the dropped ones.

    Parameters
    ----------
    m, n, k, dtype, layout
        The problem.
    cc, sm_count
        The GPU's compute capability and SM count (the ranking model's waves).
    epilogue
        A fused epilogue (only TMA-epilogue kernels fuse one; swapped kernels no bias).
    stream_k
        Include ``cutlass_cppgen``'s own Stream-K listings (the data-parallel /
        Stream-K hybrid); they and the split variants come regardless where the shape
        calls for them (few output tiles, long K).
    wide
        Add the variants (``False``: the listed configurations only, as before).
    listed
        The listed configurations (``configurations(dtype, layout, cc)`` by default).

    Returns
    -------
    ranked, dropped
        The candidates in :func:`~pyc_lab.kernels.cutlass.config.rank` order, and
        ``config id -> reason`` for those pruned.
    """
    base = list(listed) if listed is not None else configurations(dtype, layout, cc)
    configs = list(base)
    fused = epilogue is not None and epilogue.fused
    split_shape = False  # the shape calls for split-K / Stream-K: the hybrid listings too
    if wide:
        align = problem_alignment(m, n, k, layout, dtype)
        if align and align < ALIGNMENTS[dtype]:
            configs += lower_alignment(base, align, dtype)
        elif align and not fused:
            if m <= SMALL_M:
                configs += narrow_tiles(m)
                if k >= 1024:
                    configs += split_variants(narrow_tiles(m, stream_k=True), k)
            tiles_128 = math.ceil(m / 128) * math.ceil(n / 128)
            if tiles_128 < sm_count and k >= 2048:
                split_shape = True
                coop = [c for c in base if c.tile_scheduler == "Default"
                        and not c.kernel_schedule.startswith("CpAsync")
                        and c.cta_tile[0] <= 2 * max(m, 64)]
                configs += split_variants(coop, k)
            if tiles_128 >= 2 * sm_count:
                kept, _ = prune(base, m, n, k, layout, dtype, epilogue, stream_k)
                configs += raster_variants(rank(kept, m, n, k, sm_count)[:3])
    seen: dict[GemmConfig, None] = dict.fromkeys(configs)
    kept, dropped = prune(seen, m, n, k, layout, dtype, epilogue, stream_k or split_shape)
    return rank(kept, m, n, k, sm_count), dropped
