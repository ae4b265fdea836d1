"""Kernel variants beyond ``cutlass_cppgen``'s list, derived from the configurations it
offers: lower alignments, narrow and swapped tiles for small M, split-K / Stream-K
decompositions, and the persistent scheduler's raster order and swizzle.

Each function takes the listed configurations and returns new
:class:`~pyc_lab.kernels.cutlass.config.GemmConfig` s; which of them a problem gets is
decided per problem by :func:`pyc_lab.kernels.tuning.gemm_space.problem_configs`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from .config import ALIGNMENTS, GemmConfig

__all__ = ["NARROW_N", "lower_alignment", "narrow_tiles", "raster_variants",
           "split_variants"]

#: The narrow N tiles (of the swapped problem: the original M) a small-M problem gets.
NARROW_N = (16, 32, 64)
_PERSISTENT = ("TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong")


def lower_alignment(configs: Iterable[GemmConfig], alignment: int,
                    dtype: str) -> list[GemmConfig]:
    """The cp.async configurations with the no-smem epilogue, at ``alignment`` elements
    (none when ``alignment`` is the dtype's default: the listed ones already are)."""
    if not alignment or alignment >= ALIGNMENTS[dtype]:
        return []
    return [dataclasses.replace(c, alignment=alignment) for c in configs
            if c.kernel_schedule.startswith("CpAsync")
            and c.epilogue_schedule == "NoSmemWarpSpecialized" and not c.is_variant]


def narrow_tiles(m: int, swap: bool = True, k_tile: int = 128,
                 stream_k: bool = False) -> list[GemmConfig]:
    """Small-M configurations: CTA tiles whose side along M is a narrow N tile.

    With ``swap`` (the default) the kernel computes ``C^T = B^T A^T``: its M tile (64 for
    Pingpong, 128 for Cooperative) runs along the problem's N and its N tile — the
    smallest of :data:`NARROW_N` covering ``m``, and the next one — along the problem's M.
    The schedules are the TMA warp-specialised ones with the no-smem epilogue (no
    epilogue-tile constraint for a narrow N); ``stream_k`` uses the Stream-K scheduler
    (for split-K variants).
    """
    widths = [w for w in NARROW_N if w >= m][:2] or [NARROW_N[-1]]
    scheduler = "StreamK" if stream_k else "Default"
    # Stream-K kernels here are Cooperative (as cutlass_cppgen lists them)
    shapes = [(128, "TmaWarpSpecializedCooperative")] if stream_k else \
        [(64, "TmaWarpSpecializedPingpong"), (128, "TmaWarpSpecializedCooperative")]
    return [GemmConfig((tm, w, k_tile), (1, 1, 1), schedule, "NoSmemWarpSpecialized",
                       scheduler, swap=swap) for w in widths for tm, schedule in shapes]


def split_variants(configs: Sequence[GemmConfig], k: int,
                   splits: Sequence[int] = (2, 4, 8)) -> list[GemmConfig]:
    """Stream-K-scheduler variants of the Cooperative kernels among ``configs`` (on a
    1x1x1 cluster, their CTA tile kept): split-K into each of ``splits`` pieces that
    leaves each at least two K tiles, pure Stream-K, and the scheduler's data-parallel /
    Stream-K hybrid heuristic."""
    out: list[GemmConfig] = []
    for c in dict.fromkeys(dataclasses.replace(c, tile=c.cta_tile, cluster=(1, 1, 1))
                           for c in configs):
        if c.kernel_schedule != "TmaWarpSpecializedCooperative":
            continue
        base = dataclasses.replace(c, tile_scheduler="StreamK", splits=1,
                                   decomposition="Heuristic")
        out.append(base)
        out.append(dataclasses.replace(base, decomposition="StreamK"))
        k_tiles = -(-k // c.tile[2])
        out.extend(dataclasses.replace(base, decomposition="SplitK", splits=s)
                   for s in splits if k_tiles >= 2 * s)
    return out


def raster_variants(configs: Sequence[GemmConfig]) -> list[GemmConfig]:
    """Raster-order and swizzle variants of the persistent kernels among ``configs``:
    along M, along N, and swizzles of 4 and 8 tiles (heuristic raster)."""
    out: list[GemmConfig] = []
    for c in configs:
        if c.kernel_schedule not in _PERSISTENT:
            continue
        out.extend([dataclasses.replace(c, raster="AlongM"),
                    dataclasses.replace(c, raster="AlongN"),
                    dataclasses.replace(c, swizzle=4), dataclasses.replace(c, swizzle=8)])
    return out
