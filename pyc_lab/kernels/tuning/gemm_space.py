"""GEMM configurations as a search space: a candidate is a CUTLASS configuration.

The space's parameters are the configuration's fields (tile, cluster, kernel schedule,
epilogue schedule, tile scheduler), restricted to the combinations that exist, so that
the strategies' neighbour moves (one field to an adjacent value) stay meaningful.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...search import SearchSpace
from ..cutlass.config import GemmConfig

__all__ = ["config_of", "gemm_space"]


def _shape(values: tuple[int, ...]) -> str:
    return "x".join(map(str, values))


def _key(cfg: GemmConfig) -> tuple[str, str, str, str, str]:
    return (_shape(cfg.tile), _shape(cfg.cluster), cfg.kernel_schedule,
            cfg.epilogue_schedule, cfg.tile_scheduler)


def gemm_space(configs: Sequence[GemmConfig]) -> SearchSpace:
    """The search space whose valid candidates are exactly ``configs``."""
    keys = [_key(c) for c in configs]
    names = ("tile", "cluster", "kernel_schedule", "epilogue_schedule", "tile_scheduler")
    params = {name: sorted({k[i] for k in keys}) for i, name in enumerate(names)}
    allowed = set(keys)

    def exists(cand: Mapping[str, Any]) -> bool:
        return tuple(cand[name] for name in names) in allowed

    return SearchSpace(params, restrictions=[exists])


def config_of(candidate: Mapping[str, Any]) -> GemmConfig:
    """The configuration a candidate of :func:`gemm_space` stands for."""
    return GemmConfig(tuple(int(x) for x in candidate["tile"].split("x")),
                      tuple(int(x) for x in candidate["cluster"].split("x")),
                      candidate["kernel_schedule"], candidate["epilogue_schedule"],
                      candidate["tile_scheduler"])
